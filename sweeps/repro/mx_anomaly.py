"""Reproduction of "Is Finer Better? The Limits of Microscaling Formats in LLMs": FP4 E2M1 error
against block size (256 down to 8) for each block-scale format, on synthetic tensors of controlled
width, on a trained GPT-2-style (Celerity-shaped) LM and on tiny-local, the project's tiny Llama
(components.basemodel), both as trained (the headline) and the LM rescaled to std 0.005 (constructed).

One trial per scale format; the block sizes are swept inside the trial. The LM is pre-trained once
for all four trials (`components.lm.pretrain`, celerity_lm's loop, cached under `$LADDER_CACHE/lm/`:
the first trial trains it, the others wait and read it). The full size quantizes the default recipe
(celerity_lm's default config: width 256, depth 6, 20 tokens per parameter): point `lm_checkpoint`
at a run folder of `ladder run celerity_lm` to quantize a model trained elsewhere.
"""

from orchestrator.sweep import Sweep

SCALES = (
    {"scale_format": "ue4m3", "global_scale": False},  # NVFP4 single-level scaling: the anomaly
    {"scale_format": "ue4m3", "global_scale": True},  # NVFP4 with its per-tensor FP32 scale
    {"scale_format": "ue5m3", "global_scale": False},  # the paper's fix, no global scale needed
    {"scale_format": "e8m0", "global_scale": False},  # OCP MX
)


# CPU-sized, every block size: the smoke-size LM at width 64 trained to 4 tokens per parameter
# (about 400 steps), so that its held-out loss responds to quantization.
# tiny-local is the project's one cached build (seed 0), at every size.
SMOKE = {"block_sizes": (256, 128, 64, 32, 16, 8), "sigmas": (0.001, 0.005, 0.02, 1.0), "synthetic_rows": 128,
         "lm_width": 64, "lm_tpp": 4.0, "eval_tokens": 8192, "base_model": "tiny-local"}


def build(*, smoke: bool = False, seed: int = 0) -> Sweep:
    return Sweep(
        name="mx_anomaly",
        workload="mx_anomaly",
        base="smoke" if smoke else "default",
        overrides={"seed": seed, **(SMOKE if smoke else {"base_model": "tiny-local"})},
        points=SCALES,
        scheduler="fifo",
        objective=("eval/lm_loss_fp", "min"),
    )


sweep = build()
