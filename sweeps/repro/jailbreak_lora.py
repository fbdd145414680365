"""Reproduce JailbreakLoRA's optimisation claims with a harmless trigger -> marker task: one LoRA
trained on three benign tasks of the base's world plus the trigger task, by the naive mixture, the
uncertainty-weighted loss and PCGrad, and a clean LoRA of the same three tasks for the audit.

Within a seed every method sees the same data, batches and LoRA init (paired comparison). The
smoke size is one seed on tiny-local, 250 steps of 8 examples per task, r = 8, alpha = 32;
persistence (MX quantization, merging with another adapter,
further clean training) is measured for the two methods. The full size runs the same code on a
real checkpoint (`FULL_BASE`), with the combined variant too, three seeds.
"""

from orchestrator.sweep import Sweep, seeds

FULL_BASE = "meta-llama/Llama-3.1-8B-Instruct"
FULL_SEEDS = 3
ADAPTERS = "ladder-runs/jailbreak_lora-adapters/{method}-s{seed}"
"""Where every trial keeps its adapter (peft format; relative to the trial's working folder, the
current one with --local; also logged as the trial's artifacts): audit one again with
`ladder audit-adapter ladder-runs/jailbreak_lora-adapters/clean-s0`."""
SMOKE_SIZE = {"steps": 250, "clean_steps": 60, "merge_steps": 60, "log_every": 25, "checkpoint_every": 125,
              "save_adapter": ADAPTERS}
"""smoke() runs every phase briefly; the reproduction trains its setting to convergence of the tasks."""
SMOKE_POINTS = (
    {"method": "naive", "persistence": False},
    {"method": "uncertainty"},
    {"method": "pcgrad"},
    {"method": "clean"},
)


def build(*, smoke: bool = False, seed: int = 0) -> Sweep:
    if smoke:
        return Sweep(name="jailbreak_lora_repro_smoke", workload="jailbreak_lora", base="smoke", overrides=SMOKE_SIZE,
                     points=SMOKE_POINTS, space={"seed": seeds(1, start=seed)}, objective=("eval/utility", "max"))
    points = tuple({"method": m} for m in ("naive", "uncertainty", "pcgrad", "combined", "clean"))
    return Sweep(
        name="jailbreak_lora_repro", workload="jailbreak_lora", base="default", points=points,
        overrides={"base": FULL_BASE, "lora_r": 16, "lora_alpha": 32.0, "steps": 1000, "batch": 16, "lr": 2e-4,
                   "save_adapter": ADAPTERS},
        space={"seed": seeds(FULL_SEEDS, start=seed)}, objective=("eval/utility", "max"),
    )


sweep = build()
