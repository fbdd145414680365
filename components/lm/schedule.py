"""The learning-rate schedule of the language-model workloads."""

from __future__ import annotations


def lr_factor(step: int, steps: int, warmup_frac: float) -> float:
    """Linear warmup to 1, then linear decay to zero at the last step."""
    warmup = max(1, round(warmup_frac * steps))
    if step <= warmup:
        return step / warmup
    return max(0.0, (steps - step) / max(1, steps - warmup))
