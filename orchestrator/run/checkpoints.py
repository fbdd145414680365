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


def identity(workload: str, config: dict[str, Any]) -> dict[str, Any]:
    """What a checkpoint belongs to: the workload and its config (a plain dict of fields)."""
    return {"workload": workload, "config": {k: v for k, v in config.items()}}


def check_identity(path: Path, found: dict[str, Any] | None, expected: dict[str, Any] | None) -> None:
    """Refuse a checkpoint written by another workload or another config: it would not fit, or
    worse, fit and continue someone else's run."""
    if not found or not expected:
        return  # written before checkpoints carried their identity, or by a caller that has none
    if found.get("workload") != expected.get("workload"):
        raise CheckpointMismatch(
            f"checkpoint {path} belongs to a run of {found.get('workload')!r}, not {expected.get('workload')!r}: "
            f"resume a folder of this workload's own runs (ladder-runs/{expected.get('workload')}/...)")
    a, b = found.get("config", {}), expected.get("config", {})
    changed = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    if changed:
        detail = ", ".join(f"{k}: {a.get(k)!r} in the checkpoint, {b.get(k)!r} now" for k in changed[:5])
        more = f" and {len(changed) - 5} more" if len(changed) > 5 else ""
        raise CheckpointMismatch(
            f"checkpoint {path} was written with another {expected.get('workload')} config ({detail}{more}): "
            "resume with the config it was written with, or start a new run")


class CheckpointMismatch(CheckpointError):
    """A readable checkpoint that belongs to another workload or config."""


def write_checkpoint(folder: str | os.PathLike, state: dict[str, Any], *, keep: int = 2,
                     identity: dict[str, Any] | None = None) -> Path:
    """Write `state` (which must carry an integer `step`) and prune all but the newest `keep`.

    `identity` (see `identity()`) is stored beside the state, so that a restore can refuse a
    checkpoint that belongs to another run's workload or config."""
    if "step" not in state:
        raise ValueError("a checkpoint state must include 'step' (the last completed step)")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    step = int(state["step"])
    final = folder / f"step-{step:09d}.pt"
    tmp = folder / f".tmp-{os.getpid()}-{final.name}"
    import torch  # deferred so the CLI can name checkpoint errors without importing torch

    payload = {"ladder_checkpoint": FORMAT_VERSION, "state": state}
    if identity is not None:
        payload["identity"] = identity
    torch.save(payload, tmp)
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, final)
    for old in list_checkpoints(folder)[:-keep] if keep > 0 else []:
        old.unlink(missing_ok=True)
    return final


def read_checkpoint(path: str | os.PathLike, identity: dict[str, Any] | None = None) -> dict[str, Any]:
    """Load one checkpoint file; raises `CheckpointError` naming the file when it is unreadable, and
    `CheckpointMismatch` when it belongs to another workload or config than `identity`."""
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
    check_identity(path, payload.get("identity"), identity)
    return payload["state"]


def load_latest(folder: str | os.PathLike, identity: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The newest readable checkpoint's state, falling back past unreadable ones; None if none exist.

    A readable checkpoint of another workload or config is an error, not something to skip: the
    folder is not this run's."""
    candidates = list_checkpoints(folder)
    errors = []
    for path in reversed(candidates):
        try:
            state = read_checkpoint(path, identity)
        except CheckpointMismatch:
            raise
        except CheckpointError as exc:
            errors.append(str(exc))
            print(f"ladder: {exc}; trying the previous checkpoint", file=sys.stderr)
            continue
        return state
    if errors:
        raise CheckpointError("no readable checkpoint in " + str(folder) + ":\n  " + "\n  ".join(errors))
    return None
