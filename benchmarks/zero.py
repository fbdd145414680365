"""Per-step cost of DeepSpeed ZeRO against plain DDP: celerity_lm's model on 2 gloo workers.

The same model, data and AdamW as `celerity_lm`, trained for a fixed number of steps after a
warm-up, once with DDP and once per ZeRO setting (the engine `run.prepare` builds, from
`orchestrator.runners.zero`). Prints the median step time and its ratio to DDP's, measured in the same
run. On a CPU this measures DeepSpeed's bookkeeping and collectives (every ZeRO-3 parameter is
gathered and released around each use), not memory savings, which need a GPU to matter.

    .venv/bin/python benchmarks/zero.py [--width 128] [--steps 30]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SETTINGS = [
    ("DDP", {}),
    ("ZeRO-1", {"zero_stage": 1}),
    ("ZeRO-2", {"zero_stage": 2}),
    ("ZeRO-3", {"zero_stage": 3}),
    ("ZeRO-2 + optimizer offload", {"zero_stage": 2, "offload_optimizer": True}),
    ("ZeRO-3 + optimizer and parameter offload", {"zero_stage": 3, "offload_optimizer": True, "offload_params": True}),
]


def _worker(rank: int, world: int, port: int, args: argparse.Namespace, changes: dict, out: Path) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from orchestrator.runners import zero
    from workloads import celerity_lm
    from components.lm.corpus import BatchSampler, load_corpus

    cfg = dataclasses.replace(celerity_lm.smoke(), width=args.width, head_dim=16, depth=args.depth,
                              seq_len=args.seq_len, batch_size=args.batch, **changes)
    torch.manual_seed(0)
    model, optimizer, _ = celerity_lm.build(cfg)
    spec = zero.spec_of(cfg)
    if spec.enabled:
        model, optimizer = zero.build_engine(model, optimizer, spec, torch.device("cpu"))
    else:
        model = torch.nn.parallel.DistributedDataParallel(model)
    train, _ = load_corpus("stdlib", heldout_frac=0.1, max_bytes=2_000_000)
    sampler = BatchSampler(train, cfg.seq_len, cfg.batch_size // world, seed=0, rank=rank)
    times = []
    for step in range(args.warmup + args.steps):
        x, y = sampler.next()
        dist.barrier()
        t = time.perf_counter()
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if not spec.enabled:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        dist.barrier()
        if step >= args.warmup:
            times.append(time.perf_counter() - t)
    if rank == 0:
        params = sum(p.numel() for p in celerity_lm.build(cfg)[0].parameters())
        out.write_text(f"{statistics.median(times)} {params}")
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2, help="passes over all settings; the fastest counts")
    args = parser.parse_args()
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    best: dict[str, float] = {}
    # Rounds pass over every setting in turn, so a slow spell on a shared machine hits all of them.
    for r in range(args.rounds):
        for i, (name, changes) in enumerate(SETTINGS):
            out = Path(f".zero-bench-{os.getpid()}-{i}")
            mp.spawn(_worker, args=(2, 29400 + i, args, changes, out), nprocs=2, join=True)
            seconds, params = out.read_text().split()
            out.unlink()
            best[name] = min(best.get(name, float("inf")), float(seconds))
            print(f"round {r + 1}: {name:<42} {1000 * float(seconds):8.1f} ms/step", flush=True)
    base = best["DDP"]
    print(f"\n{int(params):,} parameters, 2 gloo workers, batch {args.batch} x {args.seq_len} tokens, "
          f"median of {args.steps} steps, fastest of {args.rounds} rounds")
    print(f"{'setting':<42} {'ms/step':>8} {'x DDP':>7}")
    for name, seconds in best.items():
        print(f"{name:<42} {1000 * seconds:8.1f} {seconds / base:7.2f}")


if __name__ == "__main__":
    main()
