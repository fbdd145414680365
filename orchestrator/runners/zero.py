"""ZeRO through `run.prepare`: a DeepSpeed engine for a workload whose config asks for one.

A workload asks for ZeRO with optional `Config` fields, read here by name; a workload without
`zero_stage` never gets an engine, and the other names are read only when it has that one:

- `zero_stage: int` — 0 is plain DDP; 1, 2, 3 shard optimizer state, then gradients, then
  parameters over the Ray Train workers (DeepSpeed ZeRO);
- `offload_optimizer: bool` — optimizer state and its update on the CPU (stages 1-3);
- `offload_params: bool` — parameters on the CPU between uses (stage 3 only);
- `precision: str` — `'fp32'`, or `'bf16'` (bf16 weights and compute, fp32 master copy) on GPU
  workers;
- `grad_clip: float` — the global gradient-norm clip; under ZeRO the engine applies it, because
  the gradients it clips are sharded and `torch.nn.utils.clip_grad_norm_` would see none.

Under ZeRO, `run.prepare(model, optimizer)` returns the engine (called like the module; the
module is `engine.module`) and an `EngineOptimizer` whose `param_groups`, `zero_grad()` and
`step()` are the engine's, so the loop's `loss.backward(); optimizer.step()` is unchanged
(DeepSpeed hooks the engine's outputs, so a plain `loss.backward()` runs its backward). The
workload's own torch optimizer and its learning-rate schedule (written into `param_groups`)
are kept, not replaced by DeepSpeed's. Model and optimizer state are sharded, so the Run saves
and loads them with the engine's own `save_checkpoint` / `load_checkpoint` (every rank its
shard), next to the workload's state dict (step, data position), which the workload saves
without them.

On CPU the engine runs on DeepSpeed's CPU accelerator over gloo; nothing is compiled: the
optimizer is the workload's torch optimizer (no fused or CPU Adam), and the shared-memory
collective DeepSpeed would JIT-build at start-up (used only by inference all-reduce) is skipped.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import warnings
from pathlib import Path
from typing import Any

PRECISIONS = ("fp32", "bf16")
ENGINE_FOLDER = "deepspeed"  # inside a checkpoint folder, next to the ladder state file


@dataclasses.dataclass(frozen=True)
class ZeroSpec:
    """What a config asks of `run.prepare`; invalid combinations raise ValueError naming the fix."""

    stage: int = 0
    offload_optimizer: bool = False
    offload_params: bool = False
    precision: str = "fp32"
    grad_clip: float = 0.0

    def __post_init__(self) -> None:
        if self.stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_stage must be 0 (plain DDP), 1, 2 or 3, got {self.stage}")
        if self.offload_optimizer and self.stage == 0:
            raise ValueError("offload_optimizer needs ZeRO: set zero_stage=1, 2 or 3, or offload_optimizer=False")
        if self.offload_params and self.stage != 3:
            raise ValueError(
                f"offload_params needs ZeRO-3 (only stage 3 partitions parameters), got zero_stage={self.stage}: "
                "set zero_stage=3, or offload_params=False"
            )
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(map(repr, PRECISIONS))}, got {self.precision!r}")
        if self.precision == "bf16" and self.stage == 0:
            raise ValueError("precision='bf16' is applied by the DeepSpeed engine: set zero_stage=1, 2 or 3 "
                             "(plain DDP trains in fp32), or precision='fp32'")
        if self.grad_clip < 0:
            raise ValueError(f"grad_clip must be >= 0 (0 disables it), got {self.grad_clip}")

    @property
    def enabled(self) -> bool:
        return self.stage > 0


def spec_of(cfg: Any) -> ZeroSpec:
    """The ZeRO request of a workload config. A config without `zero_stage` asks for nothing, and
    its other fields of these names (another workload's `precision`) are its own business."""
    if not hasattr(cfg, "zero_stage"):
        return ZeroSpec()
    return ZeroSpec(
        stage=int(getattr(cfg, "zero_stage", 0)),
        offload_optimizer=bool(getattr(cfg, "offload_optimizer", False)),
        offload_params=bool(getattr(cfg, "offload_params", False)),
        precision=str(getattr(cfg, "precision", "fp32")),
        grad_clip=float(getattr(cfg, "grad_clip", 0.0) or 0.0),
    )


def check(cfg: Any, *, gpus: bool = False) -> ZeroSpec:
    """Pre-launch check of a config's ZeRO request for workers with (`gpus`) or without GPUs.

    bf16 is refused on CPU workers: DeepSpeed's CPU accelerator would run it, but slowly and with a
    numerics story nobody asked for.
    """
    spec = spec_of(cfg)
    if spec.precision == "bf16" and not gpus:
        raise ValueError("precision='bf16' needs GPU workers, and these Ray Train workers are CPU-only: "
                         "use precision='fp32', or GPU workers (ladder run --gpus-per-worker 1; gpus_per_worker "
                         "in a sweep)")
    return spec


def check_in_process(cfg: Any) -> None:
    """Refuse ZeRO for a run that trains in this process (no worker group, so no engine)."""
    from orchestrator.runners.config import ConfigError

    spec = spec_of(cfg)
    if spec.enabled:
        raise ConfigError(f"zero_stage={spec.stage} runs under Ray Train (one DeepSpeed engine per worker): drop "
                         "--local; one worker is fine (--workers 1)")


def check_resume_workers(cfg: Any, recorded: int | None, workers: int) -> None:
    """A ZeRO run resumes on the worker count it was partitioned for (DeepSpeed cannot re-shard
    ZeRO state to another count)."""
    from orchestrator.runners.config import ConfigError

    spec = spec_of(cfg)
    if spec.enabled and recorded is not None and int(recorded) != workers:
        raise ConfigError(f"this run trained with ZeRO-{spec.stage} on {recorded} workers and its optimizer state is "
                          f"sharded {recorded} ways: resume it with --workers {recorded}")


def ds_config(spec: ZeroSpec, *, on_gpu: bool) -> dict[str, Any]:
    """The DeepSpeed config for `spec` (the loop owns batching, the LR schedule and the optimizer)."""
    zero: dict[str, Any] = {
        "stage": spec.stage,
        # Partition every parameter: DeepSpeed's default keeps those under 1e5 elements whole on
        # every rank, which at small sizes is all of them and would make stage 3 a stage 2.
        "stage3_param_persistence_threshold": 0,
    }
    if spec.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": on_gpu}
    if spec.offload_params:
        zero["offload_param"] = {"device": "cpu", "pin_memory": on_gpu}
    return {
        # One micro-batch per step: the loop splits its batch over workers itself; DeepSpeed
        # uses these only for its throughput log.
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": spec.grad_clip,
        "zero_optimization": zero,
        "bf16": {"enabled": spec.precision == "bf16"},
        # Offloaded state is updated by the workload's torch optimizer, not DeepSpeed's CPU Adam
        # (a C++ build at first use).
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }


class EngineOptimizer:
    """What a loop holds as its optimizer when `run.prepare` built a DeepSpeed engine.

    `param_groups` are the workload optimizer's own groups (DeepSpeed swaps in its fp32 shards
    as their params), so an LR schedule written there is the one the update uses. `step()` is
    the engine's step: clip at `grad_clip`, update the shards, clear the gradients.
    """

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.engine.optimizer.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.engine.zero_grad()

    def step(self, closure: Any = None) -> None:
        if closure is not None:
            raise ValueError("a DeepSpeed engine's step takes no closure")
        self.engine.step()

    def state_dict(self) -> dict[str, Any]:
        raise RuntimeError("under ZeRO the optimizer state is sharded over the workers: leave it out of the state "
                           "passed to run.save, which saves the engine's shards itself")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise RuntimeError("under ZeRO, run.restore() loads the engine's sharded optimizer state itself")


def _import_deepspeed(device_type: str) -> Any:
    # The accelerator is chosen at import; naming it skips DeepSpeed's probe and its warning.
    os.environ.setdefault("DS_ACCELERATOR", "cpu" if device_type == "cpu" else "cuda")
    import deepspeed

    for name in ("DeepSpeed", "deepspeed"):
        logging.getLogger(name).setLevel(logging.WARNING)
    deepspeed.utils.logger.setLevel(logging.WARNING)
    # DeepSpeed's collectives use these torch names; the deprecation is theirs to act on, and
    # would otherwise repeat in every worker's log.
    warnings.filterwarnings("ignore", category=FutureWarning,
                            message=r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated")
    return deepspeed


def build_engine(model: Any, optimizer: Any, spec: ZeroSpec, device: Any) -> tuple[Any, EngineOptimizer]:
    """`deepspeed.initialize` over the already-initialized process group (gloo on CPU)."""
    on_gpu = getattr(device, "type", str(device)) == "cuda"
    if spec.precision == "bf16" and not on_gpu:
        raise RuntimeError(f"precision='bf16' needs a GPU worker, this one trains on {device}: use precision='fp32'")
    deepspeed = _import_deepspeed("cuda" if on_gpu else "cpu")
    if not on_gpu:
        # The shared-memory collective serves only inference all-reduce; building it is a
        # ~40 s C++ compile on a 2-core machine at every fresh start.
        import deepspeed.ops

        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config(spec, on_gpu=on_gpu))
    _load_weights_only(engine)
    return engine, EngineOptimizer(engine)


# The only non-tensor classes DeepSpeed's ZeRO checkpoints hold (stages 1-3, fp32 and bf16, with
# and without offload, DeepSpeed 0.19): plain data, safe to rebuild.
def _safe_classes() -> list[Any]:
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, ZeroStageEnum, fragment_address]


def _load_weights_only(engine: Any) -> None:
    """Make the engine read its checkpoint files with `torch.load(weights_only=True)`.

    DeepSpeed's own loader unpickles anything (`weights_only=False`); every file it reads while
    loading a ZeRO checkpoint goes through `engine.checkpoint_engine.load`, so that one method
    is replaced by a weights-only load that admits DeepSpeed's few plain data classes.
    """
    import torch

    from orchestrator.run.checkpoints import CheckpointError

    classes = _safe_classes()

    def load(path: str, map_location: Any = None) -> Any:
        try:
            with torch.serialization.safe_globals(classes):
                return torch.load(path, map_location=map_location, weights_only=True)
        except pickle.UnpicklingError as exc:
            raise CheckpointError(
                f"DeepSpeed checkpoint file {path} holds objects other than tensors and DeepSpeed's plain "
                f"state classes, and ladder does not unpickle arbitrary objects ({str(exc).splitlines()[0]})"
            ) from exc
        except Exception as exc:
            raise CheckpointError(f"DeepSpeed checkpoint file {path} is unreadable ({type(exc).__name__}: {exc})") from exc

    engine.checkpoint_engine.load = load


def tag_of(step: int) -> str:
    return f"step-{int(step):09d}"


def save_engine(engine: Any, folder: str | os.PathLike, step: int) -> None:
    """Every rank writes its shard of model and optimizer state under `folder/deepspeed/<tag>`."""
    engine.save_checkpoint(str(Path(folder) / ENGINE_FOLDER), tag=tag_of(step), save_latest=False)


def load_engine(engine: Any, folder: str | os.PathLike, step: int) -> None:
    """Load the shards saved with the ladder state of `step` (every rank reads what it needs)."""
    from orchestrator.run.checkpoints import CheckpointError

    root = Path(folder) / ENGINE_FOLDER
    if not (root / tag_of(step)).is_dir():
        raise CheckpointError(
            f"checkpoint {folder} holds the state of step {step} but no DeepSpeed shards for it ({ENGINE_FOLDER}/"
            f"{tag_of(step)}): it was not written by a ZeRO run"
        )
    path, _ = engine.load_checkpoint(str(root), tag=tag_of(step), load_optimizer_states=True,
                                     load_lr_scheduler_states=False)
    if path is None:
        raise CheckpointError(f"DeepSpeed found no loadable checkpoint {tag_of(step)} in {root}")

