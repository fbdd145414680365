"""The image scenario's data: image datasets read by Hugging Face datasets from this machine, never the network.

A dataset is a folder, either written by `datasets.save_to_disk` (CIFAR-10 and SVHN as the hub
publishes them: `load_dataset('uoft-cs/cifar10').save_to_disk(DIR)`, columns `img`, `label`;
`load_dataset('ufldl-stanford/svhn', 'cropped_digits').save_to_disk(DIR)`, columns `image`,
`label`) or one that `datasets.load_dataset(DIR)` reads, such as an imagefolder
(`DIR/<split>/<class>/<image>.png`, column `image`). A split of a DatasetDict is picked by name; a
single Dataset has no splits. The image column is named, or found: the one column of the `Image`
feature type, else `img` or `image`.

Images are read with PIL as RGB, centre-cropped to a square, resized to `image_size` (bilinear)
when they are not that size already, and kept as 8-bit values [N, 3, S, S] (uint8).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from components.pretrained import is_saved_dataset
from workloads.martingale_uq.pixelmodel import read as read_generator

LAYOUT = ("a datasets save_to_disk folder, or a folder datasets.load_dataset reads (an imagefolder: "
          "DIR/<split>/<class>/<image>.png), with an image column")
SOURCES = ("CIFAR-10: https://huggingface.co/datasets/uoft-cs/cifar10 (columns img, label; "
           "`datasets.load_dataset('uoft-cs/cifar10').save_to_disk(DIR)`), SVHN: "
           "https://huggingface.co/datasets/ufldl-stanford/svhn, config 'cropped_digits' (columns image, label; "
           "`datasets.load_dataset('ufldl-stanford/svhn', 'cropped_digits').save_to_disk(DIR)`), once, where the "
           "internet is reachable")
COLUMN_NAMES = ("img", "image")
"""Column names taken as the image column when no column has the Image feature type, in this order."""


class ImageDataError(ValueError):
    """An image dataset that cannot be read as the config asks, naming the field and the fix."""


def open_split(path: str, split: str, field: str, split_field: str) -> Any:
    """The `split` of the dataset at `path` (a datasets.Dataset); `field` and `split_field` name the
    config fields in errors."""
    import datasets

    p = Path(path).expanduser()
    if not p.is_dir():
        raise ImageDataError(f"{field}={path!r} is not a folder (nothing is downloaded at run time): expected {LAYOUT}; "
                             f"{SOURCES}")
    try:
        loaded = datasets.load_from_disk(str(p)) if is_saved_dataset(p) else datasets.load_dataset(str(p))
    except Exception as exc:  # datasets raises several types for a folder it cannot read
        raise ImageDataError(f"{field}={path!r} cannot be read by datasets ({type(exc).__name__}: {exc}): expected "
                             f"{LAYOUT}; {SOURCES}") from None
    if isinstance(loaded, (datasets.DatasetDict, dict)):
        if split not in loaded:
            raise ImageDataError(f"{field}={path!r} has splits {sorted(loaded)}, not {split_field}={split!r}")
        return loaded[split]
    return loaded


def image_column(ds: Any, column: str, field: str, column_field: str) -> str:
    """The image column: `column` when given, else the one column of the Image feature type, else img or image."""
    import datasets

    names = list(ds.column_names)
    if column:
        if column not in names:
            raise ImageDataError(f"{field} has columns {names}, not {column_field}={column!r}: name its image column "
                                 f"(CIFAR-10's is 'img', SVHN's 'image'), or leave {column_field}='' to find it")
        return column
    typed = [name for name, feature in ds.features.items() if isinstance(feature, datasets.Image)]
    if len(typed) == 1:
        return typed[0]
    for name in COLUMN_NAMES:
        if name in (typed or names):
            return name
    raise ImageDataError(f"{field} has columns {names} and none is an image column (of the Image feature type, or "
                         f"named {' or '.join(COLUMN_NAMES)}): set {column_field} to the column that holds the images")


def square(img: Any, size: int) -> np.ndarray:
    """A PIL image -> [3, size, size] uint8: RGB, centre-cropped to a square, resized when needed."""
    from PIL import Image

    img = img.convert("RGB")
    w, h = img.size
    if w != h:
        side = min(w, h)
        left, top = (w - side) // 2, (h - side) // 2
        img = img.crop((left, top, left + side, top + side))
    if img.size != (size, size):
        img = img.resize((size, size), Image.BILINEAR)
    return np.asarray(img, dtype=np.uint8).transpose(2, 0, 1)


def _as_pil(value: Any) -> Any:
    """A decoded cell: a PIL image already, or (a column not typed Image) bytes or a path dict."""
    if hasattr(value, "convert"):
        return value
    import io

    from PIL import Image

    if isinstance(value, dict):
        value = value.get("bytes") or value.get("path")
    return Image.open(io.BytesIO(value) if isinstance(value, (bytes, bytearray)) else value)


def pixels(ds: Any, column: str, size: int, indices: list[int] | None = None, batch: int = 1000) -> torch.Tensor:
    """The images at `indices` (all for None) as [N, 3, size, size] uint8, decoded in batches."""
    rows = list(range(len(ds))) if indices is None else list(indices)
    out = np.empty((len(rows), 3, size, size), dtype=np.uint8)
    for i in range(0, len(rows), batch):
        cells = ds.select(rows[i : i + batch])[column]
        for j, cell in enumerate(cells):
            out[i + j] = square(_as_pil(cell), size)
    return torch.from_numpy(out)


def problems(cfg: Any) -> list[str]:
    """The workload's preflight for generator='pixels': what keeps the config's image datasets and saved
    generator from being read on this machine, as messages naming the field and the fix (empty: none)."""

    def readable(path: str, split: str, column: str, fields: tuple[str, str, str], count: int) -> None:
        ds = open_split(path, split, fields[0], fields[1])
        where = f"{fields[0]}={path!r} (split {split!r})"
        name = image_column(ds, column, where, fields[2])
        if len(ds) < count:
            raise ImageDataError(f"{where} holds {len(ds)} images, fewer than {count}: "
                                 + ("lower real_images" if fields[0] == "image_data" else "use a larger split"))
        try:
            pixels(ds, name, cfg.image_size, [0])
        except Exception as exc:  # a column of labels or of broken files
            raise ImageDataError(f"column {name!r} of {where} cannot be read as images ({exc}): set "
                                 f"{fields[2]} to its image column") from None

    problems = []
    try:
        readable(cfg.image_data, cfg.image_split, cfg.image_column, ("image_data", "image_split", "image_column"),
                 cfg.real_images)
    except ImageDataError as exc:
        problems.append(str(exc))
    if cfg.generator_path:
        if not Path(cfg.generator_path).expanduser().is_file():
            problems.append(f"generator_path={cfg.generator_path!r} is not a file: expected a PixelCNN written by an "
                            "earlier trial with generator_save=PATH (or generator_path='' to train one on generator_data)")
        else:
            try:
                saved = read_generator(cfg.generator_path)
                for field, key in (("image_size", "image_size"), ("image_levels", "levels")):
                    if int(saved[key]) != getattr(cfg, field):
                        problems.append(f"generator_path={cfg.generator_path!r} was trained with {field}={saved[key]}, "
                                        f"not {field}={getattr(cfg, field)}: set {field}={saved[key]}")
            except ValueError as exc:
                problems.append(str(exc))
        return problems
    source = cfg.generator_data or cfg.image_data
    deployed = Path(cfg.image_data).expanduser().resolve()
    if Path(source).expanduser().resolve() == deployed and (
            cfg.generator_split == cfg.image_split or (deployed / "state.json").is_file()):  # one Dataset: no splits
        problems.append(f"the PixelCNN would be trained on the deployed images (image_data={cfg.image_data!r}, "
                        f"generator_split={cfg.generator_split!r}): give image_data a DatasetDict with another split "
                        "for generator_split (CIFAR-10's 'train'), or set generator_data")
        return problems
    try:
        readable(source, cfg.generator_split, cfg.generator_column,
                 ("generator_data" if cfg.generator_data else "image_data", "generator_split", "generator_column"), 1)
    except ImageDataError as exc:
        problems.append(str(exc))
    return problems
