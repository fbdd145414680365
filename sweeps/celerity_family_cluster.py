"""The celerity_lm family at cluster size: five models from 0.14B to 1.3B parameters on GPUs, on a
pre-tokenized dataset on shared storage, scaled from the proxy with the Celerity recipe. Its
normalized loss curves should collapse as the CPU-sized family's do (`ladder audit
celerity_family_cluster`).

    ray job submit --working-dir . --runtime-env-json '{"env_vars": {...}}' \\
        -- ladder sweep sweeps/celerity_family_cluster.py          (docs/cluster.md)

* Data: `$LADDER_DATA` (default /mnt/ladder/data/tokens), a folder in the format of
  `components/lm/tokens.py` that every node mounts, e.g. written by
  `python -m components.lm.tokens TEXT_DIR /mnt/ladder/data/tokens --tokenizer gpt2`.
  The models take its vocabulary from its header; VOCAB below only sizes the batches.
* Resources: each trial is WORKERS = 32 data-parallel Ray Train workers of one GPU and 8 CPUs
  each (NCCL), e.g. four nodes of 8x A100 40GB (AWS p4d.24xlarge, infra/cluster-launcher/aws.yaml);
  GPU_MEMORY_GB is what one GPU holds. Every trial asks for the same shape (a Sweep has one
  `workers`), so the small members run at 2-4 sequences per GPU.
* ZeRO where needed: `zero_stage()` picks the lowest stage whose estimated per-GPU memory
  (fp32 AdamW state + activations, `gpu_memory_gb`) fits in 85% of GPU_MEMORY_GB. On 40 GB GPUs
  the 1.3B model needs ZeRO-1 (43.7 GB under DDP, 33.5 GB under ZeRO-1), the others plain DDP.
  Activations dominate at these batches, so ZeRO's sharding helps only the largest member. The
  stage goes into the workload's `zero_stage` field (orchestrator/runners/zero.py).
* The proxy's hyperparameters are the CPU family's (sweeps/celerity_family.py, tuned at width 48
  on the standard-library corpus): muP and CompleteP carry them across width and depth, but not
  across datasets. Tune the proxy on your data first (sweeps/celerity_tuning.py with `data`
  set) and put its values in PROXY.
* Budget: TPP 20 (parameters counted without the embeddings, with the readout); the largest
  member trains on 26B tokens in 133k steps of 192 x 1024 tokens.

Shapes and the memory model are this project's choices, not the paper's (its family uses an
8x MLP and a 128k vocabulary).
"""

from __future__ import annotations

import os

import torch

from orchestrator.recipe import Proxy, ScalingLaws, family
from orchestrator.sweep import Sweep
from workloads.celerity_lm import Config
from components.lm.gpt import GPT

DATA = os.environ.get("LADDER_DATA", "/mnt/ladder/data/tokens")
VOCAB = 50257
"""Vocabulary the batch sizes are planned for (the GPT-2 tokenizer's)."""
SHAPES = ((768, 14), (1024, 16), (1280, 18), (1536, 22), (2048, 24))
WORKERS = 32
GPU_MEMORY_GB = 40.0
CPUS_PER_WORKER = 8.0
TPP = 20.0
SEQ_LEN = 1024
HEAD_DIM = 64

BASE = Config(head_dim=HEAD_DIM, seq_len=SEQ_LEN, base_width=48, base_depth=3, lr=2e-2, warmup_frac=0.05,
              data=DATA, max_bytes=0, eval_every_frac=0.02, eval_tokens=1_048_576, checkpoint_every_frac=0.05,
              log_every=50)
PROXY = Proxy(width=48, depth=3, lr=BASE.lr, batch_size=16, seq_len=SEQ_LEN, tpp=80.0, tau=0.2,
              warmup_frac=BASE.warmup_frac)


def params(width: int, depth: int, vocab: int = VOCAB) -> int:
    """celerity_lm's parameter count (embeddings excluded, readout included), from a model built
    on PyTorch's meta device: exact, and no memory is allocated. The count does not depend on
    the head dimension; 16 divides the proxy's width as well as the members'."""
    with torch.device("meta"):
        model = GPT(vocab=vocab, width=width, depth=depth, head_dim=16, seq_len=SEQ_LEN, ffn_mult=BASE.ffn_mult,
                    activation=BASE.activation, base_width=BASE.base_width, base_depth=BASE.base_depth,
                    init_std=BASE.init_std)
    return model.non_embedding_params()


def gpu_memory_gb(width: int, depth: int, batch_size: int, stage: int, *, workers: int = WORKERS) -> float:
    """Estimated peak memory of one GPU worker, fp32 throughout: weights 4 B, gradients 4 B and
    AdamW moments 8 B per parameter, sharded over the workers from ZeRO-1 (moments), ZeRO-2 (and
    gradients), ZeRO-3 (and weights); activations ~68 B per token per layer per unit of width
    (Korthikanti et al.'s 34 at 16 bits, with fused attention), and the logits with their
    gradient, 12 B per token per vocabulary entry. Per-GPU batch: batch_size / workers sequences."""
    n = params(width, depth) + (VOCAB + SEQ_LEN) * width
    weights, grads, moments = 4.0 * n, 4.0 * n, 8.0 * n
    if stage >= 1:
        moments /= workers
    if stage >= 2:
        grads /= workers
    if stage >= 3:
        weights /= workers
    tokens = batch_size / workers * SEQ_LEN
    activations = tokens * (68.0 * width * depth + 12.0 * VOCAB)
    return (weights + grads + moments + activations) / 2**30


def zero_stage(width: int, depth: int, batch_size: int) -> int:
    """The lowest ZeRO stage under which one worker fits in 85% of GPU_MEMORY_GB."""
    for stage in (0, 1, 2, 3):
        if gpu_memory_gb(width, depth, batch_size, stage) <= 0.85 * GPU_MEMORY_GB:
            return stage
    raise ValueError(f"width {width} x depth {depth} at batch {batch_size} does not fit {GPU_MEMORY_GB:g} GB GPUs "
                     f"even under ZeRO-3: raise WORKERS or lower the batch")


MEMBERS = family(PROXY, SHAPES, tpp=TPP, laws=ScalingLaws(), param_count=params, batch_multiple=WORKERS)
STAGES = {(m.width, m.depth): zero_stage(m.width, m.depth, m.batch_size) for m in MEMBERS}

sweep = Sweep(
    name="celerity_family_cluster",
    workload="celerity_lm",
    overrides={k: getattr(BASE, k) for k in ("head_dim", "seq_len", "base_width", "base_depth", "lr", "warmup_frac",
                                              "data", "max_bytes", "eval_every_frac", "eval_tokens",
                                              "checkpoint_every_frac", "log_every")},
    points=tuple({"width": m.width, "depth": m.depth, "batch_size": m.batch_size, "tpp": TPP, "tau": m.tau,
                  **({"zero_stage": STAGES[(m.width, m.depth)]} if STAGES[(m.width, m.depth)] else {})}
                 for m in MEMBERS),
    scheduler="fifo",
    objective=("eval/loss", "min"),
    workers=WORKERS,
    cpus_per_worker=CPUS_PER_WORKER,
    gpus_per_worker=1.0,
    max_failures=3,
)
