"""DiffGDA: Learning Structure-Semantic Evolution Trajectories for Graph Domain Adaptation (ICLR 2026) — https://arxiv.org/abs/2602.10506

diffgda: graph domain adaptation by a score-based diffusion over node features X and dense
adjacency A jointly (a system of SDEs, GDSS-style: VP for X, VE for A), trained on the labelled
source graphs with the labels as a condition that every step carries along. A time-dependent
source-vs-target domain network gives the density-ratio guidance grad log p_target,t / p_source,t,
added at `guidance_scale` to the learned score in the reverse SDE, so that source graphs evolve
into graphs of the target domain that keep their labels. A GCN node classifier is then trained on
the source plus the evolved graphs and scored by Macro-F1 on the target graphs.

Data: contextual stochastic block model graphs generated here, with a feature shift (class means
moved) and a homophily shift (p_in, p_out) between the domains. Model selection never reads a
target label (`adapt` receives the target as `Unlabelled` graphs; `evaluate` is the only reader):
the GCN's epoch is chosen on held-out evolved graphs by default.

The papers' own tasks (`data_dir`, `source`, `target`): two whole attributed graphs read from the
published .mat files (networks.py; ACMv9/Citationv1/DBLPv7, Blog1/Blog2), the GCN on each whole
graph through a sparse adjacency, the diffusion on breadth-first subgraphs cut from them;
`sweeps/repro/diffgda_real.py` runs them.

Graph domain adaptation baselines at the same GCN: DANN (`mode="dann"`, a gradient-reversal domain
classifier on the node embeddings), an MMD-aligned GCN (`mode="mmd"`, DAN-style), and, on the
generated domains, a discrete path of intermediate graphs mixed from source and target at fixed
ratios (`mode="gradual"`, GIFT-style), the kind of discrete path the paper's continuous SDE
trajectory replaces.

The claims, headline first: the GCN trained on the guided evolution beats the best of the GDA
baselines in target Macro-F1; guided evolution lands closer to the target domain than unguided
evolution (MMD of node descriptors, and a fresh domain classifier's accuracy); and it beats the
source-only GCN in target Macro-F1.
"""

from workloads.diffgda.claims import CHECKS, CLAIMS, plot
from workloads.diffgda.workload import MAX_WORKERS, Config, preflight, smoke, train, validate

__all__ = ["CHECKS", "CLAIMS", "MAX_WORKERS", "Config", "plot", "preflight", "smoke", "train", "validate"]
