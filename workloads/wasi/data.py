"""scikit-learn's handwritten digits (1,797 8x8 images shipped inside the package), split for
transfer: pretraining on some digit classes, fine-tuning on the others.

The pretraining classes are split 80/20 (train / held-out check of the pretrained model); the
fine-tuning classes are split by `test_frac`, stratified per class. Every split is drawn from the
seed, so vanilla and WASI trials of one seed see the same images in the same roles.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import math

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Split:
    x_train: torch.Tensor  # [n, H, W] float32 in [0, 1]
    y_train: torch.Tensor  # [n] int64, relabelled 0..classes-1
    x_test: torch.Tensor
    y_test: torch.Tensor

    @property
    def classes(self) -> int:
        return int(self.y_train.max()) + 1


@lru_cache(maxsize=1)
def load_digits() -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits as sklearn_digits

    d = sklearn_digits()
    x = torch.tensor(d.images, dtype=torch.float32) / 16.0  # pixel values are 0..16
    return x, torch.tensor(d.target, dtype=torch.int64)


def _stratified(y: torch.Tensor, test_frac: float, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    train, test = [], []
    for c in torch.unique(y):
        idx = torch.nonzero(y == c).flatten()
        idx = idx[torch.randperm(idx.numel(), generator=generator)]
        n_test = round(test_frac * idx.numel())
        test.append(idx[:n_test])
        train.append(idx[n_test:])
    return torch.cat(train), torch.cat(test)


TRANSFERS = ("classes", "rotated", "none")


def make_splits(transfer: str, pretrain_classes: tuple[int, ...], test_frac: float, image_size: int,
                seed: int, pretrain_seed: int | None = None) -> tuple[Split | None, Split]:
    """(pretraining split, fine-tuning split); labels renumbered 0.. in ascending class order.

    transfer='classes': pretrain on `pretrain_classes` (80/20), fine-tune on the other classes.
    transfer='rotated': fine-tune on all ten classes, upright; pretrain on the fine-tuning
    training images rotated by 90 degrees (80/20): a shifted domain, and no test image is ever
    seen in any orientation. transfer='none': no pretraining split (None), the fine-tuning split
    of 'rotated'. The fine-tuning split is drawn from `seed`, the pretraining split of 'classes'
    from `pretrain_seed` (default: `seed`)."""
    x, y = load_digits()
    if image_size != 8:
        x = F.interpolate(x[:, None], size=(image_size, image_size), mode="bilinear", align_corners=False)[:, 0]
    generator = torch.Generator().manual_seed(10_007 * seed + 17)
    pre_generator = torch.Generator().manual_seed(10_007 * (seed if pretrain_seed is None else pretrain_seed) + 29)
    if transfer in ("rotated", "none"):
        tr, te = _stratified(y, test_frac, generator)
        fine = Split(x[tr].contiguous(), y[tr], x[te].contiguous(), y[te])
        if transfer == "none":
            return None, fine
        rotated = torch.rot90(fine.x_train, 1, dims=(1, 2))
        ptr, pte = _stratified(fine.y_train, 0.2, generator)
        return Split(rotated[ptr].contiguous(), fine.y_train[ptr], rotated[pte].contiguous(), fine.y_train[pte]), fine
    out = []
    rest = sorted(set(range(10)) - set(pretrain_classes))
    for classes, frac, gen in ((sorted(pretrain_classes), 0.2, pre_generator), (rest, test_frac, generator)):
        keep = torch.isin(y, torch.tensor(classes))
        xs, ys = x[keep], y[keep]
        relabel = torch.full((10,), -1, dtype=torch.int64)
        relabel[torch.tensor(classes)] = torch.arange(len(classes))
        ys = relabel[ys]
        tr, te = _stratified(ys, frac, gen)
        out.append(Split(xs[tr].contiguous(), ys[tr], xs[te].contiguous(), ys[te]))
    return out[0], out[1]


def augment_batch(x: torch.Tensor, strength: float, generator: torch.Generator) -> torch.Tensor:
    """A random affine warp per image: rotation up to 12*strength degrees, scale 1 +- 0.1*strength,
    translation up to 0.1*strength of the side (bilinear, zero fill). x is [B, H, W] or
    [B, C, H, W]; strength 0 returns x."""
    if strength == 0:
        return x
    b = x.shape[0]
    u = torch.rand(b, 4, generator=generator) * 2 - 1  # [b, 4] in [-1, 1]
    angle = u[:, 0] * math.radians(12.0) * strength
    scale = 1 + 0.1 * strength * u[:, 1]
    cos, sin = torch.cos(angle) / scale, torch.sin(angle) / scale
    theta = torch.stack([torch.stack([cos, -sin, 0.2 * strength * u[:, 2]], 1),
                         torch.stack([sin, cos, 0.2 * strength * u[:, 3]], 1)], 1)  # [b, 2, 3]
    images = x[:, None] if x.dim() == 3 else x  # [B, C, H, W]
    grid = F.affine_grid(theta.to(x.device), tuple(images.shape), align_corners=False)
    out = F.grid_sample(images, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    return out[:, 0] if x.dim() == 3 else out
