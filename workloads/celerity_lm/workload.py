"""celerity_lm: Config and the training loop (see the package docstring); the model and its token
budget are built by the shared `components.lm.pretrain`, which also pre-trains this LM for others."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from components.lm.corpus import BatchSampler, check_data, heldout_batches, load_data
from components.lm.gpt import GPT, adamw
from components.lm.pretrain import Budget, budget, build_model
from components.lm.schedule import lr_factor
from orchestrator.run import devices, fraction_steps

CURVE_PREFIX = "curve/eval_loss/"
"""Final-metric keys `curve/eval_loss/<fraction>`: the held-out loss at each evaluation, so that
claims over finished trials can see the whole curve."""


@dataclass(frozen=True)
class Config:
    width: int = 256
    """Model width d_model; a multiple of head_dim."""
    depth: int = 6
    """Number of transformer blocks."""
    head_dim: int = 32
    """Per-head dimension, held fixed across widths (heads = width / head_dim)."""
    seq_len: int = 256
    """Context length in bytes."""
    batch_size: int = 64
    """Global batch in sequences per step, split evenly across data-parallel workers."""
    tpp: float = 20.0
    """Token budget as tokens per (non-embedding) parameter: D = tpp * N."""
    lr: float = 2e-2
    """Peak base learning rate, tuned at base_width; hidden matrices use lr * base_width / width."""
    weight_decay: float = 0.1
    """AdamW weight decay on hidden matrices (ignored when tau is set)."""
    tau: float | None = None
    """Target AdamW timescale B/(eta*lambda*D); when set, weight decay is solved from it."""
    warmup_frac: float = 0.05
    """Fraction of steps spent in linear warmup before the linear decay to zero."""
    beta1: float = 0.9
    """AdamW first-moment decay."""
    beta2: float = 0.95
    """AdamW second-moment decay."""
    grad_clip: float = 1.0
    """Global gradient-norm clip (0 disables)."""
    init_std: float = 0.02
    """Init std of embeddings, and of hidden matrices at base_width (muP-scaled elsewhere)."""
    base_width: int = 48
    """Width of the proxy model the base hyperparameters were tuned at (muP)."""
    base_depth: int = 3
    """Depth of the proxy model; residual branches are scaled by base_depth / depth (CompleteP)."""
    ffn_mult: int = 4
    """MLP hidden size as a multiple of width."""
    activation: str = "gelu"
    """MLP activation: 'gelu' or 'relu2' (squared ReLU, as in Celerity)."""
    data: str = "stdlib"
    """'stdlib' (the Python standard library's source), a folder of text files, or a tokenized dataset folder (tokens.json)."""
    heldout_frac: float = 0.1
    """Fraction of text files held out for evaluation (by a hash of their path); a tokenized dataset has its own split."""
    max_bytes: int = 0
    """Cap on training bytes read from a text corpus, or on training tokens of a tokenized dataset (0: all of it)."""
    eval_every_frac: float = 0.1
    """Evaluate on the fixed held-out set at every multiple of this training fraction."""
    eval_tokens: int = 32768
    """Size of the fixed held-out set in tokens."""
    checkpoint_every_frac: float = 0.1
    """Save a checkpoint at every multiple of this training fraction (and at the end)."""
    log_every: int = 10
    """Report train/loss (averaged since the last report) every this many steps."""
    seed: int = 0
    """Seed of the initialization and of the data order."""
    zero_stage: int = 0
    """0: plain DDP; 1, 2, 3: a DeepSpeed ZeRO engine under Ray Train, sharding optimizer state, then grads, then weights."""
    offload_optimizer: bool = False
    """With ZeRO: keep the optimizer state and its update on the CPU (DeepSpeed offload_optimizer)."""
    offload_params: bool = False
    """With ZeRO-3: keep the parameters on the CPU between uses (DeepSpeed offload_param)."""
    precision: str = "fp32"
    """'fp32', or 'bf16' with ZeRO on GPU workers (bf16 weights and compute, fp32 master weights)."""
    lr_spike_at: float = 0.0
    """Injected pathology (off by default): training fraction at which a learning-rate spike starts."""
    lr_spike_len: float = 0.0
    """Injected pathology: length of the learning-rate spike as a fraction of training (0: no spike)."""
    lr_spike_factor: float = 1.0
    """Injected pathology: the scheduled learning rate is multiplied by this during the spike (1: no spike)."""


def smoke() -> Config:
    """A CPU-sized run: about 300 steps of a 70k-parameter model, a few seconds."""
    return Config(
        width=48,
        depth=2,
        head_dim=16,
        seq_len=64,
        batch_size=16,
        tpp=4.0,
        base_depth=2,
        max_bytes=2_000_000,
        eval_tokens=8192,
        log_every=5,
    )


def preflight(cfg: Config) -> None:
    """Checks of the machine that runs it: the data folder is there and readable. Kept out of
    `validate` so that a sweep for a cluster's shared storage checks as valid anywhere."""
    check_data(cfg.data)  # raises DataError (a ValueError) naming the folder


def validate(cfg: Config, world_size: int = 1) -> None:
    """Checks that need no training: raised before anything is launched."""
    for name in ("width", "depth", "head_dim", "seq_len", "batch_size", "log_every", "eval_tokens"):
        if getattr(cfg, name) <= 0:
            raise ValueError(f"{name} must be positive, got {getattr(cfg, name)}")
    if cfg.tpp <= 0:
        raise ValueError(f"tpp must be positive, got {cfg.tpp}")
    if cfg.width % cfg.head_dim:
        raise ValueError(f"width={cfg.width} is not a multiple of head_dim={cfg.head_dim}")
    if cfg.batch_size % world_size:
        raise ValueError(
            f"batch_size={cfg.batch_size} does not split over {world_size} workers: "
            f"use a multiple of {world_size}"
        )
    if cfg.lr_spike_factor != 1.0 and not (0.0 < cfg.lr_spike_at < 1.0 and cfg.lr_spike_len > 0.0):
        raise ValueError(f"an LR spike (lr_spike_factor={cfg.lr_spike_factor}) needs 0 < lr_spike_at < 1 and "
                         f"lr_spike_len > 0, got {cfg.lr_spike_at}, {cfg.lr_spike_len}")
    if cfg.activation not in ("gelu", "relu2"):
        raise ValueError(f"activation must be 'gelu' or 'relu2', got {cfg.activation!r}")


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]], device: torch.device) -> float:
    model.eval()
    total, count = 0.0, 0
    for x, y in batches:
        logits = model(x.to(device))
        total += F.cross_entropy(logits.flatten(0, 1), y.to(device).flatten(), reduction="sum").item()
        count += y.numel()
    model.train()
    return total / count


def build(cfg: Config) -> tuple[GPT, torch.optim.AdamW, Budget]:
    """The model, its AdamW with muP learning rates per parameter group, and the budget."""
    model = build_model(cfg)  # the shared builder reads the config's model fields by name
    plan = budget(cfg, model.non_embedding_params())
    optimizer = adamw(model, hidden_lr=plan.hidden_lr, lr=cfg.lr, weight_decay=plan.weight_decay,
                      betas=(cfg.beta1, cfg.beta2))
    return model, optimizer, plan


def train(cfg: Config, run) -> dict[str, float]:
    validate(cfg, run.world_size)
    torch.manual_seed(cfg.seed)
    preflight(cfg)
    train_bytes, held_bytes = load_data(cfg.data, heldout_frac=cfg.heldout_frac, max_bytes=cfg.max_bytes)
    model, optimizer, plan = build(cfg)
    peak_lrs = [g["lr"] for g in optimizer.param_groups]
    model, optimizer = run.prepare(model, optimizer)
    # With zero_stage > 0, `model` is a DeepSpeed engine and `optimizer` stands for it: its
    # step() clips at grad_clip and updates the shards, and run.save / run.restore carry the
    # sharded model and optimizer state themselves (see orchestrator/runners/zero.py).
    sharded = cfg.zero_stage > 0
    raw = getattr(model, "module", model)
    sampler = BatchSampler(
        train_bytes, cfg.seq_len, cfg.batch_size // run.world_size, seed=cfg.seed, rank=run.rank
    )
    heldout = heldout_batches(held_bytes, cfg.seq_len, cfg.eval_tokens, batch=32)

    start = 0
    curve: dict[str, float] = {}
    state = run.restore()
    if state is not None:
        if not sharded:
            raw.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
        sampler.load_state(state["sampler"])
        start = int(state["step"])
        curve = dict(state.get("curve", {}))

    eval_at = fraction_steps(plan.steps, cfg.eval_every_frac)
    save_at = fraction_steps(plan.steps, cfg.checkpoint_every_frac)
    fixed = {"tau": plan.tau, "tpp": plan.tokens / plan.params}
    spiked = cfg.lr_spike_factor != 1.0 and cfg.lr_spike_len > 0.0
    spike_steps = 0
    window_loss, window_n, window_tokens = 0.0, 0, 0
    train_loss = eval_loss = math.nan
    tokens_per_s = math.nan
    # Throughput is wall time between reports, minus evaluation: data, optimizer, reporting and
    # checkpointing costs all count, so the number is what a user's budget actually buys.
    window_start, eval_time = devices.clock(run.device), 0.0
    for step in range(start + 1, plan.steps + 1):
        factor = lr_factor(step, plan.steps, cfg.warmup_frac)
        if spiked and cfg.lr_spike_at <= (step - 1) / plan.steps < cfg.lr_spike_at + cfg.lr_spike_len:
            factor *= cfg.lr_spike_factor  # the injected pathology (deviation-from-collapse demo)
            spike_steps += 1
        for group, peak in zip(optimizer.param_groups, peak_lrs):
            group["lr"] = peak * factor
        x, y = sampler.next()
        x, y = x.to(run.device), y.to(run.device)
        logits = model(x)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip > 0 and not sharded:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        window_loss += loss.item()
        window_n += 1
        window_tokens += plan.batch_tokens

        metrics: dict[str, float] = {}
        if step % cfg.log_every == 0 or step == plan.steps:
            train_loss = window_loss / window_n
            now = devices.clock(run.device)
            tokens_per_s = window_tokens / max(now - window_start - eval_time, 1e-9)
            # train/lr is read back from the optimizer (under ZeRO, the engine's): the rate applied.
            lr_now = optimizer.param_groups[1]["lr"]
            metrics.update({"train/loss": train_loss, "perf/tokens_per_s": tokens_per_s, "train/lr": lr_now})
            window_loss, window_n, window_tokens = 0.0, 0, 0
            window_start, eval_time = now, 0.0
        if step in eval_at:
            t_eval = devices.clock(run.device)
            eval_loss = evaluate(model, heldout, run.device)
            eval_time += devices.clock(run.device) - t_eval
            metrics["eval/loss"] = eval_loss
            curve[f"{CURVE_PREFIX}{step / plan.steps:.4f}"] = eval_loss
        if metrics:
            metrics.update(fixed, progress=step * plan.batch_tokens / plan.tokens, tokens=step * plan.batch_tokens)
            run.report(metrics, step=step)
        if step in save_at:
            state = {"step": step, "sampler": sampler.state(), "curve": dict(curve)}
            if not sharded:
                state.update(model=raw.state_dict(), optimizer=optimizer.state_dict())
            run.save(state)
    if math.isnan(eval_loss) or start >= plan.steps:
        eval_loss = evaluate(model, heldout, run.device)
    return {
        "train/loss": train_loss,
        "eval/loss": eval_loss,
        "perf/tokens_per_s": tokens_per_s,
        "params": float(plan.params),
        "steps": float(plan.steps),
        **fixed,
        **curve,
        # steps trained at the spiked rate in this process (a resumed run counts from its restart)
        **({"pathology/lr_spike_steps": float(spike_steps)} if spiked else {}),
    }
