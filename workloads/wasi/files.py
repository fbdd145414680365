"""Image datasets from files, read by Hugging Face `datasets`: a folder written by
`save_to_disk` (CIFAR-10's published layout: an `img` image column and a `label` class column,
`train` and `test` splits) read with `load_from_disk`, or a folder of images in one subfolder per
class (optionally under `train/` and `test/`) read with `load_dataset("imagefolder")`.

Images are decoded by PIL, converted to RGB and resized (bilinear) to `image_size`, and kept as
float32 [n, 3, H, W] in [0, 1]. When the dataset has no `test` split, each class of the `train`
split is split by `test_frac`, seeded like the digits.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from components.pretrained import is_saved_dataset
from workloads.wasi.data import Split, _stratified

SOURCES = ("CIFAR-10: https://huggingface.co/datasets/uoft-cs/cifar10 (`datasets.load_dataset('uoft-cs/cifar10')"
           ".save_to_disk(DIR)` once, where the internet is reachable) or https://www.cs.toronto.edu/~kriz/cifar.html; "
           "any image folder with one subfolder per class also reads")
EXPECTED = ("a folder written by datasets' save_to_disk (an image column 'img' or 'image' and a 'label' column, "
            "splits 'train' and optionally 'test'), or an image folder (CLASS/IMAGE.png, optionally under train/ and test/)")


def open_splits(path: str) -> dict[str, Any]:
    """{split name: datasets.Dataset} of a saved dataset or an image folder."""
    import datasets

    folder = Path(path)
    if is_saved_dataset(folder):
        loaded = datasets.load_from_disk(str(folder))
    else:
        loaded = datasets.load_dataset("imagefolder", data_dir=str(folder))
    if isinstance(loaded, datasets.Dataset):
        return {"train": loaded}
    return dict(loaded)


def columns(ds: Any, image_column: str, label_column: str) -> tuple[str, str]:
    """The image and label column names, checked; an empty image_column means 'img' or 'image'."""
    image = image_column or next((c for c in ("img", "image") if c in ds.column_names), "")
    if not image or image not in ds.column_names:
        raise ValueError(f"no image column {image_column or 'img/image'!r} among {ds.column_names}: set image_column")
    if label_column not in ds.column_names:
        raise ValueError(f"no label column {label_column!r} among {ds.column_names}: set label_column")
    return image, label_column


def describe(path: str, image_column: str, label_column: str) -> dict[str, Any]:
    """What the checks need, without decoding an image: splits, rows, classes per split."""
    folder = Path(path)
    if not folder.is_dir():
        raise ValueError(f"data_path={path!r} does not exist or is not a folder: expected {EXPECTED}. {SOURCES}")
    try:
        splits = open_splits(path)
    except Exception as exc:  # datasets raises its own types for a folder it cannot read
        raise ValueError(f"data_path={path!r} cannot be read as {EXPECTED}: {exc}") from None
    if "train" not in splits:
        raise ValueError(f"data_path={path!r} has splits {sorted(splits)}, no 'train'")
    out: dict[str, Any] = {"splits": sorted(splits)}
    for name in ("train", "test"):
        if name in splits:
            _, label = columns(splits[name], image_column, label_column)
            y = np.asarray(splits[name][label])
            out[name] = {"rows": len(y), "classes": sorted(int(c) for c in np.unique(y)),
                         "counts": {int(c): int(n) for c, n in zip(*np.unique(y, return_counts=True))}}
    return out


def _decode(ds: Any, image: str, label: str, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    from PIL import Image

    xs, ys = [], []
    for batch in ds.iter(batch_size=1000):
        for img in batch[image]:
            img = img.convert("RGB")
            if img.size != (size, size):
                img = img.resize((size, size), Image.BILINEAR)
            xs.append(np.asarray(img, dtype=np.uint8))
        ys.extend(int(v) for v in batch[label])
    x = torch.from_numpy(np.stack(xs)).permute(0, 3, 1, 2).float() / 255.0  # [n, 3, H, W]
    return x.contiguous(), torch.tensor(ys, dtype=torch.int64)


@lru_cache(maxsize=1)
def load_images(path: str, image_column: str, label_column: str, size: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{'train': (x, y), 'test': (x, y) when the dataset has one}; x [n, 3, size, size] in [0, 1]."""
    splits = open_splits(path)
    out = {}
    for name in ("train", "test"):
        if name in splits:
            image, label = columns(splits[name], image_column, label_column)
            out[name] = _decode(splits[name], image, label, size)
    return out


def _pick(x: torch.Tensor, y: torch.Tensor, classes: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The images of `classes`, labels renumbered 0.. in ascending class order."""
    keep = torch.isin(y, torch.tensor(classes))
    relabel = torch.full((int(y.max()) + 1,), -1, dtype=torch.int64)
    relabel[torch.tensor(classes)] = torch.arange(len(classes))
    return x[keep].contiguous(), relabel[y[keep]]


def file_splits(path: str, image_column: str, label_column: str, size: int, transfer: str,
                pretrain_classes: tuple[int, ...], test_frac: float, seed: int,
                pretrain_seed: int) -> tuple[Split | None, Split]:
    """(pretraining split or None, fine-tuning split) of a dataset's files, as `make_splits` does
    for the digits: 'classes' pretrains on `pretrain_classes` of the train split (80/20) and
    fine-tunes on the other classes; 'rotated' pretrains on the fine-tuning training images rotated
    by 90 degrees; 'none' only fine-tunes, on every class. Fine-tuning tests on the test split."""
    loaded = load_images(path, image_column, label_column, size)
    x, y = loaded["train"]
    generator = torch.Generator().manual_seed(10_007 * seed + 17)
    pre_generator = torch.Generator().manual_seed(10_007 * pretrain_seed + 29)
    if "test" in loaded:
        x_test, y_test = loaded["test"]
    else:
        tr, te = _stratified(y, test_frac, generator)
        x, y, x_test, y_test = x[tr], y[tr], x[te], y[te]
    present = sorted(int(c) for c in torch.unique(y))
    fine_classes = [c for c in present if transfer != "classes" or c not in pretrain_classes]
    fine = Split(*_pick(x, y, fine_classes), *_pick(x_test, y_test, fine_classes))
    if transfer == "none":
        return None, fine
    if transfer == "rotated":
        rotated = torch.rot90(fine.x_train, 1, dims=(-2, -1))
        ptr, pte = _stratified(fine.y_train, 0.2, generator)
        return Split(rotated[ptr].contiguous(), fine.y_train[ptr], rotated[pte].contiguous(), fine.y_train[pte]), fine
    xs, ys = _pick(x, y, sorted(pretrain_classes))
    tr, te = _stratified(ys, 0.2, pre_generator)
    return Split(xs[tr].contiguous(), ys[tr], xs[te].contiguous(), ys[te]), fine
