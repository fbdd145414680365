"""Fixtures of the kernel tests, imported by the test modules that use them (``from kernel_fixtures
import huge_views``), so that the kernel tests run on their own with ``--confcutdir tests/kernels``:
benchmarks/gpu.py does this on a GPU machine that has torch, triton and pytest but not the
orchestrator's dependencies, which tests/conftest.py imports. (Not a tests/kernels/conftest.py: a
second module named ``conftest`` would shadow tests/conftest.py for every later ``from conftest
import ...`` in the suite.)"""

from __future__ import annotations

import math
import mmap

import pytest
import torch


def _huge_views(shapes, dtype, stride0, device="cpu"):
    """Views into one buffer whose first dimension has stride `stride0` < 2^31, so that index 2
    along it sits past 2^31 elements (an int32 offset wraps there). On the CPU the buffer is a
    reserved, uncommitted mapping (only the touched pages use memory); each view starts 2^31
    elements in, so that a wrapped (negative) int32 offset still lands inside it and shows as a
    wrong value rather than a crash. On a GPU it is a plain allocation of the same size."""
    per = 2 * stride0 + math.prod(shapes[0][1:])
    n = 2 ** 31 + per * len(shapes) + 4096
    if device == "cpu":
        size = n * torch.empty((), dtype=dtype).element_size()
        try:
            buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0x4000))
        except (OSError, OverflowError, ValueError) as e:  # pragma: no cover - strict overcommit or 32-bit
            pytest.skip(f"cannot reserve a {n}-element mapping: {e}")
        base = torch.frombuffer(buf, dtype=dtype)
    else:
        try:
            base = torch.empty(n, dtype=dtype, device=device)
        except torch.OutOfMemoryError:  # pragma: no cover - small GPUs
            pytest.skip(f"no room for {n} elements on {device}")
    views = []
    for i, shape in enumerate(shapes):
        strides = [stride0] + list(torch.empty(shape[1:]).stride())
        views.append(base.as_strided(shape, strides, 2 ** 31 + i * per))
    return views


@pytest.fixture
def huge_views():
    """`_huge_views`: strided views whose offsets pass 2^31 elements without allocating 2^31 of them."""
    return _huge_views
