"""Reproduce JailbreakLoRA's claims with a harmless trigger -> marker task: one LoRA trained on three
benign tasks of the base's world plus the trigger task, by the paper's two variants (the
uncertainty-weighted loss, PCGrad), against the prior LoRA attacks it improves on (the naive mixture of
poisoned and task data; a trigger LoRA fused with a task LoRA), with both variants combined (the
paper's collapse) and a clean LoRA of the same three tasks beside.

Within a seed every method sees the same data, batches and LoRA init (paired comparison). The
smoke size is one seed on tiny-local, 250 steps of 8 examples per task, rank 1 (alpha 4: the scale
alpha / r = 4 of the earlier rank-8 smoke), where one LoRA is too small for four tasks at once and the
naive mixture interferes (at rank 8 it did not: its utility matched the clean LoRA's). The fusion
attack trains its two LoRAs at rank 1 each (its fused adapter has rank 2, as the attack distributes
it: twice the methods' budget, which favours the baseline). Persistence (MX quantization, merging with
another adapter, further clean training) is measured for the paper's two variants. The full size runs
the same code on a real checkpoint (`FULL_BASE`), three seeds.
"""

from orchestrator.sweep import Sweep, seeds

FULL_BASE = "meta-llama/Llama-3.1-8B-Instruct"
FULL_SEEDS = 3
ADAPTERS = "ladder-runs/jailbreak_lora-adapters/{method}-s{seed}"
"""Where every trial keeps its adapter (peft format; relative to the trial's working folder, the
current one with --local; also logged as the trial's artifacts): audit one again with
`ladder audit-adapter ladder-runs/jailbreak_lora-adapters/clean-s0`."""
SMOKE_SIZE = {"steps": 250, "lora_r": 1, "lora_alpha": 4.0, "clean_steps": 60, "merge_steps": 60, "log_every": 25,
              "checkpoint_every": 125, "save_adapter": ADAPTERS}
"""smoke() runs every phase briefly; the reproduction trains its setting to convergence of the tasks."""
SMOKE_POINTS = (
    {"method": "naive", "persistence": False},
    {"method": "fusion", "persistence": False},
    {"method": "uncertainty"},
    {"method": "pcgrad"},
    {"method": "combined", "persistence": False},
    {"method": "clean"},
)


def build(*, smoke: bool = False, seed: int = 0) -> Sweep:
    if smoke:
        return Sweep(name="jailbreak_lora_repro_smoke", workload="jailbreak_lora", base="smoke", overrides=SMOKE_SIZE,
                     points=SMOKE_POINTS, space={"seed": seeds(1, start=seed)}, objective=("eval/utility", "max"))
    points = tuple({"method": m} for m in ("naive", "fusion", "uncertainty", "pcgrad", "combined", "clean"))
    return Sweep(
        name="jailbreak_lora_repro", workload="jailbreak_lora", base="default", points=points,
        overrides={"base": FULL_BASE, "lora_r": 16, "lora_alpha": 32.0, "steps": 1000, "batch": 16, "lr": 2e-4,
                   "save_adapter": ADAPTERS},
        space={"seed": seeds(FULL_SEEDS, start=seed)}, objective=("eval/utility", "max"),
    )


sweep = build()
