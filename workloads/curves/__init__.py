"""Scaling with Collapse (Bergsma et al., 2025), synthetic: loss curves that collapse by construction, for exercising schedulers — https://arxiv.org/abs/2509.25087

curves: no model, no data. A trial draws the training curve a well-tuned run of a collapsing
family would have, L(t) = L_final * s(t) with one shape s for every trial and a final loss
that depends on the learning rate (and, for searches over several fields, on a warmup fraction
and a schedule whose defaults add nothing), plus multiplicative noise, and reports it like a real
workload (progress, train/loss, eval/loss, checkpoints). It costs microseconds per step, so a
sweep of hundreds of trials measures the orchestration itself: scheduler decisions, Tune and
MLflow overheads, resume. `diverge_at` makes a trial report NaN from that training fraction on,
the fault a scheduler must stop and mark as diverged.
"""

from workloads.curves.workload import MAX_WORKERS, Config, final_loss, shape, smoke, train, validate

__all__ = ["MAX_WORKERS", "Config", "final_loss", "shape", "smoke", "train", "validate"]
