"""palc: Config, the preference-training loop and the evaluation (see the package docstring)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Literal

import torch

from components.basemodel import (
    PromptField, base_world, check_records, load_base, lora, read_records, select, task_problems, with_task_fields,
)
from orchestrator.run import devices
from workloads.palc.baselines import args_decode, best_of_n, fit_reward, pooled_features, reward_accuracy
from workloads.palc.data import (
    Pair, file_fields, generation_prompts, gentle_share, make_pairs, pair_batch, pairs_from_records, split_entities,
)
from workloads.palc.model import (
    Calibrator, arm_latency, base_forward, dpo_loss, freeze, generate, group_by_length, latency, logprob_sums, margins,
    mean_logprob, param_digest, preference_loss,
)


MAX_WORKERS = 1
"""palc trains a small calibrator on one worker: the runner refuses more."""


@dataclass(frozen=True)
class Config(with_task_fields(PromptField)):
    """palc's settings after the task-file fields (`components.basemodel.taskfields`): the base stays frozen
    in `dtype`, the calibrator and DPO's LoRA adapter are float32; task_path's records are preference pairs
    (prompt_field, `chosen_field`, `rejected_field`; task_path '': the synthetic gentle-vs-blunt pairs of
    tiny-local's world)."""

    method: Literal["palc", "dpo"] = "palc"
    """'palc': the calibrator on the frozen base; 'dpo': the DPO baseline, a LoRA policy on the same
    base whose reference is the base itself (the adapter disabled: one model in memory)."""
    chosen_field: str = "chosen"
    """The preferred response's field: a string or a chat message list (its last message's content). With
    prompt_field "" chosen and rejected are whole dialogues (HH-RLHF as Anthropic publishes it): the prompt
    is then split off each after its last '\\n\\nAssistant:'."""
    rejected_field: str = "rejected"
    """The dispreferred response's field, the same forms."""
    max_len: int = 1024
    """Most tokens of a prompt-response row (the released code's 1024): the prompt keeps its end, the response its start."""
    micro_batch: int = 0
    """Pairs per forward pass, gradients accumulated over the batch (0: the whole batch at once)."""
    dpo_beta: float = 0.1
    """DPO's beta (the DPO paper's 0.1)."""
    dpo_targets: str = "all-linear"
    """DPO's LoRA targets: 'all-linear' or comma-separated projection kinds of the base (Llama:
    q_proj,v_proj; GPT-2: c_attn; `components.basemodel.base_kinds` lists a model's)."""
    lora_r: int = 8
    """DPO's LoRA rank."""
    lora_alpha: float = 16.0
    """DPO's LoRA alpha."""
    bottleneck: int = 256
    """B, the calibrator's width: W_down in R^{B x H}, W_up in R^{V x B} (the paper's 256)."""
    relu: bool = True
    """ReLU between W_down and W_up, as the paper's equations have it (its released code has none)."""
    dropout: float = 0.1
    """Dropout on the hidden state during training (the released code's 0.1)."""
    up_init_std: float = 0.01
    """Std of W_up's normal init (the released code's); W_down is Kaiming-normal."""
    gamma_train: float = 1.0
    """gamma during training (l' = l + gamma m)."""
    gamma_eval: float = 1.0
    """gamma of the reported preference accuracy (the paper's 1.0; the released README uses 5.0)."""
    gammas: tuple[float, ...] = (-1.0, 0.0, 0.5, 1.0, 2.0)
    """gamma grid of the evaluation: accuracy and the preferred-word share of generations at each."""
    train_pairs: int = 4000
    """Synthetic preference pairs about the training entities; with a task file, at most this many
    of its pairs (a seeded draw; 0: all)."""
    heldout_pairs: int = 500
    """Held-out pairs for the preference accuracy: about held-out entities, or from the task file
    (the first ones of eval_path, else a seeded draw of task_path kept out of training)."""
    heldout_entities: int = 12
    """Entities (of the world's 48) whose pairs and prompts are never trained on."""
    context_prob: float = 0.5
    """Probability that a prompt starts with a pre-training sentence about its entity."""
    steps: int = 1000
    """Optimiser steps."""
    batch: int = 16
    """Pairs per step."""
    lr: float = 1e-4
    """AdamW peak learning rate (the paper's 1e-5 is for a 7B base and 160k pairs)."""
    weight_decay: float = 0.01
    """AdamW weight decay (the released code's)."""
    warmup_steps: int = 100
    """Linear warm-up steps, then cosine decay to 0."""
    clip: float = 1.0
    """Gradient-norm clip."""
    autocast: str = "fp32"
    """'fp32', or 'bf16': the training forward passes under CUDA autocast to bfloat16, as the
    released code trains (bf16); GPU runs only."""
    gen_new_tokens: int = 8
    """Tokens generated per prompt when counting preferred words."""
    gen_samples: int = 4
    """Sampled generations per prompt (temperature 1, the same random stream at every gamma), besides the greedy one."""
    latency_reps: int = 21
    """Repetitions of the latency measurement, each timing base and PALC back to back (median of the ratios)."""
    latency_new_tokens: int = 8
    """Tokens decoded per latency repetition."""
    latency_clock: Literal["wall", "cpu"] = "wall"
    """'wall': elapsed time (synchronised on CUDA); 'cpu': this thread's CPU time, which other
    processes on a shared CPU machine do not inflate (meaningful with threads=1 on CPU only)."""
    baselines: bool = True
    """Also run the test-time alignment baselines on the same base, pairs and held-out prompts
    (`workloads.palc.baselines`: a Bradley-Terry reward head, best-of-N, ARGS); PALC trials on the
    synthetic world only (a task file has no gentle words to count)."""
    rm_pool: Literal["last", "mean"] = "last"
    """The reward head reads the last hidden state at the response's last token ('last', the usual
    reward-model head) or its mean over the response's tokens ('mean'). On tiny-local the mean-pooled
    head, fitted on pairs that differ only in trait words, gave best-of-N no lift over the base's
    samples at a trial seed outside those judged or calibrated (200); 'last' did."""
    rm_steps: int = 300
    """Full-batch AdamW steps of the reward head's Bradley-Terry fit."""
    rm_lr: float = 0.05
    """The reward head's learning rate."""
    rm_weight_decay: float = 0.01
    """The reward head's weight decay."""
    dpo_head: bool = True
    """With the baselines, also train DPO on a calibrator-shaped head (`train_dpo_head`), reported beside
    them and not judged."""
    bon_n: int = 16
    """Best-of-N's samples per prompt."""
    args_k: int = 10
    """ARGS's candidates per step (the ARGS paper's k = 10 on HH-RLHF)."""
    args_w: float = 1.5
    """ARGS's reward weight (the ARGS paper's w = 1.5 on HH-RLHF)."""
    baseline_latency_reps: int = 7
    """Repetitions of the baselines' latency measurement (base, PALC, best-of-N, ARGS in rotating order)."""
    log_every: int = 50
    """Report training metrics every this many steps."""
    checkpoint_every: int = 250
    """Save a checkpoint every this many steps (and at the end)."""
    threads: int = 1
    """Intra-op CPU threads of the trial, pinned by the runner around `train` (0 leaves torch's setting)."""
    seed: int = 0
    """Seed of the entity split, the pairs, the calibrator's init and the batches."""


def smoke() -> Config:
    """A CPU-sized run on tiny-local: B = 16, 150 steps of 16 pairs, a few seconds. Latency is read
    on this thread's CPU clock: on a shared CPU machine, elapsed time mostly measures the others."""
    return Config(bottleneck=16, train_pairs=2000, heldout_pairs=400, steps=150, lr=3e-3, warmup_steps=15,
                  log_every=25, checkpoint_every=50, latency_clock="cpu")


def validate(cfg: Config, world_size: int = 1) -> None:
    """Checks that need no model: raised before anything is launched."""
    if problems := task_problems(cfg):
        raise ValueError("; ".join(problems))
    if cfg.method not in ("palc", "dpo"):
        raise ValueError(f"method={cfg.method!r}: choose 'palc' or 'dpo'")
    if not cfg.task_path and cfg.train_pairs <= 0:
        raise ValueError(f"train_pairs must be positive, got {cfg.train_pairs}")
    if cfg.train_pairs < 0 or cfg.micro_batch < 0 or not (cfg.max_len == 0 or cfg.max_len >= 2):
        raise ValueError("train_pairs and micro_batch must be >= 0 and max_len 0 (no limit) or at least 2")
    if not cfg.chosen_field or not cfg.rejected_field:
        raise ValueError("chosen_field and rejected_field must name fields")
    if cfg.baselines and (cfg.bon_n < 1 or cfg.args_k < 1 or cfg.rm_steps < 1 or cfg.baseline_latency_reps < 1):
        raise ValueError("bon_n, args_k, rm_steps and baseline_latency_reps must be at least 1")
    if cfg.rm_pool not in ("last", "mean"):
        raise ValueError(f"rm_pool={cfg.rm_pool!r}: choose 'last' or 'mean'")
    if not cfg.dpo_beta > 0 or cfg.lora_r <= 0 or not dpo_targets(cfg):
        raise ValueError("dpo_beta and lora_r must be positive and dpo_targets name at least one kind")
    for name in ("bottleneck", "heldout_pairs", "heldout_entities", "steps", "batch", "gen_new_tokens",
                 "latency_reps", "latency_new_tokens", "log_every", "checkpoint_every"):
        if getattr(cfg, name) <= 0:
            raise ValueError(f"{name} must be positive, got {getattr(cfg, name)}")
    if cfg.heldout_entities >= 48:
        raise ValueError(f"heldout_entities={cfg.heldout_entities} leaves no training entity of the world's 48: use at most 40")
    if not 0 <= cfg.dropout < 1 or not 0 <= cfg.context_prob <= 1:
        raise ValueError(f"dropout must lie in [0, 1) and context_prob in [0, 1], got {cfg.dropout}, {cfg.context_prob}")
    if not cfg.lr > 0 or cfg.weight_decay < 0 or not cfg.clip > 0 or cfg.warmup_steps < 0:
        raise ValueError("lr and clip must be positive, weight_decay and warmup_steps non-negative")
    if cfg.gen_samples < 0 or cfg.threads < 0:
        raise ValueError("gen_samples and threads must be >= 0")
    if 0.0 not in cfg.gammas or cfg.gamma_eval not in cfg.gammas:
        raise ValueError(f"gammas {cfg.gammas} must contain 0 (the base) and gamma_eval={cfg.gamma_eval}: add them")
    if list(cfg.gammas) != sorted(set(cfg.gammas)):
        raise ValueError(f"gammas must be strictly increasing, got {cfg.gammas}")
    if cfg.latency_clock not in ("wall", "cpu"):
        raise ValueError("latency_clock must be 'wall' or 'cpu'")


def dpo_targets(cfg: Config) -> list[str] | str:
    """dpo_targets as `lora` takes it: 'all-linear' or a list of kinds."""
    if cfg.dpo_targets.strip() == "all-linear":
        return "all-linear"
    return [t.strip() for t in cfg.dpo_targets.split(",") if t.strip()]


def preflight(cfg: Config) -> None:
    """Checks of the machine that runs it, before any Ray work: the base is tiny-local, a folder or
    a cached hub id; DPO's targets are projection kinds of that base; the task files read with
    their fields. Every problem in one error."""
    fields = file_fields(cfg.prompt_field, cfg.chosen_field, cfg.rejected_field)
    problems = task_problems(cfg, machine=True, targets=dpo_targets(cfg) if cfg.method == "dpo" else None,
                             target_field="dpo_targets",
                             check=lambda path, split, what: check_records(path, fields, split=split, what=what))
    if problems:
        raise ValueError("; ".join(problems))


def task_pairs(cfg: Config) -> tuple[list[Pair], list[Pair], list[str] | None, int]:
    """(training pairs, held-out pairs, held-out entities or None for a task file, skipped records)."""
    if not cfg.task_path:
        world = base_world(cfg.base, seed=cfg.base_seed)
        train_ents, held_ents = split_entities(world, cfg.heldout_entities, cfg.seed)
        pairs = make_pairs(world, train_ents, cfg.train_pairs, f"{cfg.seed}-train", cfg.context_prob)
        held = make_pairs(world, held_ents, cfg.heldout_pairs, f"{cfg.seed}-heldout", cfg.context_prob)
        return pairs, held, held_ents, 0
    fields = file_fields(cfg.prompt_field, cfg.chosen_field, cfg.rejected_field)
    names = dict(prompt_field=cfg.prompt_field, chosen_field=cfg.chosen_field, rejected_field=cfg.rejected_field)
    records = read_records(cfg.task_path, fields, split=cfg.task_split, what="task_path")
    pairs, skipped = pairs_from_records(records, what=f"task_path={cfg.task_path!r}", **names)
    order = list(range(len(pairs)))
    random.Random(f"palc-file-{cfg.seed}").shuffle(order)
    if cfg.eval_path:
        records = read_records(cfg.eval_path, fields, split=cfg.eval_split, what="eval_path")
        held, more = pairs_from_records(records, what=f"eval_path={cfg.eval_path!r}", **names)
        held, skipped = held[: cfg.heldout_pairs], skipped + more
    else:
        if len(pairs) <= cfg.heldout_pairs:
            raise ValueError(f"task_path={cfg.task_path!r} has {len(pairs)} usable pairs: heldout_pairs={cfg.heldout_pairs} "
                             f"leaves none to train on; lower it or give an eval_path")
        held, order = [pairs[i] for i in order[: cfg.heldout_pairs]], order[cfg.heldout_pairs:]
    if not held:
        raise ValueError(f"eval_path={cfg.eval_path!r} gave no usable pairs")
    train_set = [pairs[i] for i in (order[: cfg.train_pairs] if cfg.train_pairs else order)]
    return train_set, held, None, skipped


def chunks(items: list, size: int) -> list[list]:
    """`items` in consecutive pieces of `size` (0: one piece)."""
    size = size or len(items)
    return [items[i: i + size] for i in range(0, len(items), size)]


def gamma_key(g: float) -> str:
    """Metric-name suffix of a gamma value: `gamma_0.5`, `gamma_-1`."""
    return f"gamma_{g:g}"


def lr_at(cfg: Config, step: int) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    frac = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * 0.5 * (1 + math.cos(math.pi * frac))


def train(cfg: Config, run) -> dict[str, float]:
    validate(cfg, run.world_size)
    dev = run.device
    pairs, held, held_ents, skipped = task_pairs(cfg)
    base, tok = load_base(cfg.base, seed=cfg.base_seed, device=dev, dtype=None if cfg.dtype == "auto" else cfg.dtype)
    freeze(base)
    vocab, hidden = base.get_output_embeddings().weight.shape
    torch.manual_seed(cfg.seed)
    if cfg.method == "palc":
        model = cal = Calibrator(hidden, vocab, cfg.bottleneck, relu=cfg.relu, dropout=cfg.dropout,
                                 up_init_std=cfg.up_init_std).to(dev)
        expected = cfg.bottleneck * (hidden + vocab)
    else:
        # peft wraps the base in place: the policy is base + adapter, the reference the same
        # model with the adapter disabled, so one copy of the weights serves both.
        expected = sum(cfg.lora_r * (p.in_features + p.out_features) for p in select(base, dpo_targets(cfg)).values())
        model = lora(base, dpo_targets(cfg), r=cfg.lora_r, alpha=cfg.lora_alpha)
        model.eval()  # the base's own dropout off; LoRA's dropout is 0
        cal = None
    trainable = [p for p in model.parameters() if p.requires_grad]
    exclude = "lora_" if cfg.method == "dpo" else ""
    digest = param_digest(base, exclude)
    opt = torch.optim.AdamW(trainable, lr=cfg.lr, weight_decay=cfg.weight_decay)

    def weights() -> dict[str, torch.Tensor]:
        return cal.state_dict() if cal is not None else {k: v for k, v in model.state_dict().items() if "lora_" in k}

    start = 0
    state = run.restore()
    if state is not None:
        if cal is not None:
            cal.load_state_dict(state["calibrator"])
        else:
            model.load_state_dict(state["adapter"], strict=False)
        opt.load_state_dict(state["optimizer"])
        if "rng" in state:  # the dropout masks' generator: a resumed run draws the masks it would have
            torch.set_rng_state(state["rng"])
        start = int(state["step"])

    def to_dev(b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: v.to(dev) for k, v in b.items()}

    def pair_loss(batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss, mean response log-probability of each row under the model being trained), the
        forward passes under `cfg.autocast`."""
        with devices.autocast(dev, cfg.autocast):
            if cal is not None:
                logits, h = base_forward(base, batch["ids"], batch["attn"])  # frozen, no graph
                lp = mean_logprob(logits + cfg.gamma_train * cal(h), batch["ids"], batch["resp"])
                return preference_loss(lp), lp
            with torch.no_grad(), model.disable_adapter():
                ref, _ = row_sums(model, batch)
            pol, count = row_sums(model, batch)
            return dpo_loss(pol, ref, cfg.dpo_beta), pol.detach() / count

    loss_v, acc_v, window_t, window_n = math.nan, math.nan, devices.clock(dev), 0
    if cal is not None:
        cal.train()  # its dropout; DPO's model stays in eval mode (see above)
    for step in range(start, cfg.steps):
        # The batch is a function of (seed, step), so a resumed run sees the batches it would have.
        g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        chosen = [pairs[i] for i in torch.randint(len(pairs), (cfg.batch,), generator=g).tolist()]
        for group in opt.param_groups:
            group["lr"] = lr_at(cfg, step)
        opt.zero_grad(set_to_none=True)
        pieces = chunks(chosen, cfg.micro_batch)
        if len(pieces) == 1:
            loss, lp = pair_loss(to_dev(pair_batch(tok, chosen, cfg.max_len)))
            loss.backward()
            won = lp[: cfg.batch] > lp[cfg.batch:]
        else:  # gradient accumulation: each piece's mean loss weighted by its share of the batch
            loss, won = torch.zeros(()), []
            for piece in pieces:
                part, lp = pair_loss(to_dev(pair_batch(tok, piece, cfg.max_len)))
                (part * (len(piece) / cfg.batch)).backward()
                loss = loss + part.detach().cpu() * (len(piece) / cfg.batch)
                won.append((lp[: len(piece)] > lp[len(piece):]).cpu())
            won = torch.cat(won)
        torch.nn.utils.clip_grad_norm_(trainable, cfg.clip)
        opt.step()
        window_n += 1
        done = step + 1
        if done % cfg.log_every == 0 or done == cfg.steps:
            loss_v, acc_v = loss.item(), float(won.float().mean())
            now = devices.clock(dev)
            run.report({"train/loss": loss_v, "train/pref_acc": acc_v, "train/lr": lr_at(cfg, step),
                        "perf/steps_per_s": window_n / max(now - window_t, 1e-9), "progress": done / cfg.steps}, step=done)
            window_t, window_n = now, 0
        if done % cfg.checkpoint_every == 0 or done == cfg.steps:
            run.save({"step": done, ("calibrator" if cal is not None else "adapter"): weights(),
                      "optimizer": opt.state_dict(), "rng": torch.get_rng_state()})

    model.eval()
    if cal is not None:
        final = evaluate(cfg, base, tok, cal, held, held_ents, dev)
        if cfg.baselines and held_ents is not None:
            final.update(evaluate_baselines(cfg, base, tok, cal, pairs, held, held_ents, dev))
    else:
        final = evaluate_dpo(cfg, model, tok, held, dev)
    final["train/loss"], final["train/pref_acc"] = loss_v, acc_v
    base_params = [(n, p) for n, p in base.named_parameters() if not (exclude and exclude in n)]
    final["eval/base_unchanged"] = float(param_digest(base, exclude) == digest)
    final["eval/base_trainable_params"] = float(sum(p.numel() for _, p in base_params if p.requires_grad))
    final["eval/base_grads"] = float(sum(p.grad is not None for _, p in base_params))
    final["eval/trainable_params"] = float(sum(p.numel() for p in trainable))
    final["eval/expected_params"] = float(expected)
    final["eval/train_pairs"], final["eval/heldout_pairs"] = float(len(pairs)), float(len(held))
    final["eval/skipped_records"] = float(skipped)
    run.report({**{k: v for k, v in final.items() if k.startswith(("eval/", "perf/"))}, "progress": 1.0},
               step=cfg.steps)
    return final


@torch.no_grad()
def evaluate_baselines(cfg: Config, base: Any, tok: Any, cal: Calibrator, pairs: list[Pair], held: list[Pair],
                       held_ents: list[str], dev: torch.device) -> dict[str, float]:
    """The test-time baselines on the held-out generation prompts PALC's shares are counted on: the
    reward head fitted on PALC's training pairs (its accuracy on them and on the held-out pairs),
    the gentle-word share of best-of-N's and ARGS's responses, and their per-token latency over
    the base's (with PALC's again, measured in the same rotation)."""
    out: dict[str, float] = {}
    train_f = pooled_features(base, tok, pairs, cfg.max_len, dev, pool=cfg.rm_pool)
    head = fit_reward(train_f, cfg.rm_steps, cfg.rm_lr, cfg.rm_weight_decay, cfg.seed)
    out["eval/rm_train_acc"], out["eval/rm_train_margin"] = reward_accuracy(head, train_f)
    out["eval/rm_heldout_acc"], out["eval/rm_heldout_margin"] = reward_accuracy(
        head, pooled_features(base, tok, held, cfg.max_len, dev, pool=cfg.rm_pool))
    stop = tok(".", add_special_tokens=False).input_ids
    stop_id = stop[0] if len(stop) == 1 else None
    groups = [ids.to(dev) for ids in group_by_length(tok, generation_prompts(held_ents))]
    bon, args_, bon_samples = [], [], []
    for j, ids in enumerate(groups):
        gen = torch.Generator(device=dev).manual_seed(cfg.seed * 7919 + 104729 + j)
        chosen, samples, _ = best_of_n(base, head, ids, cfg.bon_n, cfg.gen_new_tokens, gen, stop_id, cfg.rm_pool)
        bon += tok.batch_decode(chosen, skip_special_tokens=True)
        bon_samples += tok.batch_decode(samples.reshape(-1, samples.shape[-1]), skip_special_tokens=True)
        args_ += tok.batch_decode(args_decode(base, head, ids, cfg.gen_new_tokens, cfg.args_k, cfg.args_w, cfg.rm_pool),
                                  skip_special_tokens=True)
    out["eval/share_bon"] = gentle_share(bon)
    out["eval/share_bon_samples"] = gentle_share(bon_samples)
    out["eval/share_args"] = gentle_share(args_)
    out["eval/gamma_eval"] = cfg.gamma_eval  # the gamma of PALC's share the headline compares with
    ids = groups[-1]
    gen = torch.Generator(device=dev)
    arms = {"base": lambda: generate(base, None, ids, cfg.latency_new_tokens),
            "palc": lambda: generate(base, cal, ids, cfg.latency_new_tokens, cfg.gamma_eval),
            "bon": lambda: best_of_n(base, head, ids, cfg.bon_n, cfg.latency_new_tokens, gen.manual_seed(0), stop_id,
                                     cfg.rm_pool),
            "args": lambda: args_decode(base, head, ids, cfg.latency_new_tokens, cfg.args_k, cfg.args_w,
                                        cfg.rm_pool)}
    lat = arm_latency(arms, cfg.latency_new_tokens, cfg.baseline_latency_reps, dev, cfg.latency_clock)
    for name in ("palc", "bon", "args"):
        out[f"perf/{name}_latency_ratio_rot"] = lat[f"{name}_ratio"]
    if cfg.dpo_head:  # last, so that its training draws change nothing measured above
        dpo = train_dpo_head(cfg, base, tok, pairs, dev)
        margin = torch.cat([margins(base, dpo, {k: v.to(dev) for k, v in pair_batch(tok, piece, cfg.max_len).items()},
                                    [1.0])[1.0] for piece in chunks(held, cfg.micro_batch or 256)])
        out["eval/pref_acc_dpo_head"] = float((margin > 0).float().mean())
        greedy = []
        for ids in groups:
            greedy += tok.batch_decode(generate(base, dpo, ids, cfg.gen_new_tokens, 1.0), skip_special_tokens=True)
        out["eval/share_dpo_head"] = gentle_share(greedy)
    return out


@torch.enable_grad()
def train_dpo_head(cfg: Config, base: Any, tok: Any, pairs: list[Pair], dev: torch.device) -> Calibrator:
    """The training-based reference, reported beside the test-time baselines and not judged: DPO
    (Rafailov et al. 2023, beta = dpo_beta) with the policy l + m(h), m a calibrator of PALC's shape
    and init on the frozen base, the reference the base itself; the same steps, batches, schedule and
    dropout as PALC's training. It differs from PALC only in the loss (DPO's summed log-ratio against
    the base, where PALC's is reference-free on mean log-probabilities). The paper's DPO tunes the
    whole model; the `method='dpo'` trials run a LoRA one."""
    vocab, hidden = base.get_output_embeddings().weight.shape
    torch.manual_seed(cfg.seed + 1)
    head = Calibrator(hidden, vocab, cfg.bottleneck, relu=cfg.relu, dropout=cfg.dropout,
                      up_init_std=cfg.up_init_std).to(dev)
    opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    head.train()
    for step in range(cfg.steps):
        g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        chosen = [pairs[i] for i in torch.randint(len(pairs), (cfg.batch,), generator=g).tolist()]
        for group in opt.param_groups:
            group["lr"] = lr_at(cfg, step)
        batch = {k: v.to(dev) for k, v in pair_batch(tok, chosen, cfg.max_len).items()}
        logits, h = base_forward(base, batch["ids"], batch["attn"])
        pol, _ = logprob_sums(logits + head(h), batch["ids"], batch["resp"])
        ref, _ = logprob_sums(logits, batch["ids"], batch["resp"])
        opt.zero_grad(set_to_none=True)
        dpo_loss(pol, ref, cfg.dpo_beta).backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), cfg.clip)
        opt.step()
    head.eval()
    return head


def row_sums(model: Any, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """`logprob_sums` of the batch's rows under `model` (as it is: adapter on or off)."""
    logits = model(input_ids=batch["ids"], attention_mask=batch["attn"]).logits.float()
    return logprob_sums(logits, batch["ids"], batch["resp"])


def _margins_of(sums: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean-log-probability margin, summed-log-probability margin) per pair, rows chosen then rejected."""
    n = sums.shape[0] // 2
    mean = sums / counts
    return mean[:n] - mean[n:], sums[:n] - sums[n:]


def _shared_metrics(out: dict[str, float], aligned: torch.Tensor, base: torch.Tensor, reward: torch.Tensor) -> None:
    """The held-out metrics both methods report: preference accuracy and mean margin (mean
    response log-probability, chosen minus rejected) of the aligned model and of the base, and the
    implicit reward's accuracy and margin (summed log-probability over the base's, chosen minus
    rejected; DPO's reward without beta)."""
    out["eval/pref_acc"] = float((aligned > 0).float().mean())
    out["eval/pref_acc_base"] = float((base > 0).float().mean())
    out["eval/margin"] = float(aligned.mean())
    out["eval/margin_base"] = float(base.mean())
    out["eval/reward_acc"] = float((reward > 0).float().mean())
    out["eval/reward_margin"] = float(reward.mean())


@torch.no_grad()
def evaluate_dpo(cfg: Config, model: Any, tok: Any, held: list[Pair], dev: torch.device) -> dict[str, float]:
    aligned, plain, reward = [], [], []
    for piece in chunks(held, cfg.micro_batch or 256):
        batch = {k: v.to(dev) for k, v in pair_batch(tok, piece, cfg.max_len).items()}
        pol = row_sums(model, batch)
        with model.disable_adapter():
            ref = row_sums(model, batch)
        (a, a_sum), (b, b_sum) = _margins_of(*pol), _margins_of(*ref)
        aligned.append(a)
        plain.append(b)
        reward.append(a_sum - b_sum)
    out: dict[str, float] = {}
    _shared_metrics(out, torch.cat(aligned), torch.cat(plain), torch.cat(reward))
    return out


def latency_prompts(tok: Any, held: list[Pair], max_len: int, n: int = 8) -> torch.Tensor:
    """Equal-length decoding prompts from a task file's held-out pairs: the first `n` prompts, each
    cut to the last tokens of the shortest (and of at most max_len / 2)."""
    rows = [tok(p.prompt).input_ids for p in held[:n]]
    width = min(min(len(r) for r in rows), max_len // 2 or 10**9)
    return torch.tensor([r[-width:] for r in rows])


@torch.no_grad()
def evaluate(cfg: Config, base: Any, tok: Any, cal: Calibrator, held: list, held_ents: list[str] | None,
             dev: torch.device) -> dict[str, float]:
    out: dict[str, float] = {}
    # Held-out preference accuracy at every gamma (gamma 0 is the base model).
    margin: dict[float, list[torch.Tensor]] = {g: [] for g in cfg.gammas}
    reward: list[torch.Tensor] = []
    gamma0_diff = 0.0
    for piece in chunks(held, cfg.micro_batch or 256):
        batch = {k: v.to(dev) for k, v in pair_batch(tok, piece, cfg.max_len).items()}
        for g, m in margins(base, cal, batch, list(cfg.gammas)).items():
            margin[g].append(m)
        logits, h = base_forward(base, batch["ids"], batch["attn"])
        plain = base(input_ids=batch["ids"], attention_mask=batch["attn"]).logits.float()
        gamma0_diff = max(gamma0_diff, float((logits + 0.0 * cal(h) - plain).abs().max()))
        aligned, _ = logprob_sums(logits + cfg.gamma_eval * cal(h), batch["ids"], batch["resp"])
        ref, _ = logprob_sums(logits, batch["ids"], batch["resp"])
        n = len(piece)
        reward.append((aligned[:n] - ref[:n]) - (aligned[n:] - ref[n:]))
    for g in cfg.gammas:
        m = torch.cat(margin[g])
        out[f"eval/pref_acc/{gamma_key(g)}"] = float((m > 0).float().mean())
        out[f"eval/margin/{gamma_key(g)}"] = float(m.mean())
    _shared_metrics(out, torch.cat(margin[cfg.gamma_eval]), torch.cat(margin[0.0]), torch.cat(reward))
    out["eval/gamma0_max_abs_logit_diff"] = gamma0_diff
    if held_ents is None:  # a task file: no gentle words to count; latency on its held-out prompts
        lat = latency(base, cal, latency_prompts(tok, held, cfg.max_len).to(dev), cfg.latency_new_tokens,
                      cfg.latency_reps, cfg.gamma_eval, cfg.latency_clock)
        out["perf/base_s_per_token"], out["perf/palc_s_per_token"], out["perf/latency_ratio"] = (
            lat["base_s"], lat["palc_s"], lat["ratio"])
        return out

    # Preferred-word share of greedy and sampled generations on held-out prompts, per gamma;
    # sampling reuses one random stream at every gamma, so the comparison across gamma is paired.
    groups = [ids.to(dev) for ids in group_by_length(tok, generation_prompts(held_ents))]
    for g in cfg.gammas:
        greedy, sampled = [], []
        for j, ids in enumerate(groups):
            greedy += tok.batch_decode(generate(base, cal, ids, cfg.gen_new_tokens, g), skip_special_tokens=True)
            if cfg.gen_samples:
                gen = torch.Generator(device=dev).manual_seed(cfg.seed * 7919 + j)
                rows = ids.repeat_interleave(cfg.gen_samples, 0)
                sampled += tok.batch_decode(generate(base, cal, rows, cfg.gen_new_tokens, g, generator=gen),
                                            skip_special_tokens=True)
        out[f"eval/share_greedy/{gamma_key(g)}"] = gentle_share(greedy)
        if cfg.gen_samples:
            out[f"eval/share_sampled/{gamma_key(g)}"] = gentle_share(sampled)

    lat = latency(base, cal, groups[-1], cfg.latency_new_tokens, cfg.latency_reps, cfg.gamma_eval, cfg.latency_clock)
    out["perf/base_s_per_token"] = lat["base_s"]
    out["perf/palc_s_per_token"] = lat["palc_s"]
    out["perf/latency_ratio"] = lat["ratio"]
    return out
