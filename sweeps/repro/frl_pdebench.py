"""Breaking Scale Anchoring on PDEBench's data: each backbone (FNO, CNN and Galerkin Transformer, width 32, 4 blocks)
trained at one resolution and evaluated zero-shot at 2x and 4x, as a baseline and with FRL, on
PDEBench's 1-D Burgers (nu = 0.01, 1,024 points: trained at 256) and on the vorticity of its
periodic 2-D compressible flow (128^2: trained at 32^2).

ladder does not download the files: fetch them once from PDEBench's DaRUS repository
(docs/datasets.md) into `$LADDER_DATA` (default `./data` of the folder the sweep starts in):

    1D_Burgers_Sols_Nu0.01.hdf5
    2D_CFD_Rand_M0.1_Eta0.01_Zeta0.01_periodic_128_Train.hdf5

`ladder sweep sweeps/repro/frl_pdebench.py --check` says which are missing. Times are the files'
own: Burgers is stored every 0.01 up to 2, the 2-D flow every 0.05 up to 1. The pseudo-spectral
solver control of the generated-data reproduction is not run on files (their PDE is their own).
"""

from __future__ import annotations

from orchestrator.sweep import Sweep, data_root, seeds

# Absolute: trials run in folders of their own (on a cluster the folder must be shared storage).
DATA = data_root()

FRL = {"frl": True, "multires_levels": 2, "spectral_weight": 0.1, "cross_scale_weight": 0.1}
BASELINE = {"frl": False, "multires_levels": 0, "spectral_weight": 0.0, "cross_scale_weight": 0.0}
BURGERS = {"pde": "burgers", "data_path": str(DATA / "1D_Burgers_Sols_Nu0.01.hdf5"), "data_field": "tensor",
           "ref_n": 1024, "rho0": 256, "modes": 128, "t_starts": (0.2, 0.4, 0.6, 0.8, 1.0), "lag": 0.5}
FLOW_2D = {"pde": "navier_stokes", "data_field": "vorticity", "ref_n": 128, "rho0": 32, "modes": 16,
           "data_path": str(DATA / "2D_CFD_Rand_M0.1_Eta0.01_Zeta0.01_periodic_128_Train.hdf5"),
           "t_starts": (0.2, 0.3, 0.4, 0.5), "lag": 0.25, "batch_size": 16, "eval_batch": 10}

sweep = Sweep(
    name="frl_pdebench",
    workload="frl",
    base="default",
    overrides={"width": 32, "depth": 4, "n_train": 1000, "n_test": 200},
    points=tuple({**data, "backbone": backbone, **variant}
                 for data in (BURGERS, FLOW_2D) for backbone in ("fno", "cnn", "transformer") for variant in (BASELINE, FRL)),
    space={"seed": seeds(3)},
    scheduler="fifo",
    objective=("eval/rel_l2/x4", "min"),
)
