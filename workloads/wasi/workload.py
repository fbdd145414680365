"""wasi: Config, the pretraining and fine-tuning loops, and the per-step measurements (see the
package docstring)."""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from workloads.wasi import files
from workloads.wasi.data import TRANSFERS, Split, augment_batch, load_digits, make_splits
from workloads.wasi.measure import (
    make_optimizer, measure_peak, measure_step, probe_ranks, subspace_diagnostics, time_steps, training_step,
)
from workloads.wasi.model import ViT, WASILinear, load_pretrained, new_head, to_dense, to_wasi
from components import pretrained
from orchestrator.run import devices, fraction_steps

METHODS = ("vanilla", "wasi")


MAX_WORKERS = 1
"""wasi measures one process's saved tensors: one worker, the runner refuses more."""


@dataclass(frozen=True)
class Config:
    method: str = "wasi"
    """'vanilla' (dense fine-tuning, autograd's own linear) or 'wasi' (the block linears trained by WASI)."""
    threshold: float = 0.8
    """WASI: explained-variance threshold epsilon; each layer keeps the smallest rank k whose
    singular values hold this fraction of ||W||_F^2 at the start of fine-tuning, fixed afterwards."""
    act_ranks: tuple[int, int, int] = (32, 16, 32)
    """WASI: Tucker ranks (batch, token, channel) of every compressed activation; 0 keeps a mode
    whole (no factor). The paper picks per-layer ranks offline by explained variance under a
    memory budget (a knapsack over its 'perplexity' table); that selection is not reproduced:
    one fixed triple for every layer."""
    tucker: str = "hosvd"
    """WASI: 'hosvd' finds every mode's factor from the whole activation (the paper's);
    'sequential' (ST-HOSVD) finds each from the activation already projected on the earlier modes'
    factors, batch mode first: the same storage, fewer flops."""
    r_from: str = "new"
    """WASI: R after the subspace step. 'new': R = L^T W, the projection onto the new subspace
    (a reconstruction: sign- and rotation-safe); 'previous': R = L_prev^T W as in the paper's code."""
    data_path: str = ""
    """Images from files: a folder written by Hugging Face datasets' `save_to_disk` (CIFAR-10's
    layout: 'img' and 'label' columns, 'train' and 'test' splits; read with `load_from_disk`) or an
    image folder (CLASS/IMAGE.png, optionally under train/ and test/; read with
    `load_dataset('imagefolder')`), as RGB resized to image_size. Empty: scikit-learn's 8x8 digits."""
    image_column: str = ""
    """data_path: the image column ('' finds 'img', CIFAR-10's, or 'image', an image folder's)."""
    label_column: str = "label"
    """data_path: the integer class column."""
    model: str = ""
    """A transformers ViT fine-tuned instead of the local small ViT: a folder written by
    `save_pretrained` or a hub id already in the local Hugging Face cache (e.g.
    'google/vit-base-patch32-224-in21k', the paper's ViT-B/32), loaded by `ViTModel.from_pretrained`
    with a new head; images are resized to its own size. Needs transfer='none' and pretrain_steps=0
    (it was pretrained elsewhere); patch, dim, depth, heads, mlp_ratio do not apply. Empty: the local ViT."""
    image_size: int = 16
    """Image side: 8 is the digits' own resolution, larger sizes upsample bilinearly (files: every
    image is resized to it; with `model`, the model resizes it again to its own size)."""
    patch: int = 2
    """Patch side in pixels; (image_size / patch)^2 tokens plus a class token."""
    dim: int = 192
    """Token width."""
    depth: int = 6
    """Transformer blocks."""
    heads: int = 3
    """Attention heads (dim must divide by it)."""
    mlp_ratio: int = 4
    """MLP hidden width over dim."""
    init_std: float = 0.02
    """Std of the truncated-normal initialisation of every linear, the class token and positions."""
    transfer: str = "classes"
    """Pretrained-then-fine-tuned setting. 'classes': pretrain on `pretrain_classes`, fine-tune on
    the other digits. 'rotated': pretrain on the fine-tuning training images rotated by 90 degrees
    (a shifted domain), fine-tune on all ten classes upright (twice the test images). 'none': no
    pretraining here (pretrain_steps=0), fine-tune on every class: the paper's setting with `model`."""
    pretrain_classes: tuple[int, ...] = (0, 1, 2, 3, 4)
    """transfer='classes': classes (digits, or a dataset's label values) of the vanilla pretraining;
    the others are fine-tuned on."""
    test_frac: float = 0.5
    """Fraction of each fine-tuning class held out as the test set (the accuracy claim's noise
    falls with its size: 0.5 gives about 450 test images)."""
    pretrain_steps: int = 3000
    """Vanilla AdamW steps of pretraining (cached per process: trials that share the pretraining
    fields and pretrain_seed pretrain once)."""
    pretrain_lr: float = 1e-3
    """Peak AdamW learning rate of pretraining (5% warmup, cosine decay)."""
    pretrain_weight_decay: float = 0.05
    """AdamW weight decay of pretraining."""
    pretrain_batch_size: int = 128
    """Images per pretraining step."""
    finetune_steps: int = 1500
    """Fine-tuning steps, every parameter trained."""
    optimizer: str = "sgd"
    """Fine-tuning optimizer: 'sgd' (the paper's) or 'adamw' (lr, weight_decay apply; momentum is ignored)."""
    batch_size: int = 128
    """Images per fine-tuning step (the paper's 128); batches never run short, so the Tucker batch
    factor keeps its shape. Vanilla's saved activations grow with it, WASI's hardly."""
    lr: float = 0.05
    """Fine-tuning learning rate (the paper's 0.05 with SGD), cosine decay to zero."""
    momentum: float = 0.0
    """Fine-tuning SGD momentum (the paper's 0)."""
    weight_decay: float = 1e-4
    """Fine-tuning weight decay (the paper's 1e-4)."""
    grad_clip: float = 2.0
    """Gradient-norm clip of fine-tuning (the paper's 2.0; 0 disables)."""
    augment: float = 0.5
    """Strength of a random affine warp of training images (rotation up to 12 x strength degrees,
    scale 1 +- 0.1 x strength, shift up to 0.1 x strength of the side; 0: none)."""
    test_views: int = 8
    """Fine-tuning test accuracy is averaged over this many views of every held-out image: the
    image itself and test_views - 1 fixed random warps of it (the training augmentation's
    distribution, the same warps for every method of a seed). More views make the accuracy of
    one model less a matter of a few borderline images, not the test images more numerous."""
    eval_every_frac: float = 0.25
    """Evaluate at every multiple of this fraction of each phase (and at its end)."""
    probe_thresholds: tuple[float, ...] = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99)
    """WASI: after training, saved bytes and flops of one step are also measured (not trained) with
    the weight rank re-chosen at each of these thresholds: the memory-vs-rank curve."""
    probe_act_scales: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0)
    """WASI: the same, with act_ranks scaled by each factor (rounded, at least 1, capped by the shape)."""
    time_rounds: int = 12
    """WASI: after training, time this many interleaved rounds of a training step and an inference
    forward of the WASI model and of its dense twin (the same W) on one batch; the medians give the
    speed-ups (0: not timed)."""
    checkpoint_every_frac: float = 0.25
    """Checkpoint at every multiple of this fraction of each phase (and at its end)."""
    log_every: int = 50
    """Report train/loss (mean since the last report) every this many steps."""
    threads: int = 1
    """CPU threads for torch during the trial, pinned by the runner around `train` (0: leave the process setting)."""
    seed: int = 0
    """Seed of fine-tuning: its split, head, batch order, augmentation and WASI's random starts."""
    pretrain_seed: int = -1
    """Seed of pretraining (its split, initialisation, batches); -1: the same as `seed`. Trials that
    share it fine-tune one pretrained model, as the paper's seeds share one ImageNet checkpoint
    (with transfer='rotated' the pretraining images are the seed's fine-tuning training split)."""


def smoke() -> Config:
    """CPU-sized: 16x16 digits in 4x4 patches (17 tokens), width 48, 2 blocks, fine-tuning batch
    128 (the paper's), 100 pretraining and 60 fine-tuning steps: a few seconds. The reproduction
    (sweeps/repro/wasi.py) trains it 300 + 400 steps.

    Activation ranks (16, 8, 16) with the sequential Tucker keep the linear layers' saved bytes
    about 14x below vanilla and the step's flops about 0.7x. AdamW rather than the paper's plain
    SGD: at this budget SGD leaves the small ViT under-trained, both methods, and an under-trained
    WASI trails vanilla most."""
    return Config(
        image_size=16, patch=4, dim=48, depth=2, heads=3, act_ranks=(16, 8, 16), tucker="sequential",
        pretrain_steps=100, pretrain_lr=2e-3, pretrain_batch_size=64, finetune_steps=60, optimizer="adamw", lr=2e-3,
        weight_decay=1e-4, log_every=20, eval_every_frac=0.5, probe_thresholds=(0.5, 0.7, 0.8, 0.9, 0.99),
        probe_act_scales=(0.5, 1.0, 2.0), time_rounds=3,
    )


def finetune_train_size(cfg: Config) -> int:
    """Fine-tuning training images (the digits hold 174 to 183 images per class)."""
    _, y = load_digits()
    rest = [c for c in range(10) if cfg.transfer == "rotated" or c not in cfg.pretrain_classes]
    return sum(int((y == c).sum()) - round(cfg.test_frac * int((y == c).sum())) for c in rest)


def validate(cfg: Config, world_size: int = 1) -> None:
    """Checks that need no training: raised before anything is launched."""
    if cfg.method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {cfg.method!r}")
    if cfg.optimizer not in ("sgd", "adamw"):
        raise ValueError(f"optimizer must be 'sgd' or 'adamw', got {cfg.optimizer!r}")
    if cfg.tucker not in ("hosvd", "sequential"):
        raise ValueError(f"tucker must be 'hosvd' or 'sequential', got {cfg.tucker!r}")
    if any(not 0 < t <= 1 for t in cfg.probe_thresholds) or any(not a > 0 for a in cfg.probe_act_scales):
        raise ValueError(f"probe_thresholds must lie in (0, 1] and probe_act_scales be positive, got "
                         f"{cfg.probe_thresholds}, {cfg.probe_act_scales}")
    if cfg.r_from not in ("new", "previous"):
        raise ValueError(f"r_from must be 'new' or 'previous', got {cfg.r_from!r}")
    if not 0 < cfg.threshold <= 1:
        raise ValueError(f"threshold is an explained-variance fraction in (0, 1], got {cfg.threshold}")
    if len(cfg.act_ranks) != 3 or any(int(r) < 0 for r in cfg.act_ranks):
        raise ValueError(f"act_ranks must be three ranks >= 0 (batch, token, channel; 0 keeps the mode whole), got {cfg.act_ranks}")
    for name in ("image_size", "patch", "dim", "depth", "heads", "mlp_ratio", "finetune_steps", "batch_size",
                 "pretrain_batch_size", "log_every"):
        if getattr(cfg, name) <= 0:
            raise ValueError(f"{name} must be positive, got {getattr(cfg, name)}")
    if (cfg.pretrain_steps == 0) != (cfg.transfer == "none"):
        raise ValueError(f"pretrain_steps must be 0 exactly when transfer='none' (no pretraining here), got "
                         f"pretrain_steps={cfg.pretrain_steps}, transfer={cfg.transfer!r}")
    if cfg.image_size < 8 or (not cfg.model and cfg.image_size % cfg.patch):
        raise ValueError(f"image_size={cfg.image_size} must be >= 8 (the digits' side) and divisible by patch={cfg.patch}")
    if cfg.model and (cfg.transfer != "none" or cfg.pretrain_steps != 0):
        raise ValueError(f"model={cfg.model!r} was pretrained elsewhere: set transfer='none' and pretrain_steps=0, "
                         f"got transfer={cfg.transfer!r}, pretrain_steps={cfg.pretrain_steps}")
    if cfg.dim % cfg.heads:
        raise ValueError(f"dim={cfg.dim} must be divisible by heads={cfg.heads}")
    if cfg.transfer not in TRANSFERS:
        raise ValueError(f"transfer must be one of {TRANSFERS}, got {cfg.transfer!r}")
    classes = set(cfg.pretrain_classes)
    if not cfg.data_path and (not classes <= set(range(10)) or len(classes) != len(cfg.pretrain_classes)
                              or not 2 <= len(classes) <= 8):
        raise ValueError(f"pretrain_classes must be 2..8 distinct digits, leaving at least 2 to fine-tune on; got {cfg.pretrain_classes}")
    if len(classes) != len(cfg.pretrain_classes) or any(c < 0 for c in classes):
        raise ValueError(f"pretrain_classes must be distinct class labels >= 0, got {cfg.pretrain_classes}")
    if not 0.1 <= cfg.test_frac <= 0.8:
        raise ValueError(f"test_frac must lie in [0.1, 0.8] (both the training and the test set need images), got {cfg.test_frac}")
    if not cfg.data_path:  # a dataset's files are counted by preflight, on the machine that reads them
        train_n = finetune_train_size(cfg)
        if cfg.batch_size > train_n:
            raise ValueError(f"batch_size={cfg.batch_size} exceeds the ~{train_n} fine-tuning training images: lower batch_size or test_frac")
    for name in ("pretrain_lr", "lr"):
        if not getattr(cfg, name) > 0:
            raise ValueError(f"{name} must be positive, got {getattr(cfg, name)}")
    if cfg.momentum < 0 or cfg.weight_decay < 0 or cfg.pretrain_weight_decay < 0 or cfg.grad_clip < 0:
        raise ValueError("momentum, weight_decay, pretrain_weight_decay and grad_clip must be >= 0")
    if cfg.init_std <= 0 or not 0 <= cfg.augment <= 2:
        raise ValueError(f"init_std must be positive and augment in [0, 2], got {cfg.init_std}, {cfg.augment}")
    if cfg.test_views < 1 or (cfg.test_views > 1 and cfg.augment == 0):
        raise ValueError(f"test_views must be >= 1, and warped views need augment > 0; got test_views={cfg.test_views}, augment={cfg.augment}")
    for name in ("eval_every_frac", "checkpoint_every_frac"):
        if not 0 < getattr(cfg, name) <= 1:
            raise ValueError(f"{name} must lie in (0, 1], got {getattr(cfg, name)}")
    if cfg.time_rounds < 0:
        raise ValueError(f"time_rounds must be >= 0 (0: not timed), got {cfg.time_rounds}")
    if cfg.threads < 0:
        raise ValueError(f"threads must be >= 0 (0: torch's own setting), got {cfg.threads}")


MODEL_SOURCES = ("a folder written by transformers' save_pretrained (config.json with model_type 'vit' and its weights), or "
                 "a hub id fetched once beforehand into the Hugging Face cache, e.g. `hf download "
                 "google/vit-base-patch32-224-in21k` (https://huggingface.co/google/vit-base-patch32-224-in21k)")


def preflight(cfg: Config) -> None:
    """Checks of the machine that runs it: `model` is a ViT folder or a cached hub id, the
    `data_path` folder reads as a dataset with a train split, and the pretraining and fine-tuning
    classes are there and hold a batch (every problem found, in one error). Kept out of
    `validate`, so that a sweep of files on a cluster's storage checks as valid anywhere."""
    problems = []
    if cfg.model:
        found = pretrained.model_config(cfg.model)
        kind = json.loads(Path(found).read_text()).get("model_type") if found else None
        if not found:
            problems.append(f"model={cfg.model!r} is neither a folder with config.json nor in the local Hugging Face "
                            f"cache (nothing is downloaded at run time): expected {MODEL_SOURCES}")
        elif kind != "vit":
            problems.append(f"model={cfg.model!r} is a {kind!r} model, not a ViT (model_type 'vit'): expected {MODEL_SOURCES}")
    if cfg.data_path:
        try:
            _check_files(cfg)
        except ValueError as exc:
            problems.append(str(exc))
    if problems:
        raise ValueError("; ".join(problems))


def _check_files(cfg: Config) -> None:
    facts = files.describe(cfg.data_path, cfg.image_column, cfg.label_column)
    train = facts["train"]
    present = train["classes"]
    if cfg.transfer == "classes":
        missing = sorted(set(cfg.pretrain_classes) - set(present))
        if missing or len(present) - len(cfg.pretrain_classes) < 2:
            raise ValueError(f"data_path={cfg.data_path!r} has classes {present}: pretrain_classes={cfg.pretrain_classes} "
                             f"must be among them and leave at least 2 to fine-tune on")
    fine = [c for c in present if cfg.transfer != "classes" or c not in cfg.pretrain_classes]
    counts = train["counts"]
    held = 0.0 if "test" in facts else cfg.test_frac
    fine_n = sum(counts[c] - round(held * counts[c]) for c in fine)
    if cfg.batch_size > fine_n:
        raise ValueError(f"data_path={cfg.data_path!r} holds {fine_n} fine-tuning training images, fewer than "
                         f"batch_size={cfg.batch_size}: lower batch_size")
    if cfg.transfer == "classes":
        pre_n = sum(counts[c] - round(0.2 * counts[c]) for c in cfg.pretrain_classes)
        if cfg.pretrain_batch_size > pre_n:
            raise ValueError(f"data_path={cfg.data_path!r} holds {pre_n} pretraining images, fewer than "
                             f"pretrain_batch_size={cfg.pretrain_batch_size}: lower it")


def splits(cfg: Config) -> tuple[Split | None, Split]:
    """(pretraining split, None with transfer='none'; fine-tuning split) of the digits or the files."""
    if cfg.data_path:
        return files.file_splits(cfg.data_path, cfg.image_column, cfg.label_column, cfg.image_size, cfg.transfer,
                                 tuple(cfg.pretrain_classes), cfg.test_frac, cfg.seed, pretrain_seed(cfg))
    return make_splits(cfg.transfer, tuple(cfg.pretrain_classes), cfg.test_frac, cfg.image_size, cfg.seed,
                       pretrain_seed(cfg))


def build_model(cfg: Config, classes: int, channels: int = 1) -> torch.nn.Module:
    if cfg.model:
        return load_pretrained(cfg.model, classes, cfg.init_std)
    return ViT(cfg.image_size, cfg.patch, cfg.dim, cfg.depth, cfg.heads, cfg.mlp_ratio, classes, cfg.init_std, channels)


def cosine(step: int, steps: int, warmup: int = 0) -> float:
    if step <= warmup:
        return step / max(1, warmup)
    return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


class Batches:
    """Epochs of shuffled full batches (the remainder of an epoch is dropped), resumable."""

    def __init__(self, n: int, batch: int, seed: int) -> None:
        self.n, self.batch = n, batch
        self.generator = torch.Generator().manual_seed(seed)
        self.order, self.pos = torch.empty(0, dtype=torch.int64), 0

    def next(self) -> torch.Tensor:
        if self.pos + self.batch > self.order.numel():
            self.order, self.pos = torch.randperm(self.n, generator=self.generator), 0
        self.pos += self.batch
        return self.order[self.pos - self.batch : self.pos]

    def state(self) -> dict:
        return {"generator": self.generator.get_state(), "order": self.order, "pos": self.pos}

    def load(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
        self.order, self.pos = state["order"], int(state["pos"])


@torch.no_grad()
def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 512) -> float:
    model.eval()
    dev = next(model.parameters()).device
    correct = sum(int((model(x[i : i + batch].to(dev)).argmax(-1).cpu() == y[i : i + batch]).sum())
                  for i in range(0, len(y), batch))
    model.train()
    return correct / len(y)


def test_set(data: Split, cfg: Config) -> tuple[torch.Tensor, torch.Tensor]:
    """The held-out images and, with test_views > 1, fixed warped views of them (seeded)."""
    views = [data.x_test]
    warps = torch.Generator().manual_seed(cfg.seed + 6)
    views += [augment_batch(data.x_test, cfg.augment, warps) for _ in range(cfg.test_views - 1)]
    return torch.cat(views), data.y_test.repeat(cfg.test_views)


def to_finetune(model: torch.nn.Module, cfg: Config, classes: int) -> list[WASILinear]:
    """A fresh head for the fine-tuning classes; for WASI the block linears become WASI layers."""
    model.head = new_head(model.head.in_features, classes, cfg.init_std).to(model.head.weight.device)
    if cfg.method == "vanilla":
        return []
    return to_wasi(model, tuple(cfg.act_ranks), cfg.r_from, cfg.seed, sequential=cfg.tucker == "sequential")


_PRETRAINED: dict[tuple, dict] = {}
"""Pretrained states by the fields that determine them: trials of one seed pretrain once."""
PRETRAIN_FIELDS = ("data_path", "image_column", "label_column", "transfer", "test_frac", "image_size", "patch", "dim", "depth", "heads", "mlp_ratio", "init_std",
                   "pretrain_classes", "pretrain_steps", "pretrain_lr", "pretrain_weight_decay", "pretrain_batch_size", "augment")


def pretrain_seed(cfg: Config) -> int:
    return cfg.seed if cfg.pretrain_seed < 0 else cfg.pretrain_seed


def _pretrain_key(cfg: Config) -> tuple:
    seeds = (pretrain_seed(cfg), cfg.seed if cfg.transfer == "rotated" else None)
    return tuple(getattr(cfg, f) for f in PRETRAIN_FIELDS) + seeds


def train(cfg: Config, run) -> dict[str, float]:
    validate(cfg, run.world_size)
    pre, fine = splits(cfg)
    total = cfg.pretrain_steps + cfg.finetune_steps
    state = run.restore()
    torch.manual_seed(pretrain_seed(cfg))
    channels = 1 if fine.x_train.dim() == 3 else fine.x_train.shape[1]
    if pre is None:  # transfer='none': fine-tune the model as loaded (or as initialised)
        model = build_model(cfg, fine.classes, channels).to(run.device)
        return _finetune(cfg, run, model, fine, state, total, {})
    phase = state["phase"] if state is not None else "pretrain"
    model = build_model(cfg, pre.classes, channels).to(run.device)
    key = _pretrain_key(cfg)
    if phase == "pretrain" and state is None and key in _PRETRAINED:
        model.load_state_dict(_PRETRAINED[key]["model"])
        pretrain_metrics = dict(_PRETRAINED[key]["metrics"])
        run.report({**pretrain_metrics, "progress": cfg.pretrain_steps / total}, step=cfg.pretrain_steps)
    elif phase == "pretrain":
        pretrain_metrics = _pretrain(cfg, run, model, pre, state, total)
        _PRETRAINED.clear()  # one entry: a reproduction runs its trials seed by seed
        _PRETRAINED[key] = {"model": copy.deepcopy(model.state_dict()), "metrics": pretrain_metrics}
        state = None
    else:
        pretrain_metrics = state["pretrain_metrics"]
    return _finetune(cfg, run, model, fine, state, total, pretrain_metrics)


def _pretrain(cfg: Config, run, model: ViT, data: Split, state: dict | None, total: int) -> dict[str, float]:
    """Vanilla AdamW on the pretraining classes: the 'pretrained model' the paper fine-tunes."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.pretrain_lr, weight_decay=cfg.pretrain_weight_decay)
    batches = Batches(len(data.y_train), cfg.pretrain_batch_size, pretrain_seed(cfg) + 1)
    shifts = torch.Generator().manual_seed(pretrain_seed(cfg) + 2)
    start = 0
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        batches.load(state["batches"])
        shifts.set_state(state["shifts"])
        start = int(state["step"])
    steps = cfg.pretrain_steps
    eval_at, save_at = fraction_steps(steps, cfg.eval_every_frac), fraction_steps(steps, cfg.checkpoint_every_frac)
    window, window_n, metrics = 0.0, 0, {}
    for step in range(start + 1, steps + 1):
        for group in optimizer.param_groups:
            group["lr"] = cfg.pretrain_lr * cosine(step, steps, warmup=max(1, steps // 20))
        idx = batches.next()
        x = augment_batch(data.x_train[idx], cfg.augment, shifts).to(run.device)
        loss = F.cross_entropy(model(x), data.y_train[idx].to(run.device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        window, window_n = window + float(loss.detach()), window_n + 1
        report = {}
        if step % cfg.log_every == 0 or step == steps:
            report["train/loss"] = window / window_n
            window, window_n = 0.0, 0
        if step in eval_at:
            metrics = {"eval/pretrain_acc": accuracy(model, data.x_test, data.y_test)}
            report.update(metrics)
        if report:
            run.report({**report, "progress": step / total}, step=step)
        if step in save_at and step < steps:  # the end of pretraining is saved as fine-tuning's start
            run.save({"step": step, "phase": "pretrain", "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                      "batches": batches.state(), "shifts": shifts.get_state()})
    return metrics or {"eval/pretrain_acc": accuracy(model, data.x_test, data.y_test)}


def _finetune(cfg: Config, run, model: ViT, data: Split, state: dict | None, total: int,
              pretrain_metrics: dict[str, float]) -> dict[str, float]:
    """Every parameter fine-tuned by SGD on the other classes; WASI layers for method='wasi'."""
    torch.manual_seed(cfg.seed + 3)
    layers = to_finetune(model, cfg, data.classes)
    if state is None:
        for layer in layers:
            layer.init_subspace(cfg.threshold)  # truncated SVD, k by explained variance, fixed from here
    optimizer = make_optimizer(model, cfg.optimizer, cfg.lr, cfg.weight_decay, cfg.momentum)
    batches = Batches(len(data.y_train), cfg.batch_size, cfg.seed + 4)
    shifts = torch.Generator().manual_seed(cfg.seed + 5)
    start = cfg.pretrain_steps
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        batches.load(state["batches"])
        shifts.set_state(state["shifts"])
        start = int(state["step"])
    steps = cfg.finetune_steps
    x_test, y_test = test_set(data, cfg)
    acc0 = accuracy(model, x_test, y_test) if state is None else math.nan
    eval_at = {cfg.pretrain_steps + s for s in fraction_steps(steps, cfg.eval_every_frac)}
    save_at = {cfg.pretrain_steps + s for s in fraction_steps(steps, cfg.checkpoint_every_frac)}
    window, window_n, drift, test_acc, train_loss = 0.0, 0, math.nan, math.nan, math.nan
    started = devices.clock(run.device)
    for step in range(start + 1, total + 1):
        for group in optimizer.param_groups:
            group["lr"] = cfg.lr * cosine(step - cfg.pretrain_steps, steps)
        idx = batches.next()
        x = augment_batch(data.x_train[idx], cfg.augment, shifts).to(run.device)
        previous = [layer.left for layer in layers]
        # forward, backward, clip, step and, for WASI, one warm-started subspace-iteration step per layer
        loss = training_step(model, optimizer, x, data.y_train[idx].to(run.device), cfg.grad_clip)
        window, window_n = window + float(loss), window_n + 1
        report = {}
        if step % cfg.log_every == 0 or step == total:
            train_loss = window / window_n
            report["train/loss"] = train_loss
            window, window_n = 0.0, 0
            if layers:  # how far span(L) moved in this step: ||P_new - P_old||_F / sqrt(2k), 0..1
                drift = max(float(torch.linalg.matrix_norm(l.left @ l.left.t() - p @ p.t())) / math.sqrt(2 * l.rank)
                            for l, p in zip(layers, previous))
                report["diag/subspace_drift"] = drift
        if step in eval_at:
            test_acc = accuracy(model, x_test, y_test)
            report["eval/acc"] = test_acc
        if report:
            run.report({**report, "progress": step / total}, step=step)
        if step in save_at:
            run.save({"step": step, "phase": "finetune", "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                      "batches": batches.state(), "shifts": shifts.get_state(), "pretrain_metrics": pretrain_metrics,
                      "acc_before": acc0 if state is None else state.get("acc_before", math.nan)})
    if math.isnan(test_acc):
        test_acc = accuracy(model, x_test, y_test)
    probe = torch.arange(cfg.batch_size)  # the same first training batch for every method
    x_probe, y_probe = data.x_train[probe].to(run.device), data.y_train[probe].to(run.device)
    measured = measure_step(model, x_probe, y_probe)
    opt_args = dict(optimizer=cfg.optimizer, grad_clip=cfg.grad_clip, lr=cfg.lr, weight_decay=cfg.weight_decay,
                    momentum=cfg.momentum)
    measured.update(measure_peak(model, x_probe, y_probe, **opt_args))
    if layers and cfg.time_rounds > 0:  # WASI against its dense twin (same W), interleaved, same batch
        timed = time_steps({"wasi": model, "dense": to_dense(model)}, x_probe, y_probe, rounds=cfg.time_rounds, **opt_args)
        measured.update({"perf/train_step_s": timed["wasi/train"], "perf/infer_step_s": timed["wasi/infer"],
                         "perf/dense_train_step_s": timed["dense/train"], "perf/dense_infer_step_s": timed["dense/infer"],
                         "perf/train_speedup": timed["dense/train"] / timed["wasi/train"],
                         "perf/infer_speedup": timed["dense/infer"] / timed["wasi/infer"]})
    if layers:
        measured.update(probe_ranks(model, x_probe, y_probe, tuple(cfg.probe_thresholds),
                                    tuple(cfg.act_ranks), tuple(cfg.probe_act_scales)))
    return {
        **pretrain_metrics,
        **measured,
        **subspace_diagnostics(layers),
        "train/loss": train_loss,
        "eval/acc": test_acc,
        "eval/acc_before": acc0 if state is None else float(state.get("acc_before", math.nan)),
        "eval/acc_original": accuracy(model, data.x_test, data.y_test),  # the held-out images alone
        "eval/test_size": float(len(data.y_test)),
        "diag/subspace_drift": drift,
        "perf/finetune_s": devices.clock(run.device) - started,
    }
