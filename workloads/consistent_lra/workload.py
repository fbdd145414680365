"""consistent_lra: Config, the streaming loop and its measurements (see the package docstring)."""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Literal

import numpy as np
import torch

from orchestrator.run import devices
from workloads.consistent_lra.algorithms import ALGORITHMS, ConsistentLRA
from workloads.consistent_lra.data import check_format, table_shape
from workloads.consistent_lra.streams import BUNDLED, STREAMS, make_stream, uniforms

# A prefix whose optimum is below this fraction of ||A^(t)||_F^2 has rank <= k up to rounding:
# cost/OPT is not defined there, and the additive excess (cost - OPT)/||A||_F^2 says all there is.
OPT_FLOOR = 1e-9
SINGLE_THREAD_MAX_D = 256
MAX_CURVE_POINTS = 60


MAX_WORKERS = 1
"""consistent_lra follows one stream on one worker: the runner refuses more."""


@dataclass(frozen=True)
class Config:
    stream: Literal["flip", "gaussian", "emerging", "randint", "file", "bundled"] = "flip"
    """Row stream: 'flip' (best subspace changes every row), 'gaussian' (i.i.d.), 'emerging', 'randint',
    'file' (the first n rows of the table at data_path: CSV/TSV, ARFF, Matrix Market or .npy), or
    'bundled' (the first n rows of a real table shipped with scikit-learn: `dataset`)."""
    algorithm: Literal["every", "additive", "multiplicative", "heavy_light", "fd"] = "additive"
    """'every' (recompute each row), 'additive' (lazy, on Frobenius growth), 'multiplicative',
    'heavy_light' (multiplicative, recomputing only the bottom sqrt(k) directions when that keeps
    the (1 + a) bound: the paper's Algorithm 2, reconstructed), or 'fd' (the Frequent Directions
    baseline: top-k subspace of an fd_rows-row sketch, at every row)."""
    n: int = 100_000
    """Rows in the stream."""
    d: int = 50
    """Columns (the flip stream needs d >= 2k, the emerging stream d >= k + 1); a 'file' stream has
    its file's column count, which d=0 takes (another value must match it)."""
    k: int = 25
    """Rank of the output subspace."""
    eps: float = 0.1
    """Accuracy: additive recomputes past (1 + eps) growth; multiplicative targets (1 + eps) OPT."""
    noise: float = 1e-3
    """Std of the Gaussian noise on every entry (flip: breaks ties) or direction (emerging: floor)."""
    gap: float = 0.01
    """gaussian: spacing of the k+1 nearly tied leading covariance eigenvalues 1, 1-gap, ..."""
    tail: float = 0.1
    """gaussian: covariance eigenvalue of the remaining d-k-1 directions."""
    weak: float = 0.03
    """emerging: std of the weak k-th signal direction (OPT before the onset is about weak^2 * t)."""
    onset: float = 0.75
    """emerging: fraction of the stream after which the new strong direction appears."""
    normalize: bool = False
    """randint: divide each column by its norm (the paper's text) instead of raw integers (its code)."""
    data_path: str = ""
    """file: the table of rows (.csv/.tsv/.txt/.data, .arff, .mtx, .npy; relative to the run's folder)."""
    columns: str = ""
    """file: comma-separated column names or 0-based indices to stream (default: every numeric column)."""
    standardize: bool = False
    """file: centre and scale each column over the n streamed rows, as the paper does for Rice and Skin."""
    dataset: Literal["digits", "breast_cancer", "wine", "diabetes"] = "digits"
    """bundled: the scikit-learn table ('digits': integers 0..16, the paper's integer-bounded kind)."""
    shuffle: bool = False
    """bundled: stream the rows in a seeded random order instead of the table's own."""
    fd_rows: int = 0
    """fd: rows l of the Frequent Directions sketch (0: 2k, as in the paper's FD comparison)."""
    sketch: Literal["leverage", "exact"] = "leverage"
    """multiplicative, heavy_light: online ridge-leverage-score sample of the rows, or every row (no sampling)."""
    oversample: float = 1.0
    """multiplicative, heavy_light: sampling constant c in p = min(1, c * ridge score / a^2) [reconstructed]."""
    trigger: Literal["check", "kept"] = "check"
    """multiplicative, heavy_light: recompute when the sketch finds V's cost above (1 + a) OPT, or at every kept row."""
    curve_points: int = 20
    """Log-spaced steps at which recourse and the segment's worst cost/OPT are kept for the plot."""
    log_every: int = 1000
    """Report metrics every this many rows (and at the last)."""
    checkpoint_every: int = 20_000
    """Save a checkpoint every this many rows (and at the last)."""
    seed: int = 0
    """Seed of the stream (noise, rotation, Gaussian rows) and of the sketch's sampling coins."""


def smoke() -> Config:
    """A CPU-sized run: 3,000 rows of the two-pair flip stream, well under a second."""
    return Config(n=3000, d=4, k=2, log_every=50, checkpoint_every=1000)


def validate(cfg: Config, world_size: int = 1) -> None:
    """Checks that need no data: raised before anything is launched."""
    for name in ("n", "k", "curve_points", "log_every", "checkpoint_every") + (() if cfg.stream in ("file", "bundled") else ("d",)):
        if getattr(cfg, name) < 1:
            raise ValueError(f"{name} must be positive, got {getattr(cfg, name)}")
    if cfg.curve_points > MAX_CURVE_POINTS:
        # The curves travel in the final metrics, which Ray runs store as one MLflow tag (8,000 chars).
        raise ValueError(f"curve_points={cfg.curve_points} is too many for the final metrics: use at most {MAX_CURVE_POINTS}")
    if cfg.n < 2:
        raise ValueError(f"n must be at least 2 rows to have any recourse, got {cfg.n}")
    if cfg.stream == "file":
        check_format(cfg.data_path)  # the file itself is checked where the run starts (`preflight`)
        if cfg.d < 0:
            raise ValueError(f"d must be the file's column count or 0 (read from the file), got {cfg.d}")
    elif cfg.stream == "bundled":
        if cfg.dataset not in BUNDLED:
            raise ValueError(f"dataset must be one of {', '.join(BUNDLED)}, got {cfg.dataset!r}")
        rows, cols = BUNDLED[cfg.dataset]
        if cfg.n > rows:
            raise ValueError(f"dataset={cfg.dataset!r} has {rows} rows, fewer than n={cfg.n}: set n={rows}")
        if cfg.d not in (0, cols):
            raise ValueError(f"dataset={cfg.dataset!r} streams {cols} columns, not d={cfg.d}: set d={cols} or d=0")
        if not cfg.k < cols:
            raise ValueError(f"k={cfg.k} must be below the {cols} columns of dataset={cfg.dataset!r}")
    elif not cfg.k < cfg.d:
        raise ValueError(f"k={cfg.k} must be below d={cfg.d}: a rank-d subspace never changes")
    if not (cfg.eps > 0 and math.isfinite(cfg.eps)):
        raise ValueError(f"eps must be a positive number, got {cfg.eps}")
    if cfg.fd_rows < 0:
        raise ValueError(f"fd_rows must be >= 0 (0: 2k), got {cfg.fd_rows}")
    if cfg.oversample <= 0:
        raise ValueError(f"oversample must be positive, got {cfg.oversample}")
    if cfg.noise < 0 or cfg.tail < 0 or cfg.weak < 0 or cfg.gap < 0:
        raise ValueError("noise, tail, weak and gap are scales and must be >= 0")
    if cfg.stream == "flip" and cfg.d < 2 * cfg.k:
        raise ValueError(
            f"the flip stream needs d >= 2k (k alternating pairs): d={cfg.d}, k={cfg.k}: set d={2 * cfg.k}"
        )
    if cfg.stream == "gaussian" and cfg.gap * cfg.k >= 1:
        raise ValueError(
            f"gap*k = {cfg.gap * cfg.k:g} must be below 1 (the leading variances 1 - i*gap must stay positive)"
        )
    if cfg.stream == "emerging":
        if cfg.k < 2 or cfg.d < cfg.k + 1:
            raise ValueError(f"the emerging stream needs k >= 2 and d >= k + 1, got k={cfg.k}, d={cfg.d}")
        if not 0 < cfg.onset < 1:
            raise ValueError(f"onset must lie strictly between 0 and 1, got {cfg.onset}")
    for name, options in (("stream", STREAMS),
                          ("algorithm", ALGORITHMS),
                          ("sketch", ("leverage", "exact")), ("trigger", ("check", "kept"))):
        if getattr(cfg, name) not in options:
            raise ValueError(f"{name} must be one of {', '.join(options)}, got {getattr(cfg, name)!r}")


def preflight(cfg: Config) -> None:
    """Checks of the machine that runs it: a 'file' stream's table is there, has n rows and more
    than k columns (and d of them when d is set). Kept out of `validate` so that a sweep of files
    on a cluster's storage checks as valid anywhere."""
    if cfg.stream != "file":
        return
    rows, cols = table_shape(cfg.data_path, cfg.columns)
    if cfg.d and cfg.d != cols:
        raise ValueError(f"data_path={cfg.data_path!r} streams {cols} columns, not d={cfg.d}: set d={cols} or d=0")
    if not cfg.k < cols:
        raise ValueError(f"k={cfg.k} must be below the {cols} columns of {cfg.data_path!r}")
    if rows < cfg.n:
        raise ValueError(f"data_path={cfg.data_path!r} has {rows} rows, fewer than n={cfg.n}: set n={rows}")


def curve_steps(n: int, points: int) -> list[int]:
    """Rows (1-based) at which the curves are sampled: log-spaced from 10 (or 1) to n."""
    start = min(10, n)
    return sorted({int(round(x)) for x in np.geomspace(start, n, points)} | {n})


@contextmanager
def _few_threads(d: int) -> Iterator[None]:
    """One intra-op thread for the per-row d x d eigendecompositions: they are far too small to
    share out, and with several threads LAPACK spends more on synchronising than on the work
    (about 10x slower at d = 50)."""
    threads = torch.get_num_threads()
    if d <= SINGLE_THREAD_MAX_D:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _fresh_tally() -> dict[str, Any]:
    return {"recourse": 0.0, "changes": 0, "max_ratio": -math.inf, "max_excess": 0.0, "segment": -math.inf,
            "curve_recourse": [], "curve_ratio": [], "last_cost": 0.0, "last_opt": 0.0, "last_frob": 0.0}


def train(cfg: Config, run) -> dict[str, float]:
    validate(cfg, run.world_size)
    rows = make_stream(cfg).to(run.device)  # [n, d]
    d = rows.shape[1]
    if not cfg.k < d:
        raise ValueError(f"k={cfg.k} must be below the stream's {d} columns")
    draws = uniforms(cfg.n, cfg.seed).tolist()
    algo = ConsistentLRA(d, cfg.k, cfg.algorithm, cfg.eps, sketch=cfg.sketch, oversample=cfg.oversample,
                         trigger=cfg.trigger, fd_rows=cfg.fd_rows, device=run.device)
    ends = curve_steps(cfg.n, cfg.curve_points)
    tally = _fresh_tally()
    start = 0
    state = run.restore()
    if state is not None:
        algo.load_state_dict(state["algo"])
        tally = state["tally"]
        start = int(state["step"])

    began = devices.clock(run.device)
    with _few_threads(d):
        for t in range(start + 1, cfg.n + 1):
            s = algo.update(rows[t - 1], draws[t - 1])
            tally["recourse"] += s.recourse
            tally["changes"] += int(s.recourse > 1e-9)
            tally["max_excess"] = max(tally["max_excess"], (s.cost - s.opt) / s.frob if s.frob > 0 else 0.0)
            ratio = s.cost / s.opt if s.opt > OPT_FLOOR * s.frob else math.nan
            if not math.isnan(ratio):
                tally["max_ratio"] = max(tally["max_ratio"], ratio)
                tally["segment"] = max(tally["segment"], ratio)
            tally.update(last_cost=s.cost, last_opt=s.opt, last_frob=s.frob)
            if t == ends[len(tally["curve_recourse"])]:
                tally["curve_recourse"].append(tally["recourse"])
                tally["curve_ratio"].append(tally["segment"] if tally["segment"] > -math.inf else math.nan)
                tally["segment"] = -math.inf
            if t % cfg.log_every == 0 or t == cfg.n:
                metrics = {
                    "train/loss": s.cost / s.frob if s.frob > 0 else 0.0,
                    "eval/recourse": tally["recourse"],
                    "eval/refreshes": float(algo.refreshes),
                    "eval/excess": (s.cost - s.opt) / max(s.frob, 1e-300),
                    "progress": t / cfg.n,
                }
                if not math.isnan(ratio):
                    metrics["eval/cost_ratio"] = ratio
                run.report(metrics, step=t)
            if t % cfg.checkpoint_every == 0 or t == cfg.n:
                run.save({"step": t, "algo": algo.state_dict(), "tally": tally})
    elapsed = devices.clock(run.device) - began
    return summary(cfg, algo, tally, rows_per_s=(cfg.n - start) / elapsed if elapsed > 0 else math.nan)


def summary(cfg: Config, algo: ConsistentLRA, tally: dict[str, Any], *, rows_per_s: float) -> dict[str, float]:
    """The final metrics: totals, worst cases over t, and the sampled curves (for the plot)."""
    cost, opt, frob = tally["last_cost"], tally["last_opt"], tally["last_frob"]
    sampled = algo.algorithm in ("multiplicative", "heavy_light") and algo.sketch == "leverage"
    out = {
        "train/loss": cost / frob if frob > 0 else 0.0,
        "eval/recourse": float(tally["recourse"]),
        # The paper's experiments count recourse as k per recomputation of the output (the
        # released code's count); recomputing every row, and FD, recompute at every row.
        "eval/recourse_count": float(cfg.k * algo.refreshes),
        "eval/changes": float(tally["changes"]),
        "eval/refreshes": float(algo.refreshes),
        "eval/max_cost_ratio": tally["max_ratio"] if tally["max_ratio"] > -math.inf else math.nan,
        "eval/final_cost_ratio": cost / opt if opt > OPT_FLOOR * frob else math.nan,
        "eval/max_excess": float(tally["max_excess"]),
        "eval/frob_growth": frob / algo.frob_first if algo.frob_first > 0 else math.nan,
        "eval/sketch_rows": float(algo.kept if sampled else cfg.n),
        "perf/rows_per_s": float(rows_per_s),
    }
    if algo.algorithm == "heavy_light":
        out["eval/light_updates"] = float(algo.light)
        out["eval/heavy_updates"] = float(algo.heavy)
    for i, (r, q) in enumerate(zip(tally["curve_recourse"], tally["curve_ratio"])):
        out[f"eval/curve/recourse/{i:02d}"] = float(r)
        out[f"eval/curve/ratio/{i:02d}"] = float(q)
    return out
