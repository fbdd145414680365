"""tubal_fgd: Config, the factorized gradient descent loop and its early stopping (see the package docstring)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
from orchestrator.run import devices, fraction_steps

from workloads.tubal_fgd import completion, images
from workloads.tubal_fgd.problem import (
    Problem, make_problem, relative_error, sensing, small_init, spectral_init,
)
from workloads.tubal_fgd.tensor import t_gram, t_outer, t_product

CURVE_PREFIX = "curve/rse/"
"""Final-metric keys `curve/rse/<step>`: the error curve at log-spaced iterations, for the plot."""


MAX_WORKERS = 1
"""tubal_fgd runs on one worker (the problem is small): the runner refuses more."""


@dataclass(frozen=True)
class Config:
    task: Literal["simulation", "completion"] = "simulation"
    """'simulation': recover a generated PSD X* = X * X^T from Gaussian measurements (the fields n
    to symmetric_sensing); 'completion': complete a real image tensor read from image_dir from
    observed_frac of its entries, by FGD on X ~ U * V^T (the fields image_dir to observed_frac)."""
    n: int = 30
    """Side of the target X* in R^{n x n x k}."""
    k: int = 3
    """Number of frontal slices (the tube length, the FFT axis)."""
    rank: int = 3
    """True tubal rank r of X*."""
    factor_rank: int = 12
    """Over-estimated rank R of the factor U in R^{n x R x k} (R >= r over-parameterises); in completion
    the rank of U [n1, R, k] and V [n2, R, k], at most min(n1, n2)."""
    oversample: float = 6.0
    """Measurements m = oversample * n * r * k, before the validation split."""
    val_frac: float = 0.1
    """Fraction of the m measurements held out for early stopping (never used by the gradient);
    the early-stopped iterate minimises (1/4 m_val) ||y_val - M_val(U * U^T)||^2. In completion, the
    fraction of the observed entries held out (their mean squared residual / 2 is `eval/loss`)."""
    noise_std: float = 0.1
    """Std of the Gaussian measurement noise s_i (X* has unit Frobenius norm); in completion, of the
    noise added to every observed pixel (values in [0, 1]; the paper's images use 0.07 and 0.1)."""
    symmetric_sensing: bool = True
    """Symmetrise each sensing tensor, A_i <- (A_i + A_i^T) / 2, so that the FGD step is the exact
    gradient of f and stays symmetric (False: raw Gaussian A_i, the step as written)."""
    image_dir: str = ""
    """Completion: a folder of image files (png, jpg, bmp, tif; its subfolders are not read), e.g. the
    Berkeley Segmentation Dataset's test images (docs/datasets.md); a relative path is read from the
    folder the run starts in."""
    tensor_from: Literal["rgb", "frames"] = "rgb"
    """Completion: 'rgb' makes one colour image (the image_index-th in name order) an n1 x n2 x 3
    tensor, the t-product along the colour mode (the paper's setting); 'frames' stacks the first
    `frames` images, as grayscale, into n1 x n2 x frames, the t-product along time (a video)."""
    image_index: int = 0
    """Completion with tensor_from='rgb': which image of the folder, in sorted name order, from 0."""
    frames: int = 0
    """Completion with tensor_from='frames': how many images, in sorted name order (0: all)."""
    image_size: int = 0
    """Completion: resize (bicubic) so that every image's longer side has this many pixels, aspect
    kept; 0 keeps the files' own size (481 x 321 for the paper's images; frames must then agree)."""
    observed_frac: float = 0.3
    """Completion: fraction of the tensor's entries observed (uniformly, without replacement), in
    (0, 1]; the paper observes 30%."""
    init: Literal["small", "spectral", "large"] = "small"
    """'small': U_0 ~ N(0, init_scale^2 / R) entries; 'spectral': top-R factor of (1/m) M*(y);
    'large' (simulation only): U_0 ~ N(0, large_init_scale^2 / R), the paper's large random
    initialisation. In completion, 'small' draws Gaussian U_0, V_0 of t-spectral norm
    init_scale * sqrt(sigma_1) (init_scale = 1 is its large random init) and 'spectral' takes the
    truncated t-SVD of the rescaled observations (1/p) P_Omega(M)."""
    spectral_by: Literal["eig", "svd"] = "eig"
    """Spectral init keeps the top-R eigenpairs ('eig', negative ones clipped: the best PSD
    approximation) or the top-R singular triplets ('svd', the truncated t-SVD); the paper's choice
    was not available, and 'eig' is the stronger baseline."""
    init_scale: float = 1e-10
    """alpha of the small initialisation (1e-10 in the paper; init='large' takes large_init_scale).
    In completion it is relative to the data: 1 starts U * V^T as large as its top component."""
    large_init_scale: float = 0.3
    """alpha of init='large' [ours; the paper's value was not available]: U_0 * U_0^T starts at the
    size of X* (||X*||_F = 1; 1.6-3x it over R = r..8r at the smoke's size), not near zero. 0.3 is
    the largest of 0.1, 0.3, 0.5, 1 at which lr = 0.3 converges at every R (0.5 overflows at R <= 2r,
    1 at every R; seeds 100-101); 0.1 grows with R alike (8r over r: 3.0x at seed 101)."""
    lr: float = 0.3
    """Step size eta of U <- U - eta * [(1/m) M*(M(U U^T) - y)] * U: a calibration, the paper's
    was not available (with ||X*||_F = 1 no Fourier eigenvalue of X* exceeds sqrt(k)). In completion
    the step is lr / sigma_1, sigma_1 the largest Fourier-slice singular value of (1/p) P_Omega(M)."""
    steps: int = 5000
    """Gradient steps."""
    es_patience: int = 0
    """Early stopping: 0 returns the argmin of the validation loss over the whole run; > 0 freezes the
    choice once the validation loss has not improved for this many steps."""
    eval_every: int = 1
    """Measure the error and the validation loss every this many steps (best and early-stopped
    iterates are chosen among these)."""
    curve_points: int = 60
    """Log-spaced iterations at which the error curve is kept in the final metrics."""
    log_every: int = 100
    """Report metrics every this many steps."""
    checkpoint_every_frac: float = 0.25
    """Save a checkpoint at every multiple of this training fraction (and at the end)."""
    threads: int = 1
    """Intra-op CPU threads of the trial, pinned by the runner around `train` (0 leaves torch's
    setting): on tensors this small, thread synchronisation costs more than it saves."""
    dtype: Literal["float64", "float32"] = "float64"
    """Arithmetic precision of the problem and the iterates."""
    seed: int = 0
    """Seed of the target, the measurements and noise (shared by every R and init) and of U_0; in
    completion, of the observed entries and their noise, and of U_0, V_0."""


def smoke() -> Config:
    """A CPU-sized run: n = 16, k = 3, r = 2, R = 8r, 2,000 steps, a couple of seconds.

    Training uses 6nrk measurements as in the paper's simulations, and as many again are held
    out, where the paper holds out 5-10%: early stopping has to tell a 10% error difference from
    validation noise, and that noise relative to the error shrinks only with the held-out count
    per degree of freedom nrk, which is small at this size. Over 16 seeds the worst
    early-stopped/best ratio was 1.14 with 3nrk held out and 1.04 with 6nrk; at the full size
    (nrk = 270) 10% is enough.
    """
    return Config(
        n=16, k=3, rank=2, factor_rank=16, oversample=12.0, val_frac=0.5, init_scale=1e-6,
        steps=2000, log_every=100,
    )


def measurements(cfg: Config) -> tuple[int, int]:
    """(training, validation) measurement counts."""
    total = round(cfg.oversample * cfg.n * cfg.rank * cfg.k)
    val = round(cfg.val_frac * total)
    return total - val, val


def validate(cfg: Config, world_size: int = 1) -> None:
    """Checks that need no training: raised before anything is launched."""
    for name in ("n", "k", "rank", "factor_rank", "steps", "eval_every", "log_every", "curve_points"):
        if getattr(cfg, name) <= 0:
            raise ValueError(f"{name} must be positive, got {getattr(cfg, name)}")
    if cfg.threads < 0:
        raise ValueError(f"threads must be >= 0 (0: torch's own setting), got {cfg.threads}")
    if cfg.rank > cfg.n:
        raise ValueError(f"rank={cfg.rank} exceeds n={cfg.n}: a tubal rank is at most n")
    if cfg.task == "simulation" and cfg.factor_rank > cfg.n:
        raise ValueError(f"factor_rank={cfg.factor_rank} exceeds n={cfg.n}: use factor_rank <= n")
    if not 0 < cfg.val_frac < 1:
        raise ValueError(f"val_frac must lie in (0, 1): early stopping needs held-out measurements, got {cfg.val_frac}")
    train_m, val_m = measurements(cfg)
    if train_m < 1 or val_m < 1:
        raise ValueError(f"oversample={cfg.oversample} gives {train_m} training and {val_m} validation measurements: raise oversample")
    if cfg.init not in ("small", "spectral", "large"):
        raise ValueError(f"init must be 'small', 'spectral' or 'large', got {cfg.init!r}")
    if cfg.spectral_by not in ("eig", "svd"):
        raise ValueError(f"spectral_by must be 'eig' or 'svd', got {cfg.spectral_by!r}")
    if cfg.init == "small" and not cfg.init_scale > 0:
        raise ValueError(f"init_scale must be positive for init='small', got {cfg.init_scale}")
    if cfg.init == "large" and not cfg.large_init_scale > 0:
        raise ValueError(f"large_init_scale must be positive for init='large', got {cfg.large_init_scale}")
    if not cfg.lr > 0 or not cfg.noise_std >= 0:
        raise ValueError(f"lr must be positive and noise_std non-negative, got lr={cfg.lr}, noise_std={cfg.noise_std}")
    if cfg.es_patience < 0:
        raise ValueError(f"es_patience must be >= 0 (0: argmin over the run), got {cfg.es_patience}")
    if not 0 < cfg.checkpoint_every_frac <= 1:
        raise ValueError(f"checkpoint_every_frac must lie in (0, 1], got {cfg.checkpoint_every_frac}")
    if cfg.dtype not in ("float64", "float32"):
        raise ValueError(f"dtype must be 'float64' or 'float32', got {cfg.dtype!r}")
    validate_task(cfg)


def validate_task(cfg: Config) -> None:
    """The completion fields: what the task reads and how; the folder itself is `preflight`'s."""
    if cfg.task not in ("simulation", "completion"):
        raise ValueError(f"task must be 'simulation' or 'completion', got {cfg.task!r}")
    if cfg.task == "simulation":
        if cfg.image_dir:
            raise ValueError(f"image_dir={cfg.image_dir!r} is read only by task='completion': set task=completion "
                             "to complete its images, or image_dir='' for the simulation")
        return
    if cfg.init == "large":
        raise ValueError("init='large' is the simulation's arm: in completion, large random init is init='small' "
                         "with init_scale=1 (relative to the data's top component)")
    if not cfg.image_dir:
        raise ValueError("task='completion' needs image_dir: set it to a folder of images (docs/datasets.md, tubal_fgd)")
    if cfg.tensor_from not in ("rgb", "frames"):
        raise ValueError(f"tensor_from must be 'rgb' (one colour image, n1 x n2 x 3) or 'frames' (grayscale frames, "
                         f"n1 x n2 x frames), got {cfg.tensor_from!r}")
    if not 0 < cfg.observed_frac <= 1:
        raise ValueError(f"observed_frac must lie in (0, 1] (the fraction of entries observed), got {cfg.observed_frac}: "
                         "e.g. observed_frac=0.3, the paper's")
    for name in ("image_index", "frames", "image_size"):
        if getattr(cfg, name) < 0:
            raise ValueError(f"{name} must be >= 0, got {getattr(cfg, name)}")
    if cfg.image_size == 1:
        raise ValueError("image_size=1 leaves one pixel: use image_size >= 2, or 0 for the files' own size")


def preflight(cfg: Config) -> None:
    """Checks of the machine that runs it: for completion, image_dir holds the images the config
    reads, of a size that fits factor_rank and leaves observed entries to train and to hold out.
    Kept out of `validate` so that a sweep of images on a cluster's storage checks as valid anywhere."""
    if cfg.task != "completion":
        return
    n1, n2, k = images.tensor_shape(cfg.image_dir, cfg.tensor_from, cfg.image_index, cfg.frames, cfg.image_size)
    if cfg.factor_rank > min(n1, n2):
        raise ValueError(f"factor_rank={cfg.factor_rank} exceeds min(n1, n2)={min(n1, n2)} of the {n1} x {n2} x {k} "
                         f"image tensor: use factor_rank <= {min(n1, n2)}")
    train_m, val_m = completion.observed_counts(n1 * n2 * k, cfg.observed_frac, cfg.val_frac)
    if train_m < 1 or val_m < 1:
        raise ValueError(f"observed_frac={cfg.observed_frac} of the {n1 * n2 * k} entries gives {train_m} training and "
                         f"{val_m} held-out entries: raise observed_frac or val_frac, or image_size")


def curve_steps(steps: int, points: int) -> list[int]:
    """Step 0 and about `points` log-spaced steps up to `steps`, unique and sorted."""
    grid = {0, steps}
    for i in range(points):
        grid.add(round(steps ** (i / max(1, points - 1))))
    return sorted(s for s in grid if 0 <= s <= steps)


class Tracker:
    """The best iterate (by the true error) and the early-stopped one (by the validation loss)."""

    def __init__(self, patience: int) -> None:
        self.patience = patience
        self.best_rse, self.best_step = math.inf, -1
        self.val_min, self.es_rse, self.es_step = math.inf, math.nan, -1
        self.frozen = False

    def update(self, step: int, rse: float, val: float) -> None:
        if rse < self.best_rse:
            self.best_rse, self.best_step = rse, step
        if self.frozen:
            return
        if val < self.val_min:
            self.val_min, self.es_rse, self.es_step = val, rse, step
        elif self.patience and step - self.es_step >= self.patience:
            self.frozen = True

    def state(self) -> dict[str, Any]:
        return dict(vars(self))

    def load(self, state: dict[str, Any]) -> None:
        vars(self).update(state)


def initial_factor(cfg: Config, problem: Problem) -> torch.Tensor:
    if cfg.init == "spectral":
        return spectral_init(problem, cfg.factor_rank, by=cfg.spectral_by)
    scale = cfg.large_init_scale if cfg.init == "large" else cfg.init_scale
    return small_init(cfg.n, cfg.factor_rank, cfg.k, scale, seed=cfg.seed,
                      dtype=problem.target.dtype, device=problem.target.device)


def train(cfg: Config, run) -> dict[str, float]:
    validate(cfg, run.world_size)
    return _train_completion(cfg, run) if cfg.task == "completion" else _train(cfg, run)


def _train(cfg: Config, run) -> dict[str, float]:
    dtype = getattr(torch, cfg.dtype)
    train_m, val_m = measurements(cfg)
    problem = make_problem(
        n=cfg.n, k=cfg.k, rank=cfg.rank, measurements=train_m, val_measurements=val_m,
        noise_std=cfg.noise_std, seed=cfg.seed, symmetric_sensing=cfg.symmetric_sensing,
        dtype=dtype, device=run.device,
    )
    tracker = Tracker(cfg.es_patience)
    curve: dict[int, float] = {}
    keep_curve = set(curve_steps(cfg.steps, cfg.curve_points))
    save_at = fraction_steps(cfg.steps, cfg.checkpoint_every_frac)

    start, diverged = 0, False
    state = run.restore()
    if state is not None:
        u = state["u"].to(device=run.device, dtype=dtype)
        tracker.load(state["tracker"])
        curve = {int(s): float(v) for s, v in state["curve"].items()}
        start = int(state["step"])
    else:
        u = initial_factor(cfg, problem)

    # A step is bound by reading the operator: with t-symmetric sensing it is packed to one column
    # per entry pair (half the columns), and on an evaluated step the training and held-out rows
    # are one matrix-vector product.
    op_train = sensing(problem.a_train, problem.shape, cfg.symmetric_sensing)
    op_both = sensing(torch.cat([problem.a_train, problem.a_val]), problem.shape, cfg.symmetric_sensing)
    y_both = torch.cat([problem.y_train, problem.y_val])

    def residuals(x: torch.Tensor, with_val: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        if not with_val:
            return op_train.measure(x) - problem.y_train, None
        both = op_both.measure(x) - y_both
        return both[:train_m], both[train_m:]

    def evaluate(step: int, x: torch.Tensor, val_residual: torch.Tensor) -> tuple[float, float]:
        rse = relative_error(problem, x)
        val = float(val_residual.square().mean() / 4)
        tracker.update(step, rse, val)
        if step in keep_curve:
            curve[step] = rse
        return rse, val

    x = t_gram(u)
    residual, val_residual = residuals(x, with_val=True)
    train_loss = float(residual.square().mean() / 4)
    rse, val = evaluate(start, x, val_residual) if state is None else (relative_error(problem, x), math.nan)
    window_start, window_steps, iters_per_s = devices.clock(run.device), 0, math.nan
    for step in range(start + 1, cfg.steps + 1):
        # One FGD step; the residual of the new iterate is the next step's gradient input.
        g = op_train.adjoint(residual) / train_m
        u = u - cfg.lr * t_product(g, u)
        x = t_gram(u)
        evaluating = step % cfg.eval_every == 0 or step in keep_curve or step == cfg.steps
        residual, val_residual = residuals(x, with_val=evaluating)
        window_steps += 1
        if evaluating:
            rse, val = evaluate(step, x, val_residual)
        if step % cfg.log_every == 0 or step == cfg.steps:
            train_loss = float(residual.square().mean() / 4)
            diverged = not math.isfinite(train_loss)
            now = devices.clock(run.device)
            iters_per_s = window_steps / max(now - window_start, 1e-9)
            window_start, window_steps = now, 0
            run.report({
                "train/loss": train_loss, "eval/rse": rse, "eval/val_loss": val,
                "eval/best_rse": tracker.best_rse, "eval/es_rse": tracker.es_rse,
                "perf/iters_per_s": iters_per_s, "progress": 1.0 if diverged else step / cfg.steps,
            }, step=step)
        if step in save_at or diverged:
            run.save({"step": step, "u": u.cpu(), "tracker": tracker.state(), "curve": curve})
        if diverged:  # the iterate overflowed: later steps only carry NaNs
            break
    return {
        "train/loss": train_loss,
        "eval/rse": rse,
        "eval/best_rse": tracker.best_rse,
        "eval/best_step": float(tracker.best_step),
        "eval/es_rse": tracker.es_rse,
        "eval/es_step": float(tracker.es_step),
        "eval/diverged": float(diverged),
        "perf/iters_per_s": iters_per_s,
        **{f"{CURVE_PREFIX}{s}": v for s, v in sorted(curve.items())},
    }


def _train_completion(cfg: Config, run) -> dict[str, float]:
    """FGD on (U, V) for the completion task (workloads/tubal_fgd/completion.py has the maths):
    the loop of `_train`, with the held-out observed entries in place of the held-out measurements."""
    dtype = getattr(torch, cfg.dtype)
    truth = images.load(cfg.image_dir, cfg.tensor_from, cfg.image_index, cfg.frames, cfg.image_size)
    c = completion.make_completion(truth, observed_frac=cfg.observed_frac, val_frac=cfg.val_frac,
                                   noise_std=cfg.noise_std, seed=cfg.seed, dtype=dtype, device=run.device)
    step_size = cfg.lr / c.sigma_1
    tracker = Tracker(cfg.es_patience)
    curve: dict[int, float] = {}
    keep_curve = set(curve_steps(cfg.steps, cfg.curve_points))
    save_at = fraction_steps(cfg.steps, cfg.checkpoint_every_frac)

    start, diverged = 0, False
    state = run.restore()
    if state is not None:
        u = state["u"].to(device=run.device, dtype=dtype)
        v = state["v"].to(device=run.device, dtype=dtype)
        tracker.load(state["tracker"])
        curve = {int(s): float(e) for s, e in state["curve"].items()}
        start, init_rse = int(state["step"]), float(state["init_rse"])
    elif cfg.init == "spectral":
        u, v = completion.spectral_pair(c, cfg.factor_rank)
    else:
        u, v = completion.small_pair(c, cfg.factor_rank, cfg.init_scale, seed=cfg.seed)

    def evaluate(step: int, x: torch.Tensor, val_residual: torch.Tensor) -> tuple[float, float]:
        rse = completion.relative_error(c, x)
        val = float(val_residual.square().mean() / 2)
        tracker.update(step, rse, val)
        if step in keep_curve:
            curve[step] = rse
        return rse, val

    x = t_outer(u, v)
    residual, val_residual = completion.residuals(c, x)
    train_loss = float(residual.square().mean() / 2)
    if state is None:
        rse, val = evaluate(start, x, val_residual)
        init_rse = rse
    else:
        rse, val = completion.relative_error(c, x), math.nan
    window_start, window_steps, iters_per_s = devices.clock(run.device), 0, math.nan
    for step in range(start + 1, cfg.steps + 1):
        # One FGD step on both factors from the same iterate.
        grad_u, grad_v = completion.gradients(c, u, v, residual)
        u, v = u - step_size * grad_u, v - step_size * grad_v
        x = t_outer(u, v)
        residual, val_residual = completion.residuals(c, x)
        window_steps += 1
        if step % cfg.eval_every == 0 or step in keep_curve or step == cfg.steps:
            rse, val = evaluate(step, x, val_residual)
        if step % cfg.log_every == 0 or step == cfg.steps:
            train_loss = float(residual.square().mean() / 2)
            diverged = not math.isfinite(train_loss)
            now = devices.clock(run.device)
            iters_per_s = window_steps / max(now - window_start, 1e-9)
            window_start, window_steps = now, 0
            run.report({
                "train/loss": train_loss, "eval/loss": val, "eval/rse": rse, "eval/psnr": completion.psnr(c, rse),
                "eval/best_rse": tracker.best_rse, "eval/es_rse": tracker.es_rse,
                "eval/es_psnr": completion.psnr(c, tracker.es_rse),
                "perf/iters_per_s": iters_per_s, "progress": 1.0 if diverged else step / cfg.steps,
            }, step=step)
        if step in save_at or diverged:
            run.save({"step": step, "u": u.cpu(), "v": v.cpu(), "tracker": tracker.state(), "curve": curve,
                      "init_rse": init_rse})
        if diverged:  # the iterate overflowed: later steps only carry NaNs
            break
    return {
        "train/loss": train_loss,
        "eval/loss": val,
        "eval/rse": rse,
        "eval/psnr": completion.psnr(c, rse),
        "eval/init_rse": init_rse,
        "eval/best_rse": tracker.best_rse,
        "eval/best_psnr": completion.psnr(c, tracker.best_rse),
        "eval/best_step": float(tracker.best_step),
        "eval/es_rse": tracker.es_rse,
        "eval/es_psnr": completion.psnr(c, tracker.es_rse),
        "eval/es_step": float(tracker.es_step),
        "eval/diverged": float(diverged),
        "perf/iters_per_s": iters_per_s,
        **{f"{CURVE_PREFIX}{s}": e for s, e in sorted(curve.items())},
    }
