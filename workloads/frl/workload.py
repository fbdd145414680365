"""frl: Config, the training loop and the multi-resolution evaluation (see the package docstring)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from workloads.frl.data import DataSpec, make_dataset, solver_for
from workloads.frl.files import check_path, describe
from workloads.frl.losses import cross_scale_loss, rel_mse, spectral_loss
from workloads.frl.model import CNN, FNO
from workloads.frl.transformer import GalerkinTransformer
from workloads.frl.solver import truncate, upsample
from orchestrator.run import devices, fraction_steps

PDES = ("burgers", "navier_stokes")
BACKBONES = ("fno", "cnn", "transformer")


MAX_WORKERS = 1
"""frl trains one small model per trial on one device: the runner refuses more workers."""


@dataclass(frozen=True)
class Config:
    pde: str = "burgers"
    """'burgers' (1-D viscous Burgers) or 'navier_stokes' (2-D vorticity, Kolmogorov forcing)."""
    backbone: str = "fno"
    """'fno' (Fourier neural operator), 'cnn' (residual periodic CNN) or 'transformer' (Galerkin Transformer)."""
    frl: bool = False
    """FRL's resolution-aligned representation: FRLSpectralConv / AlignedConv layers and frequency input channels."""
    multires_levels: int = 0
    """FRL step 1: also train on the truncations to rho0/2, ..., rho0/2^levels (0: rho0 only)."""
    spectral_weight: float = 0.0
    """FRL step 3, lambda of the octave-balanced spectral loss (0 disables)."""
    cross_scale_weight: float = 0.0
    """FRL step 3, lambda of the cross-scale term |T_{rho/2} F(u_rho) - F(T_{rho/2} u_rho)|^2 (needs multires_levels >= 1)."""
    nu: float = 0.02
    """Viscosity."""
    dns_n: int = 1024
    """DNS grid points per axis."""
    dns_dt: float = 1e-3
    """DNS time step (also the calibration solver's at every resolution)."""
    ref_n: int = 256
    """Reference grid: the DNS is stored truncated to it and the fixed-reference error is measured on it."""
    ic_modes: int = 8
    """Burgers initial condition: sine modes k <= ic_modes with amplitudes ~ N(0, k^-2), max|u| = 1."""
    t_starts: tuple[float, ...] = (0.2, 0.4, 0.6, 0.8, 1.0)
    """Start times t0 of the pairs (u(t0), u(t0 + lag)); each initial condition gives one pair per t0."""
    lag: float = 0.5
    """Forecast horizon of the one-step map. Reconstructed (the paper gives none): one step must be long
    enough that the fine scales change, or copying them is already a forecast. Burgers' band above
    k = 16 decorrelates in ~0.4 (persistence error 0.71 at 0.2, 1.05 at 0.4, 1.12-1.19 at 0.5)."""
    ns_forcing: float = 1.0
    """Navier-Stokes: amplitude A of the Kolmogorov forcing A sin(4 y)."""
    ns_drag: float = 0.1
    """Navier-Stokes: linear drag that keeps the forced flow statistically steady."""
    n_train: int = 1000
    """Training pairs."""
    n_test: int = 200
    """Test pairs (from initial conditions disjoint from the training ones)."""
    rho0: int = 32
    """Training resolution (grid points per axis)."""
    eval_factors: tuple[int, ...] = (1, 2, 4)
    """Evaluation resolutions as multiples of rho0 (must include 1)."""
    width: int = 32
    """Channels of the hidden layers."""
    depth: int = 4
    """Spectral blocks (FNO), residual conv blocks (CNN) or attention blocks (Transformer)."""
    modes: int = 16
    """Baseline FNO and Transformer regressor: Fourier modes per axis kept by each spectral layer (at most rho0/2)."""
    heads: int = 4
    """Transformer: attention heads (width must be a multiple)."""
    kernel: int = 5
    """CNN: taps per axis at the training resolution (odd)."""
    residual: bool = True
    """Predict u(t0 + lag) - u(t0) and add the input back (not stated in the paper; the common forecasting
    form). Above rho0/2 the increment has no learned response, so the input's fine scales pass on as they are.
    False is the plain FNO (lift, W + K, projection); that baseline is not anchored on Burgers (see claims.py)."""
    frl_coord: str = "physical"
    """FRL spectral weight input: 'physical' (|k|/k_Nyq(rho0), held above it) or 'nyquist' (|k|/k_Nyq(rho) and log2(rho/rho0))."""
    frl_features: int = 8
    """Fourier features per coordinate of the FRL weight MLPs."""
    frl_hidden: int = 64
    """Hidden width of the FRL weight MLPs."""
    frl_diagonal: bool = False
    """FRL FNO: one complex weight per channel and mode instead of a [c, c] matrix."""
    pe_count: int = 4
    """FRL frequency input channels sin/cos(2 pi m x / k_Nyq(rho)) for m = 1..pe_count (0: none)."""
    pe_coord: str = "index"
    """x in the frequency channels: 'index' (grid index, resolution-aligned) or 'physical' (x in [0, 2 pi))."""
    steps: int = 8000
    """Optimizer steps."""
    batch_size: int = 64
    """Pairs per step (the same pairs at every training resolution)."""
    lr: float = 1e-3
    """Peak Adam learning rate (5% linear warmup, cosine decay to zero)."""
    weight_decay: float = 1e-4
    """Adam (decoupled) weight decay."""
    eval_every_frac: float = 0.25
    """Evaluate at every multiple of this fraction of the steps (and at the end)."""
    checkpoint_every_frac: float = 0.25
    """Checkpoint at every multiple of this fraction of the steps (and at the end)."""
    log_every: int = 50
    """Report train/loss (averaged since the last report) every this many steps."""
    eval_batch: int = 50
    """Test pairs per forward pass during evaluation."""
    threads: int = 1
    """CPU threads for torch during the trial, pinned by the runner around `train` (0: leave the
    process setting); small FFTs gain nothing from more."""
    data_path: str = ""
    """A PDEBench-format HDF5 file of trajectories to read the pairs from instead of the DNS (its grid
    takes dns_n's place; t_starts and lag are in its time units; the solver control is not run)."""
    data_field: str = "tensor"
    """The file's field to forecast: 'tensor' (PDEBench 1-D), a 2-D field such as 'density', or
    'vorticity' (derived from Vx/Vy or velocity on a periodic grid)."""
    seed: int = 0
    """Seed of the data (initial conditions), the initialisation and the batch order."""


def smoke() -> Config:
    """CPU-sized Burgers: DNS at 256 points, 300 pairs, 120 steps of a width-24 FNO; a few seconds."""
    return Config(
        dns_n=256,
        dns_dt=5e-3,
        n_train=300,
        n_test=60,
        width=24,
        steps=120,
        batch_size=32,
        lr=3e-3,
        log_every=20,
        eval_every_frac=0.5,
        checkpoint_every_frac=0.25,
    )


def data_spec(cfg: Config) -> DataSpec:
    return DataSpec(cfg.pde, cfg.nu, cfg.dns_n, cfg.dns_dt, cfg.ref_n, cfg.ic_modes, tuple(cfg.t_starts),
                    cfg.lag, cfg.n_train, cfg.n_test, cfg.seed, cfg.ns_forcing, cfg.ns_drag,
                    data_path=cfg.data_path, data_field=cfg.data_field)


def train_resolutions(cfg: Config) -> list[int]:
    """rho0, rho0/2, ..., rho0/2^multires_levels."""
    return [cfg.rho0 // 2**j for j in range(cfg.multires_levels + 1)]


def validate(cfg: Config, world_size: int = 1) -> None:
    """Checks that need no training: raised before anything is launched."""
    if cfg.pde not in PDES:
        raise ValueError(f"pde must be one of {PDES}, got {cfg.pde!r}")
    if cfg.backbone not in BACKBONES:
        raise ValueError(f"backbone must be one of {BACKBONES}, got {cfg.backbone!r}")
    if cfg.frl_coord not in ("physical", "nyquist"):
        raise ValueError(f"frl_coord must be 'physical' or 'nyquist', got {cfg.frl_coord!r}")
    if cfg.pe_coord not in ("index", "physical"):
        raise ValueError(f"pe_coord must be 'index' or 'physical', got {cfg.pe_coord!r}")
    for name in ("width", "depth", "steps", "batch_size", "log_every", "n_train", "n_test", "rho0", "eval_batch"):
        if getattr(cfg, name) <= 0:
            raise ValueError(f"{name} must be positive, got {getattr(cfg, name)}")
    for name in ("nu", "dns_dt", "lag", "lr"):
        if not getattr(cfg, name) > 0:
            raise ValueError(f"{name} must be positive, got {getattr(cfg, name)}")
    if cfg.multires_levels < 0 or cfg.rho0 % 2 ** (cfg.multires_levels + 1) or cfg.rho0 // 2**cfg.multires_levels < 4:
        raise ValueError(
            f"rho0={cfg.rho0} with multires_levels={cfg.multires_levels}: every training grid rho0/2^j must be even "
            f"and at least 4 points; lower multires_levels or use a rho0 divisible by 2^(levels+1)"
        )
    if cfg.cross_scale_weight > 0 and cfg.multires_levels < 1:
        raise ValueError("cross_scale_weight > 0 compares two training resolutions: set multires_levels >= 1")
    if 1 not in cfg.eval_factors or any(f < 1 for f in cfg.eval_factors):
        raise ValueError(f"eval_factors must be integers >= 1 and include 1 (the training resolution), got {cfg.eval_factors}")
    top = max(cfg.eval_factors) * cfg.rho0
    if cfg.data_path:
        check_path(cfg.data_path)  # the file itself is checked where the run starts (`preflight`)
        if top > cfg.ref_n:
            raise ValueError(f"need rho0 * max(eval_factors) = {top} <= ref_n = {cfg.ref_n}: the reference grid must "
                             f"hold every evaluation grid")
    elif not (top <= cfg.ref_n <= cfg.dns_n):
        raise ValueError(
            f"need rho0 * max(eval_factors) = {top} <= ref_n = {cfg.ref_n} <= dns_n = {cfg.dns_n}: "
            f"the reference grid must hold every evaluation grid and be a truncation of the DNS"
        )
    if cfg.backbone == "transformer" and (cfg.heads < 1 or cfg.width % cfg.heads):
        raise ValueError(f"width={cfg.width} must be a positive multiple of heads={cfg.heads}")
    if cfg.backbone in ("fno", "transformer") and not cfg.frl and not 1 <= cfg.modes <= cfg.rho0 // 2:
        raise ValueError(f"modes={cfg.modes} must lie in 1..rho0/2={cfg.rho0 // 2} (modes above the training Nyquist are never trained)")
    if cfg.backbone == "cnn" and (cfg.kernel < 1 or cfg.kernel % 2 == 0):
        raise ValueError(f"kernel must be a positive odd number of taps, got {cfg.kernel}")
    if not cfg.t_starts or min(cfg.t_starts) < 0:
        raise ValueError(f"t_starts must be non-empty and non-negative, got {cfg.t_starts}")
    if cfg.spectral_weight < 0 or cfg.cross_scale_weight < 0 or cfg.weight_decay < 0:
        raise ValueError("spectral_weight, cross_scale_weight and weight_decay must be >= 0")


def preflight(cfg: Config) -> None:
    """Checks of the machine that runs it: a `data_path` file is there, holds `data_field` with the
    PDE's dimensions, the times t_starts and t_starts + lag, enough trajectories for n_train and
    n_test, and a grid of at least ref_n points. Kept out of `validate` so that a sweep of files on
    a cluster's storage checks as valid anywhere."""
    if not cfg.data_path:
        return
    dims = 1 if cfg.pde == "burgers" else 2
    facts = describe(cfg.data_path, cfg.data_field, dims, tuple(cfg.t_starts), cfg.lag)
    per = len(facts["pairs"])
    need = math.ceil(cfg.n_train / per) + math.ceil(cfg.n_test / per)
    if need > facts["trajectories"]:
        raise ValueError(f"data_path={cfg.data_path!r} has {facts['trajectories']} trajectories; n_train={cfg.n_train} "
                         f"and n_test={cfg.n_test} at {per} pairs each need {need}: lower them")
    if facts["grid"] < cfg.ref_n:
        raise ValueError(f"data_path={cfg.data_path!r} has {facts['grid']} grid points per axis, below ref_n={cfg.ref_n}: "
                         f"lower ref_n")


def build_model(cfg: Config) -> torch.nn.Module:
    dims = 1 if cfg.pde == "burgers" else 2
    common = dict(pe_count=cfg.pe_count, pe_coord=cfg.pe_coord, residual=cfg.residual,
                  features=cfg.frl_features, hidden=cfg.frl_hidden)
    if cfg.backbone == "transformer":
        return GalerkinTransformer(dims, cfg.width, cfg.depth, cfg.modes, cfg.rho0, cfg.frl, heads=cfg.heads,
                                   coord=cfg.frl_coord, diagonal=cfg.frl_diagonal, **common)
    if cfg.backbone == "fno":
        return FNO(dims, cfg.width, cfg.depth, cfg.modes, cfg.rho0, cfg.frl,
                   coord=cfg.frl_coord, diagonal=cfg.frl_diagonal, **common)
    return CNN(dims, cfg.width, cfg.depth, cfg.kernel, cfg.rho0, cfg.frl, **common)


def lr_factor(step: int, steps: int) -> float:
    """5% linear warmup, then cosine decay to zero at the last step."""
    warmup = max(1, round(0.05 * steps))
    if step <= warmup:
        return step / warmup
    return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


def blind_band(p: torch.Tensor, x: torch.Tensor, y: torch.Tensor, lo: int, dims: int) -> dict[str, float]:
    """The band |k| >= lo (max-norm over axes) on p's grid, the blind zone above rho0/2, pooled over samples.

    `err`: the prediction's relative error in the band. `persistence`: the same for the input
    itself, copied forward: below 1, the input's own fine scales predict the target's, so a skip
    or pointwise path that carries them gains without any response learned above rho0/2.
    `transmit`: <p_band, x_band> / |x_band|^2, the share of the input's band the model passes on.
    `energy`: |y_band| / |y|, the share of the target in the band.
    """
    n = p.shape[-1]
    high = lambda f: f - upsample(truncate(f, 2 * lo, dims), n, dims)  # noqa: E731
    hp, hx, hy = high(p), high(x), high(y)
    norm = hy.norm().clamp_min(1e-30)
    return {"err": float((hp - hy).norm() / norm), "persistence": float((hx - hy).norm() / norm),
            "transmit": float((hp * hx).sum() / hx.pow(2).sum().clamp_min(1e-30)), "energy": float(norm / y.norm())}


def _rel(p: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-sample relative L2 error. [B]"""
    return (p - y).flatten(1).norm(dim=1) / y.flatten(1).norm(dim=1).clamp_min(1e-30)


@torch.no_grad()
def evaluate(model: torch.nn.Module, cfg: Config, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """Errors at every rho = f * rho0 of eval_factors; x, y on the reference grid (float64)."""
    dims = 1 if cfg.pde == "burgers" else 2
    device = next(model.parameters()).device
    model.eval()
    out: dict[str, float] = {}
    for f in sorted(cfg.eval_factors):
        rho = f * cfg.rho0
        ref, grid, preds = [], [], []
        for i in range(0, x.shape[0], cfg.eval_batch):
            xb, yb = x[i : i + cfg.eval_batch].to(device), y[i : i + cfg.eval_batch].to(device)
            p = model(truncate(xb, rho, dims).float()).double()
            ref.append(_rel(upsample(p, cfg.ref_n, dims), yb))
            grid.append(_rel(p, truncate(yb, rho, dims)))
            preds.append(p.cpu())
        out[f"eval/rel_l2/x{f}"] = float(torch.cat(ref).mean())
        out[f"eval/rel_l2_grid/x{f}"] = float(torch.cat(grid).mean())
        if f > 1:
            band = blind_band(torch.cat(preds), truncate(x, rho, dims), truncate(y, rho, dims), cfg.rho0 // 2, dims)
            out.update({f"eval/blind_band_{k}/x{f}": v for k, v in band.items()})
    for f in cfg.eval_factors:
        out[f"eval/ratio/x{f}"] = out[f"eval/rel_l2/x{f}"] / out["eval/rel_l2/x1"]
    model.train()
    return out


def solver_errors(cfg: Config, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """Two references per rho, against the DNS reference: the truncation floor (the truth itself on
    the rho grid, the least error any rho-grid prediction can have) and the calibration control,
    the pseudo-spectral solver run on the rho grid from the truncated input. A solver's error
    falls with resolution; that is the behaviour asked of the models."""
    spec = data_spec(cfg)
    dims = spec.dims
    out = {}
    for f in sorted(cfg.eval_factors):
        rho = f * cfg.rho0
        out[f"eval/floor_rel_l2/x{f}"] = float(_rel(upsample(truncate(y, rho, dims), cfg.ref_n, dims), y).mean())
        if cfg.data_path:
            continue  # the file's PDE, domain and units are its own: the solver control would not be its solver
        pred = solver_for(spec, rho).evolve(truncate(x, rho, dims), cfg.lag)
        out[f"eval/solver_rel_l2/x{f}"] = float(_rel(upsample(pred, cfg.ref_n, dims), y).mean())
    return out


def train(cfg: Config, run) -> dict[str, float]:
    validate(cfg, run.world_size)
    torch.manual_seed(cfg.seed)
    dims = 1 if cfg.pde == "burgers" else 2
    data = make_dataset(data_spec(cfg))
    device = run.device
    levels = train_resolutions(cfg)
    # Every training resolution is a truncation of the same pairs: a step sees the same samples at each.
    xs = {r: truncate(data.x_train, r, dims).float().to(device) for r in levels}
    ys = {r: truncate(data.y_train, r, dims).float().to(device) for r in levels}

    model = build_model(cfg).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    model, optimizer = run.prepare(model, optimizer)
    sampler = torch.Generator().manual_seed(cfg.seed + 7919)

    start = 0
    state = run.restore()
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        sampler.set_state(state["sampler"])
        start = int(state["step"])

    eval_at = fraction_steps(cfg.steps, cfg.eval_every_frac)
    save_at = fraction_steps(cfg.steps, cfg.checkpoint_every_frac)
    window, window_n, train_loss = 0.0, 0, math.nan
    metrics_eval: dict[str, float] = {}
    t_train, t_mark = 0.0, devices.clock(device)
    for step in range(start + 1, cfg.steps + 1):
        for group in optimizer.param_groups:
            group["lr"] = cfg.lr * lr_factor(step, cfg.steps)
        idx = torch.randint(0, data.x_train.shape[0], (cfg.batch_size,), generator=sampler).to(device)
        preds = {r: model(xs[r][idx]) for r in levels}
        fit = sum(rel_mse(preds[r], ys[r][idx]) for r in levels) / len(levels)
        loss = fit
        if cfg.spectral_weight > 0:
            loss = loss + cfg.spectral_weight * sum(spectral_loss(preds[r], ys[r][idx], dims) for r in levels) / len(levels)
        if cfg.cross_scale_weight > 0:
            pairs = list(zip(levels, levels[1:]))
            loss = loss + cfg.cross_scale_weight * sum(
                cross_scale_loss(preds[fine], preds[coarse], ys[coarse][idx], dims) for fine, coarse in pairs
            ) / len(pairs)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        # train/loss is the whole objective (fit plus FRL's terms); train/fit is the shared part.
        window += float(loss.detach())
        window_n += 1

        report: dict[str, float] = {}
        if step % cfg.log_every == 0 or step == cfg.steps:
            train_loss = window / window_n
            now = devices.clock(device)
            t_train += now - t_mark
            report.update({"train/loss": train_loss, "train/fit": float(fit.detach()), "train/lr": cfg.lr * lr_factor(step, cfg.steps),
                           "perf/steps_per_s": window_n / max(now - t_mark, 1e-9)})
            window, window_n = 0.0, 0
        if step in eval_at:
            metrics_eval = evaluate(model, cfg, data.x_test, data.y_test)
            report.update(metrics_eval)
        if report:
            report["progress"] = step / cfg.steps
            run.report(report, step=step)
            t_mark = devices.clock(device)
        if step in save_at:
            run.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                      "sampler": sampler.get_state()})
    if not metrics_eval:  # restored at the last step: nothing left to train, measure again
        metrics_eval = evaluate(model, cfg, data.x_test, data.y_test)
    final = {"train/loss": train_loss, **metrics_eval, **solver_errors(cfg, data.x_test, data.y_test)}
    final["perf/train_s"] = t_train
    final["params"] = float(sum(p.numel() for p in model.parameters()))
    return {k: float(v) for k, v in final.items()}
