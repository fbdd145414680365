"""Real images as a third-order tensor, for the completion task: a folder of image files, read by PIL.

    IMAGE_DIR/<image>.{png,jpg,jpeg,bmp,tif,tiff}

Only the folder's own files are read (not its subfolders), in sorted name order. Two ways to make a
tensor [n1, n2, k] with values in [0, 1]:

- `rgb`: one colour image (the `image_index`-th), n1 x n2 x 3, the t-product along the colour mode:
  the paper's colour-image completion (Berkeley Segmentation Dataset images, 481 x 321 x 3);
- `frames`: the first `frames` images (all of them for 0) as grayscale frames of one video,
  n1 x n2 x frames, the t-product along time.

`image_size` > 0 resizes every image (bicubic) so that its longer side has that many pixels, the
aspect ratio kept; 0 keeps the files' own size, and frames must then all share one.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff")
LAYOUT = "a folder of image files, IMAGE_DIR/<image>.png|jpg|jpeg|bmp|tif (read by PIL; subfolders are not read)"
WHERE = ("any colour images serve (task='completion', tensor_from='rgb'), or the frames of a video extracted into one "
         "folder (tensor_from='frames', e.g. `ffmpeg -i video.mp4 IMAGE_DIR/%04d.png`); the paper completes colour "
         "images of the Berkeley Segmentation Dataset, 481 x 321 "
         "(https://www2.eecs.berkeley.edu/Research/Projects/CS/vision/bsds/, BSDS300-images.tgz: images/test/*.jpg)")


class ImageDataError(ValueError):
    """An image folder that cannot be used as the config asks, with what to change."""


def scan(image_dir: str) -> list[Path]:
    """The folder's image files, sorted by name; raises ImageDataError for a missing or empty folder."""
    root = Path(image_dir).expanduser()
    if not root.is_dir():
        raise ImageDataError(f"image_dir={image_dir!r} is not a folder (a relative path is read from the folder the run "
                             f"starts in); expected {LAYOUT}: {WHERE}")
    paths = sorted(p for p in root.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if not paths:
        raise ImageDataError(f"image_dir={image_dir!r} holds no image files; expected {LAYOUT}: {WHERE}")
    return paths


def chosen(paths: list[Path], tensor_from: str, image_index: int, frames: int) -> list[Path]:
    """The files the tensor is made of: one image for 'rgb', the first `frames` (0: all) for 'frames'."""
    if tensor_from == "rgb":
        if image_index >= len(paths):
            raise ImageDataError(f"image_index={image_index} but image_dir holds {len(paths)} images: "
                                 f"use 0..{len(paths) - 1}")
        return [paths[image_index]]
    if frames > len(paths):
        raise ImageDataError(f"frames={frames} but image_dir holds {len(paths)} images: set frames={len(paths)} or 0 (all)")
    return paths[:frames or len(paths)]


def resized(size: tuple[int, int], image_size: int) -> tuple[int, int]:
    """(width, height) after scaling the longer side to `image_size` (0: unchanged)."""
    w, h = size
    if not image_size:
        return w, h
    scale = image_size / max(w, h)
    return max(1, round(w * scale)), max(1, round(h * scale))


def tensor_shape(image_dir: str, tensor_from: str, image_index: int, frames: int, image_size: int) -> tuple[int, int, int]:
    """[n1, n2, k] of the tensor the config reads, from the files' headers only (nothing is decoded)."""
    from PIL import Image, UnidentifiedImageError

    files = chosen(scan(image_dir), tensor_from, image_index, frames)
    sizes = set()
    for p in files:
        try:
            with Image.open(p) as img:
                sizes.add(resized(img.size, image_size))
        except (OSError, UnidentifiedImageError) as exc:
            raise ImageDataError(f"{p.name} in image_dir={image_dir!r} cannot be read as an image: {exc}") from None
    if len(sizes) > 1:
        raise ImageDataError(f"the {len(files)} frames in image_dir={image_dir!r} have different sizes {sorted(sizes)}: "
                             "set image_size (> 0) to resize them to one")
    (w, h), = sizes
    return h, w, 3 if tensor_from == "rgb" else len(files)


def load(image_dir: str, tensor_from: str, image_index: int, frames: int, image_size: int) -> torch.Tensor:
    """The image tensor [n1, n2, k] (rows, columns, colours or frames), float64 in [0, 1]."""
    from PIL import Image

    n1, n2, _ = tensor_shape(image_dir, tensor_from, image_index, frames, image_size)
    mode = "RGB" if tensor_from == "rgb" else "L"
    slices = []
    for p in chosen(scan(image_dir), tensor_from, image_index, frames):
        with Image.open(p) as img:
            img = img.convert(mode)
            if img.size != (n2, n1):
                img = img.resize((n2, n1), Image.BICUBIC)
            slices.append(np.asarray(img, dtype=np.float64) / 255.0)
    x = slices[0] if tensor_from == "rgb" else np.stack(slices, axis=2)  # [n1, n2, k]
    return torch.from_numpy(np.ascontiguousarray(x))
