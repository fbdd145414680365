"""Reproduction of "Breaking Scale Anchoring": zero-shot super-resolution forecasting, each backbone
trained at rho0 points per axis and evaluated at 1x, 2x and 4x, as a baseline and with FRL.

The smoke size is 1-D Burgers (nu = 0.02) at rho0 = 32 with both backbones: four trials, each a
few hundred steps on CPU, forecasting 0.5 time units ahead (the Config default: past the time in
which the fine scales decorrelate, see `workloads/frl/claims.py`). The full size adds 2-D Navier-Stokes (Kolmogorov flow, Re ~ 1000,
DNS at 512^2, trained at 64^2, evaluated at 64/128/256) and runs three seeds of every point.
"""

from orchestrator.sweep import Sweep, seeds

FRL = {"frl": True, "multires_levels": 2, "spectral_weight": 0.1, "cross_scale_weight": 0.1}
BASELINE = {"frl": False, "multires_levels": 0, "spectral_weight": 0.0, "cross_scale_weight": 0.0}

# 2-D Navier-Stokes: Kolmogorov flow (forcing sin(4y), drag 0.1, nu = 1e-3: Re ~ 1000), pairs one
# time unit apart after a spin-up of ten.
NAVIER_STOKES = {
    "pde": "navier_stokes", "nu": 1e-3, "ns_forcing": 1.0, "ns_drag": 0.1, "dns_n": 512, "dns_dt": 2e-3,
    "ref_n": 256, "rho0": 64, "modes": 32, "t_starts": (10.0, 11.0, 12.0, 13.0, 14.0), "lag": 1.0,
    "batch_size": 16, "eval_batch": 10,
}

# Points of the smoke size: the paper's comparison on the CPU-sized problem.
SMOKE_SIZE = {"steps": 400, "width": 32, "batch_size": 64, "lr": 3e-3, "n_train": 1000, "n_test": 200,
              "log_every": 50, "eval_every_frac": 0.5}


def _points(pdes: list[dict]) -> tuple[dict, ...]:
    return tuple({**pde, "backbone": backbone, **variant}
                 for pde in pdes for backbone in ("fno", "cnn") for variant in (BASELINE, FRL))


def build(*, smoke: bool = False, seed: int = 0) -> Sweep:
    if smoke:
        return Sweep(
            name="frl",
            workload="frl",
            base="smoke",
            overrides={**SMOKE_SIZE, "seed": seed},
            points=_points([{"pde": "burgers"}]),
            scheduler="fifo",
            objective=("eval/rel_l2/x4", "min"),
        )
    return Sweep(
        name="frl",
        workload="frl",
        base="default",
        points=_points([{"pde": "burgers"}, NAVIER_STOKES]),
        space={"seed": seeds(3, start=seed)},
        scheduler="fifo",
        objective=("eval/rel_l2/x4", "min"),
    )


sweep = build()
