"""lowprec_attention: Config, the bias measurement and the low-precision training loop."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F

from kernels import attention as attn

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
PRECISIONS = ("paper", "kernel")
HELDOUT_FRAC = 0.1
"""Share of the corpus's files held out for the evaluation loss (by a hash of each path)."""
SPIKE_RATIO = 1.5
"""A logged train loss (the mean over `log_every` steps) past the first tenth of the run that
exceeds this multiple of the lowest logged loss before it is a spike: the paper's failure is a
loss that leaves its running minimum, not noise around it. Logged means, not single steps: a
step's loss at batch 8 x 32 bytes swings past 1.5x its running minimum by noise alone (measured:
65-106 such steps in 1000 in every arm, baseline or fix)."""


@dataclass(frozen=True)
class Config:
    stable_rounding: bool = False
    """The paper's fix: shift a tile's row max when it is attained more than once."""
    stable_rule: str = "paper"
    """The fix's shift: 'paper' (beta*m / 0, the released code's, reproduced here) or 'bounded' (the kernels' default)."""
    precision: str = "paper"
    """Reference arithmetic: 'paper' (statistics in the input dtype, as the paper's code) or 'kernel' (fp32, as FA-2)."""
    block: int = 512
    """Attention tile (block_m = block_n) of the reference; the paper's code uses 512."""
    dtype: str = "bf16"
    """Low precision of attention inputs and of the training run's matmuls: 'bf16', 'fp16' or 'fp32'."""
    bias_seeds: int = 5
    """Tied-maximum input sets measured for the error-bias statistic."""
    bias_queries: int = 128
    """Queries per bias input set."""
    bias_keys: int = 1024
    """Keys per bias input set (most of them tie at every row's maximum)."""
    bias_head_dim: int = 64
    """Head dimension of the bias inputs."""
    v_mean: float = -1.0
    """Mean of V in the bias inputs; the bias takes its sign from it."""
    impl: str = "auto"
    """Attention in the training run: 'auto' (Triton on CUDA, else the reference), 'triton' or 'reference'."""
    width: int = 768
    """Decoder width (GPT-2 small: 768)."""
    depth: int = 12
    """Decoder blocks (GPT-2 small: 12)."""
    head_dim: int = 64
    """Per-head dimension."""
    seq_len: int = 1024
    """Context length in bytes."""
    batch_size: int = 32
    """Sequences per step."""
    steps: int = 20000
    """Training steps."""
    lr: float = 6e-4
    """Peak learning rate (AdamW, linear warmup then linear decay)."""
    weight_decay: float = 0.1
    """AdamW weight decay on hidden matrices."""
    warmup_frac: float = 0.02
    """Fraction of steps in linear warmup."""
    data: str = "stdlib"
    """'stdlib' (the Python standard library's source) or a folder of text files."""
    max_bytes: int = 0
    """Cap on training bytes read from the corpus (0: all of it)."""
    eval_every: int = 500
    """Evaluate the held-out loss every this many steps (and at the end)."""
    eval_tokens: int = 65536
    """Held-out tokens per evaluation."""
    log_every: int = 10
    """Report train/loss every this many steps."""
    checkpoint_every: int = 1000
    """Save a checkpoint every this many steps (and at the end)."""
    seed: int = 0
    """Seed of the bias inputs, the initialization and the data order."""


def smoke() -> Config:
    """Seconds on a CPU: two bias input sets and a one-block decoder trained 40 steps in bf16 (the
    emulating reference rounds tensor by tensor, so the decoder is kept tiny)."""
    return Config(bias_seeds=2, width=32, depth=1, head_dim=16, seq_len=32, batch_size=8, steps=40, lr=3e-3,
                  max_bytes=1_000_000, eval_every=20, eval_tokens=2048, log_every=5, checkpoint_every=20)


def validate(cfg: Config, world_size: int = 1) -> None:
    if cfg.precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {cfg.precision!r}")
    if cfg.stable_rule not in attn.STABLE_RULES:
        raise ValueError(f"stable_rule must be one of {attn.STABLE_RULES}, got {cfg.stable_rule!r}")
    if cfg.dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {cfg.dtype!r}")
    if cfg.impl not in attn.IMPLS:
        raise ValueError(f"impl must be one of {attn.IMPLS}, got {cfg.impl!r}")
    if cfg.impl == "triton" and not attn.HAS_TRITON:
        raise ValueError("impl='triton' needs Triton installed; use impl='reference'")
    for name in ("block", "bias_seeds", "bias_queries", "bias_keys", "bias_head_dim", "width", "depth", "head_dim",
                 "seq_len", "batch_size", "steps", "eval_every", "eval_tokens", "log_every", "checkpoint_every"):
        if getattr(cfg, name) <= 0:
            raise ValueError(f"{name} must be positive, got {getattr(cfg, name)}")
    if cfg.block & (cfg.block - 1):
        raise ValueError(f"block must be a power of two, got {cfg.block}")
    if cfg.width % cfg.head_dim:
        raise ValueError(f"width={cfg.width} is not a multiple of head_dim={cfg.head_dim}")
    if cfg.bias_seeds < 2:
        raise ValueError(f"bias_seeds must be at least 2 (the claims judge a spread), got {cfg.bias_seeds}")
    if cfg.batch_size % world_size:
        raise ValueError(f"batch_size={cfg.batch_size} does not split over {world_size} workers")
    if cfg.data != "stdlib":
        from components.lm.corpus import corpus_files

        corpus_files(cfg.data)


def _fix(cfg: Config) -> bool | str:
    """The kernels' stable_rounding argument for this config."""
    return cfg.stable_rule if cfg.stable_rounding else False


def bias_statistics(cfg: Config) -> dict[str, float]:
    """`error_bias` of the emulated flash attention on tied-maximum inputs, one value per seed."""
    dtype = DTYPES[cfg.dtype]
    out: dict[str, float] = {}
    rs = []
    for i in range(cfg.bias_seeds):
        seed = cfg.seed * 1000 + i
        q, k, v = attn.tied_max_inputs(seed, queries=cfg.bias_queries, keys=cfg.bias_keys, head_dim=cfg.bias_head_dim,
                                       v_mean=cfg.v_mean, dtype=dtype)
        o, _ = attn.reference.flash_attention_forward(q, k, v, stable_rounding=_fix(cfg), block_m=cfg.block,
                                                      block_n=cfg.block, precision=cfg.precision)
        r = attn.error_bias(o, attn.attention_fp64(q, k, v))
        out[f"eval/bias_r/seed{i}"] = r
        rs.append(r)
    mean = sum(rs) / len(rs)
    out["eval/bias_r_mean"] = mean
    out["eval/bias_r_abs_min"] = min(abs(r) for r in rs)
    out["eval/bias_r_abs_max"] = max(abs(r) for r in rs)
    return out


def attention_fn(cfg: Config, device: torch.device, probe: dict[str, float] | None = None):
    """The decoder's attention: q, k, v [B, H, T, D] in the run's low precision, causal.

    probe: while probe["on"] is truthy, probe["logit_max"] keeps the largest scaled score q.k/sqrt(D)
    seen (the paper's runaway shows as growing attention logits); off, it costs nothing."""
    dtype = DTYPES[cfg.dtype]
    if attn.resolve_impl(cfg.impl, torch.empty(0, device=device)) == "triton":
        kernel = partial(attn.flash_attention_triton, causal=True, stable_rounding=_fix(cfg))
    else:
        kernel = partial(attn.flash_attention_reference, causal=True, stable_rounding=_fix(cfg),
                         block_m=cfg.block, block_n=cfg.block, precision=cfg.precision)

    def attention(q, k, v):
        out_dtype = q.dtype
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
        if probe is not None and probe.get("on"):
            with torch.no_grad():
                s = (q.float() @ k.float().transpose(-1, -2)) * q.shape[-1] ** -0.5  # [B, H, T, T]
                causal = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
                probe["logit_max"] = max(probe.get("logit_max", 0.0), s.masked_fill(~causal, -math.inf).amax().item())
        return kernel(q, k, v).to(out_dtype)

    return attention


def build_lm(cfg: Config):
    """The shared GPT (`components.lm.gpt`) at its base width and depth: no muP/CompleteP
    rescaling, GPT-2-style init; AdamW at one learning rate, weight decay on the hidden matrices."""
    from components.lm.corpus import data_vocab
    from components.lm.gpt import GPT, adamw

    model = GPT(vocab=data_vocab(cfg.data), width=cfg.width, depth=cfg.depth, head_dim=cfg.head_dim,
                seq_len=cfg.seq_len, ffn_mult=4, activation="gelu", base_width=cfg.width, base_depth=cfg.depth,
                init_std=0.02)
    return model, adamw(model, hidden_lr=cfg.lr, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))


def qk_spectral_max(model) -> float:
    """The largest spectral norm of any block's W_Q or W_K (the paper: the bias raises it); inf
    once a weight is not finite (a diverged run)."""
    norms = []
    for block in model.blocks:
        w_q, w_k, _ = block.qkv.weight.detach().float().chunk(3, dim=0)  # [C, C] each
        if not (torch.isfinite(w_q).all() and torch.isfinite(w_k).all()):
            return math.inf
        norms += [torch.linalg.matrix_norm(w_q, ord=2).item(), torch.linalg.matrix_norm(w_k, ord=2).item()]
    return max(norms)


def hidden_norm(model) -> float:
    """Frobenius norm of the blocks' matrices, all together."""
    total = math.sqrt(sum(p.detach().float().square().sum().item() for p in model.hidden_matrices()))
    return total if math.isfinite(total) else math.inf


@dataclass
class Spikes:
    """Loss spikes as the run goes: logged losses past step `settle` that leave their running
    minimum by SPIKE_RATIO, or are not finite; and the largest ratio of a finite one to that minimum.

    `settle` is the warmup or the first tenth of the run, whichever is longer: at a high learning
    rate every arm's loss bounces off its first fast drop (measured: at lr 1e-2, 3-6 such steps in
    the baseline and both fixes alike), which is not the paper's late explosion."""

    settle: int
    low: float = math.inf
    spikes: float = 0.0
    jump: float = 1.0
    loss_max: float = 0.0

    def add(self, step: int, loss: float) -> None:
        if not math.isfinite(loss):
            self.spikes += step > self.settle
            return
        if step > self.settle and math.isfinite(self.low):
            self.spikes += loss > SPIKE_RATIO * self.low
            self.jump = max(self.jump, loss / self.low)
            self.loss_max = max(self.loss_max, loss)
        self.low = min(self.low, loss)


def _evaluate(model, batches, device, autocast) -> float:
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad(), autocast():
        for x, y in batches:
            logits = model(x.to(device)).float()
            total += F.cross_entropy(logits.flatten(0, 1), y.to(device).flatten(), reduction="sum").item()
            count += y.numel()
    model.train()
    return total / count


def train(cfg: Config, run) -> dict[str, float]:
    from components.lm.corpus import BatchSampler, heldout_batches, load_corpus
    from components.lm.schedule import lr_factor

    validate(cfg, run.world_size)
    bias = bias_statistics(cfg)
    torch.manual_seed(cfg.seed)
    train_bytes, held_bytes = load_corpus(cfg.data, heldout_frac=HELDOUT_FRAC, max_bytes=cfg.max_bytes)
    model, optimizer = build_lm(cfg)
    probe: dict[str, float] = {"on": 0.0}
    for block in model.blocks:
        block.attention = attention_fn(cfg, run.device, probe)
    norm0, spectral0 = hidden_norm(model), qk_spectral_max(model)
    model, optimizer = run.prepare(model, optimizer)
    raw = getattr(model, "module", model)
    sampler = BatchSampler(train_bytes, cfg.seq_len, cfg.batch_size // run.world_size, seed=cfg.seed, rank=run.rank)
    heldout = heldout_batches(held_bytes, cfg.seq_len, cfg.eval_tokens, batch=32)
    dtype = DTYPES[cfg.dtype]
    autocast = partial(torch.autocast, device_type=run.device.type, dtype=dtype, enabled=dtype != torch.float32)

    start = 0
    state = run.restore()
    if state is not None:
        raw.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        sampler.load_state(state["sampler"])
        start = int(state["step"])
    spikes = Spikes(settle=max(1, round(cfg.warmup_frac * cfg.steps), cfg.steps // 10))
    if state is not None and "spikes" in state:  # a checkpoint of an older run has none: measured from here
        norm0, spectral0, probe["logit_max"] = state["norm0"], state["spectral0"], state["logit_max"]
        spikes = Spikes(**state["spikes"])
    window, n = 0.0, 0
    train_loss = eval_loss = math.nan
    nonfinite = float(state.get("nonfinite", 0.0)) if state is not None else 0.0
    for step in range(start + 1, cfg.steps + 1):
        factor = lr_factor(step, cfg.steps, cfg.warmup_frac)
        for g in optimizer.param_groups:
            g["lr"] = cfg.lr * factor
        x, y = sampler.next()
        x, y = x.to(run.device), y.to(run.device)
        probe["on"] = float(step % cfg.log_every == 0 or step == cfg.steps)  # logits measured at log steps only
        with autocast():
            logits = model(x)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        probe["on"] = 0.0
        if not math.isfinite(loss.item()):
            nonfinite += 1  # the paper's failure is a loss that explodes; count it, do not hide it
        window += loss.item()
        n += 1
        metrics: dict[str, float] = {}
        if step % cfg.log_every == 0 or step == cfg.steps:
            train_loss = window / n
            metrics["train/loss"] = train_loss
            spikes.add(step, train_loss)
            window, n = 0.0, 0
        if step % cfg.eval_every == 0 or step == cfg.steps:
            eval_loss = _evaluate(model, heldout, run.device, autocast)
            metrics["eval/loss"] = eval_loss
        if metrics:
            metrics["progress"] = step / cfg.steps
            if step == start + 1 or step == cfg.steps:
                metrics.update(bias)
            run.report(metrics, step=step)
        if step % cfg.checkpoint_every == 0 or step == cfg.steps:
            run.save({"step": step, "model": raw.state_dict(), "optimizer": optimizer.state_dict(),
                      "sampler": sampler.state(), "nonfinite": nonfinite, "spikes": dataclasses.asdict(spikes),
                      "norm0": norm0, "spectral0": spectral0, "logit_max": probe.get("logit_max", 0.0)})
    if math.isnan(eval_loss):
        eval_loss = _evaluate(model, heldout, run.device, autocast)
    stability = {"train/loss_spikes": spikes.spikes, "train/loss_jump": spikes.jump, "train/loss_max": spikes.loss_max,
                 "train/loss_min": spikes.low,
                 "train/weight_norm_growth": hidden_norm(raw) / norm0,
                 "train/qk_spectral_growth": qk_spectral_max(raw) / spectral0,
                 "train/attn_logit_max": probe.get("logit_max", 0.0)}
    return {**bias, "train/loss": train_loss, "eval/loss": eval_loss, "train/nonfinite_steps": nonfinite, **stability}
