"""pica: Config, the fine-tuning loop, and the exact checks on the trained model (see the package docstring)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Literal

import torch

from orchestrator.basemodel import base_world, check_base, load_base
from orchestrator.run import fraction_steps
from workloads.pica import data
from workloads.pica.adapter import (
    PiCa, count_at_depths, decoder_linears, full_gradients, gradient_energy, merge, shared_gradient_error, span_residual, trainable_count,
)

DEPTH_PREFIX = "diag/trainable_at_depth/"
"""Final-metric keys `<prefix><depth>`: PiCa's trainable count on an untrained model of that depth."""
UNSHARED_PREFIX = "diag/unshared_at_depth/"
"""The same count without sharing (one M per layer), the contrast that grows with depth."""


MAX_WORKERS = 1
"""pica runs on one worker: the runner refuses more."""


@dataclass(frozen=True)
class Config:
    base: str = "tiny-local"
    """Base model: tiny-local[:k=v,...], a local save_pretrained folder or a hub id."""
    base_seed: int = 0
    """Seed of the tiny-local build (ignored for other bases); keep it fixed across a sweep."""
    task: Literal["qa", "sub", "mul", "facts"] = "qa"
    """Downstream task from the base's world: 'qa' = a question format pre-training never used about
    attributes it learnt, held out by entity; 'sub' / 'mul' = `a - b` / `a * b mod p = c` (operations
    tiny-local never saw); 'facts' = the key-value facts whose keys pre-training held out."""
    modulus: int = 11
    """p of the arithmetic tasks."""
    heldout_frac: float = 0.2
    """Fraction of the task's examples (of its entities, for 'qa') held out for eval/loss (0: evaluate on the training set)."""
    targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "up_proj", "down_proj")
    """Module types that get PiCa (the paper's math setting: q, k, v, up, down)."""
    rank: int = 32
    """r: top singular vectors per weight; every target's min(out, in) must be >= r."""
    subspace: Literal["column", "random"] = "column"
    """'column': P = top-r right singular vectors of W0 (PiCa); 'random': a uniformly random r-dim
    orthonormal basis per layer, the paper's equal-parameter ablation."""
    share: bool = True
    """One M per module type shared across layers (PiCa); False: one M per layer (the ablation)."""
    steps: int = 1250
    """Optimizer steps (the paper: 2 epochs of MetaMathQA-40K at batch 64)."""
    batch: int = 64
    """Examples per step, drawn with replacement."""
    lr: float = 1e-3
    """Peak Adam(W) learning rate of the Ms."""
    warmup_frac: float = 0.1
    """Linear warm-up fraction of the steps, then cosine decay to 0 (the paper's schedule)."""
    weight_decay: float = 0.0
    """AdamW weight decay of the Ms (0 in the paper)."""
    grad_clip: float = 0.0
    """Clip the Ms' gradient norm to this (0: no clipping)."""
    eval_every: int = 250
    """Evaluate on the held-out examples every this many steps (and at the end)."""
    log_every: int = 50
    """Report train/loss every this many steps."""
    checkpoint_every_frac: float = 0.25
    """Save a checkpoint at every multiple of this training fraction (and at the end)."""
    exact_checks: bool = True
    """Measure the exact claims on the trained model (merge, span residual, shared gradient) and, at the
    start, the share of the base's gradient dL/dW0 inside span(P): these keep a copy of the target
    weights, one full gradient of them, and run three extra forward/backward passes."""
    check_examples: int = 64
    """Training examples in the batch of the shared-gradient and merged-logits checks."""
    count_depths: tuple[int, ...] = (1, 2, 4, 16)
    """Depths of the untrained meta-device models (the base's architecture) the trainable count is taken at."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Weights' dtype (the Ms and projectors share it)."""
    threads: int = 1
    """Intra-op CPU threads of the trial, pinned by the runner around `train` (0 leaves torch's setting)."""
    seed: int = 0
    """Trial seed: batch order and the random subspace (M starts at zero; the base is not reseeded)."""


def smoke() -> Config:
    """tiny-local, the qa task, r = 2 on q, k, v, up, down, 40 steps: about a second."""
    return Config(rank=2, steps=40, batch=32, lr=1e-2, warmup_frac=0.0, eval_every=20, log_every=5,
                  check_examples=32, count_depths=(1, 2, 4))


def validate(cfg: Config, world_size: int = 1) -> None:
    """Checks that need no model: raised before anything is launched."""
    check_base(cfg.base)
    if cfg.task not in data.TASKS:
        raise ValueError(f"task must be one of {data.TASKS}, got {cfg.task!r}")
    if cfg.subspace not in ("column", "random"):
        raise ValueError(f"subspace must be 'column' or 'random', got {cfg.subspace!r}")
    if not cfg.targets or len(set(cfg.targets)) != len(cfg.targets):
        raise ValueError(f"targets must be distinct module type names such as ('q_proj', 'v_proj'), got {cfg.targets}")
    for name in ("rank", "steps", "batch", "eval_every", "log_every", "check_examples", "modulus"):
        if getattr(cfg, name) <= 0:
            raise ValueError(f"{name} must be positive, got {getattr(cfg, name)}")
    if not cfg.count_depths or min(cfg.count_depths) < 1:
        raise ValueError(f"count_depths must be depths >= 1, got {cfg.count_depths}")
    if not 0 <= cfg.heldout_frac < 1:
        raise ValueError(f"heldout_frac must lie in [0, 1), got {cfg.heldout_frac}")
    if not cfg.lr > 0 or cfg.weight_decay < 0 or cfg.grad_clip < 0:
        raise ValueError(f"lr must be positive, weight_decay and grad_clip >= 0; got {cfg.lr}, {cfg.weight_decay}, {cfg.grad_clip}")
    if not 0 <= cfg.warmup_frac < 1:
        raise ValueError(f"warmup_frac must lie in [0, 1), got {cfg.warmup_frac}")
    if not 0 < cfg.checkpoint_every_frac <= 1:
        raise ValueError(f"checkpoint_every_frac must lie in (0, 1], got {cfg.checkpoint_every_frac}")
    if cfg.dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"dtype must be 'float32', 'bfloat16' or 'float16', got {cfg.dtype!r}")
    if cfg.threads < 0:
        raise ValueError(f"threads must be >= 0 (0: torch's own setting), got {cfg.threads}")


def check_model(cfg: Config, model: torch.nn.Module) -> None:
    """Checks that need the loaded model's shapes."""
    found = decoder_linears(model, cfg.targets)
    types = {leaf for _, _, leaf, _ in found}
    missing = [t for t in cfg.targets if t not in types]
    if missing:
        from orchestrator.basemodel import linear_types

        raise ValueError(f"targets {missing} are not linear module types of {cfg.base!r}; choose among {linear_types(model)}")
    smallest = min(min(lin.weight.shape) for _, _, _, lin in found)
    if cfg.rank > smallest:
        raise ValueError(f"rank={cfg.rank} exceeds the smallest target's min(out, in) = {smallest}: use rank <= {smallest}")


def lr_factor(step: int, cfg: Config) -> float:
    """Linear warm-up then cosine decay to 0, as a multiple of cfg.lr (step counts from 0)."""
    warm = round(cfg.warmup_frac * cfg.steps)
    if step < warm:
        return (step + 1) / warm
    return 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, cfg.steps - warm)))


def train(cfg: Config, run: Any) -> dict[str, float]:
    validate(cfg, run.world_size)
    model, tokenizer = load_base(cfg.base, seed=cfg.base_seed, dtype=cfg.dtype, device=run.device)
    check_model(cfg, model)
    world = base_world(cfg.base, seed=cfg.base_seed)
    train_ex, held_ex = data.split(data.task_examples(world, cfg.task, cfg.modulus), cfg.heldout_frac, cfg.base_seed,
                                   by_entity=cfg.task == "qa")
    train_set = data.encode(train_ex, tokenizer).to(run.device)
    held_set = data.encode(held_ex, tokenizer).to(run.device)

    snapshot = {}
    if cfg.exact_checks:  # W0 of every target, to measure the merge and the update against
        snapshot = {name: lin.weight.detach().clone() for name, _, _, lin in decoder_linears(model, cfg.targets)}
    check_batch = train_set.rows(torch.arange(min(cfg.check_examples, len(train_set))))
    # dL/dW0 at the base: the first step of full fine-tuning, which PiCa's theory says lies mostly in span(P).
    full_grads = full_gradients(model, cfg.targets, lambda m: data.answer_loss(m, check_batch)) if cfg.exact_checks else {}
    pica = PiCa(model, cfg.targets, cfg.rank, subspace=cfg.subspace, share=cfg.share, seed=cfg.seed)
    energy = gradient_energy(pica, full_grads) if full_grads else math.nan
    optimizer = torch.optim.AdamW(pica.ms.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    model, optimizer = run.prepare(model, optimizer)
    gen = torch.Generator().manual_seed(cfg.seed)

    start = 0
    state = run.restore()
    if state is not None:
        pica.ms.load_state_dict(state["ms"])
        optimizer.load_state_dict(state["optimizer"])
        gen.set_state(state["gen"])
        start = int(state["step"])
    save_at = fraction_steps(cfg.steps, cfg.checkpoint_every_frac)

    model.train()
    held = {"loss": math.nan, "acc": math.nan}
    loss_sum, loss_n, window_start, window_steps = 0.0, 0, time.perf_counter(), 0
    for step in range(start + 1, cfg.steps + 1):
        for group in optimizer.param_groups:
            group["lr"] = cfg.lr * lr_factor(step - 1, cfg)
        rows = torch.randint(len(train_set), (cfg.batch,), generator=gen)
        loss = data.answer_loss(model, train_set.rows(rows))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(pica.ms.parameters(), cfg.grad_clip)
        optimizer.step()
        loss_sum, loss_n, window_steps = loss_sum + loss.item(), loss_n + 1, window_steps + 1
        metrics: dict[str, float] = {}
        if step % cfg.eval_every == 0 or step == cfg.steps:
            model.eval()
            held = data.evaluate(model, held_set)
            model.train()
            metrics.update({"eval/loss": held["loss"], "eval/acc": held["acc"]})
        if step % cfg.log_every == 0 or step == cfg.steps:
            now = time.perf_counter()
            metrics.update({"train/loss": loss_sum / loss_n, "perf/steps_per_s": window_steps / max(now - window_start, 1e-9)})
            loss_sum, loss_n, window_start, window_steps = 0.0, 0, now, 0
        if metrics:
            run.report({**metrics, "progress": step / cfg.steps}, step=step)
        if step in save_at:
            run.save({"step": step, "ms": pica.ms.state_dict(), "optimizer": optimizer.state_dict(), "gen": gen.get_state()})

    model.eval()
    fit = data.evaluate(model, train_set)
    held = data.evaluate(model, held_set)
    out = {
        "eval/loss": held["loss"], "eval/acc": held["acc"], "eval/train_loss": fit["loss"], "eval/train_acc": fit["acc"],
        "diag/grad_energy_in_span": energy,
        "diag/grad_energy_chance": sum(cfg.rank / lay.in_features for lay in pica.layers.values()) / len(pica.layers),
        "diag/trainable": float(trainable_count(model)),
        "diag/expected_trainable": float(sum(m.shape[0] * cfg.rank for m in pica.ms.values())),
    }
    if cfg.exact_checks:
        out.update(exact_checks(cfg, model, pica, snapshot, train_set))
    for share, prefix in ((True, DEPTH_PREFIX), (False, UNSHARED_PREFIX)):
        counts = count_at_depths(model.config, cfg.count_depths, cfg.targets, cfg.rank, share=share, subspace=cfg.subspace)
        out.update({f"{prefix}{d}": float(c) for d, c in counts.items()})
    out["diag/depth"] = float(model.config.num_hidden_layers)
    return out


def exact_checks(cfg: Config, model: torch.nn.Module, pica: PiCa, snapshot: dict[str, torch.Tensor],
                 train_set: data.Batch) -> dict[str, float]:
    """The exact claims, measured on the trained model (see adapter.py for each measurement)."""
    batch = train_set.rows(torch.arange(min(cfg.check_examples, len(train_set))))
    merged = merge(model)
    modules = dict(merged.named_modules())
    merge_err, residual, base_changed = 0.0, 0.0, 0.0
    for name, layer in pica.layers.items():
        w0 = snapshot[name].double()
        base_changed = max(base_changed, float((layer.base.weight.double() - w0).abs().max()))
        merged_w = modules[name].weight.detach().double()
        reference = w0 + layer.m.detach().double() @ layer.projector.double()  # W0 + M P in float64
        scale = float((reference - w0).abs().max())
        merge_err = max(merge_err, float((merged_w - reference).abs().max()) / max(scale, 1e-30))
        residual = max(residual, span_residual(merged_w - w0, layer.projector))
    with torch.no_grad():
        a = model(input_ids=batch.ids, attention_mask=batch.mask).logits.double()
        b = merged(input_ids=batch.ids, attention_mask=batch.mask).logits.double()
    logit_err = float((a - b).abs().max()) / max(float(a.abs().max()), 1e-30)
    grad_err = shared_gradient_error(model, pica, lambda m: data.answer_loss(m, batch))
    return {
        "diag/merge_weight_err": merge_err, "diag/merge_logit_err": logit_err, "diag/base_changed": base_changed,
        "diag/span_residual": residual, "diag/shared_grad_err": grad_err,
    }
