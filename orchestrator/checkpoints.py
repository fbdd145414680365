"""Checkpoint files shared by every `Run`: atomic writes, the newest readable one wins.

A checkpoint is one `torch.save` file `step-<step>.pt` holding the workload's state dict. It is
written to a temporary name and renamed, so a process killed mid-write never leaves a torn file
under a real name; a file that is unreadable anyway (a disk fault, a copy cut short) is reported
and the previous checkpoint is used instead.
"""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path
from typing import Any

FORMAT_VERSION = 1


class CheckpointError(RuntimeError):
    """No checkpoint in a folder could be read."""


def _step_of(path: Path) -> int:
    try:
        return int(path.stem.split("-", 1)[1])
    except (IndexError, ValueError):
        return -1


def list_checkpoints(folder: str | os.PathLike) -> list[Path]:
    """Checkpoint files in `folder`, oldest first."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [p for p in folder.glob("step-*.pt") if _step_of(p) >= 0]
    return sorted(found, key=_step_of)


def write_checkpoint(folder: str | os.PathLike, state: dict[str, Any], *, keep: int = 2) -> Path:
    """Write `state` (which must carry an integer `step`) and prune all but the newest `keep`."""
    if "step" not in state:
        raise ValueError("a checkpoint state must include 'step' (the last completed step)")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    step = int(state["step"])
    final = folder / f"step-{step:09d}.pt"
    tmp = folder / f".tmp-{os.getpid()}-{final.name}"
    import torch  # deferred so the CLI can name checkpoint errors without importing torch

    torch.save({"ladder_checkpoint": FORMAT_VERSION, "state": state}, tmp)
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, final)
    for old in list_checkpoints(folder)[:-keep] if keep > 0 else []:
        old.unlink(missing_ok=True)
    return final


def read_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Load one checkpoint file; raises `CheckpointError` naming the file when it is unreadable."""
    import torch

    path = Path(path)
    try:
        # weights_only: tensors, numbers, strings and containers, never arbitrary pickled objects,
        # so loading a checkpoint from a shared folder cannot run code.
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if "weights_only" not in str(exc) and "Weights only" not in str(exc):
            raise CheckpointError(f"checkpoint {path} is unreadable (UnpicklingError: {exc})") from exc
        raise CheckpointError(
            f"checkpoint {path} holds objects other than tensors, numbers, strings, lists and dicts, and ladder "
            f"does not unpickle arbitrary objects. Save plain state (tensors, state_dict(), numbers). "
            f"({str(exc).splitlines()[0]})") from exc
    except Exception as exc:  # torn zip, truncated pickle, wrong format: all mean "unusable"
        raise CheckpointError(f"checkpoint {path} is unreadable ({type(exc).__name__}: {exc})") from exc
    if not isinstance(payload, dict) or payload.get("ladder_checkpoint") != FORMAT_VERSION:
        raise CheckpointError(f"{path} is not a ladder checkpoint (format {FORMAT_VERSION})")
    return payload["state"]


def load_latest(folder: str | os.PathLike) -> dict[str, Any] | None:
    """The newest readable checkpoint's state, falling back past unreadable ones; None if none exist."""
    candidates = list_checkpoints(folder)
    errors = []
    for path in reversed(candidates):
        try:
            state = read_checkpoint(path)
        except CheckpointError as exc:
            errors.append(str(exc))
            print(f"ladder: {exc}; trying the previous checkpoint", file=sys.stderr)
            continue
        return state
    if errors:
        raise CheckpointError("no readable checkpoint in " + str(folder) + ":\n  " + "\n  ".join(errors))
    return None
