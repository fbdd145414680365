"""Trajectories read from PDEBench-format HDF5 files, in place of the generated DNS.

PDEBench (Takamoto et al., NeurIPS 2022 Datasets and Benchmarks) ships each PDE as one HDF5 file
of trajectories on a periodic grid, with the time stamps beside them:

- 1-D, e.g. `1D_Burgers_Sols_Nu0.01.hdf5`: `tensor` [N, T, X], `x-coordinate` [X],
  `t-coordinate` [T or T+1];
- 2-D, e.g. the compressible CFD files `2D_CFD_Rand_M0.1_Eta0.01_Zeta0.01_periodic_128_Train.hdf5`:
  one dataset per field (`density`, `pressure`, `Vx`, `Vy`) [N, T, X, Y], `x-coordinate`,
  `y-coordinate`, `t-coordinate`; the incompressible Navier-Stokes files hold `velocity`
  [N, T, X, Y, 2] and `t` [N, T].

`data_field` names the scalar field to forecast. `vorticity` is derived from the velocity
(`Vx`/`Vy` or `velocity`) by spectral derivatives, which assumes the grid is periodic, as in the
`periodic` files. A pair (u(t0), u(t0 + lag)) is read for every start time in `t_starts` from
each trajectory: times in the file's units, matched to its stamps to within half a step. Training
pairs come from the first trajectories, test pairs from the ones after them. Only the time slices
used are read, so a file of several GB costs only the pairs it gives.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

WHERE = ("PDEBench's files are at https://darus.uni-stuttgart.de/dataset.xhtml?persistentId=doi:10.18419/darus-2986 "
         "(e.g. 1D_Burgers_Sols_Nu0.01.hdf5; 2D_CFD_Rand_M0.1_Eta0.01_Zeta0.01_periodic_128_Train.hdf5)")
SUFFIXES = (".h5", ".hdf5")


class FileDataError(ValueError):
    """A trajectory file that cannot be read as the config asks, with what to change."""


def _h5py():
    try:
        import h5py
    except ImportError:  # pragma: no cover - a dependency of ladder
        raise FileDataError("reading HDF5 trajectories needs h5py: pip install h5py") from None
    return h5py


def check_path(data_path: str) -> None:
    if Path(data_path).suffix.lower() not in SUFFIXES:
        raise FileDataError(f"data_path={data_path!r} is not an HDF5 file ({', '.join(SUFFIXES)}); {WHERE}")


def _velocity_keys(f) -> tuple[str, ...]:
    if "Vx" in f and "Vy" in f:
        return ("Vx", "Vy")
    if "velocity" in f:
        return ("velocity",)
    raise FileDataError(f"data_field='vorticity' needs the velocity (Vx and Vy, or velocity); the file holds "
                        f"{', '.join(sorted(f.keys()))}")


def _field_shape(f, data_field: str, dims: int) -> tuple[int, ...]:
    """[N, T, *grid] of the field, checked against the PDE's dimensions."""
    if data_field == "vorticity":
        keys = _velocity_keys(f)
        shape = tuple(f[keys[0]].shape)
        shape = shape[:-1] if keys == ("velocity",) else shape
        if dims != 2:
            raise FileDataError("data_field='vorticity' is a 2-D field: set pde='navier_stokes'")
    else:
        if data_field not in f:
            raise FileDataError(f"data_field={data_field!r} is not in the file; it holds {', '.join(sorted(f.keys()))}")
        shape = tuple(f[data_field].shape)
    if len(shape) != 2 + dims:
        raise FileDataError(f"data_field={data_field!r} has shape {shape}; pde={'burgers' if dims == 1 else 'navier_stokes'} "
                            f"needs [trajectories, times, {'x' if dims == 1 else 'x, y'}]")
    grid = shape[2:]
    if len(set(grid)) != 1 or grid[0] % 2:
        raise FileDataError(f"the grid {grid} must be square with an even number of points per axis")
    return shape


def _times(f, steps: int) -> np.ndarray:
    """The time of each stored step (PDEBench's `t-coordinate` may carry one stamp more)."""
    if "t-coordinate" in f:
        t = np.asarray(f["t-coordinate"][:], dtype=np.float64)
    elif "t" in f:
        t = np.asarray(f["t"][:], dtype=np.float64)
        t = t[0] if t.ndim == 2 else t
    else:
        raise FileDataError("the file has no time stamps (t-coordinate or t)")
    if t.size < steps:
        raise FileDataError(f"the file stamps {t.size} times for {steps} stored steps")
    return t[:steps]


def _index(times: np.ndarray, t: float) -> int:
    j = int(np.argmin(np.abs(times - t)))
    step = float(np.median(np.diff(times))) if times.size > 1 else math.inf
    if abs(times[j] - t) > 0.5 * step + 1e-12:
        raise FileDataError(f"time {t:g} is not among the file's stamps ({times[0]:g} to {times[-1]:g}, every {step:g}): "
                            f"choose t_starts and lag on that grid")
    return j


def describe(data_path: str, data_field: str, dims: int, t_starts: tuple[float, ...], lag: float) -> dict:
    """Shape facts for the checks before a run: trajectories, grid, and the time indices used."""
    check_path(data_path)
    path = Path(data_path).expanduser()
    if not path.is_file():
        raise FileDataError(f"data_path={data_path!r} does not exist (relative paths are read from the folder the run "
                            f"starts in); {WHERE}")
    with _h5py().File(path, "r") as f:
        shape = _field_shape(f, data_field, dims)
        times = _times(f, shape[1])
        pairs = [(_index(times, t0), _index(times, t0 + lag)) for t0 in sorted(t_starts)]
    return {"trajectories": shape[0], "grid": shape[2], "pairs": pairs}


def _length(f, n: int) -> float:
    """The periodic domain's side: n times the spacing of `x-coordinate` (2 pi without it)."""
    if "x-coordinate" in f and f["x-coordinate"].shape[0] > 1:
        x = np.asarray(f["x-coordinate"][:2], dtype=np.float64)
        return n * float(x[1] - x[0])
    return 2 * math.pi


def _vorticity(vx: torch.Tensor, vy: torch.Tensor, length: float) -> torch.Tensor:
    """dVy/dx - dVx/dy on the periodic [X, Y] grid of side `length` (axis -2 is x)."""
    n = vx.shape[-1]
    k = torch.fft.fftfreq(n, d=length / n, dtype=torch.float64) * 2 * math.pi
    kx, ky = k[:, None], k[None, :]
    wh = 1j * kx * torch.fft.fft2(vy) - 1j * ky * torch.fft.fft2(vx)
    return torch.fft.ifft2(wh).real


def _slice(f, data_field: str, rows: slice, j: int) -> torch.Tensor:
    if data_field != "vorticity":
        return torch.from_numpy(np.asarray(f[data_field][rows, j], dtype=np.float64))
    keys = _velocity_keys(f)
    if keys == ("velocity",):
        v = np.asarray(f["velocity"][rows, j], dtype=np.float64)
        vx, vy = torch.from_numpy(v[..., 0]), torch.from_numpy(v[..., 1])
    else:
        vx = torch.from_numpy(np.asarray(f["Vx"][rows, j], dtype=np.float64))
        vy = torch.from_numpy(np.asarray(f["Vy"][rows, j], dtype=np.float64))
    return _vorticity(vx, vy, _length(f, vx.shape[-1]))


def read_pairs(data_path: str, data_field: str, dims: int, t_starts: tuple[float, ...], lag: float,
               n_train: int, n_test: int, ref_n: int, truncate) -> tuple[torch.Tensor, ...]:
    """(x_train, y_train, x_test, y_test) on the reference grid: each field truncated to
    |k| < ref_n/2 by `truncate` (the workload's spectral truncation), float64."""
    facts = describe(data_path, data_field, dims, t_starts, lag)
    per = len(facts["pairs"])
    n_tr, n_te = math.ceil(n_train / per), math.ceil(n_test / per)
    if n_tr + n_te > facts["trajectories"]:
        raise FileDataError(f"data_path={data_path!r} has {facts['trajectories']} trajectories; n_train={n_train} and "
                            f"n_test={n_test} at {per} pairs each need {n_tr + n_te}: lower them")
    if facts["grid"] < ref_n:
        raise FileDataError(f"the file's grid has {facts['grid']} points per axis, below ref_n={ref_n}: lower ref_n")
    out = []
    with _h5py().File(Path(data_path).expanduser(), "r") as f:
        for rows, count in ((slice(0, n_tr), n_train), (slice(n_tr, n_tr + n_te), n_test)):
            xs = [truncate(_slice(f, data_field, rows, j0), ref_n, dims) for j0, _ in facts["pairs"]]
            ys = [truncate(_slice(f, data_field, rows, j1), ref_n, dims) for _, j1 in facts["pairs"]]
            # Trajectory-major order, as the generated data: cutting to `count` keeps whole trajectories first.
            out += [torch.stack(xs, 1).flatten(0, 1)[:count], torch.stack(ys, 1).flatten(0, 1)[:count]]
    return tuple(out)
