"""ladder's cache folder (`$LADDER_CACHE`, default `~/.cache/ladder`): built models, trained LMs,
and the empty tracking store that new SQLite stores start from."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """`$LADDER_CACHE` or `~/.cache/ladder`."""
    return Path(os.environ.get("LADDER_CACHE") or Path.home() / ".cache" / "ladder").expanduser()
