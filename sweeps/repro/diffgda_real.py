"""diffgda on the papers' graph-transfer tasks: node classification from a labelled source graph
to an unlabelled target graph, the GCN trained on the source alone (source-only), with a
gradient-reversal domain classifier on its embeddings (DANN, the adversarial GDA baseline), with
MMD^2 between source and target embeddings in its loss (DAN-style, the moment-matching GDA
baseline), and on the source plus source subgraphs evolved towards the target by the guided SDE
(DiffGDA), scored by Macro-F1 (the objective) and Micro-F1 over every target node. (The smoke's
third baseline, a discrete path of intermediate graphs, pairs small graphs node by node and runs
on the generated domains only.)

The tasks are the paper's citation transfers between ACMv9, Citationv1 and DBLPv7 (all six
directions) and Blog1 <-> Blog2. ladder downloads nothing: fetch the .mat files once, where the
internet is reachable (docs/datasets.md, diffgda), into one folder:

    https://github.com/shenxiaocam/ACDNE   ACDNE_codes/input/{acmv9,citationv1,dblpv7,Blog1,Blog2}.mat
    $LADDER_DATA/gda/<domain>.mat

`$LADDER_DATA` defaults to `./data` of the folder the sweep starts in; `ladder sweep
sweeps/repro/diffgda_real.py --check` says what is missing. The paper's Airport tasks (a text
format) are not read yet. Sizes: the released code's GCN (3 layers, dropout 0.2, lr 1e-3, 150
epochs, MMD weight 0.05 beside the evolution), feature projection to 100 dimensions and 50
reverse steps; the diffusion runs on 128 breadth-first subgraphs of 64 nodes of each graph (the
released code densifies one larger subgraph: ours, to keep the dense score network's node pairs
small), guidance scale 1 (the synthetic reproduction's label-free choice at full size); five seeds.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.sweep import Sweep, data_root, seeds

# Absolute: trials run in folders of their own (on a cluster the folder must be shared storage).
DATA_DIR = Path(data_root() / "gda").resolve()
TASKS = (
    ("acmv9", "dblpv7"), ("dblpv7", "acmv9"), ("acmv9", "citationv1"), ("citationv1", "acmv9"),
    ("citationv1", "dblpv7"), ("dblpv7", "citationv1"), ("Blog1", "Blog2"), ("Blog2", "Blog1"),
)
"""(source, target) file stems of DATA_DIR."""
ARMS = (
    {"mode": "source_only", "select_by": "source"},
    {"mode": "dann", "select_by": "source", "dann_weight": 1.0},
    {"mode": "mmd", "select_by": "source", "mmd_weight": 1.0},
    {"mode": "evolve", "guidance_scale": 1.0, "mmd_weight": 0.05, "select_by": "evolved"},
)
REAL = {
    "data_dir": str(DATA_DIR), "dim": 100, "nodes": 64, "source_graphs": 128, "target_graphs": 128,
    "source_val_frac": 0.1, "sample_steps": 50, "gcn_layers": 3, "gcn_hidden": 128, "gcn_dropout": 0.2,
    "gcn_lr": 1e-3, "gcn_epochs": 150, "log_every": 50, "checkpoint_every": 500, "threads": 4,
}
"""The overrides every trial shares (the tests run the same loader on tiny files)."""

sweep = Sweep(
    name="diffgda_real",
    workload="diffgda",
    base="default",
    overrides=REAL,
    points=tuple({"source": s, "target": t, **arm} for s, t in TASKS for arm in ARMS),
    space={"seed": seeds(5)},
    scheduler="fifo",
    objective=("eval/target_macro_f1", "max"),
    cpus_per_worker=4,
)
