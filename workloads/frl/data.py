"""The one-step forecasting data: DNS pairs (u(t0), u(t0 + lag)) stored on the reference grid, or
the same pairs read from a PDEBench-format HDF5 file (`files.py`).

The DNS runs at `dns_n` points per axis and is stored truncated to `ref_n` (|k| < ref_n/2): every
resolution the workload trains or evaluates at is a further truncation of it, and the fixed-
reference error compares predictions with it. Datasets are cached per process by their
parameters, so the trials of a reproduction that share data generate it once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch

from workloads.frl.solver import Burgers, NavierStokes2d, burgers_initial, truncate, vorticity_initial


@dataclass(frozen=True)
class DataSpec:
    pde: str
    nu: float
    dns_n: int
    dns_dt: float
    ref_n: int
    ic_modes: int
    t_starts: tuple[float, ...]
    lag: float
    n_train: int
    n_test: int
    seed: int
    ns_forcing: float
    ns_drag: float
    data_path: str = ""
    data_field: str = "tensor"

    @property
    def dims(self) -> int:
        return 1 if self.pde == "burgers" else 2


@dataclass(frozen=True)
class Dataset:
    spec: DataSpec
    x_train: torch.Tensor  # [N, *ref grid], float64
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor


def solver_for(spec: DataSpec, n: int, dt: float | None = None):
    """The pseudo-spectral solver of `spec`'s PDE on an n-point grid."""
    dt = spec.dns_dt if dt is None else dt
    if spec.pde == "burgers":
        return Burgers(n, spec.nu, dt)
    return NavierStokes2d(n, spec.nu, dt, forcing_amp=spec.ns_forcing, drag=spec.ns_drag)


def _pairs(spec: DataSpec, count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    per_ic = len(spec.t_starts)
    n_ic = math.ceil(count / per_ic)
    if spec.pde == "burgers":
        u = burgers_initial(n_ic, spec.dns_n, spec.ic_modes, generator)
    else:
        u = vorticity_initial(n_ic, spec.dns_n, generator)
    solver = solver_for(spec, spec.dns_n)
    xs, ys, t = [], [], 0.0
    for t0 in sorted(spec.t_starts):
        u = solver.evolve(u, t0 - t) if t0 > t else u
        t = t0
        xs.append(truncate(u, spec.ref_n, spec.dims))
        ys.append(truncate(solver.evolve(u, spec.lag), spec.ref_n, spec.dims))
    # IC-major order, so that cutting to `count` keeps whole trajectories first.
    x = torch.stack(xs, 1).flatten(0, 1)[:count]
    y = torch.stack(ys, 1).flatten(0, 1)[:count]
    return x, y


@lru_cache(maxsize=4)
def make_dataset(spec: DataSpec) -> Dataset:
    if spec.data_path:  # a PDEBench-format file instead of the DNS
        from workloads.frl.files import read_pairs

        x_tr, y_tr, x_te, y_te = read_pairs(spec.data_path, spec.data_field, spec.dims, spec.t_starts, spec.lag,
                                            spec.n_train, spec.n_test, spec.ref_n, truncate)
        return Dataset(spec, x_tr, y_tr, x_te, y_te)
    # Train and test come from disjoint initial conditions: separate generator streams.
    x_tr, y_tr = _pairs(spec, spec.n_train, 1_000_003 * spec.seed + 1)
    x_te, y_te = _pairs(spec, spec.n_test, 1_000_003 * spec.seed + 2)
    return Dataset(spec, x_tr, y_tr, x_te, y_te)
