"""plop: Config, the NFN scoring pass, the placement and the parameter-matched LoRA loop (see the package docstring)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Literal

import torch

from components.basemodel import (
    LLAMA_LINEAR_TYPES, AnswerField, PromptField, base_kinds, base_world, check_records, load_base, lora, parse_tiny,
    task_problems, with_task_fields,
)
from orchestrator.run import devices
from workloads.plop.data import TASKS, answer_loss, encode, evaluate, file_split, fits, split
from workloads.plop.nfn import by_type, kendall_tau, module_kinds, score_modules, select
from workloads.plop.placement import PLACEMENTS, match_ranks, placement_types, type_costs


MAX_WORKERS = 1
"""plop fine-tunes on one worker: the runner refuses more."""


@dataclass(frozen=True)
class Config(with_task_fields(PromptField, AnswerField, dtype="float32")):
    """plop's settings after the task-file fields (`components.basemodel.taskfields`): NFN scores are computed
    in float32 whatever `dtype`; task_path is supervised fine-tuning data (MetaMathQA: 'query' -> 'response'),
    eval_path e.g. GSM8K's test split after it (its own fields: `eval_prompt_field`, `eval_answer_field`)."""

    task: Literal["attr_query", "fact_query", "sub_mod", "mul_mod"] = "mul_mod"
    """Built-in downstream task on tiny-local's world (workloads.plop.data): none of them is in the
    base's pre-training. Not read when `task_path` is set."""
    eval_prompt_field: str = ""
    """The prompt field of `eval_path`'s records ("" = `prompt_field`)."""
    eval_answer_field: str = ""
    """The answer field of `eval_path`'s records ("" = `answer_field`)."""
    task_limit: int = 0
    """Training records drawn (by the seed) from a task file; 0 keeps them all."""
    eval_limit: int = 0
    """Held-out records drawn (by the seed) from a task file's held-out set; 0 keeps them all."""
    max_tokens: int = 0
    """File tasks: records whose `prompt answer` is longer than this many tokens are left out of
    training and evaluation (0 keeps every record)."""
    modulus: int = 11
    """p of the arithmetic tasks (sub_mod, mul_mod)."""
    heldout_frac: float = 0.25
    """Fraction of the task's groups (entities, keys, pairs; a task file's records) held out of
    fine-tuning."""
    placement: Literal["plop", "plop_inverse", "attention", "mlp", "all"] = "plop"
    """Where LoRA goes: PLoP's lowest-NFN kinds, the highest (PLoP^-1), attention-only, MLP-only or
    every projection kind ('all')."""
    attention_kinds: tuple[str, ...] = ()
    """The projection kinds of the attention-only arm; () = every projection in a module named
    like attn/attention (Llama: q/k/v/o_proj; GPT-2: c_attn, attn.c_proj)."""
    mlp_kinds: tuple[str, ...] = ()
    """The projection kinds of the MLP-only arm; () = every projection in a module named like
    mlp/ffn (Llama: gate/up/down_proj; GPT-2: c_fc, mlp.c_proj)."""
    matched: tuple[str, ...] = ("plop", "attention", "mlp")
    """Placements whose trainable-parameter counts are made equal (a sweep comparing them keeps
    this fixed; `placement` must be one of them)."""
    n_types: int = 3
    """Module types PLoP chooses (the paper's default: 3)."""
    nfn_samples: int = 32
    """Task examples per NFN sample; two disjoint samples of the training split are scored (the
    first decides the placement, the second checks its stability). The paper finds >= 64 stable;
    the smallest task here (fact_query) has 72 training examples, so two samples of 32."""
    nfn_inputs: Literal["text", "prompt"] = "text"
    """What the scoring pass reads: the whole fine-tuning text ('text', prompt and answer) or the
    prompts only. The notes leave this open (the reference scores its dataset's inputs)."""
    nfn_batch: int = 64
    """Examples per forward pass of the scoring (NFN is averaged over batches, as in the paper)."""
    eval_batch: int = 256
    """Examples per forward pass of the held-out evaluation."""
    nfn_control: bool = True
    """Also score a freshly initialised model of the same architecture (the control: NFN ~ 1)."""
    rank: int = 4
    """Nominal LoRA rank: the budget is PLoP's placement at this uniform rank; every matched
    placement gets per-type ranks that reach one common count (see placement.match_ranks)."""
    rank_window: int = 3
    """How far a type's rank may stray from its placement's uniform rank to make counts equal."""
    alpha_over_rank: float = 2.0
    """LoRA scale alpha / r, the same for every module whatever its rank."""
    lr: float = 3e-3
    """AdamW learning rate of the adapters (constant)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    batch: int = 32
    """Training examples per step (sampled with replacement)."""
    steps: int = 600
    """Training steps."""
    eval_every: int = 100
    """Evaluate the held-out set every this many steps."""
    log_every: int = 25
    """Report training metrics every this many steps."""
    checkpoint_every_frac: float = 0.25
    """Save a checkpoint at every multiple of this training fraction (and at the end)."""
    threads: int = 1
    """Intra-op CPU threads of the trial, pinned by the runner around `train` (0 leaves torch's setting)."""
    seed: int = 0
    """Trial seed: the task split, the NFN samples and reference directions, the control's init,
    the LoRA init and the batch order."""


def smoke() -> Config:
    """A CPU-sized run on tiny-local: 200 steps at rank 4, a few seconds."""
    return Config(steps=200, eval_every=100, log_every=20)


def validate(cfg: Config, world_size: int = 1) -> None:
    """Checks that need no model: raised before anything is launched."""
    if problems := task_problems(cfg):
        raise ValueError("; ".join(problems))
    if cfg.task not in TASKS:
        raise ValueError(f"task must be one of {', '.join(TASKS)}, got {cfg.task!r}")
    if cfg.placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}, got {cfg.placement!r}")
    unknown = [p for p in cfg.matched if p not in PLACEMENTS]
    if unknown or not cfg.matched:
        raise ValueError(f"matched must list placements among {', '.join(PLACEMENTS)}, got {cfg.matched!r}")
    if cfg.placement not in cfg.matched:
        raise ValueError(f"placement {cfg.placement!r} is not in matched={cfg.matched!r}: add it, so its "
                         f"parameter count is matched with the others")
    for name in ("n_types", "nfn_samples", "nfn_batch", "rank", "batch", "steps", "eval_every", "log_every"):
        if getattr(cfg, name) <= 0:
            raise ValueError(f"{name} must be positive, got {getattr(cfg, name)}")
    if parse_tiny(cfg.base) is not None and cfg.n_types > len(LLAMA_LINEAR_TYPES):
        raise ValueError(f"n_types={cfg.n_types} exceeds the 7 linear module types of a Llama layer")
    if cfg.eval_batch <= 0 or min(cfg.task_limit, cfg.eval_limit, cfg.max_tokens) < 0:
        raise ValueError(f"eval_batch must be positive and task_limit, eval_limit, max_tokens >= 0, got "
                         f"{cfg.eval_batch}, {cfg.task_limit}, {cfg.eval_limit}, {cfg.max_tokens}")
    for name in ("prompt_field", "answer_field"):
        if cfg.task_path and not getattr(cfg, name):
            raise ValueError(f"{name} must name a field of task_path's records, got ''")
    for name in ("attention_kinds", "mlp_kinds"):
        kinds = getattr(cfg, name)
        if not isinstance(kinds, (tuple, list)) or not all(isinstance(k, str) and k for k in kinds):
            raise ValueError(f"{name} must be a list of projection kinds (e.g. ['q_proj', 'v_proj']), got {kinds!r}")
    if cfg.rank_window < 0 or cfg.threads < 0:
        raise ValueError(f"rank_window and threads must be >= 0, got {cfg.rank_window} and {cfg.threads}")
    if not 0 < cfg.heldout_frac < 1:
        raise ValueError(f"heldout_frac must lie in (0, 1), got {cfg.heldout_frac}")
    if not 2 <= cfg.modulus <= 100:
        raise ValueError(f"modulus must lie in [2, 100] (numbers 0-99 are words of the vocabulary), got {cfg.modulus}")
    if not cfg.lr > 0 or cfg.weight_decay < 0 or not cfg.alpha_over_rank > 0:
        raise ValueError(f"lr and alpha_over_rank must be positive and weight_decay >= 0, got "
                         f"lr={cfg.lr}, alpha_over_rank={cfg.alpha_over_rank}, weight_decay={cfg.weight_decay}")
    if not 0 < cfg.checkpoint_every_frac <= 1:
        raise ValueError(f"checkpoint_every_frac must lie in (0, 1], got {cfg.checkpoint_every_frac}")
    if cfg.task_path:
        return  # the file's size is known where it is read (preflight, train)
    train_n = len(split(base_world(cfg.base, seed=cfg.base_seed), cfg.task, heldout_frac=cfg.heldout_frac,
                        seed=cfg.seed, modulus=cfg.modulus)[0])
    if 2 * cfg.nfn_samples > train_n:
        raise ValueError(f"nfn_samples={cfg.nfn_samples} needs two disjoint samples of {cfg.nfn_samples} "
                         f"training examples, and task {cfg.task!r} has {train_n}: use nfn_samples <= {train_n // 2}")


def placement_problems(cfg: Config, kinds: list[str], where: str) -> list[str]:
    """Why the placement does not fit a model with projection kinds `kinds` (empty when it does):
    a named kind the model lacks, or more kinds to choose than it has."""
    problems = []
    for name in ("attention_kinds", "mlp_kinds"):
        unknown = [k for k in getattr(cfg, name) if k not in kinds]
        if unknown:
            problems.append(f"{name}={list(getattr(cfg, name))} names {unknown}, not projection kinds of {where}; "
                            f"its kinds are {kinds}")
    if cfg.n_types > len(kinds):
        problems.append(f"n_types={cfg.n_types} exceeds the {len(kinds)} projection kinds of {where}: {kinds}")
    return problems


def block_problems(cfg: Config, folder: str) -> list[str]:
    """Why the attention-only or MLP-only arm finds no kinds by module name in the model at
    `folder` (built from its config on the meta device: no weights), when the config names none."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from workloads.plop.placement import block_types

    wanted = [p for p in ("attention", "mlp") if p in cfg.matched and not getattr(cfg, f"{p}_kinds")]
    if not wanted:
        return []
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder))
    problems = []
    for placement in wanted:
        try:
            block_types(model, placement)
        except ValueError as exc:
            problems.append(f"base {cfg.base!r}: {exc}")
    return problems


def preflight(cfg: Config) -> None:
    """Checks of the machine that runs it, before any Ray work: the base model is here (a folder
    or a cached hub id; nothing is downloaded), the placement's kinds are the model's, and the
    task files read with their fields. Every problem in one error."""
    from components.pretrained import model_config

    fields = {"task_path": {cfg.prompt_field: str, cfg.answer_field: str},
              "eval_path": {cfg.eval_prompt_field or cfg.prompt_field: str, cfg.eval_answer_field or cfg.answer_field: str}}
    problems = task_problems(cfg, machine=True,
                             check=lambda path, split_, what: check_records(path, fields[what], split=split_, what=what))
    if parse_tiny(cfg.base) is not None:
        found = cfg.base
    else:  # the folder of its config.json ('' when not here: task_problems names it)
        config = model_config(cfg.base)
        found = str(Path(config).parent) if config else ""
    if found:
        problems += placement_problems(cfg, base_kinds(found), f"base {cfg.base!r}")
    if found and parse_tiny(cfg.base) is None:
        problems += block_problems(cfg, found)
    if problems:
        raise ValueError("; ".join(problems))


def task_sets(cfg: Config, tokenizer: Any) -> tuple[list, list]:
    """(train, heldout) examples: the built-in task on the base's world, or the task file's."""
    if not cfg.task_path:
        world = base_world(cfg.base, seed=cfg.base_seed)
        return split(world, cfg.task, heldout_frac=cfg.heldout_frac, seed=cfg.seed, modulus=cfg.modulus)
    train_set, held_set = file_split(
        cfg.task_path, task_split=cfg.task_split, eval_path=cfg.eval_path, eval_split=cfg.eval_split,
        prompt_field=cfg.prompt_field, answer_field=cfg.answer_field, eval_prompt_field=cfg.eval_prompt_field,
        eval_answer_field=cfg.eval_answer_field, heldout_frac=cfg.heldout_frac, seed=cfg.seed,
        task_limit=cfg.task_limit, eval_limit=cfg.eval_limit)
    train_set, held_set = fits(train_set, tokenizer, cfg.max_tokens), fits(held_set, tokenizer, cfg.max_tokens)
    if 2 * cfg.nfn_samples > len(train_set) or not held_set:
        raise ValueError(f"task_path={cfg.task_path!r} leaves {len(train_set)} training and {len(held_set)} held-out "
                         f"records (max_tokens={cfg.max_tokens}): nfn_samples={cfg.nfn_samples} needs two disjoint "
                         f"samples of {cfg.nfn_samples} training records, and the held-out set at least one")
    return train_set, held_set


def nfn_batches(examples: list, tokenizer: Any, cfg: Config) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(input_ids, attention_mask) batches of what the scoring pass reads (see `nfn_inputs`)."""
    texts = [e.prompt if cfg.nfn_inputs == "prompt" else f"{e.prompt} {e.answer}" for e in examples]
    for s in range(0, len(texts), cfg.nfn_batch):
        enc = tokenizer(texts[s: s + cfg.nfn_batch], padding=True, return_tensors="pt")
        yield enc["input_ids"], enc["attention_mask"]


def score_task(cfg: Config, model: torch.nn.Module, tokenizer: Any, train_set: list) -> dict[str, dict[str, float]]:
    """NFN by projection kind on two disjoint samples of the training split ('a' decides the
    placement, 'b' checks it), and on a freshly initialised copy of the architecture ('control',
    built on the base's device and dropped after scoring: two models at most are alive)."""
    order = torch.randperm(len(train_set), generator=torch.Generator().manual_seed(cfg.seed)).tolist()
    sample_a = [train_set[i] for i in order[: cfg.nfn_samples]]
    sample_b = [train_set[i] for i in order[cfg.nfn_samples: 2 * cfg.nfn_samples]]
    kinds = module_kinds(model)
    out = {"a": by_type(score_modules(model, nfn_batches(sample_a, tokenizer, cfg), seed=cfg.seed), kinds),
           "b": by_type(score_modules(model, nfn_batches(sample_b, tokenizer, cfg), seed=cfg.seed + 1), kinds)}
    if cfg.nfn_control:
        from transformers import AutoModelForCausalLM

        torch.manual_seed(cfg.seed)
        weight = next(model.parameters())
        with torch.device(weight.device):
            control = AutoModelForCausalLM.from_config(model.config, dtype=weight.dtype)
        scores = score_modules(control, nfn_batches(sample_a, tokenizer, cfg), seed=cfg.seed)
        del control
        out["control"] = by_type(scores, kinds)
    return out


def train(cfg: Config, run) -> dict[str, float]:
    validate(cfg, run.world_size)
    model, tok = load_base(cfg.base, seed=cfg.base_seed, dtype=cfg.dtype, device=run.device)
    problems = placement_problems(cfg, list(dict.fromkeys(module_kinds(model).values())), f"base {cfg.base!r}")
    if problems:
        raise ValueError("; ".join(problems))
    train_set, held_set = task_sets(cfg, tok)
    train_data, held_data = encode(train_set, tok), encode(held_set, tok)

    scores = score_task(cfg, model, tok, train_set)  # deterministic: a resumed run recomputes it
    chosen_a = select(scores["a"], cfg.n_types)
    chosen_b = select(scores["b"], cfg.n_types)
    fixed = {"attention": tuple(cfg.attention_kinds), "mlp": tuple(cfg.mlp_kinds)}
    placements = {p: placement_types(p, model, scores["a"], cfg.n_types, fixed) for p in cfg.matched}
    costs = type_costs(model)
    target = cfg.rank * sum(costs[t] for t in chosen_a)
    match = match_ranks(costs, placements, target, cfg.rank_window)
    ranks = match.ranks[cfg.placement]
    base_held = evaluate(model, held_data, cfg.eval_batch)

    torch.manual_seed(cfg.seed)  # the adapters' init
    model = lora(model, list(ranks), r=max(ranks.values()), alpha=cfg.alpha_over_rank * max(ranks.values()),
                 rank_pattern=dict(ranks), alpha_pattern={t: cfg.alpha_over_rank * r for t, r in ranks.items()})
    params = [p for p in model.parameters() if p.requires_grad]
    trainable = sum(p.numel() for p in params)
    if trainable != match.counts[cfg.placement]:  # the rank arithmetic and peft must agree
        raise RuntimeError(f"peft made {trainable} trainable parameters, the rank match expected {match.counts[cfg.placement]}")
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    gen = torch.Generator().manual_seed(cfg.seed)
    save_at = {min(cfg.steps, max(1, round(j * cfg.checkpoint_every_frac * cfg.steps)))
               for j in range(1, math.ceil(1 / cfg.checkpoint_every_frac) + 1)}

    start = 0
    state = run.restore()
    if state is not None:
        with torch.no_grad():
            for n, p in model.named_parameters():
                if p.requires_grad:
                    p.copy_(state["adapter"][n])
        opt.load_state_dict(state["optimizer"])
        gen.set_state(state["generator"])
        start = int(state["step"])

    model.train()
    held = {"loss": math.nan, "acc": math.nan}
    loss_sum, loss_n, window_start, window_steps = 0.0, 0, devices.clock(run.device), 0
    for step in range(start + 1, cfg.steps + 1):
        idx = torch.randint(len(train_data[0]), (cfg.batch,), generator=gen)
        width = int(train_data[1][idx].sum(1).max())  # the batch's longest row: padding beyond it is never read
        ids, mask, target_mask = (x[idx, :width].to(run.device) for x in train_data)
        loss, _ = answer_loss(model(input_ids=ids, attention_mask=mask).logits, ids, target_mask)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss_sum, loss_n, window_steps = loss_sum + loss.item(), loss_n + 1, window_steps + 1
        metrics: dict[str, float] = {}
        if step % cfg.eval_every == 0 or step == cfg.steps:
            held = evaluate(model, held_data, cfg.eval_batch)
            metrics.update({"eval/loss": held["loss"], "eval/acc": held["acc"]})
        if step % cfg.log_every == 0 or step == cfg.steps:
            now = devices.clock(run.device)
            metrics.update({"train/loss": loss_sum / loss_n, "perf/steps_per_s": window_steps / max(now - window_start, 1e-9),
                            "progress": step / cfg.steps})
            loss_sum, loss_n, window_start, window_steps = 0.0, 0, now, 0
        if metrics:
            run.report(metrics, step=step)
        if step in save_at:
            adapter = {n: p.detach().cpu().clone() for n, p in model.named_parameters() if p.requires_grad}
            run.save({"step": step, "adapter": adapter, "optimizer": opt.state_dict(), "generator": gen.get_state()})

    final_train = evaluate(model, train_data, cfg.eval_batch)
    final_held = evaluate(model, held_data, cfg.eval_batch)
    out = {
        "train/loss": final_train["loss"],
        "eval/train_acc": final_train["acc"],
        "eval/loss": final_held["loss"],
        "eval/acc": final_held["acc"],
        "eval/base_acc": base_held["acc"],
        "eval/base_loss": base_held["loss"],
        "diag/trainable_params": float(trainable),
        "diag/target_params": float(match.target),
        "diag/params_max_rel_diff": match.max_rel_diff,
        "diag/kendall_tau_ab": kendall_tau(scores["a"], scores["b"]),
        "diag/same_choice_ab": float(set(chosen_a) == set(chosen_b)),
    }
    out.update({f"diag/params/{p}": float(n) for p, n in match.counts.items()})
    out.update({f"diag/rank/{t}": float(ranks.get(t, 0)) for t in scores["a"]})
    for key, values in scores.items():
        out.update({f"diag/nfn_{key}/{t}": v for t, v in values.items()})
    out.update({f"diag/chosen/{t}": float(t in chosen_a) for t in scores["a"]})
    return out
