"""lmao: Config and the alternating LoRA / MeZO loop, with its passes counted (see the package docstring)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Literal

import torch

from components.basemodel import check_targets, load_base, lora, task_problems, with_task_fields
from orchestrator.run import devices, fraction_steps
from workloads.lmao import data, memory, zo


MAX_WORKERS = 1
"""lmao runs a trial on one worker: the runner refuses more."""


@dataclass(frozen=True)
class Config(with_task_fields(dtype="float32")):
    """lmao's settings after the task-file fields (`components.basemodel.taskfields`): task_path's records are
    classified (`template`, `label_field`, `label_words`); the paper's OPT runs, as MeZO's, load the base in
    float16 (`dtype`): bfloat16's 8-bit mantissa rounds away most zeroth-order updates of size zo_lr * g."""

    method: Literal["lmao", "lora", "mezo", "full"] = "lmao"
    """'lmao': per step a first-order LoRA step then a MeZO step on every base parameter, same batch;
    'lora': the LoRA step alone (base frozen); 'mezo': the MeZO step alone on every parameter, no LoRA;
    'full': full first-order fine-tuning, AdamW on every base parameter (the paper's 'FT' reference)."""
    eval_frac: float = 0.2
    """Fraction of task_path held out for evaluation when no eval_path is given."""
    template: str = "{sentence} It was"
    """Prompt around a task_path record: Python format fields name the record's text fields, strings (MeZO's SST-2
    prompt for OPT is `{sentence} It was`, answered by a label word). Fields are stripped of surrounding spaces."""
    label_field: str = "label"
    """Record field holding the label, an integer indexing `label_words` (GLUE's test splits hold -1: evaluate
    on 'validation')."""
    label_words: tuple[str, ...] = ("terrible", "great")
    """Verbalizer: the word that answers the prompt for each label (SST-2: 0 terrible, 1 great). Training
    loss: the answer-token loss of the record's own word; prediction: the word of highest mean log-probability."""
    n_train: int = 0
    """Training records drawn (seeded by `seed`) from task_path (0: all; the paper's OPT runs: 1000)."""
    n_eval: int = 0
    """Evaluation records drawn from the held-out ones (0: all; the paper's OPT runs: 1000)."""
    eval_chunk: int = 64
    """Rows per forward pass at evaluation (each record once per label word)."""
    pool: Literal["topics", "names", "keys"] = "topics"
    """Word set the random bijection pi is drawn over (63, 48, 128 words of the base world's vocabulary);
    the built-in task, used when task_path is "" (the CI default)."""
    n_pairs: int = 63
    """Words in the bijection: the task is the n pairs `a -> pi(a)`, trained and evaluated on all of them."""
    lora_targets: tuple[str, ...] = ("q_proj", "v_proj")
    """LoRA projection kinds (the paper's: q and v; OPT's kinds are q_proj, k_proj, v_proj, out_proj,
    fc1, fc2; GPT-2's c_attn, attn.c_proj, c_fc, mlp.c_proj). A kind the model lacks is refused in preflight."""
    lora_rank: int = 8
    """LoRA rank (the paper's 8; the reproduction uses 1, too small for the bijection, which is the comparison's point)."""
    lora_alpha: float = 16.0
    """LoRA alpha (the paper's 16 for r = 8: scale alpha / r = 2)."""
    lora_lr: float = 1e-4
    """Peak Adam learning rate of the LoRA factors (the paper's 1e-4)."""
    lora_schedule: Literal["linear", "constant"] = "linear"
    """LoRA learning-rate schedule: 'linear' decay to 0 over the steps (the Hugging Face Trainer default the
    paper's OPT runs inherit) or 'constant' (its RoBERTa runs). The zeroth-order rate is always constant."""
    grad_clip: float = 1.0
    """Clip the first-order gradient norm (LoRA's, or every parameter's for 'full') to this before the Adam step (0: no clipping)."""
    full_lr: float = 1e-5
    """Peak AdamW learning rate of full fine-tuning ('full'; MeZO's and the paper's RoBERTa FT grid: 1e-5 to 5e-5),
    on the LoRA rate's schedule."""
    full_weight_decay: float = 0.0
    """AdamW's decoupled weight decay of full fine-tuning (0: Adam)."""
    zo_lr: float = 1e-6
    """Learning rate of the zeroth-order SGD step on the base parameters (constant, no momentum; the paper's 1e-6)."""
    zo_eps: float = 1e-3
    """Perturbation scale eps of theta +- eps z."""
    zo_weight_decay: float = 0.0
    """Weight decay of the zeroth-order step, skipped for biases and norm weights."""
    steps: int = 1000
    """Optimizer steps (for lmao each is one LoRA step and one MeZO step)."""
    batch: int = 16
    """Pairs (or task records) per step, drawn with replacement (0: all of them every step, full batch);
    the LoRA and MeZO phases of a step use the same batch."""
    eval_every: int = 100
    """Evaluate the loss over all n pairs (or the held-out records) every this many steps (and at the end)."""
    log_every: int = 50
    """Report train/loss every this many steps."""
    checkpoint_every_frac: float = 0.25
    """Save a checkpoint at every multiple of this training fraction (and at the end)."""
    threads: int = 1
    """Intra-op CPU threads of the trial, pinned by the runner around `train` (0 leaves torch's setting)."""
    seed: int = 0
    """Trial seed: the bijection (or the records drawn and held out), the batch order, the LoRA init and
    the MeZO perturbations (every method at one seed sees the same pairs and batches)."""


def smoke() -> Config:
    """tiny-local, a bijection over the 63 topic words, full batch, LoRA r = 1 on q and v, 30 LMAO steps.

    The learning rates are tiny-local's: Adam 3e-3 on LoRA (1e-2 trains as fast but its trajectories
    diverge more between runs), and 3e-6 on the base, the largest zeroth-order rate that still lowered
    the loss from a LoRA-trained point over 200 MeZO steps (1e-5 raised it by 0.7-1.2, 3e-6 lowered it
    by 0.07). The full batch (all 63 pairs) removes batch sampling from the comparison."""
    return Config(lora_rank=1, lora_alpha=2.0, lora_lr=3e-3, zo_lr=3e-6, batch=0, steps=30, eval_every=10, log_every=3)


def validate(cfg: Config, world_size: int = 1) -> None:
    """Checks that need no model: raised before anything is launched."""
    if problems := task_problems(cfg):
        raise ValueError("; ".join(problems))
    if cfg.lora_schedule not in ("linear", "constant"):
        raise ValueError(f"lora_schedule must be 'linear' or 'constant', got {cfg.lora_schedule!r}")
    if cfg.method not in ("lmao", "lora", "mezo", "full"):
        raise ValueError(f"method must be 'lmao', 'lora', 'mezo' or 'full', got {cfg.method!r}")
    if cfg.pool not in data.POOLS:
        raise ValueError(f"pool must be one of {sorted(data.POOLS)}, got {cfg.pool!r}")
    if not 2 <= cfg.n_pairs <= len(data.POOLS[cfg.pool]):
        raise ValueError(f"n_pairs must lie in [2, {len(data.POOLS[cfg.pool])}] for pool {cfg.pool!r}, got {cfg.n_pairs}")
    if cfg.task_path:
        data.task_fields(cfg.template, cfg.label_field)  # raises naming a malformed template
        if not cfg.label_field:
            raise ValueError("label_field must name the record field holding the label, e.g. 'label'")
        words = [w.strip() for w in cfg.label_words]
        if len(words) < 2 or not all(words) or len(set(words)) != len(words):
            raise ValueError(f"label_words must be at least two distinct non-empty words, one per label, got {cfg.label_words!r}")
        if not 0 < cfg.eval_frac < 1:
            raise ValueError(f"eval_frac must lie in (0, 1), got {cfg.eval_frac}")
        if cfg.n_train < 0 or cfg.n_eval < 0:
            raise ValueError(f"n_train and n_eval must be >= 0 (0: all records), got {cfg.n_train}, {cfg.n_eval}")
    if cfg.batch < 0:
        raise ValueError(f"batch must be >= 0 (0: full batch), got {cfg.batch}")
    for name in ("steps", "eval_every", "log_every", "lora_rank", "eval_chunk"):
        if getattr(cfg, name) <= 0:
            raise ValueError(f"{name} must be positive, got {getattr(cfg, name)}")
    if not cfg.lora_targets:
        raise ValueError("lora_targets must name at least one module type, e.g. ('q_proj', 'v_proj')")
    if not cfg.lora_lr > 0 or not cfg.zo_lr > 0 or not cfg.zo_eps > 0 or not cfg.lora_alpha > 0:
        raise ValueError(f"lora_lr, zo_lr, zo_eps and lora_alpha must be positive, got "
                         f"{cfg.lora_lr}, {cfg.zo_lr}, {cfg.zo_eps}, {cfg.lora_alpha}")
    if cfg.zo_weight_decay < 0 or cfg.grad_clip < 0 or cfg.full_weight_decay < 0:
        raise ValueError(f"zo_weight_decay, full_weight_decay and grad_clip must be >= 0, got {cfg.zo_weight_decay}, "
                         f"{cfg.full_weight_decay}, {cfg.grad_clip}")
    if not cfg.full_lr > 0:
        raise ValueError(f"full_lr must be positive, got {cfg.full_lr}")
    if not 0 < cfg.checkpoint_every_frac <= 1:
        raise ValueError(f"checkpoint_every_frac must lie in (0, 1], got {cfg.checkpoint_every_frac}")
    if cfg.threads < 0:
        raise ValueError(f"threads must be >= 0 (0: torch's own setting), got {cfg.threads}")


def preflight(cfg: Config) -> None:
    """Checks of the machine that runs it, before any Ray work: the base model is a folder or a cached
    hub id whose projection kinds include every LoRA target, and the task files read, field by field.
    Every problem in one error."""
    problems = task_problems(
        cfg, machine=True, targets=cfg.lora_targets if cfg.method in ("lmao", "lora") else None,
        check=lambda path, split, what: data.check_task(path, split, cfg.template, cfg.label_field, len(cfg.label_words), what))
    if problems:
        raise ValueError("; ".join(problems))


def task(cfg: Config, tokenizer: Any, device: Any) -> tuple[data.Batch, Callable[[Any], dict[str, float]]]:
    """(the training rows, the evaluation of a model), both on `device`: the bijection's pairs,
    trained and evaluated on all of them, or a task file's records, the label words scored on the
    held-out records."""
    if not cfg.task_path:
        pairs = data.encode(data.bijection(cfg.pool, cfg.n_pairs, cfg.seed), tokenizer).to(device)
        return pairs, lambda model: {**data.evaluate(model, pairs), "items": float(len(pairs))}
    words = tuple(w.strip() for w in cfg.label_words)
    rows = data.read_task(cfg.task_path, cfg.task_split, cfg.template, cfg.label_field, len(words))
    held = (data.read_task(cfg.eval_path, cfg.eval_split, cfg.template, cfg.label_field, len(words), "eval_path")
            if cfg.eval_path else None)
    train_rows, eval_rows = data.split_task(rows, held, eval_frac=cfg.eval_frac, n_train=cfg.n_train,
                                            n_eval=cfg.n_eval, seed=cfg.seed)
    choices = data.encode_choices(eval_rows, words, tokenizer).to(device)
    return data.encode_labelled(train_rows, words, tokenizer).to(device), lambda model: {
        **data.choice_metrics(model, choices, cfg.eval_chunk), "items": float(len(choices.labels))}


def train(cfg: Config, run: Any) -> dict[str, float]:
    validate(cfg, run.world_size)
    model, tokenizer = load_base(cfg.base, seed=cfg.base_seed, dtype=cfg.dtype, device=run.device)
    pairs, evaluate = task(cfg, tokenizer, run.device)
    full = cfg.method == "full"
    first_order = cfg.method in ("lmao", "lora", "full")
    zeroth_order = cfg.method in ("lmao", "mezo")

    causal_lm = model
    # The base stays requires_grad=False throughout (but for full fine-tuning): the LoRA backward cannot
    # reach it, and the MeZO phase runs under no_grad (the paper's code unfreezes it for that phase;
    # nothing would be stored).
    for p in model.parameters():
        p.requires_grad_(full)
    if cfg.method in ("lmao", "lora"):
        check_targets(model, cfg.lora_targets, what="lora_targets")
        torch.manual_seed(cfg.seed)  # peft draws lora_A from torch's global generator
        model = lora(model, list(cfg.lora_targets), r=cfg.lora_rank, alpha=cfg.lora_alpha)
    named = list(model.named_parameters())
    lora_params = [p for n, p in named if "lora_" in n]
    base_named = [(n, p) for n, p in named if "lora_" not in n]
    base_params = [p for _, p in base_named]
    decay = zo.decay_mask(base_named)
    trainable = base_params if full else lora_params  # what the first-order step moves
    peak_lr = cfg.full_lr if full else cfg.lora_lr
    if full:
        optimizer = torch.optim.AdamW(trainable, lr=peak_lr, weight_decay=cfg.full_weight_decay)
    else:
        optimizer = torch.optim.Adam(trainable, lr=peak_lr) if first_order else None
    if optimizer is not None:
        model, optimizer = run.prepare(model, optimizer)
    counter = zo.PassCounter(causal_lm)
    gen = torch.Generator().manual_seed(cfg.seed)

    stats = {"fwd_min": math.inf, "fwd_max": -math.inf, "bwd_min": math.inf, "bwd_max": -math.inf, "base_grads": 0.0}
    mem: dict[str, float] = {}  # the largest bytes held per part, over steps (memory.py)
    saved = memory.SavedActivations(p for _, p in named)
    param_bytes = memory.tensor_bytes(p for _, p in named)
    noise_bytes = memory.zo_noise_bytes(base_params) if zeroth_order else 0
    start = 0
    state = run.restore()
    if state is not None:
        with torch.no_grad():
            current = dict(model.named_parameters())
            for name, value in state["params"].items():
                current[name].copy_(value)
        if optimizer is not None:
            optimizer.load_state_dict(state["optimizer"])
        gen.set_state(state["gen"])
        stats.update(state["stats"])
        mem.update(state.get("mem", {}))
        start = int(state["step"])
    save_at = fraction_steps(cfg.steps, cfg.checkpoint_every_frac)
    changed = [n for n, _ in named] if zeroth_order or full else [n for n, _ in named if "lora_" in n]  # what a checkpoint keeps

    result = {"loss": math.nan, "acc": math.nan}
    loss_sum, loss_n, window_start, window_steps = 0.0, 0, devices.clock(run.device), 0
    for step in range(start + 1, cfg.steps + 1):
        batch = data.trim(pairs.rows(torch.randint(len(pairs), (cfg.batch,), generator=gen))) if cfg.batch else pairs
        before = counter.snapshot()
        held = {"params": param_bytes, "grads": 0, "optimizer": 0, "activations": 0, "zo_noise": noise_bytes}
        if first_order:  # the LoRA phase (or full fine-tuning): one forward, one backward, an Adam step
            for group in optimizer.param_groups:
                group["lr"] = peak_lr * ((1 - (step - 1) / cfg.steps) if cfg.lora_schedule == "linear" else 1.0)
            model.train()
            with saved.recording():
                loss = data.answer_loss(model, batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip:
                torch.nn.utils.clip_grad_norm_(trainable, cfg.grad_clip)
            held.update(grads=memory.grad_bytes(trainable), activations=saved.bytes)
            optimizer.step()
            held["optimizer"] = memory.optimizer_state_bytes(optimizer)
            optimizer.zero_grad(set_to_none=True)
            step_loss = loss.item()
        if zeroth_order:  # the MeZO phase, with the updated adapter: two forwards, no backward
            model.eval()
            plus, minus, _ = zo.zo_step(base_params, lambda: data.answer_loss(model, batch), zo.zo_seed(cfg.seed, step),
                                        eps=cfg.zo_eps, lr=cfg.zo_lr, weight_decay=cfg.zo_weight_decay, decay=decay)
            if not first_order:
                step_loss = (plus + minus) / 2
        after = counter.snapshot()
        fwd, bwd = after[0] - before[0], after[1] - before[1]
        stats["fwd_min"], stats["fwd_max"] = min(stats["fwd_min"], fwd), max(stats["fwd_max"], fwd)
        stats["bwd_min"], stats["bwd_max"] = min(stats["bwd_min"], bwd), max(stats["bwd_max"], bwd)
        stats["base_grads"] = max(stats["base_grads"], float(zo.params_holding_grad(base_params)))
        memory.merge_max(mem, held)

        loss_sum, loss_n, window_steps = loss_sum + step_loss, loss_n + 1, window_steps + 1
        metrics: dict[str, float] = {}
        if step % cfg.eval_every == 0 or step == cfg.steps:
            counter.active = False  # evaluation passes are not the method's
            model.eval()
            result = evaluate(model)
            counter.active = True
            metrics.update({"eval/loss": result["loss"], "eval/acc": result["acc"]})
        if step % cfg.log_every == 0 or step == cfg.steps:
            now = devices.clock(run.device)
            metrics.update({"train/loss": loss_sum / loss_n, "perf/steps_per_s": window_steps / max(now - window_start, 1e-9)})
            loss_sum, loss_n, window_start, window_steps = 0.0, 0, now, 0
        if metrics:
            run.report({**metrics, "progress": step / cfg.steps}, step=step)
        if step in save_at:
            params = dict(model.named_parameters())
            run.save({"step": step, "params": {n: params[n].detach().cpu().clone() for n in changed},
                      "optimizer": optimizer.state_dict() if optimizer is not None else None,
                      "gen": gen.get_state(), "stats": dict(stats), "mem": dict(mem)})
    counter.remove()
    return {
        "eval/loss": result["loss"], "eval/acc": result["acc"], "diag/eval_items": result.get("items", math.nan),
        "diag/forwards_per_step_min": float(stats["fwd_min"]), "diag/forwards_per_step_max": float(stats["fwd_max"]),
        "diag/backwards_per_step_min": float(stats["bwd_min"]), "diag/backwards_per_step_max": float(stats["bwd_max"]),
        "diag/base_params_with_grad": float(stats["base_grads"]),
        "diag/trainable_first_order": float(sum(p.numel() for p in trainable)) if first_order else 0.0,
        "diag/zo_params": float(sum(p.numel() for p in base_params)) if zeroth_order else 0.0,
        **{f"mem/{part}_bytes": value for part, value in mem.items() if part != "total"},
        "mem/peak_train_bytes": mem.get("total", math.nan),
        **({"mem/cuda_peak_bytes": cuda} if (cuda := memory.cuda_peak_bytes(run.device)) is not None else {}),
    }
