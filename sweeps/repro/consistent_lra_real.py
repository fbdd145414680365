"""Consistent Low-Rank Approximation on the paper's real matrices (App. G): the first rows of UCI
Rice (Cammeo and Osmancik) and UCI Skin Segmentation, standardised, and of SuiteSparse's
Landmark, streamed through the four algorithms at the paper's thresholds c = 1.1, 2 and 5 (eps =
c - 1), beside the Frequent Directions baseline (l = 2k). Offline, the smoke reproduction streams
scikit-learn's bundled UCI tables instead (`sweeps/repro/consistent_lra.py`).

The files are not downloaded by ladder: fetch them once (docs/datasets.md says where) into the
folder `$LADDER_DATA` (default `./data` of the folder the sweep starts in):

    Rice_Cammeo_Osmancik.arff   Skin_NonSkin.txt   landmark.mtx

`ladder sweep sweeps/repro/consistent_lra_real.py --check` says which are missing. The ranks k are
ours (the paper's appendix, as summarised, gives k = 25 for Landmark only). Landmark has 2,704
columns: every row costs a few 2,704 x 2,704 eigendecompositions, hours per arm on one CPU core.
"""

from __future__ import annotations

from orchestrator.sweep import Sweep, data_root, seeds

# Absolute: trials run in folders of their own (on a cluster the folder must be shared storage).
DATA = data_root()

STREAMS = (
    {"data_path": str(DATA / "Rice_Cammeo_Osmancik.arff"), "n": 3000, "k": 2, "standardize": True},
    {"data_path": str(DATA / "Rice_Cammeo_Osmancik.arff"), "n": 3000, "k": 5, "standardize": True},
    {"data_path": str(DATA / "Skin_NonSkin.txt"), "columns": "0,1,2", "n": 3000, "k": 1, "standardize": True},
    {"data_path": str(DATA / "Skin_NonSkin.txt"), "columns": "0,1,2", "n": 3000, "k": 2, "standardize": True},
    {"data_path": str(DATA / "landmark.mtx"), "n": 5000, "k": 25},
)
ARMS = ([{"algorithm": "every"}, {"algorithm": "fd"}]
        + [{"algorithm": a, "eps": e} for a in ("additive", "multiplicative", "heavy_light") for e in (0.1, 1.0)]
        + [{"algorithm": "additive", "eps": 4.0}])

sweep = Sweep(
    name="consistent_lra_real",
    workload="consistent_lra",
    base="default",
    overrides={"stream": "file", "d": 0, "log_every": 100, "checkpoint_every": 1000},
    points=tuple({**stream, **arm} for stream in STREAMS for arm in ARMS),
    space={"seed": seeds(3)},  # the sampling coins of the leverage-score sketch
    scheduler="fifo",
    objective=("eval/recourse", "min"),
)
