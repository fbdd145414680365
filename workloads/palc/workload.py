"""palc: Config, the preference-training loop and the evaluation (see the package docstring)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Literal

import torch

from orchestrator.basemodel import base_world, check_base, load_base
from workloads.palc.data import generation_prompts, gentle_share, make_pairs, pair_batch, split_entities
from workloads.palc.model import (
    Calibrator, base_forward, freeze, generate, group_by_length, latency, margins, mean_logprob, param_digest,
    preference_loss,
)


MAX_WORKERS = 1
"""palc trains a small calibrator on one worker: the runner refuses more."""


@dataclass(frozen=True)
class Config:
    base: str = "tiny-local"
    """Frozen base model: tiny-local[:k=v,...], a local save_pretrained folder or a hub id."""
    base_seed: int = 0
    """tiny-local build seed (keep it fixed across a sweep; each value is its own build)."""
    base_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """dtype the base is loaded in ('auto': the checkpoint's own); the calibrator is float32."""
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
    """Synthetic preference pairs about the training entities."""
    heldout_pairs: int = 500
    """Pairs about the held-out entities, for the preference accuracy."""
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
    check_base(cfg.base)
    for name in ("bottleneck", "train_pairs", "heldout_pairs", "heldout_entities", "steps", "batch", "gen_new_tokens",
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
    if cfg.latency_clock not in ("wall", "cpu") or cfg.base_dtype not in ("auto", "float32", "bfloat16", "float16"):
        raise ValueError("latency_clock must be 'wall' or 'cpu' and base_dtype one of auto/float32/bfloat16/float16")


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
    world = base_world(cfg.base, seed=cfg.base_seed)
    base, tok = load_base(cfg.base, seed=cfg.base_seed, device=dev, dtype=None if cfg.base_dtype == "auto" else cfg.base_dtype)
    freeze(base)
    digest = param_digest(base)
    train_ents, held_ents = split_entities(world, cfg.heldout_entities, cfg.seed)
    pairs = make_pairs(world, train_ents, cfg.train_pairs, f"{cfg.seed}-train", cfg.context_prob)
    held = make_pairs(world, held_ents, cfg.heldout_pairs, f"{cfg.seed}-heldout", cfg.context_prob)
    vocab, hidden = base.get_output_embeddings().weight.shape
    torch.manual_seed(cfg.seed)
    cal = Calibrator(hidden, vocab, cfg.bottleneck, relu=cfg.relu, dropout=cfg.dropout, up_init_std=cfg.up_init_std).to(dev)
    opt = torch.optim.AdamW(cal.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)

    start = 0
    state = run.restore()
    if state is not None:
        cal.load_state_dict(state["calibrator"])
        opt.load_state_dict(state["optimizer"])
        if "rng" in state:  # the dropout masks' generator: a resumed run draws the masks it would have
            torch.set_rng_state(state["rng"])
        start = int(state["step"])

    def to_dev(b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: v.to(dev) for k, v in b.items()}

    loss_v, acc_v, window_t, window_n = math.nan, math.nan, time.perf_counter(), 0
    cal.train()
    for step in range(start, cfg.steps):
        # The batch is a function of (seed, step), so a resumed run sees the batches it would have.
        g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        batch = to_dev(pair_batch(tok, [pairs[i] for i in torch.randint(len(pairs), (cfg.batch,), generator=g).tolist()]))
        for group in opt.param_groups:
            group["lr"] = lr_at(cfg, step)
        logits, h = base_forward(base, batch["ids"], batch["attn"])  # frozen, no graph
        lp = mean_logprob(logits + cfg.gamma_train * cal(h), batch["ids"], batch["resp"])
        loss = preference_loss(lp)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(cal.parameters(), cfg.clip)
        opt.step()
        window_n += 1
        done = step + 1
        if done % cfg.log_every == 0 or done == cfg.steps:
            n = cfg.batch
            loss_v, acc_v = loss.item(), float((lp[:n] > lp[n:]).float().mean())
            now = time.perf_counter()
            run.report({"train/loss": loss_v, "train/pref_acc": acc_v, "train/lr": lr_at(cfg, step),
                        "perf/steps_per_s": window_n / max(now - window_t, 1e-9), "progress": done / cfg.steps}, step=done)
            window_t, window_n = now, 0
        if done % cfg.checkpoint_every == 0 or done == cfg.steps:
            run.save({"step": done, "calibrator": cal.state_dict(), "optimizer": opt.state_dict(),
                      "rng": torch.get_rng_state()})

    cal.eval()
    final = evaluate(cfg, base, tok, cal, held, held_ents, dev)
    final["train/loss"], final["train/pref_acc"] = loss_v, acc_v
    final["eval/base_unchanged"] = float(param_digest(base) == digest)
    final["eval/base_trainable_params"] = float(sum(p.numel() for p in base.parameters() if p.requires_grad))
    final["eval/base_grads"] = float(sum(p.grad is not None for p in base.parameters()))
    final["eval/trainable_params"] = float(sum(p.numel() for p in cal.parameters() if p.requires_grad))
    final["eval/expected_params"] = float(cfg.bottleneck * (hidden + vocab))
    run.report({**{k: v for k, v in final.items() if k.startswith(("eval/", "perf/"))}, "progress": 1.0}, step=cfg.steps)
    return final


@torch.no_grad()
def evaluate(cfg: Config, base: Any, tok: Any, cal: Calibrator, held: list, held_ents: list[str],
             dev: torch.device) -> dict[str, float]:
    out: dict[str, float] = {}
    # Held-out preference accuracy at every gamma (gamma 0 is the base model).
    margin: dict[float, list[torch.Tensor]] = {g: [] for g in cfg.gammas}
    gamma0_diff = 0.0
    for i in range(0, len(held), 256):
        batch = {k: v.to(dev) for k, v in pair_batch(tok, held[i: i + 256]).items()}
        for g, m in margins(base, cal, batch, list(cfg.gammas)).items():
            margin[g].append(m)
        logits, h = base_forward(base, batch["ids"], batch["attn"])
        plain = base(input_ids=batch["ids"], attention_mask=batch["attn"]).logits.float()
        gamma0_diff = max(gamma0_diff, float((logits + 0.0 * cal(h) - plain).abs().max()))
    for g in cfg.gammas:
        m = torch.cat(margin[g])
        out[f"eval/pref_acc/{gamma_key(g)}"] = float((m > 0).float().mean())
        out[f"eval/margin/{gamma_key(g)}"] = float(m.mean())
    out["eval/pref_acc_base"] = out[f"eval/pref_acc/{gamma_key(0.0)}"]
    out["eval/pref_acc"] = out[f"eval/pref_acc/{gamma_key(cfg.gamma_eval)}"]
    out["eval/gamma0_max_abs_logit_diff"] = gamma0_diff

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
