"""Reproduce Consistent Low-Rank Approximation (Woodruff & Zhou, ICLR 2026): recourse and cost/OPT
of recomputing every row, the lazy additive-error rule and the multiplicative variant, on streams
that flip their best subspace at every row, on i.i.d. rows, and on a nearly rank-k stream whose
best subspace changes once.

In the full sweep every stream is crossed with every algorithm arm (the `every` baseline does
not depend on eps and runs once per stream): up to 100,000 rows, k up to 25, three seeds, the
sampled and the exact multiplicative sketch, eps from 0.1 to 1. `ladder reproduce consistent_lra
--smoke` runs 12 trials of a few thousand rows on a CPU, only the arms its claims compare: each
trial trains in well under a second, so a trial fewer is worth more than a row fewer.
"""

from __future__ import annotations

from orchestrator.sweep import Sweep, seeds

SMOKE_EPS = (0.1, 0.5)
FLIP = {"stream": "flip", "n": 3000, "d": 4, "k": 2, "noise": 1e-3}
GAUSSIAN = {"stream": "gaussian", "n": 2000, "d": 20, "k": 3}
EMERGING = {"stream": "emerging", "n": 4000, "d": 6, "k": 2, "noise": 0.01}

FULL_STREAMS = (
    {"stream": "flip", "n": 100_000, "d": 2, "k": 1, "noise": 1e-3},
    {"stream": "flip", "n": 100_000, "d": 10, "k": 5, "noise": 1e-3},
    {"stream": "flip", "n": 100_000, "d": 50, "k": 25, "noise": 1e-3},
    {"stream": "gaussian", "n": 20_000, "d": 20, "k": 3},
    {"stream": "gaussian", "n": 20_000, "d": 100, "k": 25},
    {"stream": "emerging", "n": 20_000, "d": 12, "k": 5, "noise": 0.01},
    {"stream": "emerging", "n": 20_000, "d": 50, "k": 25, "noise": 0.01},
    # The paper's random experiment: 3,000 x 4 integers in [0, 100).
    {"stream": "randint", "n": 3000, "d": 4, "k": 1},
    {"stream": "randint", "n": 3000, "d": 4, "k": 2},
)


def _arms(eps_values: tuple[float, ...], sketches: tuple[str, ...]) -> list[dict]:
    arms: list[dict] = [{"algorithm": "every"}]
    arms += [{"algorithm": "additive", "eps": e} for e in eps_values]
    arms += [{"algorithm": "multiplicative", "eps": e, "sketch": s} for s in sketches for e in eps_values]
    return arms


def build(*, smoke: bool = False, seed: int = 0) -> Sweep:
    if smoke:
        arms = _arms(SMOKE_EPS, ("leverage",))
        baseline, lazy, mult = arms[:1], arms[1:1 + len(SMOKE_EPS)], arms[1 + len(SMOKE_EPS):]
        pairs = [(FLIP, arms), (GAUSSIAN, baseline + lazy), (EMERGING, lazy + mult)]
        space: dict = {}
        overrides = {"seed": seed, "log_every": 100, "checkpoint_every": 1000}
    else:
        arms = _arms((0.1, 0.5, 1.0), ("leverage", "exact"))
        pairs = [(stream, arms) for stream in FULL_STREAMS]
        space = {"seed": seeds(3, start=seed)}
        overrides = {"log_every": 1000, "checkpoint_every": 20_000}
    return Sweep(
        name="consistent_lra_repro",
        workload="consistent_lra",
        base="smoke" if smoke else "default",
        overrides=overrides,
        points=tuple({**stream, **arm} for stream, stream_arms in pairs for arm in stream_arms),
        space=space,
        scheduler="fifo",
        objective=("eval/recourse", "min"),
    )


sweep = build()
