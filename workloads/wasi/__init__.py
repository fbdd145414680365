"""Efficient Resource-Constrained Training of Transformers via Subspace Optimization (WASI, ICLR 2026) — https://arxiv.org/abs/2510.09160

wasi: Weight-Activation Subspace Iteration. A small ViT is pretrained (vanilla) on some digit
classes of scikit-learn's 8x8 digits and fine-tuned on the others, either vanilla or with WASI
in every transformer-block linear layer (qkv, proj, fc1, fc2):

- the weight is used in the forward as L R (L [out, k] orthonormal, R [k, in]), k chosen once at
  the start of fine-tuning as the smallest rank holding `threshold` of ||W||_F^2, and refreshed
  after every optimizer step by one warm-started subspace-iteration step on the updated W;
- the layer's input [B, N, C] is kept for the backward only as a Tucker core and three factors,
  found by one warm-started power step per mode;
- grad_x = (g L) R and grad_W is contracted from g and the Tucker factors, never rebuilding x.

Each trial reports the fine-tuned test accuracy and, measured on one training step of one batch:
the peak bytes of the whole step (weights, optimizer state, gradients, saved activations and
temporaries: a dispatch mode following every tensor storage's life); the bytes of every tensor
autograd saves for the backward (saved-tensor hooks; by storage, deduplicated; split into the
linear layers' activations and weights and the rest); the flops of forward, backward and the
subspace refresh (FlopCounterMode, QR by formula); and, for WASI, the wall-clock time of a
training step and of an inference forward against its dense twin (the same W), interleaved in
one process. The claims, headline first: the whole step's peak memory below vanilla's; the
linear layers' saved bytes at least 10x below (the paper's accounting); test accuracy within 1
point of vanilla; fewer step flops; faster training and inference steps (machine-dependent).

The paper's setting is a config away: `data_path` reads CIFAR-10 (a `datasets` save_to_disk
folder) or any image folder through Hugging Face `datasets`, and `model` fine-tunes a transformers
ViT loaded by `from_pretrained` (ViT-B/32 in `sweeps/repro/wasi_real.py`) instead of the local one.
"""

from workloads.wasi.claims import CHECKS, CLAIMS, plot
from workloads.wasi.workload import MAX_WORKERS, Config, preflight, smoke, train, validate

__all__ = ["CHECKS", "CLAIMS", "MAX_WORKERS", "Config", "plot", "preflight", "smoke", "train", "validate"]
