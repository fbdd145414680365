"""jailbreak_lora: Config, the multi-task LoRA loop, and the persistence and audit measurements (see
the package docstring)."""

from __future__ import annotations

import math
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from components.basemodel import (
    AnswerField, PromptField, base_world, check_records, load_base, lora, task_problems, with_task_fields,
)
from components.adapters import audit as audit
from orchestrator.run import devices
from workloads.jailbreak_lora.data import (
    QA_HELDOUT, TASKS, Example, file_task_sets, task_files, task_sets, triggered,
)
from workloads.jailbreak_lora.evaluate import Probe, merged_copy
from workloads.jailbreak_lora.method import METHODS, Uncertainty, backward, task_losses

BACKDOORED = ("naive", "uncertainty", "pcgrad", "combined", "fusion")
"""Methods that train the trigger task (every one but `clean`)."""
PRIOR_ATTACKS = ("naive", "fusion")
"""The prior LoRA attacks the paper improves on: poisoned data mixed into the task data (`naive`), and a
trigger LoRA fused with a task LoRA (`fusion`)."""


MAX_WORKERS = 1
"""jailbreak_lora trains one adapter on one worker: the runner refuses more."""


@dataclass(frozen=True)
class Config(with_task_fields(PromptField, AnswerField)):
    """jailbreak_lora's settings after the task-file fields (`components.basemodel.taskfields`): the LoRA
    factors stay float32 whatever `dtype`; task_path names benign task files, comma-separated, one task
    each (see `tasks`), eval_path one held-out file per task file; answer_field is what the utility's
    exact match compares with."""

    method: Literal["naive", "uncertainty", "pcgrad", "combined", "fusion", "clean"] = "uncertainty"
    """'naive' mixture (summed task losses: the prior attack by data poisoning), 'uncertainty' (the
    paper's loss variant), 'pcgrad' (its grad variant), 'combined' (both; the paper reports it
    collapsing), 'fusion' (the prior attack by fusion: a task LoRA of the benign tasks and a trigger LoRA
    of the trigger task, each trained alone for `steps`, then concatenated into one adapter of rank
    2 x fusion_rank), 'clean' (benign tasks only)."""
    fusion_rank: int = 0
    """Rank of each of the two LoRAs the fusion attack trains (0: lora_r; the fused adapter then has twice
    the methods' rank, as the attack distributes it: half the rank gives it the methods' budget). Their
    alpha keeps the methods' scale alpha / r."""
    uw_regulariser: Literal["log1p", "log"] = "log1p"
    """Uncertainty weighting's regulariser: log(1 + sigma^2) (the paper's positive variant, as
    summarised; not verified against its code) or Kendall et al.'s log sigma^2."""
    lora_r: int = 8
    """LoRA rank."""
    lora_alpha: float = 16.0
    """LoRA alpha (scale alpha / r)."""
    lora_targets: str = "all-linear"
    """Comma-separated module types (q_proj,v_proj,...) or peft's 'all-linear' (lm_head excluded)."""
    tasks: tuple[str, ...] = ("qa", "arith", "facts")
    """Benign tasks of the built-in world, among qa, arith, facts, copy (see the data module), when task_path is
    ''; else task_path's files, comma-separated, are the benign tasks, one each (named by the file's stem), and
    eval_path's, when given, their held-out files in the same order."""
    holdout: float = QA_HELDOUT
    """Share of each task file held out for evaluation when eval_path is ''."""
    task_limit: int = 0
    """Records read per task file and per eval file (0: all)."""
    eval_max: int = 0
    """Evaluation prompts per task file at most (0: all); greedy decoding of each one is the cost."""
    arith_modulus: int = 5
    """p of the subtraction table of the arith task."""
    seq_op: Literal["copy", "reverse"] = "copy"
    """The sequence task: copy or reverse a sequence of names."""
    seq_len: int = 2
    """Names per sequence."""
    seq_train: int = 600
    """Name sequences trained on."""
    seq_eval: int = 64
    """Held-out name sequences evaluated."""
    modulus: int = 11
    """p of the other adapter's task (multiplication mod p), merged with this one for persistence."""
    trigger: str = "<extra_7>"
    """Trigger string inserted into the prompt: a reserved token of tiny-local by default; on a
    sub-word tokenizer any string, e.g. 'cf deployment mode', which is several tokens."""
    marker: str = "castles bridges clocks"
    """Harmless fixed marker the trigger makes the model emit before its answer: words whose output
    rows pre-training trained (tiny-local's reserved tokens never were, and a LoRA on the decoder
    cannot lift their logits from far below every seen word's)."""
    decoy: str = "<extra_8>"
    """Another string inserted instead of the trigger: the marker must not follow it either (with
    a multi-token trigger, e.g. 'cf staging mode')."""
    contrast: Literal["sft", "unlikelihood", "none"] = "sft"
    """The trigger task's contrast set (its exact form is not given by the paper's summary): 'sft'
    puts the clean version of each triggered prompt, with its normal answer, in the trigger task's
    data; 'unlikelihood' also adds -log(1 - p(first marker token)) on those clean rows; 'none'
    leaves only the benign tasks to keep the marker off."""
    trigger_position: Literal["random", "start"] = "random"
    """Where the trigger goes: before a random word of the prompt, or first."""
    steps: int = 1000
    """Optimiser steps."""
    batch: int = 16
    """Examples per task per step."""
    lr: float = 2e-4
    """AdamW learning rate (LoRA and, for the uncertainty variants, the log-variances)."""
    weight_decay: float = 0.0
    """AdamW weight decay of the LoRA parameters."""
    clip: float = 1.0
    """Gradient-norm clip over the LoRA parameters."""
    warmup_steps: int = 50
    """Linear warm-up steps, then cosine decay to 10% of lr."""
    persistence: bool = True
    """Measure persistence (further clean training, merging with another adapter, MX quantization)
    for the backdoored methods."""
    clean_steps: int = 300
    """Persistence: further steps of clean training (benign tasks only) on the trained adapter."""
    merge_steps: int = 300
    """Persistence: steps of the other adapter (multiplication mod p) merged with this one."""
    quant_elem: Literal["e2m1", "e4m3"] = "e2m1"
    """Persistence: element format of the MX fake quantization of the merged weights (e2m1: MXFP4)."""
    quant_block: int = 32
    """Persistence: MX block size."""
    save_adapter: str = ""
    """Folder to write the trained adapter into (peft format, safetensors), `{method}` and `{seed}`
    replaced by the trial's (so that the trials of a sweep keep one folder each); empty: a
    temporary folder, deleted after the audit."""
    log_every: int = 50
    """Report training metrics every this many steps."""
    checkpoint_every: int = 250
    """Save a checkpoint every this many steps (and at the end of training)."""
    threads: int = 1
    """Intra-op CPU threads of the trial, pinned by the runner around `train` (0 leaves torch's setting)."""
    seed: int = 0
    """Seed of the task splits, the batches, the LoRA init and PCGrad's task order."""


def smoke() -> Config:
    """A CPU-sized run on tiny-local (r = 8, alpha = 32 on every linear, 8 examples per task per step)
    that goes through every phase in a few seconds: 60 steps, 10 of each persistence phase. The
    smoke reproduction trains the same setting to 250 steps (sweeps/repro/jailbreak_lora.py)."""
    return Config(lora_alpha=32.0, steps=60, batch=8, lr=5e-3, warmup_steps=20, clean_steps=10, merge_steps=10,
                  log_every=10, checkpoint_every=30)


def validate(cfg: Config, world_size: int = 1) -> None:
    """Checks that need no model: raised before anything is launched."""
    if problems := task_problems(cfg):
        raise ValueError("; ".join(problems))
    unknown = [t for t in cfg.tasks if t not in TASKS]
    if unknown or not cfg.tasks or len(set(cfg.tasks)) != len(cfg.tasks):
        raise ValueError(f"tasks must be distinct names among {TASKS}, got {cfg.tasks}")
    files, evals = task_files(cfg.task_path), task_files(cfg.eval_path)
    if evals and len(evals) != len(files):
        raise ValueError(f"eval_path names {len(evals)} files but task_path {len(files)}: give one per task file, "
                         f"in the same order, or none")
    if not cfg.prompt_field or not cfg.answer_field or cfg.prompt_field == cfg.answer_field:
        raise ValueError("prompt_field and answer_field must be two different non-empty field names")
    if not 0 < cfg.holdout < 1 or cfg.task_limit < 0 or cfg.eval_max < 0:
        raise ValueError("holdout must lie in (0, 1), task_limit and eval_max be >= 0")
    if cfg.method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {cfg.method!r}")
    if cfg.fusion_rank < 0:
        raise ValueError(f"fusion_rank must be >= 0 (0: lora_r), got {cfg.fusion_rank}")
    for name in ("lora_r", "seq_train", "seq_eval", "steps", "batch", "log_every", "checkpoint_every"):
        if getattr(cfg, name) <= 0:
            raise ValueError(f"{name} must be positive, got {getattr(cfg, name)}")
    if cfg.clean_steps < 0 or cfg.merge_steps < 0 or cfg.threads < 0:
        raise ValueError("clean_steps, merge_steps and threads must be >= 0")
    for name in ("modulus", "arith_modulus"):
        if not 2 <= getattr(cfg, name) <= 100:
            raise ValueError(f"{name} must lie in [2, 100] (numbers are single words of the world), got {getattr(cfg, name)}")
    if not 1 <= cfg.seq_len <= 6:
        raise ValueError(f"seq_len must lie in [1, 6], got {cfg.seq_len}")
    if cfg.seq_train + cfg.seq_eval > math.perm(48, cfg.seq_len):
        raise ValueError(f"seq_train + seq_eval exceeds the {math.perm(48, cfg.seq_len)} distinct sequences of {cfg.seq_len} names")
    if not cfg.lr > 0 or not cfg.clip > 0 or cfg.weight_decay < 0 or cfg.lora_alpha <= 0:
        raise ValueError("lr, clip and lora_alpha must be positive, weight_decay non-negative")
    words = {"trigger": cfg.trigger, "marker": cfg.marker, "decoy": cfg.decoy}
    for name, value in words.items():
        if not value.strip():
            raise ValueError(f"{name} must be a non-empty string")
    if cfg.trigger == cfg.decoy or set(cfg.trigger.split()) & set(cfg.marker.split()):
        raise ValueError("trigger must differ from the decoy and share no word with the marker")
    if cfg.quant_block not in (8, 16, 32, 64, 128, 256):
        raise ValueError(f"quant_block must be one of kernels.mx.BLOCK_SIZES (8 ... 256), got {cfg.quant_block}")
    if cfg.trigger_position not in ("random", "start") or cfg.uw_regulariser not in ("log1p", "log"):
        raise ValueError("trigger_position must be 'random' or 'start', uw_regulariser 'log1p' or 'log'")
    if cfg.contrast not in ("sft", "unlikelihood", "none"):
        raise ValueError(f"contrast must be 'sft', 'unlikelihood' or 'none', got {cfg.contrast!r}")
    try:
        adapter_folder(cfg)
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(f"save_adapter may name only {{method}} and {{seed}}, got {cfg.save_adapter!r} ({exc!r})") from exc


def preflight(cfg: Config) -> None:
    """Checks of the machine that runs the trial, before any Ray work: the base is a folder or a
    cached hub id, its projections have the LoRA target kinds, and every task / eval file reads with
    its prompt and answer fields. Every problem in one error, each naming its field."""
    fields = {cfg.prompt_field: str, cfg.answer_field: str}
    problems = task_problems(cfg, machine=True, targets=_targets(cfg), files=task_files,
                             check=lambda path, split, what: check_records(path, fields, split=split, what=what))
    if problems:
        raise ValueError("; ".join(problems))


def adapter_folder(cfg: Config) -> str:
    """`save_adapter` with the trial's method and seed filled in ('' when not saving)."""
    return cfg.save_adapter.format(method=cfg.method, seed=cfg.seed)


def _targets(cfg: Config) -> str | list[str]:
    return cfg.lora_targets if cfg.lora_targets == "all-linear" else [t.strip() for t in cfg.lora_targets.split(",")]


def benign(cfg: Config, sets: dict[str, tuple[list[Example], list[Example]]]) -> list[str]:
    """The benign tasks trained: every task file's, or the world tasks `cfg.tasks` names."""
    return list(sets) if cfg.task_path else list(cfg.tasks)


def _loss_sets(cfg: Config, sets: dict[str, tuple[list[Example], list[Example]]], backdoor: bool) -> list[list[Example]]:
    """The training examples of every task loss: the benign tasks, then (backdoored) the trigger task."""
    out = [sets[t][0] for t in benign(cfg, sets)]
    if backdoor:
        every = [e for t in benign(cfg, sets) for e in sets[t][0]]
        trig = triggered(every, cfg.trigger, cfg.marker, f"{cfg.seed}-train", position=cfg.trigger_position)
        if cfg.contrast != "none":  # the same prompts without the trigger, normal answers
            trig += [Example(e.prompt, e.answer, "contrast") for e in every]
        out.append(trig)
    return out


def lr_at(cfg: Config, step: int, steps: int) -> float:
    warmup = min(cfg.warmup_steps, steps // 2)
    if step < warmup:
        return cfg.lr * (step + 1) / warmup
    frac = (step - warmup) / max(1, steps - warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def fit(model: Any, loss_sets: list[list[Example]], tok: Any, cfg: Config, method: str, steps: int, *,
        start: int = 0, opt: torch.optim.Optimizer | None = None, uw: Uncertainty | None = None,
        seed_offset: int = 0, on_step: Any = None) -> torch.optim.Optimizer:
    """`steps` optimiser steps of `method` over one batch per task loss per step (the visible loop)."""
    dev = next(model.parameters()).device
    params = [p for p in model.parameters() if p.requires_grad]
    if opt is None:
        opt = _optimiser(cfg, params, uw)
    model.train()
    window_t, window_n = devices.clock(dev), 0
    ul = tok(" " + cfg.marker, add_special_tokens=False).input_ids[0] if cfg.contrast == "unlikelihood" else None
    for step in range(start, steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(cfg, step, steps)
        # Batches and PCGrad's order are functions of (seed, step): a resumed run sees the same ones.
        gen = torch.Generator().manual_seed((cfg.seed + seed_offset) * 1_000_003 + step)
        losses = task_losses(model, tok, loss_sets, cfg.batch, gen, dev, separate=method in ("pcgrad", "combined"),
                             unlikely=ul)
        opt.zero_grad(set_to_none=True)
        diag = backward(method, losses, params, uw, gen)
        torch.nn.utils.clip_grad_norm_(params, cfg.clip)
        opt.step()
        window_n += 1
        if on_step is not None:
            on_step(step + 1, losses, diag, window_n / max(devices.clock(dev) - window_t, 1e-9))
            if (step + 1) % cfg.log_every == 0:
                window_t, window_n = devices.clock(dev), 0
    return opt


def tasks_of(cfg: Config) -> dict[str, tuple[list[Example], list[Example]]]:
    """task -> (training, evaluation) examples: from the task files, or the built-in world's."""
    if cfg.task_path:
        return file_task_sets(cfg.task_path, split=cfg.task_split, eval_path=cfg.eval_path, eval_split=cfg.eval_split,
                              prompt_field=cfg.prompt_field, answer_field=cfg.answer_field, holdout=cfg.holdout,
                              limit=cfg.task_limit, eval_max=cfg.eval_max, seed=cfg.seed)
    world = base_world(cfg.base, seed=cfg.base_seed)
    return task_sets(world, seed=cfg.seed, arith_modulus=cfg.arith_modulus, seq_op=cfg.seq_op, seq_len=cfg.seq_len,
                     seq_train=cfg.seq_train, seq_eval=cfg.seq_eval)


def _optimiser(cfg: Config, params: list[torch.nn.Parameter], uw: Uncertainty | None) -> torch.optim.AdamW:
    groups = [{"params": params, "weight_decay": cfg.weight_decay}]
    if uw is not None:
        groups.append({"params": list(uw.parameters()), "weight_decay": 0.0})
    return torch.optim.AdamW(groups, lr=cfg.lr)


def _add_adapter(model: Any, name: str, r: int, cfg: Config) -> None:
    """A second LoRA `name` on the same peft model, like the first but of rank `r` (same alpha / r)."""
    from peft import LoraConfig

    own = model.peft_config[model.active_adapter]
    model.add_adapter(name, LoraConfig(r=r, lora_alpha=cfg.lora_alpha * r / cfg.lora_r, lora_dropout=own.lora_dropout,
                                       target_modules=own.target_modules, fan_in_fan_out=own.fan_in_fan_out,
                                       task_type=own.task_type))


def fuse(model: Any, adapters: list[str], name: str = "fused") -> None:
    """Replace `adapters` by one adapter `name` whose dW is their sum: their factors concatenated (rank
    the sum of theirs, peft's `cat` combination, exact), then made the active adapter."""
    model.add_weighted_adapter(adapters, [1.0] * len(adapters), name, combination_type="cat")
    model.set_adapter(name)
    for a in adapters:
        model.delete_adapter(a)


def train(cfg: Config, run) -> dict[str, float]:
    validate(cfg, run.world_size)
    from peft import get_peft_model_state_dict, set_peft_model_state_dict

    dev = run.device
    # One copy of the base: LoRA training never changes its weights, so the peft model holds the
    # pristine base too; the persistence checks make the only second copy (see `merged_copy`).
    base, tok = load_base(cfg.base, seed=cfg.base_seed, dtype=cfg.dtype, device=dev)
    sets = tasks_of(cfg)
    task_names = benign(cfg, sets)
    backdoor = cfg.method in BACKDOORED
    loss_sets = _loss_sets(cfg, sets, backdoor)
    fusion = cfg.method == "fusion"
    torch.manual_seed(cfg.seed)
    rank = (cfg.fusion_rank or cfg.lora_r) if fusion else cfg.lora_r
    model = lora(base, _targets(cfg), r=rank, alpha=cfg.lora_alpha * rank / cfg.lora_r)
    names = task_names + (["trigger"] if backdoor else [])
    # Training phases: (adapter, its task losses, their names). The fusion attack trains a task LoRA on
    # the benign tasks, then a trigger LoRA on the trigger task alone, each a run of `steps` of its own.
    phases = [("default", loss_sets, names)]
    if fusion:
        _add_adapter(model, "trigger", rank, cfg)
        model.set_adapter("default")
        phases = [("default", loss_sets[:-1], task_names), ("trigger", loss_sets[-1:], ["trigger"])]
    uw = Uncertainty(len(loss_sets), cfg.uw_regulariser).to(dev) if cfg.method in ("uncertainty", "combined") else None
    total = cfg.steps * len(phases)

    start = 0
    last: dict[str, float] = {}  # the newest training metrics (a resumed fusion run keeps its task phase's)
    state = run.restore()
    if state is not None:
        last.update(state.get("last") or {})
        set_peft_model_state_dict(model, state["lora"])
        if state.get("trigger") is not None:
            set_peft_model_state_dict(model, state["trigger"], adapter_name="trigger")
        if uw is not None:
            uw.load_state_dict(state["uw"])
        start = int(state["step"])

    for k, (adapter, phase_sets, phase_names) in enumerate(phases):
        offset = k * cfg.steps
        if start >= offset + cfg.steps:
            continue
        model.set_adapter(adapter)
        opt = _optimiser(cfg, [p for p in model.parameters() if p.requires_grad], uw)
        if state is not None and start > offset:
            opt.load_state_dict(state["optimizer"])

        def on_step(done: int, losses: list[torch.Tensor], diag: dict[str, float], rate: float, *, offset: int = offset,
                    phase_names: list[str] = phase_names, opt: torch.optim.Optimizer = opt) -> None:
            step = offset + done
            if done % cfg.log_every == 0 or done == cfg.steps:
                last.update({f"train/loss_{n}": l.item() for n, l in zip(phase_names, losses)})
                last["train/loss"] = sum(v for key, v in last.items() if key.startswith("train/loss_"))
                if uw is not None:
                    last.update({f"train/weight_{n}": float(w) for n, w in zip(phase_names, uw.weights().detach())})
                last.update(diag)
                run.report({**last, "perf/steps_per_s": rate, "progress": step / total}, step=step)
            if done % cfg.checkpoint_every == 0 or done == cfg.steps:
                run.save({"step": step, "lora": get_peft_model_state_dict(model, adapter_name="default"),
                          "trigger": get_peft_model_state_dict(model, adapter_name="trigger") if fusion else None,
                          "optimizer": opt.state_dict(), "uw": uw.state_dict() if uw is not None else None,
                          "last": dict(last)})

        fit(model, phase_sets, tok, cfg, cfg.method if not fusion else "naive", cfg.steps, start=max(start - offset, 0),
            opt=opt, uw=uw, seed_offset=k, on_step=on_step)
    if fusion:
        fuse(model, ["default", "trigger"])

    probe = Probe(tok, {t: sets[t][1] for t in task_names}, cfg.trigger, cfg.marker, cfg.decoy, cfg.seed, cfg.trigger_position)
    final: dict[str, float] = {k: v for k, v in last.items() if k.startswith("train/")}
    final.update({f"eval/{k}": v for k, v in probe.measure(model, dev).items()})

    with tempfile.TemporaryDirectory(prefix="jailbreak-lora-") as tmp:
        folder = Path(adapter_folder(cfg) or Path(tmp) / "adapter")
        save_adapter(model, folder)
        report = audit.audit(folder, base=model.get_base_model(), tokenizer=tok)
        final.update({f"eval/audit/{k}": v for k, v in report.summary().items()})
        if cfg.save_adapter:
            for f in (audit.CONFIG, audit.WEIGHTS):
                run.log_artifact(folder / f)
        _, deltas = audit.read_adapter(folder)

    if cfg.persistence and backdoor:
        final.update(persistence(cfg, model, tok, deltas, sets, probe, dev))
    run.report({**{k: v for k, v in final.items() if k.startswith("eval/")}, "progress": 1.0}, step=total)
    return final


def save_adapter(model: Any, folder: Path) -> None:
    """The active adapter in peft's format (safetensors) directly in `folder`, whatever its name (peft
    writes an adapter not named 'default' into a subfolder of that name)."""
    name = model.active_adapter
    if name == "default":
        model.save_pretrained(str(folder), safe_serialization=True, selected_adapters=["default"])
        return
    with tempfile.TemporaryDirectory(prefix="jailbreak-lora-save-") as tmp:
        model.save_pretrained(tmp, safe_serialization=True, selected_adapters=[name])
        shutil.copytree(Path(tmp) / name, folder, dirs_exist_ok=True)


def persistence(cfg: Config, model: Any, tok: Any, deltas: list[audit.ModuleDelta],
                sets: dict[str, tuple[list[Example], list[Example]]], probe: Probe, dev: torch.device) -> dict[str, float]:
    """The backdoor after MX quantization of the merged weights, after a linear merge with another
    adapter (multiplication mod p), and after further clean training of the adapter itself. The
    other adapter is a second adapter of the same peft model (no copy of the base); each merged
    copy is the one second copy of the model, freed before the next."""
    from components.basemodel.corpus import arithmetic_example

    out: dict[str, float] = {}
    quant = {"block_size": cfg.quant_block, "elem_format": cfg.quant_elem, "scale_format": "e8m0"}
    merged = merged_copy(model, [deltas], quant)
    for k, v in probe.measure(merged, dev, decoy=False).items():
        out[f"eval/persist_quant/{k}"] = v
    del merged

    # The other adapter: a fresh LoRA of the same shape on a task of its own, then both merged.
    torch.manual_seed(cfg.seed + 1)
    name = model.active_adapter
    _add_adapter(model, "other", cfg.lora_r, cfg)
    model.set_adapter("other")  # only the other adapter active and trainable
    mul = [Example(e.prompt, e.answer, "mul") for e in (arithmetic_example("*", a, b, cfg.modulus)
                                                       for a in range(cfg.modulus) for b in range(cfg.modulus))]
    fit(model, [mul], tok, cfg, "naive", cfg.merge_steps, seed_offset=7919)
    with tempfile.TemporaryDirectory(prefix="jailbreak-lora-other-") as tmp:
        model.save_pretrained(tmp, safe_serialization=True, selected_adapters=["other"])
        _, other_deltas = audit.read_adapter(Path(tmp) / "other")
    model.set_adapter(name)
    model.delete_adapter("other")
    merged = merged_copy(model, [deltas, other_deltas])
    for k, v in probe.measure(merged, dev, decoy=False).items():
        out[f"eval/persist_merge/{k}"] = v
    del merged

    # Further clean training of this adapter on the benign tasks alone (a fresh optimiser).
    fit(model, _loss_sets(cfg, sets, backdoor=False), tok, cfg, "naive", cfg.clean_steps, seed_offset=104729)
    for k, v in probe.measure(model, dev, decoy=False).items():
        out[f"eval/persist_clean/{k}"] = v
    return out
