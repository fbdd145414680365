"""Pre-tokenized datasets for the language-model workloads: token-id shards on shared storage, read memory-mapped.

A dataset is a folder holding a header `tokens.json` and flat binary shards of token ids:

    tokens.json        {"format": "ladder-tokens/1", "dtype": "uint16", "vocab_size": 50257,
                        "train": ["train-00000.bin", ...], "heldout": ["heldout-00000.bin"]}
    train-00000.bin    token ids, little-endian `dtype`, no header, documents separated by the
                       tokenizer's end-of-text id (the sampler draws windows across them)

`dtype` is "uint16" (vocabularies up to 65,536) or "uint32". Shards are opened with
`numpy.memmap`, so a trial reads only the windows it samples: a multi-billion-token dataset on
NFS or a mounted bucket costs no memory up front. Windows never cross a shard boundary. The
held-out shards are the evaluation split (`heldout_frac` does not apply); `max_bytes` caps the
training tokens read.

`write_dataset` writes this format from arrays of ids; `python -m components.lm.tokens
TEXT_DIR OUT_DIR --tokenizer NAME_OR_PATH` tokenizes a folder of text files with a Hugging Face
tokenizer (a local folder, or a hub id on a machine that may download it).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

HEADER = "tokens.json"
FORMAT = "ladder-tokens/1"
DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
"""Token-id types by name; little-endian on disk whatever the machine."""


class TokenDataError(ValueError):
    """A tokenized dataset folder is incomplete or inconsistent; the message names the fix."""


def is_token_dataset(path: str | Path) -> bool:
    return (Path(path).expanduser() / HEADER).is_file()


def read_header(folder: str | Path) -> dict:
    """The checked header of a dataset folder: every shard present and a whole number of ids."""
    root = Path(folder).expanduser()
    path = root / HEADER
    try:
        header = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise TokenDataError(f"cannot read the dataset header {str(path)!r}: {exc}") from None
    if header.get("format") != FORMAT:
        raise TokenDataError(f"{path}: format must be {FORMAT!r}, got {header.get('format')!r}")
    if header.get("dtype") not in DTYPES:
        raise TokenDataError(f"{path}: dtype must be one of {', '.join(DTYPES)}, got {header.get('dtype')!r}")
    vocab = header.get("vocab_size")
    if not isinstance(vocab, int) or not 2 <= vocab <= int(np.iinfo(DTYPES[header["dtype"]]).max) + 1:
        raise TokenDataError(f"{path}: vocab_size {vocab!r} does not fit dtype {header['dtype']}")
    itemsize = DTYPES[header["dtype"]].itemsize
    for split in ("train", "heldout"):
        shards = header.get(split)
        if not isinstance(shards, list) or not shards:
            raise TokenDataError(f"{path}: {split!r} must list at least one shard file")
        for name in shards:
            shard = root / name
            if not shard.is_file():
                raise TokenDataError(f"{path} lists {name!r}, which is missing from {str(root)!r}")
            if shard.stat().st_size % itemsize:
                raise TokenDataError(f"{shard}: size is not a multiple of {itemsize} bytes ({header['dtype']})")
    return header


def open_split(folder: str | Path, split: str, *, max_tokens: int = 0) -> list[np.ndarray]:
    """The shards of `split` as read-only memory maps, cut to `max_tokens` in all (0: no cap)."""
    root = Path(folder).expanduser()
    header = read_header(root)
    parts, total = [], 0
    for name in header[split]:
        if (root / name).stat().st_size == 0:
            continue  # numpy cannot map an empty file; an empty shard adds nothing
        part = np.memmap(root / name, dtype=DTYPES[header["dtype"]], mode="r")
        if max_tokens and total + len(part) > max_tokens:
            part = part[: max_tokens - total]
        parts.append(part)
        total += len(part)
        if max_tokens and total >= max_tokens:
            break
    return parts


def write_dataset(folder: str | Path, train: Sequence[np.ndarray], heldout: Sequence[np.ndarray], *,
                  vocab_size: int) -> Path:
    """Write shards (one file per array) and the header; returns the folder."""
    root = Path(folder).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    dtype = "uint16" if vocab_size <= 2**16 else "uint32"
    header = {"format": FORMAT, "dtype": dtype, "vocab_size": int(vocab_size), "train": [], "heldout": []}
    for split, arrays in (("train", train), ("heldout", heldout)):
        for i, ids in enumerate(arrays):
            ids = np.asarray(ids)
            if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
                raise TokenDataError(f"{split} shard {i} has ids outside [0, {vocab_size})")
            name = f"{split}-{i:05d}.bin"
            ids.astype(DTYPES[dtype]).tofile(root / name)
            header[split].append(name)
    (root / HEADER).write_text(json.dumps(header, indent=2))
    return root


def tokenize_folder(text_dir: str | Path, out_dir: str | Path, encode: Callable[[str], list[int]], *,
                    vocab_size: int, eot_id: int, heldout_frac: float = 0.01,
                    shard_tokens: int = 100_000_000, suffixes: Iterable[str] = (".txt", ".md", ".json", ".py")) -> Path:
    """Tokenize every text file under `text_dir` into a dataset at `out_dir`: files go to the
    held-out split by a hash of their relative path (as `corpus` splits text folders), each
    document followed by `eot_id`, shards cut every `shard_tokens` ids."""
    from components.lm.split import is_heldout

    root = Path(text_dir).expanduser()
    wanted = tuple(s.lower() for s in suffixes)
    files = sorted((p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in wanted),
                   key=lambda p: p.relative_to(root).as_posix())
    if not files:
        raise TokenDataError(f"no text files ({', '.join(wanted)}) under {str(root)!r}")
    shards: dict[str, list[np.ndarray]] = {"train": [], "heldout": []}
    pending: dict[str, list[int]] = {"train": [], "heldout": []}
    for path in files:
        split = "heldout" if is_heldout(path.relative_to(root).as_posix(), heldout_frac) else "train"
        pending[split].extend(encode(path.read_text(encoding="utf-8", errors="replace")))
        pending[split].append(eot_id)
        if len(pending[split]) >= shard_tokens:
            shards[split].append(np.asarray(pending[split]))
            pending[split] = []
    for split in shards:
        if pending[split] or not shards[split]:
            shards[split].append(np.asarray(pending[split], dtype=np.int64))
    return write_dataset(out_dir, shards["train"], shards["heldout"], vocab_size=vocab_size)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m components.lm.tokens",
                                     description="Tokenize a folder of text files into a ladder token dataset (ladder-tokens/1).")
    parser.add_argument("text_dir")
    parser.add_argument("out_dir")
    parser.add_argument("--tokenizer", required=True, help="Hugging Face tokenizer: a local folder or a hub id")
    parser.add_argument("--heldout-frac", type=float, default=0.01)
    parser.add_argument("--shard-tokens", type=int, default=100_000_000)
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    eot = tok.eos_token_id if tok.eos_token_id is not None else tok.sep_token_id
    if eot is None:
        parser.error(f"tokenizer {args.tokenizer!r} has no end-of-text token to separate documents")
    out = tokenize_folder(args.text_dir, args.out_dir, lambda text: tok.encode(text, add_special_tokens=False),
                          vocab_size=len(tok), eot_id=eot, heldout_frac=args.heldout_frac,
                          shard_tokens=args.shard_tokens)
    header = read_header(out)
    print(f"{out}: {header['dtype']} ids, vocabulary {header['vocab_size']}, "
          f"{len(header['train'])} train and {len(header['heldout'])} held-out shards")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
