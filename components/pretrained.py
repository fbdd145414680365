"""Models and texts that a workload reads from this machine, never from the network.

A pretrained model is named the way transformers' `from_pretrained` takes it: a folder written
by `save_pretrained`, or a hub id that was fetched once beforehand into the local Hugging Face
cache. A text is a UTF-8 file or a folder written by Hugging Face datasets' `save_to_disk` with a
`text` column (WikiText-2 raw as the hub publishes it). Workloads check both in their `preflight`,
on the machine that runs the trial, and say where to get what is missing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def model_config(model: str) -> str:
    """The config.json of `model` on this machine (a folder's, or a cached hub id's), or ''."""
    folder = Path(model).expanduser()
    if folder.is_dir():
        found = folder / "config.json"
        return str(found) if found.is_file() else ""
    if folder.is_absolute() or model.startswith((".", "~")) or model.count("/") > 1:
        return ""  # a path that is not there
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(model, "config.json")
    return cached if isinstance(cached, str) else ""


def is_saved_dataset(path: Path) -> bool:
    """A `save_to_disk` folder: a DatasetDict's or a single Dataset's own metadata file."""
    return (path / "dataset_dict.json").is_file() or (path / "state.json").is_file()


def open_saved(path: Path, split: str, *, field: str = "text_path", split_field: str = "text_split",
               error: type[Exception] = ValueError) -> Any:
    """The dataset a `save_to_disk` folder holds: a Dataset as it is, a DatasetDict's `split`
    (else `error` naming `field`, its splits and `split_field`)."""
    import datasets

    loaded = datasets.load_from_disk(str(path))
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise error(f"{field}={str(path)!r} has splits {sorted(loaded)}, not {split_field}={split!r}")
        return loaded[split]
    return loaded


def check_text(path: str, split: str, sources: str) -> None:
    """Raises naming the field, the formats read and where the text comes from (`sources`)."""
    p = Path(path)
    if p.is_file():
        return
    if not p.is_dir() or not is_saved_dataset(p):
        raise ValueError(f"text_path={path!r} is neither a text file nor a datasets save_to_disk folder: expected {sources}")
    columns = open_saved(p, split).column_names
    if "text" not in columns:
        raise ValueError(f"text_path={path!r} has columns {columns}, no 'text' column: expected {sources}")


def read_text(path: str, split: str) -> str:
    """The file's text, or the `split` of a saved dataset's 'text' column joined by newlines."""
    p = Path(path)
    if p.is_file():
        return p.read_text(encoding="utf-8")
    return "\n".join(open_saved(p, split)["text"])
