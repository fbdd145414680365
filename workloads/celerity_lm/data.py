"""Byte-level text corpora for celerity_lm: real text present on every machine.

The default corpus is the Python standard library's own source files (`.py`, site-packages
excluded), read as bytes (vocabulary 256). Files are assigned to the train or held-out part by a
hash of their path relative to the corpus root, so the split is deterministic, does not depend
on file order or on which files another Python version adds, and never shares a file between
the two parts. A `data` folder of text files is split the same way.
"""

from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

import numpy as np
import torch

TEXT_SUFFIXES = (".py", ".txt", ".md", ".rst", ".json", ".c", ".h", ".html", ".csv", ".tex")


class DataError(ValueError):
    """The configured data folder does not exist or holds no text."""


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def corpus_files(data: str) -> tuple[Path, list[Path]]:
    """The root and sorted file list of a corpus: `"stdlib"` or a folder of text files."""
    if data == "stdlib":
        root = stdlib_root()
        files = [
            p for p in root.rglob("*.py") if "site-packages" not in p.parts and "dist-packages" not in p.parts
        ]
    else:
        root = Path(data).expanduser()
        if not root.is_dir():
            raise DataError(f"data folder {str(root)!r} does not exist: pass an existing folder of text files or data=stdlib")
        files = [p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES]
        if not files:
            raise DataError(
                f"data folder {str(root)!r} holds no text files (looked for {', '.join(TEXT_SUFFIXES)})"
            )
    return root, sorted(files, key=lambda p: p.relative_to(root).as_posix())


def is_heldout(rel_path: str, heldout_frac: float) -> bool:
    digest = hashlib.sha1(rel_path.encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "little") / 2**32 < heldout_frac


def load_corpus(data: str, *, heldout_frac: float, max_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """(train bytes, held-out bytes) as uint8 arrays, each capped near `max_bytes` (0: no cap)."""
    root, files = corpus_files(data)
    parts: dict[bool, list[bytes]] = {False: [], True: []}
    sizes = {False: 0, True: 0}
    cap = {False: max_bytes, True: max(1, int(max_bytes * heldout_frac)) if max_bytes else 0}
    for path in files:
        held = is_heldout(path.relative_to(root).as_posix(), heldout_frac)
        if cap[held] and sizes[held] >= cap[held]:
            if all(cap[k] and sizes[k] >= cap[k] for k in (False, True)):
                break
            continue
        try:
            blob = path.read_bytes()
        except OSError:
            continue
        parts[held].append(blob)
        sizes[held] += len(blob)
    train = np.frombuffer(b"\n".join(parts[False]), dtype=np.uint8)
    held = np.frombuffer(b"\n".join(parts[True]), dtype=np.uint8)
    if len(train) < 4096 or len(held) < 1024:
        raise DataError(
            f"corpus {data!r} is too small after the split ({len(train)} train bytes, {len(held)} held-out "
            "bytes): add more text or lower heldout_frac"
        )
    return train, held


class BatchSampler:
    """Random windows of `seq_len + 1` bytes from one rank's share of the training stream.

    Each rank draws from its own generator (seed, rank) so data-parallel workers see different
    windows; the generator state is part of the checkpoint, so a resumed run sees the same
    windows it would have seen without the restart.
    """

    def __init__(self, data: np.ndarray, seq_len: int, batch: int, *, seed: int, rank: int) -> None:
        self.data = torch.from_numpy(data.astype(np.int64))
        self.seq_len = seq_len
        self.batch = batch
        self.gen = torch.Generator().manual_seed(seed * 1_000_003 + rank)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(0, len(self.data) - self.seq_len - 1, (self.batch,), generator=self.gen)
        idx = starts[:, None] + torch.arange(self.seq_len + 1)[None, :]
        window = self.data[idx]  # [B, T+1]
        return window[:, :-1], window[:, 1:]

    def state(self) -> torch.Tensor:
        return self.gen.get_state()

    def load_state(self, state: torch.Tensor) -> None:
        self.gen.set_state(state)


def heldout_batches(data: np.ndarray, seq_len: int, tokens: int, batch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A fixed held-out set: evenly spaced windows covering about `tokens` target bytes."""
    n = max(1, tokens // seq_len)
    stride = max(1, (len(data) - seq_len - 1) // n)
    starts = torch.arange(n) * stride
    flat = torch.from_numpy(data.astype(np.int64))
    idx = starts[:, None] + torch.arange(seq_len + 1)[None, :]
    window = flat[idx]
    return [(window[i : i + batch, :-1], window[i : i + batch, 1:]) for i in range(0, n, batch)]
