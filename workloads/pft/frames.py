"""Real expression frames: an image folder per subject, through a frozen pretrained image backbone.

The paper's datasets (BioVid Heat Pain, StressID, ...) are videos of many subjects whose frames
are sorted by subject and expression. ladder reads that layout as a folder tree,

    DATA_DIR/<subject>/<expression>/<frame>.{png,jpg,jpeg,bmp}

with the same expression folders for every subject, one of which is the neutral one
(`neutral_class`). Each frame goes once through a frozen ImageNet-pretrained backbone loaded with
transformers' `from_pretrained` (a model folder, or a hub id already in the Hugging Face cache:
nothing is downloaded; ViT, ResNet, ConvNeXt, ... with its image processor); the mean of its last hidden states (tokens, or a CNN's feature map) is the
frame's feature, the `dim`-dimensional frame the
method adapts. Features are extracted once and cached under `$LADDER_CACHE/pft/`, keyed by the
backbone and by every image's path, size and modification time.

Frames are taken in sorted file order: per source subject and expression the first
`frames_per_class` train the source model and the next `source_eval_per_class` measure it; the
target's first `target_neutral_frames` neutral frames are the adaptation data, and up to
`target_eval_per_class` frames per expression after those (for neutral) or from the start (the
others) evaluate it.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import torch

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp")
WHERE = ("BioVid Heat Pain (https://www.nit.ovgu.de/BioVid.html) and StressID (https://project.inria.fr/stressid/) "
         "are released on request; extract their frames into DATA_DIR/<subject>/<expression>/")


BACKBONES = ("point backbone at a folder written by transformers' save_pretrained, or at a hub id fetched once "
             "beforehand into the Hugging Face cache, e.g. `hf download microsoft/resnet-50` (ImageNet-pretrained)")


class FrameDataError(ValueError):
    """A frame folder or backbone that cannot be used as the config asks, with what to change."""


@dataclass(frozen=True)
class Layout:
    subjects: list[str]
    classes: list[str]  # neutral first, then the others sorted
    files: dict[tuple[str, str], list[Path]]  # (subject, expression) -> frames, sorted


def scan(data_dir: str, neutral_class: str) -> Layout:
    """The folder tree, checked: every subject has the same expression folders, neutral among them."""
    root = Path(data_dir).expanduser()
    if not root.is_dir():
        raise FrameDataError(f"data_dir={data_dir!r} is not a folder (relative paths are read from the folder the run "
                             f"starts in); {WHERE}")
    subjects = sorted(p.name for p in root.iterdir() if p.is_dir())
    if not subjects:
        raise FrameDataError(f"data_dir={data_dir!r} has no subject folders: expected DATA_DIR/<subject>/<expression>/<frame>")
    files: dict[tuple[str, str], list[Path]] = {}
    expressions: set[str] | None = None
    for subject in subjects:
        found = sorted(p.name for p in (root / subject).iterdir() if p.is_dir())
        if expressions is None:
            expressions = set(found)
        elif set(found) != expressions:
            raise FrameDataError(f"subject {subject!r} has expression folders {found}, the first subject "
                                 f"{sorted(expressions)}: every subject needs the same ones")
        for expression in found:
            files[subject, expression] = sorted(p for p in (root / subject / expression).iterdir()
                                                if p.suffix.lower() in IMAGE_SUFFIXES)
    if neutral_class not in (expressions or set()):
        raise FrameDataError(f"no {neutral_class!r} expression folder (found {sorted(expressions or [])}): set neutral_class")
    classes = [neutral_class] + sorted(expressions - {neutral_class})
    return Layout(subjects, classes, files)


def check(layout: Layout, *, classes: int, target: int, source_subjects: int, frames_per_class: int,
          source_eval_per_class: int, target_neutral_frames: int) -> None:
    """Enough subjects and frames for the config; raises FrameDataError naming what to lower."""
    if len(layout.classes) != classes:
        raise FrameDataError(f"the folders hold {len(layout.classes)} expressions ({', '.join(layout.classes)}): "
                             f"set classes={len(layout.classes)}")
    if target >= len(layout.subjects):
        raise FrameDataError(f"target={target} but there are {len(layout.subjects)} subjects: use 0..{len(layout.subjects) - 1}")
    sources = [s for i, s in enumerate(layout.subjects) if i != target]
    if len(sources) < source_subjects:
        raise FrameDataError(f"source_subjects={source_subjects} but only {len(sources)} subjects besides the target: "
                             f"set source_subjects={len(sources)}")
    need = frames_per_class + source_eval_per_class
    for subject in sources[:source_subjects]:
        for expression in layout.classes:
            have = len(layout.files[subject, expression])
            if have < need:
                raise FrameDataError(f"{subject}/{expression} has {have} frames; frames_per_class + source_eval_per_class "
                                     f"= {need}: lower them")
    target_name = layout.subjects[target]
    neutral = len(layout.files[target_name, layout.classes[0]])
    if neutral <= target_neutral_frames:
        raise FrameDataError(f"the target {target_name!r} has {neutral} {layout.classes[0]} frames: target_neutral_frames="
                             f"{target_neutral_frames} must leave some to evaluate on; lower it")


def _cache_key(layout: Layout, backbone: str) -> str:
    h = hashlib.sha256(backbone.encode())
    folder = Path(backbone).expanduser()
    if folder.is_dir():
        for name in ("config.json", "preprocessor_config.json"):
            if (folder / name).is_file():
                h.update((folder / name).read_bytes())
        for weights in sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.bin")):
            st = weights.stat()
            h.update(f"{weights.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    for key in sorted(layout.files):
        for path in layout.files[key]:
            st = path.stat()
            h.update(f"{path}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


@torch.no_grad()
def _extract(paths: list[Path], backbone: str, batch: int = 32) -> torch.Tensor:
    from PIL import Image
    from transformers import AutoImageProcessor, AutoModel

    try:
        processor = AutoImageProcessor.from_pretrained(backbone, local_files_only=True)
        model = AutoModel.from_pretrained(backbone, local_files_only=True).eval()
    except OSError as exc:
        raise FrameDataError(f"backbone={backbone!r} cannot be loaded ({str(exc).splitlines()[0]}): {BACKBONES}") from None
    out = []
    for i in range(0, len(paths), batch):
        images = [Image.open(p).convert("RGB") for p in paths[i:i + batch]]
        hidden = model(**processor(images=images, return_tensors="pt")).last_hidden_state
        # Tokens [B, T, H] (ViT-like): their mean; feature maps [B, C, H, W] (CNNs): global average pooling.
        out.append((hidden.mean(dim=1) if hidden.ndim == 3 else hidden.flatten(2).mean(dim=2)).float())
    return torch.cat(out)


def features(layout: Layout, backbone: str, cache_root: Path) -> dict[tuple[str, str], torch.Tensor]:
    """(subject, expression) -> [frames, dim] backbone features, extracted once and cached."""
    from filelock import FileLock

    path = cache_root / "pft" / f"features-{_cache_key(layout, backbone)}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        if not path.is_file():
            keys = sorted(layout.files)
            flat = [p for key in keys for p in layout.files[key]]
            feats = _extract(flat, backbone)
            table, start = {}, 0
            for key in keys:
                n = len(layout.files[key])
                table["/".join(key)] = feats[start:start + n].clone()
                start += n
            part = path.with_name(f"{path.name}.{os.getpid()}.part")
            torch.save({"backbone": backbone, "features": table}, part)
            os.replace(part, path)
    stored = torch.load(path, weights_only=True)["features"]
    return {tuple(k.split("/", 1)): v for k, v in stored.items()}


@dataclass(frozen=True)
class RealData:
    """What a trial needs, as the synthetic world provides it: balanced source frames, the
    source model's held-out frames, the target's neutral frames and its labelled frames."""
    source_x: torch.Tensor  # [S, K, n, dim]
    source_eval_x: torch.Tensor
    source_eval_y: torch.Tensor
    neutral: torch.Tensor  # [m, dim]
    eval_x: torch.Tensor
    eval_y: torch.Tensor
    classes: list[str]
    target: str

    @property
    def dim(self) -> int:
        return int(self.source_x.shape[-1])


def load(cfg, cache_root: Path) -> RealData:
    """The frames of `cfg` (a pft Config with data_dir set) as features."""
    layout = scan(cfg.data_dir, cfg.neutral_class)
    check(layout, classes=cfg.classes, target=cfg.target, source_subjects=cfg.source_subjects,
          frames_per_class=cfg.frames_per_class, source_eval_per_class=cfg.source_eval_per_class,
          target_neutral_frames=cfg.target_neutral_frames)
    table = features(layout, cfg.backbone, cache_root)
    target = layout.subjects[cfg.target]
    sources = [s for s in layout.subjects if s != target][:cfg.source_subjects]
    n, m = cfg.frames_per_class, cfg.source_eval_per_class
    source_x = torch.stack([torch.stack([table[s, c][:n] for c in layout.classes]) for s in sources])
    eval_parts = [(table[s, c][n:n + m], k) for s in sources for k, c in enumerate(layout.classes)]
    source_eval_x = torch.cat([x for x, _ in eval_parts])
    source_eval_y = torch.cat([torch.full((len(x),), k, dtype=torch.long) for x, k in eval_parts])
    neutral_all = table[target, layout.classes[0]]
    neutral = neutral_all[:cfg.target_neutral_frames]
    per = cfg.target_eval_per_class
    tgt = [(neutral_all[cfg.target_neutral_frames:][:per], 0)]
    tgt += [(table[target, c][:per], k) for k, c in enumerate(layout.classes) if k > 0]
    eval_x = torch.cat([x for x, _ in tgt])
    eval_y = torch.cat([torch.full((len(x),), k, dtype=torch.long) for x, k in tgt])
    return RealData(source_x, source_eval_x, source_eval_y, neutral, eval_x, eval_y, layout.classes, target)


def describe(data_dir: str, neutral_class: str) -> dict:
    layout = scan(data_dir, neutral_class)
    return {"subjects": layout.subjects, "classes": layout.classes}


__all__ = ["FrameDataError", "Layout", "RealData", "check", "describe", "features", "load", "scan"]
