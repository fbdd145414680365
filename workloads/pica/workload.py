"""pica: Config, the fine-tuning loop, and the exact checks on the trained model (see the package docstring)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch

from components.basemodel import (
    AnswerField, PromptField, base_world, check_records, file_examples, load_base, lora, resolve, select, task_problems,
    weight_oi, with_task_fields,
)
from orchestrator.run import devices, fraction_steps
from workloads.pica import data, svft
from workloads.pica.adapter import (
    PiCa, count_at_depths, decoder_linears, full_gradients, gradient_energy, merge, shared_gradient_error, span_residual, trainable_count,
)

DEPTH_PREFIX = "diag/trainable_at_depth/"
"""Final-metric keys `<prefix><depth>`: PiCa's trainable count on an untrained model of that depth."""
UNSHARED_PREFIX = "diag/unshared_at_depth/"
"""The same count without sharing (one M per layer), the contrast that grows with depth."""


METHODS = ("pica", "lora", "dora", "pissa", "svft")
"""The arms: PiCa, and the baselines its paper beats at equal or larger budgets (LoRA; DoRA, LoRA plus a
per-output magnitude; PiSSA, LoRA initialised by SVD; SVFT, a sparse update between W0's singular vectors)."""

MAX_WORKERS = 1
"""pica runs on one worker: the runner refuses more."""


@dataclass(frozen=True)
class Config(with_task_fields(PromptField, AnswerField, dtype="float32")):
    """pica's settings after the task-file fields (`components.basemodel.taskfields`): the Ms and projectors
    share the base's `dtype` (bfloat16 on a GPU); the loss and exact-match accuracy are taken on answer_field's
    tokens (LLM-Adapters' commonsense files: 'instruction' -> 'answer', the short label; MetaMathQA: 'query' ->
    'response')."""

    method: Literal["pica", "lora", "dora", "pissa", "svft"] = "pica"
    """The adapter: 'pica' (shared M on the column space, the paper's method); 'lora' (peft LoRA on the
    same targets, A random, B zero), 'dora' (peft LoRA with `use_dora=True`: the direction by LoRA, a
    trainable magnitude per output, r * sum(in + out) + sum(out) trainable) or 'pissa' (LoRA whose A, B
    start at the top singular vectors of W0 and W0 keeps the residual, peft `init_lora_weights="pissa"`),
    all three at the LoRA rank whose LoRA count is nearest PiCa's at `rank` (`lora_rank`); 'svft' (W0 +
    U M V^T, `workloads.pica.svft`) with the off-diagonal count whose count is nearest PiCa's (`svft_bands`)."""
    lora_rank: int = 0
    """Rank of the 'lora' / 'pissa' arms; 0 = matched: the r >= 1 whose count r * sum(in + out) over the
    wrapped projections is nearest PiCa's r * sum(d_out) (one M per kind). Both counts are reported."""
    lora_alpha: float = 0.0
    """LoRA's alpha (scale alpha / r); 0 = alpha = r (scale 1, PiSSA's principal part exactly W0's)."""
    svft_bands: int = -1
    """SVFT's off-diagonals of M on each side of the diagonal (0: the diagonal only, SVFT^P); -1 = matched:
    the d >= 0 whose count is nearest PiCa's (`svft.matched_bands`)."""
    svft_pattern: Literal["banded", "random"] = "banded"
    """SVFT's off-diagonal positions: 'banded' (SVFT^B_d) or as many at random positions, drawn by the
    trial seed (SVFT^R_d)."""
    pissa_niter: int = 0
    """PiSSA's SVD: 0 = exact (float32); k > 0 = peft's randomized `pissa_niter_k` (fast on large weights)."""
    eval_prompt_field: str = ""
    """eval_path's prompt field when it differs (GSM8K: 'question'); "" = prompt_field."""
    eval_answer_field: str = ""
    """eval_path's answer field when it differs; "" = answer_field."""
    max_examples: int = 0
    """Read at most this many records of task_path (and of eval_path); 0 = all."""
    max_tokens: int = 0
    """Leave out examples whose `prompt answer` is longer than this many tokens; 0 = keep all."""
    task: Literal["qa", "sub", "mul", "facts"] = "qa"
    """Downstream task from the base's world when task_path is "": 'qa' = a question format pre-training never used about
    attributes it learnt, held out by entity; 'sub' / 'mul' = `a - b` / `a * b mod p = c` (operations
    tiny-local never saw); 'facts' = the key-value facts whose keys pre-training held out."""
    modulus: int = 11
    """p of the arithmetic tasks."""
    heldout_frac: float = 0.2
    """Fraction of the task's examples (of its entities, for 'qa'; of task_path's records when eval_path is "") held
    out for eval/loss (0: evaluate on the training set)."""
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
    micro_batch: int = 0
    """Examples per forward/backward pass, the step's gradient accumulated over them (weighted by answer
    tokens, so the step equals the whole batch's); also the held-out evaluation's chunk. 0 = the whole
    batch in one pass (evaluation: 256 rows a pass)."""
    lr: float = 1e-3
    """Peak Adam(W) learning rate of the Ms."""
    warmup_frac: float = 0.1
    """Linear warm-up fraction of the steps, then cosine decay to 0 (the paper's schedule)."""
    weight_decay: float = 0.0
    """AdamW weight decay of the Ms (0 in the paper)."""
    grad_clip: float = 0.0
    """Clip the Ms' gradient norm to this (0: no clipping)."""
    autocast: str = "fp32"
    """'fp32', or 'bf16': training and evaluation forward passes under CUDA autocast to bfloat16, as
    the paper trains (MetaMath's pica.sh: bf16); GPU runs only."""
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
    if problems := task_problems(cfg):
        raise ValueError("; ".join(problems))
    if cfg.method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {cfg.method!r}")
    if cfg.svft_bands < -1:
        raise ValueError(f"svft_bands must be >= 0, or -1 (matched to PiCa's count), got {cfg.svft_bands}")
    if cfg.svft_pattern not in ("banded", "random"):
        raise ValueError(f"svft_pattern must be 'banded' or 'random', got {cfg.svft_pattern!r}")
    for name in ("lora_rank", "lora_alpha", "pissa_niter", "max_examples", "max_tokens", "micro_batch"):
        if getattr(cfg, name) < 0:
            raise ValueError(f"{name} must be >= 0, got {getattr(cfg, name)}")
    if cfg.task_path and (not cfg.prompt_field or not cfg.answer_field or cfg.prompt_field == cfg.answer_field):
        raise ValueError(f"prompt_field and answer_field must be two field names, got {cfg.prompt_field!r}, {cfg.answer_field!r}")
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
    if cfg.threads < 0:
        raise ValueError(f"threads must be >= 0 (0: torch's own setting), got {cfg.threads}")


def check_model(cfg: Config, model: torch.nn.Module) -> None:
    """Checks that need the loaded model's shapes: the targets are projection kinds of the model
    (`components.basemodel.kinds`) and r fits every target."""
    found = select(model, cfg.targets, what="targets")  # ValueError naming an unknown kind and the model's kinds
    smallest = min(min(weight_oi(p.module).shape) for p in found.values())
    if cfg.rank > smallest:
        raise ValueError(f"rank={cfg.rank} exceeds the smallest target's min(out, in) = {smallest}: use rank <= {smallest}")


def task_fields(cfg: Config, what: str = "task_path") -> dict[str, type]:
    """The fields the records of task_path (or eval_path) must carry, with their types."""
    if what == "eval_path":
        return {cfg.eval_prompt_field or cfg.prompt_field: str, cfg.eval_answer_field or cfg.answer_field: str}
    return {cfg.prompt_field: str, cfg.answer_field: str}


def preflight(cfg: Config) -> None:
    """Checks of the machine that runs it, before any Ray work: the task file(s) are there and every
    record has the prompt and answer fields; the base model (a folder, or a hub id in the local
    cache; read as its config only) has the target kinds. Every problem is named in one message."""
    problems = task_problems(cfg, machine=True, targets=cfg.targets, target_field="targets",
                             check=lambda path, split, what: check_records(path, task_fields(cfg, what), split=split, what=what))
    if problems:
        raise ValueError("; ".join(problems))


def task_sets(cfg: Config) -> tuple[list[data.Example], list[data.Example]]:
    """(train, held-out) examples: from the task file(s), or from the base's world (`task`)."""
    if not cfg.task_path:
        world = base_world(cfg.base, seed=cfg.base_seed)
        return data.split(data.task_examples(world, cfg.task, cfg.modulus), cfg.heldout_frac, cfg.base_seed,
                          by_entity=cfg.task == "qa")
    read = dict(limit=cfg.max_examples, part="file", strip=False)
    examples = file_examples(cfg.task_path, cfg.prompt_field, cfg.answer_field, split=cfg.task_split, **read)
    if cfg.eval_path:
        return examples, file_examples(cfg.eval_path, cfg.eval_prompt_field or cfg.prompt_field,
                                       cfg.eval_answer_field or cfg.answer_field, split=cfg.eval_split, what="eval_path",
                                       **read)
    return data.split(examples, cfg.heldout_frac, cfg.base_seed)


def pica_count(model: torch.nn.Module, cfg: Config) -> int:
    """PiCa's trainable count at cfg.rank on `model`: r * d_out per kind (per layer without sharing)."""
    found = select(model, cfg.targets, what="targets")
    if cfg.share:
        return cfg.rank * sum({p.kind: p.out_features for p in found.values()}.values())
    return cfg.rank * sum(p.out_features for p in found.values())


def matched_lora_rank(model: torch.nn.Module, cfg: Config) -> int:
    """The LoRA rank r >= 1 whose count r * sum(in + out) over the targets is nearest PiCa's count
    (ties: the smaller r); cfg.lora_rank when set."""
    if cfg.lora_rank:
        return cfg.lora_rank
    per_rank = sum(p.in_features + p.out_features for p in select(model, cfg.targets, what="targets").values())
    return max(1, math.floor(pica_count(model, cfg) / per_rank + 0.5 - 1e-12))


def lr_factor(step: int, cfg: Config) -> float:
    """Linear warm-up then cosine decay to 0, as a multiple of cfg.lr (step counts from 0)."""
    warm = round(cfg.warmup_frac * cfg.steps)
    if step < warm:
        return (step + 1) / warm
    return 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, cfg.steps - warm)))


def train(cfg: Config, run: Any) -> dict[str, float]:
    validate(cfg, run.world_size)
    depth_counts: dict[str, float] = {}
    if cfg.method == "pica":  # on meta-device models of the base's config, before the base is loaded (two models at most)
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(resolve(cfg.base, seed=cfg.base_seed))
        for share, prefix in ((True, DEPTH_PREFIX), (False, UNSHARED_PREFIX)):
            counts = count_at_depths(config, cfg.count_depths, cfg.targets, cfg.rank, share=share, subspace=cfg.subspace)
            depth_counts.update({f"{prefix}{d}": float(c) for d, c in counts.items()})
    model, tokenizer = load_base(cfg.base, seed=cfg.base_seed, dtype=cfg.dtype, device=run.device)
    check_model(cfg, model)
    train_ex, held_ex = task_sets(cfg)
    if cfg.max_tokens:
        train_ex, held_ex = data.within(train_ex, tokenizer, cfg.max_tokens), data.within(held_ex, tokenizer, cfg.max_tokens)
        if not train_ex or not held_ex:
            raise ValueError(f"max_tokens={cfg.max_tokens} leaves no training or no held-out example: raise it")
    train_set = data.encode(train_ex, tokenizer).to(run.device)
    held_set = data.encode(held_ex, tokenizer).to(run.device)
    budget = pica_count(model, cfg)  # the equal-parameter budget every arm is matched to
    checks = cfg.exact_checks and cfg.method == "pica"

    snapshot = {}
    if checks:  # W0 of every target, [out, in], to measure the merge and the update against
        snapshot = {name: weight_oi(mod).detach().clone() for name, _, _, mod in decoder_linears(model, cfg.targets)}
    check_batch = train_set.rows(torch.arange(min(cfg.check_examples, len(train_set))))
    # dL/dW0 at the base: the first step of full fine-tuning, which PiCa's theory says lies mostly in span(P).
    full_grads = full_gradients(model, cfg.targets, lambda m: data.answer_loss(m, check_batch)) if checks else {}
    pica, lora_r, lora_count, bands = None, 0, 0, -1
    if cfg.method == "pica":
        pica = PiCa(model, cfg.targets, cfg.rank, subspace=cfg.subspace, share=cfg.share, seed=cfg.seed)
        params = list(pica.ms.values())
    elif cfg.method == "svft":
        bands = cfg.svft_bands if cfg.svft_bands >= 0 else svft.matched_bands(model, cfg.targets, budget)
        adapter = svft.SVFT(model, cfg.targets, bands, pattern=cfg.svft_pattern, seed=cfg.seed)
        lora_count = adapter.trainable()
        params = adapter.parameters_list()
    else:
        lora_r = matched_lora_rank(model, cfg)
        found = select(model, cfg.targets).values()
        lora_count = lora_r * sum(p.in_features + p.out_features for p in found)
        init: Any = "pissa" if not cfg.pissa_niter else f"pissa_niter_{cfg.pissa_niter}"
        extra: dict[str, Any] = {}
        if cfg.method in ("lora", "dora"):
            init = True
        if cfg.method == "dora":  # the magnitude: one trainable scalar per output of every wrapped projection
            extra, lora_count = {"use_dora": True}, lora_count + sum(p.out_features for p in found)
        torch.manual_seed(cfg.seed)  # LoRA's A draws from torch's global generator
        model = lora(model, list(cfg.targets), r=lora_r, alpha=cfg.lora_alpha or lora_r, init_lora_weights=init, **extra)
        params = [p for p in model.parameters() if p.requires_grad]
    energy = gradient_energy(pica, full_grads) if full_grads else math.nan
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    model, optimizer = run.prepare(model, optimizer)
    gen = torch.Generator().manual_seed(cfg.seed)

    start = 0
    state = run.restore()
    if state is not None:
        with torch.no_grad():
            for p, saved in zip(params, state["params"]):
                p.copy_(saved)
        optimizer.load_state_dict(state["optimizer"])
        gen.set_state(state["gen"])
        start = int(state["step"])
    save_at = fraction_steps(cfg.steps, cfg.checkpoint_every_frac)

    model.train()
    held = {"loss": math.nan, "acc": math.nan}
    loss_sum, loss_n, window_start, window_steps = 0.0, 0, devices.clock(run.device), 0
    for step in range(start + 1, cfg.steps + 1):
        for group in optimizer.param_groups:
            group["lr"] = cfg.lr * lr_factor(step - 1, cfg)
        rows = torch.randint(len(train_set), (cfg.batch,), generator=gen)
        with devices.autocast(run.device, cfg.autocast):
            if cfg.micro_batch and cfg.micro_batch < cfg.batch:
                loss = accumulate(model, train_set.rows(rows), cfg.micro_batch, optimizer)
            else:
                loss = data.answer_loss(model, train_set.rows(rows))
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
        if cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        optimizer.step()
        loss_sum, loss_n, window_steps = loss_sum + loss.item(), loss_n + 1, window_steps + 1
        metrics: dict[str, float] = {}
        if step % cfg.eval_every == 0 or step == cfg.steps:
            model.eval()
            with devices.autocast(run.device, cfg.autocast):
                held = data.evaluate(model, held_set, chunk=cfg.micro_batch or 256)
            model.train()
            metrics.update({"eval/loss": held["loss"], "eval/acc": held["acc"]})
        if step % cfg.log_every == 0 or step == cfg.steps:
            now = devices.clock(run.device)
            metrics.update({"train/loss": loss_sum / loss_n, "perf/steps_per_s": window_steps / max(now - window_start, 1e-9)})
            loss_sum, loss_n, window_start, window_steps = 0.0, 0, now, 0
        if metrics:
            run.report({**metrics, "progress": step / cfg.steps}, step=step)
        if step in save_at:
            run.save({"step": step, "params": [p.detach().clone() for p in params], "optimizer": optimizer.state_dict(), "gen": gen.get_state()})

    model.eval()
    fit = data.evaluate(model, train_set, chunk=cfg.micro_batch or 256)
    held = data.evaluate(model, held_set, chunk=cfg.micro_batch or 256)
    out = {
        "eval/loss": held["loss"], "eval/acc": held["acc"], "eval/train_loss": fit["loss"], "eval/train_acc": fit["acc"],
        "diag/grad_energy_in_span": energy,
        "diag/trainable": float(trainable_count(model)),
        "diag/pica_trainable": float(budget),
        "diag/lora_rank": float(lora_r),
        "diag/svft_bands": float(bands),
        "diag/heldout_items": float(len(held_set)),
        "diag/depth": float(model.config.num_hidden_layers),
    }
    if pica is None:
        out["diag/expected_trainable"] = float(lora_count)  # LoRA's A and B (r * sum(in + out)), DoRA's magnitudes, SVFT's M
        return out
    out["diag/grad_energy_chance"] = sum(cfg.rank / lay.in_features for lay in pica.layers.values()) / len(pica.layers)
    out["diag/expected_trainable"] = float(sum(m.shape[0] * cfg.rank for m in pica.ms.values()))
    if checks:
        out.update(exact_checks(cfg, model, pica, snapshot, train_set))
    out.update(depth_counts)
    return out


def accumulate(model: torch.nn.Module, batch: data.Batch, micro: int, optimizer: Any) -> torch.Tensor:
    """The batch's answer loss and its gradient, `micro` rows a pass: each pass's mean loss weighted
    by its share of the batch's answer tokens, so the sum is the whole batch's mean."""
    optimizer.zero_grad(set_to_none=True)
    tokens = max(int((batch.labels[:, 1:] != -100).sum()), 1)
    total = torch.zeros(())
    for start in range(0, len(batch), micro):
        part = batch.rows(torch.arange(start, min(start + micro, len(batch))))
        n = int((part.labels[:, 1:] != -100).sum())
        if n == 0:
            continue
        loss = data.answer_loss(model, part) * (n / tokens)
        loss.backward()
        total = total + loss.detach().float().cpu()
    return total


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
    del merged, modules, a, b  # the shared-gradient check merges its own copy: two models at most
    grad_err = shared_gradient_error(model, pica, lambda m: data.answer_loss(m, batch))
    return {
        "diag/merge_weight_err": merge_err, "diag/merge_logit_err": logit_err, "diag/base_changed": base_changed,
        "diag/span_residual": residual, "diag/shared_grad_err": grad_err,
    }
