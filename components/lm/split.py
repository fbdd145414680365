"""The held-out split rule that text corpora (`data`) and tokenized datasets (`tokens`) share: a
file belongs to the held-out part by a hash of its path relative to the corpus root, so the split
is deterministic, independent of file order and never shares a file between the two parts."""

from __future__ import annotations

import hashlib


def is_heldout(rel_path: str, heldout_frac: float) -> bool:
    digest = hashlib.sha1(rel_path.encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "little") / 2**32 < heldout_frac
