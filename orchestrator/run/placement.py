"""Device placement, checked on a machine without a GPU.

A workload that runs on the CPU can still leave a tensor on the CPU that a GPU run needs on
`run.device`: a batch never moved, a mask made with `torch.arange(n)`, a second model nobody called
`.to()` on. On a CPU-only machine every tensor is on the same device, so nothing fails until the
workload first meets a GPU.

`DevicePlacement` is a `TorchFunctionMode` that runs the workload on the CPU while keeping, for
every storage, whether it was placed on `run.device` or left where torch puts tensors by default, and
fails the first op that mixes the two, as CUDA does. The run's device is `cpu:0`
(`PLACED_DEVICE`), which compares unequal to torch's default `cpu`, so the mode tells them apart:

- *placed*: made by a factory with `device=run.device`, moved by `.to(run.device)` (or `.to(t)`,
  `.to(t.device)`, `type_as(t)` of a placed `t`; `Module.to(run.device)` moves every parameter and
  buffer), or computed by an op from a placed tensor;
- *left*: made by a factory without a device (`torch.arange(n)`, `torch.tensor(array)`, a module's
  parameters as `nn.Linear` makes them), moved by `.cpu()` or `.to("cpu")`, computed only from left
  tensors, or an `nn.Parameter` nobody placed (however it was loaded);
- *unknown*: any other tensor made where the mode does not see it (`torch.from_numpy`, `torch.load`,
  safetensors, functorch's transforms). It mixes with either, and takes the placement of what it is
  computed with. `ladder check` marks what `run.restore()` returns as left: checkpoints load to the
  CPU.

An op whose tensor arguments include both placed and left ones fails with `PlacementError`,
naming the op, the shapes and the fix. What CUDA allows stays allowed: zero-dimensional tensors
with either (a CPU scalar), index tensors in `t[idx]`, `copy_`, `__setitem__` and moves across
devices. `.numpy()` of a placed tensor fails, as on CUDA.

Moving a tensor copies it (on the CPU, `.to` returns the same storage), so a tensor moved to the
device and the original it came from stay apart, as on a GPU. Placement belongs to a storage (held
by a weak reference, so a freed storage's address carries nothing over), which views, `.data`,
`nn.Parameter(t)` and `param.data = t` share.

What it cannot see: code that branches on `device.type == "cuda"`, generators (a
`torch.Generator()` and one made on the device are both on the CPU here), and kernels that only
exist on CUDA.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.overrides import TorchFunctionMode

PLACED_DEVICE = torch.device("cpu", 0)
"""The stand-in for a GPU: the same CPU, but a device that compares unequal to the default `cpu`."""


class PlacementError(RuntimeError):
    """An op mixed tensors on `run.device` with tensors left on the default CPU."""


_FACTORIES = {
    torch.tensor, torch.as_tensor, torch.asarray, torch.zeros, torch.ones, torch.empty, torch.full, torch.rand,
    torch.randn, torch.randint, torch.randperm, torch.arange, torch.linspace, torch.logspace, torch.eye,
    torch.empty_strided, torch.scalar_tensor, torch.tril_indices, torch.triu_indices, torch.normal,
    torch.bartlett_window, torch.hann_window, torch.hamming_window, torch.blackman_window, torch.kaiser_window,
    torch.complex, torch.polar, torch.frombuffer, torch.range,
}
_LIKE = {torch.zeros_like, torch.ones_like, torch.empty_like, torch.full_like, torch.rand_like, torch.randn_like,
         torch.randint_like}
_NEW = {torch.Tensor.new_zeros, torch.Tensor.new_ones, torch.Tensor.new_empty, torch.Tensor.new_full,
        torch.Tensor.new_tensor, torch.Tensor.new_empty_strided}
# Ops CUDA runs across devices (copies), and the moves handled apart.
_ACROSS = {torch.Tensor.copy_, torch.Tensor.__setitem__, torch._has_compatible_shallow_copy_type,
           torch.Tensor.set_, torch.Tensor.__deepcopy__}
_MOVES = {torch.Tensor.to, torch.Tensor.cpu, torch.Tensor.type_as}
# One look-up per op for the ops handled apart.
_KIND = {**{f: "move" for f in _MOVES}, **{f: "made" for f in (*_FACTORIES, *_LIKE, *_NEW)},
         **{f: "across" for f in _ACROSS}, torch.Tensor.numpy: "numpy"}
_DEVICE = torch.Tensor.device  # a getter reaches the mode as `<descriptor>.__get__`, a new object each time
_GRAD = torch.Tensor.grad


def _storage(t: torch.Tensor) -> Any:
    """The storage a tensor's placement belongs to (None: an empty or storage-less tensor, such as
    functorch's wrappers, or one on the meta device)."""
    try:
        if t.layout is not torch.strided:
            return None
        storage = t.untyped_storage()
        return storage if storage.data_ptr() else None
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def _tensors(items: Any, into: list[torch.Tensor]) -> list[torch.Tensor]:
    """The tensors among `items` (an iterable) and inside the tuples, lists and dicts among them (a
    pytree walk costs several times more per op)."""
    for item in items:
        if isinstance(item, torch.Tensor):
            into.append(item)
        elif isinstance(item, (tuple, list)):
            _tensors(item, into)
        elif isinstance(item, dict):
            _tensors(item.values(), into)
    return into


def _describe(t: torch.Tensor) -> str:
    return f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}"


class DevicePlacement(TorchFunctionMode):
    """Fail an op that mixes tensors placed on `PLACED_DEVICE` with tensors left on the CPU; see
    the module docstring. `ops` counts the ops seen."""

    def __init__(self) -> None:
        super().__init__()
        self._where: dict[int, tuple[bool, StorageWeakRef]] = {}
        self.ops = 0

    # -- bookkeeping
    def placement(self, t: torch.Tensor) -> bool | None:
        """True: placed on run.device; False: left on the CPU; None: unknown (or no storage)."""
        storage = _storage(t)
        if storage is None:
            return None
        entry = self._where.get(storage.data_ptr())
        if entry is not None and not entry[1].expired():
            return entry[0]
        if isinstance(t, torch.nn.Parameter):
            return False  # a parameter nobody placed: wherever it came from, it is on the CPU
        return None

    def placed(self, t: torch.Tensor) -> bool:
        return self.placement(t) is True

    def _mark(self, out: Any, placed: bool | None) -> None:
        if placed is None:
            return
        for t in (out,) if isinstance(out, torch.Tensor) else _tensors((out,), []):
            storage = _storage(t)
            if storage is not None:
                key = storage.data_ptr()
                entry = self._where.get(key)
                if entry is None or entry[0] is not placed or entry[1].expired():
                    self._where[key] = (placed, StorageWeakRef(storage))

    def leave(self, obj: Any) -> Any:
        """Mark every tensor in `obj` (nested dicts, lists, tuples) as left on the CPU, as what
        `torch.load(map_location="cpu")` returned; returns `obj`."""
        self._mark(obj, False)
        return obj

    def _move(self, t: torch.Tensor, out: Any, placed: bool | None) -> Any:
        """`out`, the result of moving `t`: a copy when it kept `t`'s storage but changes its placement."""
        if (placed is not None and isinstance(out, torch.Tensor) and self.placement(t) is not placed
                and _storage(out) is not None and out.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()):
            out = out.clone()
        self._mark(out, placed)
        return out

    @staticmethod
    def _target(device: Any) -> bool | None:
        """Whether moving to `device` places a tensor (None: no device given, or one that is not a
        CPU, such as `meta`, which the check leaves alone)."""
        if device is None:
            return None
        device = torch.device(device)
        return device == PLACED_DEVICE if device.type == "cpu" else None

    # -- the mode
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.ops += 1
        name = getattr(func, "__name__", "")
        owner = getattr(func, "__self__", None)
        if name == "__get__" and owner is _DEVICE:
            return PLACED_DEVICE if self.placed(args[0]) else func(*args, **kwargs)
        if name == "__get__" and owner is _GRAD:
            grad = func(*args, **kwargs)
            self._mark(grad, self.placement(args[0]))
            return grad
        kind = _KIND.get(func)
        if kind == "move":
            return self._moved(func, args, kwargs)
        if kind == "made":
            return self._made(func, args, kwargs)
        if kind == "numpy" and self.placed(args[0]):
            raise PlacementError(f"numpy() of a {_describe(args[0])} tensor on run.device fails on a GPU: call "
                                 f".cpu() first (t.detach().cpu().numpy())")
        if kind == "across" or name in ("__get__", "__set__"):
            out = func(*args, **kwargs)
            if func is torch.Tensor.__deepcopy__:
                self._mark(out, self.placement(args[0]))
            elif func is torch.Tensor.set_ and len(args) > 1:
                self._mark(args[0], self.placement(args[1]))
            return out
        tensors = _tensors(args[:1] if func is torch.Tensor.__getitem__ else args, [])  # CUDA takes CPU indices
        if kwargs and func is not torch.Tensor.__getitem__:
            _tensors(kwargs.values(), tensors)
        placed = left = stray = None  # the first placed tensor, whether any is left, the first left with dims
        for t in tensors:
            w = self.placement(t)
            if w is True:
                placed = placed if placed is not None else t
            elif w is False:
                left = True
                if stray is None and t.dim() > 0:
                    stray = t
        if placed is not None and stray is not None:
            raise PlacementError(
                f"{getattr(func, '__qualname__', name or func)} mixes a tensor on run.device ({_describe(placed)}) "
                f"with one left on the CPU ({_describe(stray)}): on a GPU this op fails. Make that tensor with "
                f"device=run.device, or move it with .to(run.device)")
        out = func(*args, **kwargs)
        if placed is not None or left:
            self._mark(out, placed is not None)
        return out

    def _moved(self, func, args, kwargs) -> Any:
        t = args[0]
        if func is torch.Tensor.cpu:
            return self._move(t, func(*args, **kwargs), False)
        if func is torch.Tensor.type_as:
            return self._move(t, func(*args, **kwargs), self.placement(args[1]))
        rest = args[1:]
        other = next((a for a in (*rest, kwargs.get("other")) if isinstance(a, torch.Tensor)), None)
        if other is not None:  # .to(other): other's device and dtype
            return self._move(t, func(*args, **kwargs), self.placement(other))
        parsed = {k: v for k, v in kwargs.items() if k != "copy"}
        target = self._target(torch._C._nn._parse_to(*rest, **parsed)[0])
        if target is None:  # a dtype or memory format only
            out = func(*args, **kwargs)
            self._mark(out, self.placement(t))
            return out
        return self._move(t, func(*args, **kwargs), target)  # cpu:0 is the CPU to torch

    def _made(self, func, args, kwargs) -> Any:
        target = self._target(kwargs.get("device"))
        source = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if target is None:
            # *_like and new_* follow their tensor; as_tensor(t) keeps t where it is; the rest are made on the CPU.
            target = self.placement(source) if source is not None else False
        out = func(*args, **kwargs)
        if source is not None and func in (torch.as_tensor, torch.asarray):
            return self._move(source, out, target)
        self._mark(out, target)
        return out


class Enough(BaseException):
    """Raised from the run's report once the check has seen enough steps (not an Exception: a
    workload's own `except Exception` does not swallow it)."""


def stop_after(reports: int) -> Callable[[Any, int], None]:
    """A `LocalRun` `on_report` that raises `Enough` at the `reports`-th report; its `.seen` lists
    the steps reported."""
    seen: list[int] = []

    def on_report(metrics: Any, step: int) -> None:
        seen.append(step)
        if len(seen) >= reports:
            raise Enough

    on_report.seen = seen  # type: ignore[attr-defined]
    return on_report


def few_steps(train: Callable[[Any, Any], Any], cfg: Any, folder: str, *, device: Any = None,
              reports: int = 2) -> dict[str, Any]:
    """Run `train(cfg, run)` on a `LocalRun` until its `reports`-th report (or its end): on
    `device` when given (a GPU: a stray tensor fails there by itself), else on `PLACED_DEVICE`
    under `DevicePlacement`. Returns the reports made and the ops the check saw (None on a device).
    A mixed op raises `PlacementError` (or torch's own error on a GPU)."""
    import contextlib

    from orchestrator.run import LocalRun

    stop = stop_after(reports)
    run = LocalRun(folder, device=PLACED_DEVICE if device is None else device, on_report=stop)
    mode = DevicePlacement() if device is None else None
    try:
        with mode if mode is not None else contextlib.nullcontext():
            train(cfg, run)
    except Enough:
        pass
    return {"reports": len(stop.seen), "ops": mode.ops if mode else None}


def where(exc: BaseException, within: str | None = None) -> str:
    """`file:line` of the innermost frame of `exc`'s traceback outside torch and this module: the
    line that made the op. With `within` (a folder: the workload's own), also the innermost line in
    it when the op was made elsewhere (a shared model's forward): `gpt.py:101, from workload.py:208`."""
    import os
    import traceback

    skip = (os.path.dirname(torch.__file__) + os.sep, __file__)
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(skip)]
    if not frames:
        return "unknown"

    def shown(f: Any) -> str:
        rel = os.path.relpath(f.filename)
        return f"{f.filename if rel.startswith('..') else rel}:{f.lineno}"

    inner = frames[-1]
    if within is None or inner.filename.startswith(within):
        return shown(inner)
    own = [f for f in frames if f.filename.startswith(within)]
    return shown(inner) + (f", from {shown(own[-1])}" if own else "")
