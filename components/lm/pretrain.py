"""A pre-trained Celerity-shaped GPT, got the way a user gets one: built here once and cached, or
read from the run folder `ladder run celerity_lm` wrote.

- `LMRecipe`: everything the trained weights depend on besides the seed (the model's shape, its
  data, its training), under the names and defaults of celerity_lm's `Config`; `PRESETS` holds
  celerity_lm's default and smoke sizes.
- `build_model` and `budget`: the GPT of a recipe and its token budget (steps, muP hidden-matrix
  learning rate, weight decay from tau). celerity_lm builds its model and budget with them.
- `pretrain`: the training loop, step for step celerity_lm's (the same seeding, sampler, muP AdamW,
  warmup-then-linear-decay schedule and clipping), so a recipe and seed train the weights that
  `ladder run celerity_lm` trains with that config and seed. It reports through a callback and
  resumes from the state it hands to `save`.
- `pretrained_lm`: that LM from the ladder cache (`$LADDER_CACHE/lm/celerity-<key>/`, `lm.pt` and
  `lm.json`), built first when missing. The key covers the recipe, the seed, the source of the
  modules a build runs (this file, gpt, corpus, schedule, split, tokens) and torch's and Python's
  versions (the default corpus is Python's own standard library): change any and the LM is trained
  again. One process builds, under a file lock; the others wait and read it. The builder keeps its
  checkpoints beside the folder, so a builder killed midway is continued by the next one, and
  renames the finished folder into place, so a reader sees a whole model or none.
- `run_checkpoint` and `load_run`: the recipe and weights of a celerity_lm run folder (its
  `run.json` and newest `step-*.pt` checkpoint).

Nothing here imports `orchestrator`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import platform
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
import torch.nn.functional as F

from components.cache import cache_root
from components.lm.corpus import BatchSampler, data_vocab, heldout_batches, load_data
from components.lm.gpt import GPT, adamw
from components.lm.schedule import lr_factor

META_FILE = "lm.json"
WEIGHTS_FILE = "lm.pt"
BUILD_MODULES = ("pretrain", "gpt", "corpus", "schedule", "split", "tokens")
"""The modules of components.lm that a build runs: their source is in the cache key."""
RUN_WORKLOADS = ("celerity_lm",)
"""Workloads whose run folders hold this GPT under these config names."""

Report = Callable[[dict[str, float], int], None]


@dataclass(frozen=True)
class LMRecipe:
    """The trained LM's shape, data and training: celerity_lm's `Config` fields of the same names."""

    width: int = 256
    """Model width d_model; a multiple of head_dim."""
    depth: int = 6
    """Number of transformer blocks."""
    head_dim: int = 32
    """Per-head dimension (heads = width / head_dim)."""
    seq_len: int = 256
    """Context length in tokens (bytes for a text corpus)."""
    ffn_mult: int = 4
    """MLP hidden size as a multiple of width."""
    activation: str = "gelu"
    """MLP activation: 'gelu' or 'relu2'."""
    init_std: float = 0.02
    """Init std of embeddings, and of hidden matrices at base_width (muP-scaled elsewhere)."""
    base_width: int = 48
    """Width the base hyperparameters were tuned at (muP)."""
    base_depth: int = 3
    """Depth of the proxy model; residual branches are scaled by base_depth / depth (CompleteP)."""
    data: str = "stdlib"
    """'stdlib' (the Python standard library's source), a folder of text files, or a tokenized dataset folder."""
    heldout_frac: float = 0.1
    """Fraction of text files held out for evaluation (by a hash of their path)."""
    max_bytes: int = 0
    """Cap on training bytes (or tokens) read (0: all of it)."""
    batch_size: int = 64
    """Sequences per step."""
    tpp: float = 20.0
    """Token budget as tokens per (non-embedding) parameter."""
    lr: float = 2e-2
    """Peak base learning rate; hidden matrices use lr * base_width / width."""
    weight_decay: float = 0.1
    """AdamW weight decay on hidden matrices (ignored when tau is set)."""
    tau: float | None = None
    """Target AdamW timescale B/(eta*lambda*D); when set, weight decay is solved from it."""
    warmup_frac: float = 0.05
    """Fraction of steps in linear warmup before the linear decay to zero."""
    beta1: float = 0.9
    """AdamW first-moment decay."""
    beta2: float = 0.95
    """AdamW second-moment decay."""
    grad_clip: float = 1.0
    """Global gradient-norm clip (0 disables)."""
    eval_tokens: int = 32768
    """Size of the fixed held-out set the LM's loss is measured on."""

    @classmethod
    def of(cls, config: Any) -> LMRecipe:
        """The recipe of a config with these fields by name: a celerity_lm `Config`, or the config
        dict of its run.json (fields it lacks keep the defaults; others are ignored)."""
        values = config if isinstance(config, Mapping) else dataclasses.asdict(config)
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})

    def check(self) -> None:
        """Raises ValueError naming the field when the recipe cannot be trained."""
        for name in ("width", "depth", "head_dim", "seq_len", "ffn_mult", "batch_size", "eval_tokens", "base_width",
                     "base_depth"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not self.tpp > 0:
            raise ValueError(f"tpp must be positive, got {self.tpp}")
        if self.width % self.head_dim:
            raise ValueError(f"width={self.width} is not a multiple of head_dim={self.head_dim}")
        if self.activation not in ("gelu", "relu2"):
            raise ValueError(f"activation must be 'gelu' or 'relu2', got {self.activation!r}")


PRESETS = {
    "default": LMRecipe(),
    "smoke": LMRecipe(width=48, depth=2, head_dim=16, seq_len=64, batch_size=16, tpp=4.0, base_depth=2,
                      max_bytes=2_000_000, eval_tokens=8192),
}
"""celerity_lm's `Config()` and `smoke()` as recipes (a test keeps them equal)."""


def build_model(recipe: LMRecipe) -> GPT:
    """The GPT of `recipe` (or of any config with its model fields by name, as celerity_lm's), freshly
    initialized from torch's global generator."""
    return GPT(
        vocab=data_vocab(recipe.data),
        width=recipe.width,
        depth=recipe.depth,
        head_dim=recipe.head_dim,
        seq_len=recipe.seq_len,
        ffn_mult=recipe.ffn_mult,
        activation=recipe.activation,
        base_width=recipe.base_width,
        base_depth=recipe.base_depth,
        init_std=recipe.init_std,
    )


@dataclass(frozen=True)
class Budget:
    params: int
    tokens: int
    steps: int
    batch_tokens: int
    hidden_lr: float
    weight_decay: float
    tau: float


def budget(recipe: LMRecipe, params: int) -> Budget:
    """Steps, hidden-matrix LR, weight decay and tau for a model of `params` non-embedding parameters
    (`recipe`: or any config with its training fields by name, as celerity_lm's)."""
    batch_tokens = recipe.batch_size * recipe.seq_len
    tokens_target = recipe.tpp * params
    steps = max(1, math.ceil(tokens_target / batch_tokens))
    tokens = steps * batch_tokens
    hidden_lr = recipe.lr * recipe.base_width / recipe.width
    if recipe.tau is not None:
        weight_decay = batch_tokens / (hidden_lr * recipe.tau * tokens)
    else:
        weight_decay = recipe.weight_decay
    tau = batch_tokens / (hidden_lr * weight_decay * tokens) if weight_decay > 0 else math.inf
    return Budget(params, tokens, steps, batch_tokens, hidden_lr, weight_decay, tau)


def _fraction_steps(steps: int, frac: float) -> set[int]:
    """The steps at every multiple of `frac` of the run, the last always among them (as
    orchestrator.run.fraction_steps, which celerity_lm evaluates and checkpoints at)."""
    if frac <= 0:
        return {steps}
    return {min(steps, max(1, round(j * frac * steps))) for j in range(1, math.ceil(1 / frac) + 1)} | {steps}


@torch.no_grad()
def heldout_loss(model: torch.nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]], device: Any) -> float:
    """Mean next-token cross-entropy over the held-out batches (nats per token)."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for x, y in batches:
        logits = model(x.to(device))
        total += F.cross_entropy(logits.flatten(0, 1), y.to(device).flatten(), reduction="sum").item()
        count += y.numel()
    model.train(was_training)
    return total / count


def pretrain(recipe: LMRecipe, seed: int, *, device: Any = "cpu", report: Report | None = None,
             state: dict[str, Any] | None = None, save: Callable[[dict[str, Any]], None] | None = None,
             eval_every_frac: float = 0.1, checkpoint_every_frac: float = 0.1,
             log_every: int = 10) -> tuple[GPT, dict[str, float]]:
    """Train the recipe's GPT from `seed`: (the model in eval mode on `device`, {"step", "steps",
    "eval_loss", "train_loss"}).

    `report(metrics, step)` gets `train/loss` (mean since the last report) every `log_every` steps,
    `eval/loss` on the held-out set at every `eval_every_frac` of the run, and `progress` with each.
    `save(state)` gets the loop's whole state at every `checkpoint_every_frac`; passing that state
    back as `state` continues the run where it was saved, with the weights an uninterrupted run
    reaches."""
    recipe.check()
    torch.manual_seed(seed)
    train_data, held_data = load_data(recipe.data, heldout_frac=recipe.heldout_frac, max_bytes=recipe.max_bytes)
    model = build_model(recipe)
    plan = budget(recipe, model.non_embedding_params())
    optimizer = adamw(model, hidden_lr=plan.hidden_lr, lr=recipe.lr, weight_decay=plan.weight_decay,
                      betas=(recipe.beta1, recipe.beta2))
    peak_lrs = [g["lr"] for g in optimizer.param_groups]
    model.to(device)
    sampler = BatchSampler(train_data, recipe.seq_len, recipe.batch_size, seed=seed, rank=0)
    heldout = heldout_batches(held_data, recipe.seq_len, recipe.eval_tokens, batch=32)
    start = 0
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        sampler.load_state(state["sampler"])
        start = int(state["step"])

    eval_at = _fraction_steps(plan.steps, eval_every_frac)
    save_at = _fraction_steps(plan.steps, checkpoint_every_frac)
    window_loss, window_n = 0.0, 0
    train_loss = eval_loss = math.nan
    model.train()
    for step in range(start + 1, plan.steps + 1):
        factor = lr_factor(step, plan.steps, recipe.warmup_frac)
        for group, peak in zip(optimizer.param_groups, peak_lrs):
            group["lr"] = peak * factor
        x, y = sampler.next()
        x, y = x.to(device), y.to(device)
        logits = model(x)  # [B, T, vocab]
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if recipe.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)
        optimizer.step()
        window_loss += loss.item()
        window_n += 1

        metrics: dict[str, float] = {}
        if step % log_every == 0 or step == plan.steps:
            train_loss = window_loss / window_n
            metrics["train/loss"] = train_loss
            window_loss, window_n = 0.0, 0
        if step in eval_at:
            eval_loss = heldout_loss(model, heldout, device)
            metrics["eval/loss"] = eval_loss
        if metrics and report is not None:
            report({**metrics, "progress": step / plan.steps}, step)
        if step in save_at and save is not None:
            save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                  "sampler": sampler.state()})
    if math.isnan(eval_loss):  # a run resumed after its last evaluation
        eval_loss = heldout_loss(model, heldout, device)
    return model.eval(), {"step": plan.steps, "steps": plan.steps, "eval_loss": eval_loss, "train_loss": train_loss}


# --- the cached artefact -----------------------------------------------------------------------


def build_key(recipe: LMRecipe, seed: int) -> str:
    blob = json.dumps({"recipe": dataclasses.asdict(recipe), "seed": seed, "torch": torch.__version__,
                       "python": platform.python_version()}, sort_keys=True)
    h = hashlib.sha256(blob.encode())
    here = Path(__file__).parent
    for name in BUILD_MODULES:
        h.update(name.encode() + (here / f"{name}.py").read_bytes())
    return h.hexdigest()[:16]


def artefact_dir(recipe: LMRecipe, seed: int) -> Path:
    return cache_root() / "lm" / f"celerity-{build_key(recipe, seed)}"


def _blank(recipe: LMRecipe) -> GPT:
    """The recipe's GPT to load weights into: its initialization leaves the caller's generator alone."""
    with torch.random.fork_rng(devices=[]):
        return build_model(recipe)


def _write_atomic(obj: Any, path: Path) -> None:
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def ensure_built(recipe: LMRecipe, seed: int, *, device: Any = "cpu", report: Report | None = None) -> Path:
    """The cached LM's folder, trained first when missing (once, whoever asks concurrently; `report`
    sees that training's metrics, and nothing when the cache already holds it)."""
    from filelock import FileLock

    final = artefact_dir(recipe, seed)
    if (final / META_FILE).is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(final) + ".lock"):
        if (final / META_FILE).is_file():  # another process built it while we waited
            return final
        partial = final.with_name(f".{final.name}.partial.pt")  # only the lock's holder reads or writes it
        state = None
        if partial.is_file():
            try:
                state = torch.load(partial, map_location="cpu", weights_only=True)
            except Exception:  # torn by a kill mid-write: start again
                state = None
        wall0 = time.perf_counter()
        model, info = pretrain(recipe, seed, device=device, report=report, state=state,
                               save=lambda s: _write_atomic(s, partial))
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
        try:
            torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, tmp / WEIGHTS_FILE)
            meta = {"recipe": dataclasses.asdict(recipe), "seed": seed, **info,
                    "params": model.non_embedding_params(), "torch": torch.__version__,
                    "python": platform.python_version(), "build_wall_s": time.perf_counter() - wall0}
            (tmp / META_FILE).write_text(json.dumps(meta, indent=1, sort_keys=True))
            os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache may be shared
            if final.exists():  # a half-made folder from a killed builder without the lock
                shutil.rmtree(final)
            os.rename(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        partial.unlink(missing_ok=True)
    return final


def load_artefact(folder: str | Path, device: Any = "cpu") -> tuple[GPT, dict[str, Any]]:
    """(the cached LM in eval mode on `device`, its lm.json)."""
    folder = Path(folder)
    meta = json.loads((folder / META_FILE).read_text())
    model = _blank(LMRecipe(**meta["recipe"]))
    model.load_state_dict(torch.load(folder / WEIGHTS_FILE, map_location="cpu", weights_only=True))
    return model.to(device).eval(), meta


def pretrained_lm(recipe: LMRecipe, seed: int, *, device: Any = "cpu",
                  report: Report | None = None) -> tuple[GPT, dict[str, Any]]:
    """The recipe's GPT trained from `seed` (the cached one, trained first when missing) in eval
    mode on `device`, and its lm.json: {"recipe", "seed", "step", "steps", "eval_loss", ...}."""
    return load_artefact(ensure_built(recipe, seed, device=device, report=report), device)


# --- a celerity_lm run folder ------------------------------------------------------------------


def _step_of(path: Path) -> int:
    tail = path.stem.split("-", 1)[-1]
    return int(tail) if tail.isdigit() else -1


def run_checkpoint(folder: str | Path) -> tuple[LMRecipe, Path]:
    """The recipe in a celerity_lm run folder's run.json and its newest checkpoint file; ValueError
    naming what is missing."""
    root = Path(folder)
    record = root / "run.json"
    if not record.is_file():
        raise ValueError(f"{str(folder)!r} has no run.json: pass the folder `ladder run celerity_lm` printed "
                         "(ladder-runs/celerity_lm/<run>/)")
    meta = json.loads(record.read_text())
    if meta.get("workload") not in RUN_WORKLOADS:
        raise ValueError(f"{str(folder)!r} is a run of {meta.get('workload')!r}, not of {' or '.join(RUN_WORKLOADS)}: "
                         "pass the folder `ladder run celerity_lm` printed")
    recipe = LMRecipe.of(meta.get("config", {}))
    recipe.check()
    found = sorted((p for p in root.rglob("step-*.pt") if _step_of(p) >= 0), key=_step_of)
    if not found:
        raise ValueError(f"{str(folder)!r} holds no checkpoint (step-*.pt): the run saved none yet")
    return recipe, found[-1]


def load_run(folder: str | Path, device: Any = "cpu") -> tuple[GPT, LMRecipe]:
    """(the LM of a celerity_lm run folder's newest checkpoint in eval mode on `device`, its recipe)."""
    recipe, path = run_checkpoint(folder)
    try:
        # weights_only: tensors, numbers and containers only, so a shared folder cannot run code
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ValueError(f"checkpoint {path} is unreadable ({type(exc).__name__}: {exc})") from exc
    state = payload.get("state", payload) if isinstance(payload, dict) else None  # a ladder checkpoint wraps it
    if not isinstance(state, dict) or "model" not in state:
        raise ValueError(f"checkpoint {path} holds no model weights (a ZeRO run's checkpoints are sharded): "
                         "quantize a run trained with zero_stage=0")
    model = _blank(recipe)
    model.load_state_dict(state["model"])
    return model.to(device).eval(), recipe
