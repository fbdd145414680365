"""Training throughput under Ray Train (1 worker) against calling `train()` in-process.

Both runs use the same config and the same CPU budget (the in-process run's torch threads equal
the Ray worker's CPU reservation). Throughput "after start-up" is tokens over wall time between
the report at `--skip` of training and the last report, from the timestamps MLflow recorded, so
Ray's cluster and worker start-up are excluded and everything inside the loop (reporting,
checkpointing, Ray round trips) is included. Start-up is printed separately.

    python benchmarks/overhead.py [--cpus 2] [--set width=64 ...]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch

from orchestrator.runners import launch, registry
from orchestrator.tracking import sink as tracking
from orchestrator.runners.config import apply_overrides, parse_sets

DEFAULT_SET = ["width=64", "depth=3", "head_dim=16", "seq_len=128", "batch_size=32", "tpp=8", "base_depth=3",
               "max_bytes=4000000", "log_every=10"]


def steady_throughput(run_id: str, uri: str, skip: float) -> tuple[float, float]:
    """(tokens/s between progress `skip` and the end, seconds from run start to the first report)."""
    c = tracking.client(uri)
    tokens = {m.step: (m.timestamp, m.value) for m in c.get_metric_history(run_id, "tokens")}
    progress = {m.step: m.value for m in c.get_metric_history(run_id, "progress")}
    steps = sorted(tokens)
    start = next(s for s in steps if progress[s] >= skip)
    (t0, k0), (t1, k1) = tokens[start], tokens[steps[-1]]
    first = tokens[steps[0]][0]
    run_start = c.get_run(run_id).info.start_time
    return (k1 - k0) / max((t1 - t0) / 1000, 1e-9), (first - run_start) / 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpus", type=float, default=min(2.0, launch.local_cpus()), help="CPUs for each run")
    parser.add_argument("--skip", type=float, default=0.2, help="training fraction treated as start-up")
    parser.add_argument("--set", nargs="+", default=DEFAULT_SET, help="celerity_lm config overrides")
    args = parser.parse_args()

    workdir = tempfile.mkdtemp(prefix="ladder-overhead-")
    os.chdir(workdir)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    cfg = apply_overrides(registry.load("celerity_lm").smoke(), parse_sets(args.set))

    torch.set_num_threads(max(1, int(args.cpus)))
    t = time.monotonic()
    local = launch.run_local("celerity_lm", cfg, progress=False)
    local_wall = time.monotonic() - t
    t = time.monotonic()
    ray_run = launch.run_ray("celerity_lm", cfg, workers=1, cpus_per_worker=args.cpus, progress=False)
    ray_wall = time.monotonic() - t

    local_tps, local_start = steady_throughput(local.mlflow_run_id, local.tracking_uri, args.skip)
    ray_tps, ray_start = steady_throughput(ray_run.mlflow_run_id, ray_run.tracking_uri, args.skip)
    print(f"config: {' '.join(args.set)}  ({args.cpus:g} CPUs each)")
    print(f"{'':<22}{'in-process':>12}{'Ray Train x1':>14}")
    print(f"{'tokens/s after start':<22}{local_tps:>12.0f}{ray_tps:>14.0f}")
    print(f"{'start-up to 1st report':<22}{local_start:>11.1f}s{ray_start:>13.1f}s")
    print(f"{'wall clock':<22}{local_wall:>11.1f}s{ray_wall:>13.1f}s")
    ratio = ray_tps / local_tps
    print(f"throughput ratio (Ray Train / in-process) after start-up: {ratio:.3f}  (target >= 0.9)")
    return 0 if ratio >= 0.9 else 1


if __name__ == "__main__":
    sys.exit(main())
