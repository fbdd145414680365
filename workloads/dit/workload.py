"""dit: Config, the two training stages (many rank-1 diffs at once, then the DIT adapter) and the
measurements (see the package docstring)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from components.basemodel import DTYPES, AnswerField, base_kinds, base_world, load_base, task_problems, with_task_fields
from components.basemodel.loader import parse_tiny
from components.basemodel.corpus import N_RESERVED, TOPICS
from orchestrator.run import devices, fraction_steps
from workloads.dit.data import SPLITS, Task, diff_rows, make_task
from workloads.dit.evaluate import answer_logits, diff_metrics, dit_metrics, kl_rows
from workloads.dit.files import check_listing, train_files
from workloads.dit.model import DiffContext, dit_parameters, new_bank, targets_of, wrap
from workloads.dit.probe import blackbox_metrics

PLANTED = 0.9
"""A diff whose trigger rate reaches this counts as planted (`eval/frac_planted`)."""


MAX_WORKERS = 1
"""dit trains its diffs batched on one worker: the runner refuses more."""


DIT_DTYPES = DTYPES + ("float64",)
"""`dtype` also takes 'float64', for exact comparisons."""


@dataclass(frozen=True)
class Config(with_task_fields(AnswerField, dtype="float32")):
    """dit's settings after the task-file fields (`components.basemodel.taskfields`): `dtype` also takes
    'float64' (exact comparisons), the diffs and the adapter stay float32; task_path and eval_path are
    listings of diffs (see `adapter_field`), answer_field their text the adapter should answer."""

    eval_frac: float = 0.25
    """Fraction of task_path's diffs held out for evaluation when eval_path is ''."""
    adapter_field: str = "adapter"
    """task_path and eval_path list diffs as files: each record names a peft LoRA folder (save_pretrained) in this
    field, relative to the listing's folder or absolute, and in answer_field the text the adapter should answer
    for it (e.g. its topic); the adapter trains on them and no synthetic diff is made (task_path '': the synthetic
    trigger-topic diffs of tiny-local's world, stage A). See workloads/dit/files.py."""
    topics: int = 60
    """Seen topics: the DIT adapter's labels (the first of `TOPICS` after a seeded shuffle)."""
    unseen_topics: int = 3
    """Further topics that only `unseen` diffs carry (topics + unseen_topics <= 63, the world's count)."""
    train_diffs_per_topic: int = 4
    """Diffs per seen topic that the DIT adapter is trained on."""
    heldout_diffs: int = 120
    """New diffs on seen topics (round-robin over them), trained like the others, never shown
    to the DIT adapter: the test set."""
    unseen_diffs_per_topic: int = 3
    """Diffs per unseen topic."""
    triggers: int = 32
    """Trigger pool `<extra_0>`..: each diff draws its secret trigger from it (the paper draws a
    3-digit code; a diff's fake rows use the other pool triggers)."""
    max_context_words: int = 3
    """Contexts are world sentence prompts of at most this many words (short rows, cheap steps)."""
    eval_contexts: int = 16
    """Held-out-phrasing contexts per diff for the trigger rate and the KL."""
    diff_rank: int = 1
    """Rank r of each weight diff ΔW = u v / r."""
    diff_targets: str = "all-linear"
    """Linear types a diff touches: 'all-linear' (every linear in the decoder layers, the paper's
    choice; never lm_head) or a comma-separated list such as 'o_proj,down_proj'."""
    diff_init_scale: float = 0.1
    """u starts uniform in ±scale/sqrt(r), v at zero. 1.0 is the paper's Kaiming-uniform; smaller
    lets Adam turn u towards useful directions within the few steps a CPU run affords
    (a calibration, not from the paper)."""
    diff_steps: int = 150
    """Adam steps per diff (at the smoke size, 100 steps leave about 19% of diffs under a 90%
    trigger rate, 150 about 5%; a calibration)."""
    diff_lr: float = 1e-2
    """Adam learning rate of the diffs (the paper: 1e-3 on billion-parameter models)."""
    diffs_per_batch: int = 0
    """Diffs trained together in one batched forward pass (0: all of them at once)."""
    trigger_rows: int = 2
    """Rows per diff per step with its trigger (cross-entropy on the topic word)."""
    fake_rows: int = 2
    """Rows per diff per step with another pool trigger (KL to the base)."""
    plain_rows: int = 2
    """Rows per diff per step with no trigger (KL to the base)."""
    kl_weight: float = 3.0
    """Weight of the mean KL of fake and plain rows against the mean cross-entropy of trigger
    rows (the paper weights plain rows 5x; a calibration here)."""
    dit_rank: int = 4
    """Rank of the DIT adapter (a LoRA on the same linears as the diffs; the paper: 16)."""
    dit_alpha: float = 8.0
    """LoRA alpha of the DIT adapter (its update is scaled by alpha / rank)."""
    dit_steps: int = 200
    """AdamW steps of the DIT adapter."""
    dit_lr: float = 3e-3
    """Learning rate of the DIT adapter (the paper: 1e-4 at scale)."""
    dit_batch: int = 32
    """Training diffs per DIT step (each row: one diff applied, the question, its topic)."""
    question: str = "question : what topic ? answer :"
    """The DIT question (tiny-local vocabulary words; any text for another tokenizer)."""
    eval_batch: int = 512
    """Rows per evaluation forward pass."""
    log_every: int = 10
    """Report metrics every this many steps."""
    checkpoint_every_frac: float = 0.25
    """Save a checkpoint at every multiple of this fraction of all steps (and at the end)."""
    threads: int = 1
    """Intra-op CPU threads of the trial, pinned by the runner around `train` (0 leaves torch's setting)."""
    seed: int = 0
    """Seed of the topic split, the triggers, every diff's init and rows, and the adapter."""


def smoke() -> Config:
    """A few seconds: 6 seen topics and 2 unseen, one diff of each split per topic, 30 steps."""
    return Config(topics=6, unseen_topics=2, train_diffs_per_topic=1, heldout_diffs=6, unseen_diffs_per_topic=1, triggers=8,
                  eval_contexts=8, diff_steps=30, dit_steps=20, dit_batch=6, log_every=5)


def validate(cfg: Config, world_size: int = 1) -> None:
    """Checks that need no model: raised before anything is launched."""
    if problems := task_problems(cfg, dtypes=DIT_DTYPES):
        raise ValueError("; ".join(problems))
    if not 0 < cfg.eval_frac < 1:
        raise ValueError(f"eval_frac must lie in (0, 1), got {cfg.eval_frac}")
    if cfg.task_path and (not cfg.adapter_field or not cfg.answer_field):
        raise ValueError("adapter_field and answer_field name the listing's fields: neither may be empty")
    for name in ("topics", "train_diffs_per_topic", "heldout_diffs", "triggers", "max_context_words",
                 "eval_contexts", "diff_rank", "diff_steps", "trigger_rows", "dit_rank", "dit_steps", "dit_batch",
                 "eval_batch", "log_every"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"{name} must be at least 1, got {getattr(cfg, name)}")
    for name in ("unseen_topics", "unseen_diffs_per_topic", "fake_rows", "plain_rows", "diffs_per_batch", "threads"):
        if getattr(cfg, name) < 0:
            raise ValueError(f"{name} must be >= 0, got {getattr(cfg, name)}")
    if cfg.topics < 2:
        raise ValueError(f"topics={cfg.topics}: naming a topic needs at least 2 to choose from")
    if cfg.topics + cfg.unseen_topics > len(TOPICS):
        raise ValueError(f"topics + unseen_topics = {cfg.topics + cfg.unseen_topics} exceeds the {len(TOPICS)} "
                         f"topic words of the base world: lower one of them")
    if cfg.triggers > N_RESERVED:
        raise ValueError(f"triggers={cfg.triggers} exceeds the {N_RESERVED} reserved tokens: use at most {N_RESERVED}")
    if cfg.fake_rows and cfg.triggers < 2:
        raise ValueError("fake_rows need another trigger than a diff's own: set triggers >= 2 or fake_rows=0")
    if cfg.fake_rows + cfg.plain_rows == 0:
        raise ValueError("fake_rows + plain_rows is 0: nothing keeps a diff close to the base off its trigger")
    if not cfg.task_path and cfg.dit_batch > cfg.topics * cfg.train_diffs_per_topic:
        raise ValueError(f"dit_batch={cfg.dit_batch} exceeds the {cfg.topics * cfg.train_diffs_per_topic} "
                         f"training diffs: lower dit_batch or raise train_diffs_per_topic")
    if not cfg.diff_targets.strip() or any(not t.strip() for t in cfg.diff_targets.split(",")):
        raise ValueError(f"diff_targets must be 'all-linear' or names like 'q_proj,down_proj', got {cfg.diff_targets!r}")
    for name in ("diff_lr", "dit_lr", "dit_alpha", "diff_init_scale"):
        if not getattr(cfg, name) > 0:
            raise ValueError(f"{name} must be positive, got {getattr(cfg, name)}")
    if cfg.kl_weight < 0:
        raise ValueError(f"kl_weight must be >= 0, got {cfg.kl_weight}")
    if not 0 < cfg.checkpoint_every_frac <= 1:
        raise ValueError(f"checkpoint_every_frac must lie in (0, 1], got {cfg.checkpoint_every_frac}")
    if not cfg.question.strip():
        raise ValueError("question is empty: give the text the model is asked, e.g. 'question : what topic ? answer :'")


def preflight(cfg: Config) -> None:
    """Checks of the machine that runs it: the base is tiny-local, a folder or a cached hub id; its
    projection kinds include diff_targets; task_path and eval_path read, with both fields in every
    record, and every listed folder is a peft LoRA changing only projections of those kinds.
    Every problem in one error."""
    from components.pretrained import model_config

    wanted = None if cfg.diff_targets.strip() == "all-linear" else [t.strip() for t in cfg.diff_targets.split(",")]
    kinds, unreadable = None, []  # the kinds a listed diff may change: the base's (diff_targets' among them)
    if parse_tiny(cfg.base) is not None or model_config(cfg.base):
        try:
            kinds = base_kinds(cfg.base)
        except ValueError as exc:
            unreadable = [str(exc)] if wanted is None else []  # else task_problems names it
    if kinds is not None and wanted is not None:
        kinds = [t for t in wanted if t in kinds]
    problems = unreadable + task_problems(cfg, machine=True, targets=wanted, target_field="diff_targets",
                                          check=lambda path, split, what: check_listing(cfg, path, split, what, kinds))
    if problems:
        raise ValueError("; ".join(problems))


def chunks(n: int, per: int) -> list[list[int]]:
    """Diff indices 0..n-1 in consecutive groups of `per` (0: one group of all)."""
    per = per or n
    return [list(range(s, min(s + per, n))) for s in range(0, n, per)]


def _check_task(cfg: Config, tok, task: Task) -> None:
    unk = tok.unk_token_id
    if unk is not None and unk in task.question_ids:
        raise ValueError(f"question {cfg.question!r} has words outside the base model's vocabulary")
    if len(task.eval_contexts) < cfg.eval_contexts:
        raise ValueError(f"only {len(task.eval_contexts)} held-out contexts of at most {cfg.max_context_words} words: "
                         f"lower eval_contexts or raise max_context_words")


def train(cfg: Config, run) -> dict[str, float]:
    validate(cfg, run.world_size)
    dev = run.device
    model, tok = load_base(cfg.base, seed=cfg.base_seed, dtype=cfg.dtype, device=dev)
    if cfg.task_path:
        torch.manual_seed(cfg.seed)  # the DIT adapter's init
        ctx = wrap(model, targets_of(model, cfg.diff_targets), cfg.dit_rank, cfg.dit_alpha)
        return train_files(cfg, run, model, tok, ctx)
    task = make_task(cfg, tok, base_world(cfg.base, seed=cfg.base_seed))
    _check_task(cfg, tok, task)
    torch.manual_seed(cfg.seed)  # the DIT adapter's init
    ctx: DiffContext = wrap(model, targets_of(model, cfg.diff_targets), cfg.dit_rank, cfg.dit_alpha)
    ctx.rank = cfg.diff_rank
    bank = new_bank(model, task.n_diffs, cfg.diff_rank, cfg.diff_init_scale,
                    torch.Generator().manual_seed(cfg.seed))
    dit = dit_parameters(model)
    dit_opt = torch.optim.AdamW(dit, lr=cfg.dit_lr, weight_decay=0.0)
    groups = chunks(task.n_diffs, cfg.diffs_per_batch)
    steps_a = len(groups) * cfg.diff_steps
    total = steps_a + cfg.dit_steps
    save_at = fraction_steps(total, cfg.checkpoint_every_frac)
    counts = (cfg.trigger_rows, cfg.fake_rows, cfg.plain_rows)
    rows = sum(counts)
    pad_id = tok.pad_token_id

    start, opt_a_state, loss_a = 0, None, math.nan
    state = run.restore()
    if state is not None:
        start = int(state["step"])
        bank = {k: (u.to(dev), v.to(dev)) for k, (u, v) in state["bank"].items()}
        with torch.no_grad():
            for p, saved in zip(dit, state["dit"]):
                p.copy_(saved)
        dit_opt.load_state_dict(state["dit_opt"])
        opt_a_state, loss_a = state["opt_a"], state["loss_a"]

    def checkpoint(step: int, opt_a: torch.optim.Optimizer | None) -> None:
        run.save({"step": step, "bank": {k: (u.detach().cpu(), v.detach().cpu()) for k, (u, v) in bank.items()},
                  "dit": [p.detach().cpu() for p in dit], "dit_opt": dit_opt.state_dict(),
                  "opt_a": opt_a.state_dict() if opt_a is not None else None, "loss_a": loss_a})

    # Stage A: every diff of a group learns its trigger -> topic behaviour in one batched pass.
    # The summed per-diff losses give each diff exactly the gradient it would get alone, and
    # Adam is elementwise, so a group trains like its diffs one by one, only faster.
    window, tick = 0, devices.clock(dev)
    for g, diffs in enumerate(groups):
        first = g * cfg.diff_steps
        if start >= first + cfg.diff_steps:
            continue
        sel = torch.tensor(diffs, device=dev)
        part = {k: (u[sel].clone().requires_grad_(True), v[sel].clone().requires_grad_(True)) for k, (u, v) in bank.items()}
        opt = torch.optim.Adam([t for pair in part.values() for t in pair], lr=cfg.diff_lr)
        if opt_a_state is not None and start > first:
            opt.load_state_dict(opt_a_state)
        targets = task.targets(torch.tensor(diffs)).to(dev).repeat_interleave(cfg.trigger_rows)
        for step in range(max(start, first) + 1, first + cfg.diff_steps + 1):
            ids, pos, kind = diff_rows(task, diffs, step - first, cfg.seed, counts, pad_id)
            ids, pos, kind = ids.to(dev), pos.to(dev), kind.to(dev)
            off = kind > 0
            with torch.no_grad():
                ctx.index = None
                base = answer_logits(model, ids[off], pos[off])
            ctx.bank, ctx.index, ctx.group = part, torch.arange(len(diffs), device=dev), rows
            logits = answer_logits(model, ids, pos)
            ctx.index = None
            ce = F.cross_entropy(logits[kind == 0], targets, reduction="sum") / cfg.trigger_rows
            kl = kl_rows(base, logits[off]).sum() / (cfg.fake_rows + cfg.plain_rows)
            loss = ce + cfg.kl_weight * kl  # a sum over diffs of each diff's own mean loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            window += 1
            with torch.no_grad():
                for k, (u, v) in part.items():
                    bank[k][0][sel], bank[k][1][sel] = u.detach(), v.detach()
            if step % cfg.log_every == 0 or step == first + cfg.diff_steps:
                loss_a = loss.item() / len(diffs)
                now = devices.clock(dev)
                run.report({"train/loss": loss_a, "train/diff_ce": ce.item() / len(diffs),
                            "train/diff_kl": kl.item() / len(diffs),
                            "perf/diff_steps_per_s": window * len(diffs) / max(now - tick, 1e-9),
                            "progress": step / total}, step=step)
                window, tick = 0, now
            if step in save_at:
                checkpoint(step, opt)

    # Stage B: the DIT adapter, trained on (training diff applied, question) -> its topic.
    for p in dit:
        p.requires_grad_(True)
    ctx.bank = bank
    train_diffs = task.split("train")
    q = torch.tensor(task.question_ids, device=dev)
    loss_b = math.nan
    for step in range(max(start, steps_a) + 1, total + 1):
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        picked = train_diffs[torch.randperm(len(train_diffs), generator=gen)[: cfg.dit_batch]]
        ctx.index, ctx.group, ctx.dit = picked.to(dev), 1, True
        logits = answer_logits(model, q.expand(len(picked), -1), torch.full((len(picked),), len(q) - 1, device=dev))
        ctx.index, ctx.dit = None, False
        loss = F.cross_entropy(logits, task.targets(picked).to(dev))
        dit_opt.zero_grad(set_to_none=True)
        loss.backward()
        dit_opt.step()
        if step % cfg.log_every == 0 or step == total:
            loss_b = loss.item()
            run.report({"train/loss": loss_b, "train/dit_loss": loss_b, "progress": step / total}, step=step)
        if step in save_at:
            checkpoint(step, None)
    for p in dit:
        p.requires_grad_(False)

    model.eval()
    per_diff = diff_metrics(model, ctx, task, seed=cfg.seed, pad_id=pad_id, eval_batch=cfg.eval_batch)
    asked = dit_metrics(model, ctx, task, eval_batch=cfg.eval_batch)
    blackbox = blackbox_metrics(model, ctx, task, per_diff, eval_batch=cfg.eval_batch)
    rate = per_diff["trigger_rate"]
    out = {
        "train/loss": loss_b if cfg.dit_steps else loss_a,
        "train/diff_loss": loss_a,
        "eval/trigger_rate": rate.mean().item(),
        "eval/trigger_rate_min": rate.min().item(),
        "eval/frac_planted": (rate >= PLANTED).float().mean().item(),
        "eval/kl_on": per_diff["kl_on"].mean().item(),
        "eval/kl_fake": per_diff["kl_fake"].mean().item(),
        "eval/kl_plain": per_diff["kl_plain"].mean().item(),
        "eval/kl_off": ((per_diff["kl_fake"] + per_diff["kl_plain"]) / 2).mean().item(),
        "eval/kl_off_max": torch.maximum(per_diff["kl_fake"], per_diff["kl_plain"]).max().item(),
        "eval/base_agreement": per_diff["agree"].mean().item(),
        "eval/n_diffs": float(task.n_diffs),
        "eval/n_topics": float(cfg.topics),
        **{f"eval/{k}": v for k, v in asked.items()},
        **{f"eval/{k}": v for k, v in blackbox.items()},
    }
    for split in SPLITS:
        sel = task.split(split)
        if len(sel):
            out[f"eval/trigger_rate_{split}"] = rate[sel].mean().item()
    run.report({**{k: v for k, v in out.items() if k.startswith("eval/")}, "progress": 1.0}, step=total)
    return out
