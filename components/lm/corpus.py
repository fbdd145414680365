"""Byte-level text corpora for the language-model workloads: real text present on every machine.

The default corpus is the Python standard library's own source files (`.py`, site-packages
excluded), read as bytes (vocabulary 256). Files are assigned to the train or held-out part by a
hash of their path relative to the corpus root, so the split is deterministic, does not depend
on file order or on which files another Python version adds, and never shares a file between
the two parts. A `data` folder of text files is split the same way. A folder holding a
`tokens.json` header is a pre-tokenized dataset instead (`components.lm.tokens`): its
shards are read memory-mapped and its vocabulary replaces the 256 bytes.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import numpy as np
import torch

from components.lm.split import is_heldout

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


class TokenStream:
    """A stream of token ids made of one or more arrays (e.g. memory-mapped shards). Windows are
    addressed by a start in [0, starts(width)) and never cross from one array into the next;
    only the windows asked for are read and widened to int64."""

    def __init__(self, parts: np.ndarray | list[np.ndarray]) -> None:
        self.parts = [parts] if isinstance(parts, np.ndarray) else list(parts)

    def __len__(self) -> int:
        return sum(len(p) for p in self.parts)

    def starts(self, width: int) -> int:
        """How many windows of `width` ids there are."""
        return sum(max(0, len(p) - width + 1) for p in self.parts)

    def windows(self, starts: np.ndarray, width: int) -> torch.Tensor:
        """[len(starts), width] int64 windows at the given window starts."""
        counts = np.array([max(0, len(p) - width + 1) for p in self.parts])
        ends = np.cumsum(counts)
        which = np.searchsorted(ends, starts, side="right")
        offsets = starts - (ends - counts)[which]
        out = np.empty((len(starts), width), dtype=np.int64)
        span = np.arange(width)
        for part in np.unique(which):
            rows = np.nonzero(which == part)[0]
            out[rows] = self.parts[part][offsets[rows, None] + span[None, :]]
        return torch.from_numpy(out)


def as_stream(data: np.ndarray | TokenStream) -> TokenStream:
    return data if isinstance(data, TokenStream) else TokenStream(data)


def data_vocab(data: str) -> int:
    """The vocabulary the model needs for `data`: 256 bytes, or a token dataset's vocab_size."""
    from components.lm import tokens

    if data != "stdlib" and tokens.is_token_dataset(data):
        return int(tokens.read_header(data)["vocab_size"])
    return 256


def check_data(data: str) -> None:
    """Raise DataError (a ValueError) naming the problem when `data` cannot be read here."""
    from components.lm import tokens

    if data == "stdlib":
        return
    if tokens.is_token_dataset(data):
        try:
            tokens.read_header(data)
        except tokens.TokenDataError as exc:
            raise DataError(str(exc)) from None
        return
    corpus_files(data)


def load_data(data: str, *, heldout_frac: float, max_bytes: int) -> tuple[TokenStream, TokenStream]:
    """(train, held-out) streams of `data`: a text corpus (bytes) or a token dataset (ids)."""
    from components.lm import tokens

    if data != "stdlib" and tokens.is_token_dataset(data):
        train, held = tokens.open_split(data, "train", max_tokens=max_bytes), tokens.open_split(data, "heldout")
        return TokenStream(train), TokenStream(held)
    train_bytes, held_bytes = load_corpus(data, heldout_frac=heldout_frac, max_bytes=max_bytes)
    return TokenStream(train_bytes), TokenStream(held_bytes)


class BatchSampler:
    """Random windows of `seq_len + 1` bytes from one rank's share of the training stream.

    Each rank draws from its own generator (seed, rank) so data-parallel workers see different
    windows. The checkpointed position is the number of batches drawn, the same on every rank:
    under data parallelism only rank 0 writes the checkpoint and every rank restores it, so each
    rank re-seeds its own generator and replays that many draws, and a resumed run sees the same
    windows on every rank as it would have without the restart.
    """

    def __init__(self, data: np.ndarray | TokenStream, seq_len: int, batch: int, *, seed: int, rank: int) -> None:
        self.data = as_stream(data)
        self.seq_len = seq_len
        self.batch = batch
        self.seed = seed * 1_000_003 + rank
        self.gen = torch.Generator().manual_seed(self.seed)
        self.drawn = 0

    def _starts(self) -> torch.Tensor:
        self.drawn += 1
        return torch.randint(0, self.data.starts(self.seq_len + 1) - 1, (self.batch,), generator=self.gen)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        # The same draws as indexing one flat array, so runs on a text corpus are unchanged.
        window = self.data.windows(self._starts().numpy(), self.seq_len + 1)  # [B, T+1]
        return window[:, :-1], window[:, 1:]

    def state(self) -> dict[str, int]:
        return {"drawn": self.drawn}

    def load_state(self, state: dict[str, int] | torch.Tensor) -> None:
        if isinstance(state, torch.Tensor):  # checkpoints written before positions were counted
            self.gen.set_state(state)
            return
        self.gen.manual_seed(self.seed)
        self.drawn = 0
        for _ in range(int(state["drawn"])):  # microseconds a draw: far below a training step
            self._starts()


def heldout_batches(data: np.ndarray | TokenStream, seq_len: int, tokens: int, batch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A fixed held-out set: evenly spaced windows covering about `tokens` target tokens."""
    stream = as_stream(data)
    n = max(1, tokens // seq_len)
    last = stream.starts(seq_len + 1) - 1
    if last < 1:
        raise DataError(f"the held-out data ({len(stream)} tokens) is shorter than one window of {seq_len + 1}")
    stride = max(1, last // n)
    starts = np.minimum(np.arange(n) * stride, last)
    window = stream.windows(starts, seq_len + 1)
    return [(window[i : i + batch, :-1], window[i : i + batch, 1:]) for i in range(0, n, batch)]
