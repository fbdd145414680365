"""Reproduce CAR-LoRA's claims: one compression-aware adapter against plain LoRA and against one
adapter per compression scheme, evaluated under every scheme, a held-out scheme and a drifted base.

One trial per adapter: plain LoRA, CAR-LoRA, and a per-scheme adapter for each in-set scheme, all
from the same seed (same task split, same initialisation), so the comparison is paired. The smoke
size runs them on tiny-local at the given seed with the default Config (80 steps, CAR 4x as many,
as in the paper's 20 epochs against 5; the drifted base is built once and cached) and the paper's
schemes plus 2-bit groups of 16 (`SMOKE_QUANT`, the quantiser that costs plain LoRA at tiny size). The full size runs the same code on a real checkpoint (`FULL_BASE`, from the
Hugging Face cache or a local folder) with the `a - b mod 97` task (a real base does not know the
tiny world's facts), the paper's r = 8, alpha = 16, its drift recipe (LoRA r = 64, alpha = 128,
lr 1e-4, merged) on WikiText-2 raw read from `$LADDER_DATA/wikitext-2-raw` (docs/datasets.md), three
seeds.
"""

from orchestrator.sweep import Sweep, data_root, grid, seeds
from workloads.car_lora import Config
from workloads.car_lora.workload import SMOKE_SCHEMES

FULL_BASE = "meta-llama/Llama-3.1-8B"
FULL_SEEDS = 3


def build(*, smoke: bool = False, seed: int = 0) -> Sweep:
    adapters = grid("plain", "car", *Config().schemes)
    if smoke:  # tiny-local at the default size: the adapters are small, the steps few
        # The paper's operator kinds plus 2-bit groups of 16 (SMOKE_QUANT): at hidden size 64 no
        # 4- or 8-bit format costs a plain LoRA anything, so without it no quantiser is compared.
        return Sweep(name="car_lora_repro_smoke", workload="car_lora", base="default",
                     overrides={"seed": seed, "schemes": SMOKE_SCHEMES},
                     space={"adapter": grid("plain", "car", *SMOKE_SCHEMES)}, objective=("eval/acc/none", "max"))
    return Sweep(
        name="car_lora_repro", workload="car_lora", base="default",
        overrides={"base": FULL_BASE, "dtype": "bfloat16", "task": "arith", "arith_modulus": 97, "lora_r": 8,
                   "lora_alpha": 16.0, "steps": 2000, "batch": 16, "lr": 2e-4, "skip_layer": 24,
                   "cache_compressed": False, "mx_impl": "auto", "drift_steps": 1000, "drift_lr": 1e-4,
                   "drift_rank": 64, "drift_alpha": 128.0, "drift_batch": 8, "drift_seq_len": 256, "threads": 0,
                   "drift_path": str(data_root() / "wikitext-2-raw")},
        space={"adapter": adapters, "seed": seeds(FULL_SEEDS, start=seed)}, objective=("eval/acc/none", "max"),
    )


sweep = build()
