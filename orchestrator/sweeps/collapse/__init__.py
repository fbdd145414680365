"""Scaling with Collapse: Efficient and Predictable Training of LLM Families (Bergsma et al., 2025) — https://arxiv.org/abs/2509.25087

The pure maths of loss-curve collapse, with numpy only (no Ray, MLflow or torch): normalized
curves and references, the divisor fit that predicts a run's final loss from a prefix, the
deviation-from-collapse residual and its seed-noise threshold, the rung-based stopping logic the
Ray scheduler wraps, and replays of stopping policies over finished sweeps.
"""

from orchestrator.sweeps.collapse.curves import as_curve, collapse_deviation, final_loss, normalize, smooth
from orchestrator.sweeps.collapse.divisor import DivisorEstimate, fit_divisor, fit_divisor_with_uncertainty
from orchestrator.sweeps.collapse.parametric import (
    ControlledCurve,
    LinearDecaySchedule,
    ParametricFit,
    ParametricReference,
    fit_parametric,
)
from orchestrator.sweeps.collapse.reference import (
    EmpiricalReference,
    Reference,
    ReferenceFamily,
    ReferenceTable,
    resolve_reference,
)
from orchestrator.sweeps.collapse.replay import (
    ReplayResult,
    replay_asha,
    replay_collapse,
    replay_current_best,
    replay_median,
    replay_random,
    replay_stopper,
)
from orchestrator.sweeps.collapse.residual import (
    ALIGN,
    Residual,
    Threshold,
    calibrate_threshold,
    collapse_residual,
    detect_deviation,
    seed_threshold,
)
from orchestrator.sweeps.collapse.stopper import CONTINUE, STOP, CollapseStopper, Decision

__all__ = [
    "ALIGN",
    "CONTINUE",
    "STOP",
    "CollapseStopper",
    "ControlledCurve",
    "Decision",
    "DivisorEstimate",
    "EmpiricalReference",
    "LinearDecaySchedule",
    "ParametricFit",
    "ParametricReference",
    "Reference",
    "ReferenceFamily",
    "ReferenceTable",
    "ReplayResult",
    "Residual",
    "Threshold",
    "as_curve",
    "calibrate_threshold",
    "collapse_deviation",
    "collapse_residual",
    "detect_deviation",
    "final_loss",
    "fit_divisor",
    "fit_divisor_with_uncertainty",
    "fit_parametric",
    "normalize",
    "replay_asha",
    "replay_collapse",
    "replay_current_best",
    "replay_median",
    "replay_random",
    "replay_stopper",
    "resolve_reference",
    "seed_threshold",
    "smooth",
]
