"""car_lora: Config, and the loop that trains one adapter and evaluates it under every scheme."""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass
from typing import Any, Literal

import torch

from components.basemodel import (
    AnswerField, Example, PromptField, base_world, load_base, lora, parse_tiny, projections, task_problems, with_task_fields,
)
from orchestrator.run import devices
from workloads.car_lora import bnb, data
from workloads.car_lora.compress import BACKWARDS, SCHEME_NAMES, Compressor, make_schemes
from workloads.car_lora.drift import ensure_drifted

ADAPTERS = ("plain", "car")
"""Besides these, `adapter` may name a scheme: the per-scheme ("QLoRA-style") adapter trained on it alone."""


SMOKE_QUANT = "int2g16"
"""The quantiser that really costs a plain LoRA on tiny-local, added to the smoke reproduction's
schemes: 2-bit ({-1, 0, 1} x scale) with one absmax scale per 16 inputs. Found on calibration seed
100 only (plain LoRA's held-out accuracy, uncompressed 0.957): int8 0.957, nf4 0.965, mxfp4 0.957,
int4 per channel 0.965, int4 per tensor 0.965, FP4 E2M1 per tensor 0.965 and per row 0.957, MX FP4
in blocks of 256 0.957, NF4 in blocks of 4096 0.957, int3 per channel 0.922, per tensor 0.930, in
groups of 16 0.930; int2 per channel 0.200 (the base's facts are gone), int2 in groups of 32 0.426,
of 16 0.600, of 8 0.765. Groups of 16 hurt plain LoRA most while an adapter trained on that base
alone still recovers it (0.878, seed 100), which is the paper's setting: naive INT4 costs the Llama
LoRA 38.9 -> 16.3 on GSM8K, retrained adapters recover 38.5. At 8B the paper's own formats do that;
at hidden size 64 with no outlier weights only 2 bits does."""


MAX_WORKERS = 1
"""car_lora trains one adapter per trial on one worker: the runner refuses more."""


@dataclass(frozen=True)
class Config(with_task_fields(PromptField, AnswerField, prompt_field="", answer_field="")):
    """car_lora's settings after the task-file fields (`components.basemodel.taskfields`): the base
    stays frozen in `dtype` while peft keeps the adapter in float32; task_path's records are read in
    `task_format`, whose own fields prompt_field / answer_field '' stand for."""

    adapter: str = "car"
    """'plain' (LoRA on the uncompressed base), 'car' (one scheme of `schemes` sampled per step), or a
    scheme name: the per-scheme adapter trained on that compressed base alone."""
    schemes: tuple[str, ...] = ("int8", "nf4", "mxfp4", "sparse24", "rowprune", "skip")
    """The in-set schemes: CAR's operator distribution, each evaluated (the paper's operator kinds;
    the smoke reproduction adds `SMOKE_QUANT`). Names: none, int8, int4, int3, int2g16, nf4, mxfp4,
    sparse24, sparse50, rowprune, colprune, skip."""
    heldout_scheme: str = "colprune"
    """A scheme CAR never trains on, evaluated as well (structured input-channel pruning by default:
    a pruning kind the in-set row pruning does not cover)."""
    car_identity: bool = False
    """Also sample the uncompressed base ('none') in CAR's per-step draw; the paper's operator set
    lists only compressors (reconstruction choice)."""
    backward: Literal["full", "compressed"] = "full"
    """Input gradient through a compressed linear: 'full' = straight-through, grad @ W0 (dC/dW0 ~ I);
    'compressed' = autograd through C(W0), as QLoRA. The paper's summary does not settle which it means."""
    task: Literal["ask", "recall", "arith"] = "ask"
    """Downstream task of the tiny-local world when task_path is '' (see data.py): 'ask' = `<entity> <relation
    word> ?` -> the attribute, 'recall' = the same with reserved marker tokens for relations, 'arith' =
    `a - b mod p =` (any base)."""
    task_format: Literal["qa", "gsm8k", "instruction"] = "qa"
    """Field layout of task_path's and eval_path's records (GSM8K's test split as eval_path): 'qa' (prompt,
    answer), 'gsm8k' (question, answer ending `#### <number>`, as published) or 'instruction' (Alpaca:
    instruction, optional input, output); prompt_field / answer_field '' read the format's own."""
    eval_limit: int = 0
    """Evaluate on the first this many held-out examples (0: all of them)."""
    eval_batch: int = 256
    """Examples per evaluation forward pass (lower it for a large base)."""
    gen_tokens: int = 256
    """GSM8K: greedy tokens generated per question; its accuracy is the final `#### <number>` matching
    the reference's. 0 scores the solution's tokens (teacher-forced exact match) instead."""
    heldout_frac: float = 0.3
    """Share of the task's queries (of task_path's records when eval_path is '') held out of adapter training
    and used for every evaluation."""
    arith_modulus: int = 11
    """p of the 'arith' task."""
    lora_r: int = 8
    """LoRA rank on every decoder linear (the paper's 8; rank 4 and 16 did no better on tiny-local)."""
    lora_alpha: float = 16.0
    """LoRA alpha (scale alpha / r; the paper's 16)."""
    lora_dropout: float = 0.1
    """Dropout on the adapter's input (peft's lora_dropout), for every adapter alike."""
    lora_targets: str = "all-linear"
    """'all-linear' or comma-separated module types (q_proj,v_proj,...)."""
    steps: int = 80
    """AdamW steps of the plain and per-scheme adapters (on tiny-local they fit every training query by then)."""
    car_steps_factor: float = 4.0
    """CAR trains this many times `steps` (the paper: 20 epochs against the baselines' 5)."""
    batch: int = 64
    """Queries per step."""
    lr: float = 5e-3
    """AdamW peak learning rate."""
    schedule: Literal["constant", "cosine"] = "cosine"
    """Learning-rate schedule over the adapter's steps: constant, or cosine decay to 10% of `lr`."""
    weight_decay: float = 0.5
    """AdamW weight decay on the adapter, for every adapter alike. Every adapter fits its training
    queries; what differs is held-out accuracy, and CAR's suffered most without it (not in the paper)."""
    nf4_block: int = 64
    """NF4 block size (QLoRA: 64)."""
    mx_block: int = 32
    """MX FP4 block size along the input dimension (OCP MX: 32)."""
    mx_impl: Literal["auto", "reference", "triton"] = "auto"
    """kernels.mx implementation for MX FP4 ('auto': Triton on CUDA, the reference otherwise)."""
    prune_frac: float = 0.3
    """Share of output neurons (rowprune) or input channels (colprune) removed per linear."""
    skip_layer: int = 2
    """Decoder layer dropped by 'skip' (negative counts from the end); its adapter goes with it. The
    paper does not say which; on tiny-local dropping layer 1 costs the base half its sentence
    accuracy (0.98 -> 0.55) and leaves no adapter, per-scheme or CAR, near the others."""
    bnb_schemes: tuple[str, ...] = ()
    """Real compressed bases to evaluate the adapter on as well, loaded through transformers'
    BitsAndBytesConfig: 'nf4', 'int8' (needs bitsandbytes and a CUDA GPU; reported as bnb_<name>)."""
    cache_compressed: bool = True
    """Keep each scheme's compressed weights after first use (off for a large base: recomputed per switch)."""
    drift: bool = True
    """Also evaluate on the drifted base (built once and cached, see drift.py)."""
    drift_path: str = ""
    """Text the drifted base is continued on: a .txt file (a text per line), or a JSONL / save_to_disk
    folder with a `drift_field` string; '' = the shifted tiny-world corpus (tiny-local bases only)."""
    drift_field: str = "text"
    """The text field of a JSONL / saved-dataset `drift_path`."""
    drift_split: str = "train"
    """Split of a saved DatasetDict read from `drift_path`."""
    drift_steps: int = 200
    """Continued-pretraining steps of the drifted base."""
    drift_lr: float = 2e-3
    """Its AdamW learning rate (the paper: 1e-4 at 8B)."""
    drift_rank: int = 32
    """Rank of its merged LoRA (the paper: 64); 0 continues every weight instead."""
    drift_alpha: float = 64.0
    """Its LoRA alpha (the paper: 128)."""
    drift_batch: int = 8
    """Rows per drift step."""
    drift_seq_len: int = 32
    """Tokens per packed drift row."""
    drift_modulus: int = 7
    """Modulus of the new `*` arithmetic in the shifted corpus."""
    drift_seed: int = 0
    """Seed of the drift build (never a trial seed: one drifted base serves a sweep)."""
    drift_schemes: bool = True
    """Evaluate the drifted base under every scheme too, not only uncompressed."""
    log_every: int = 25
    """Report the training loss every this many steps."""
    checkpoint_every_frac: float = 0.25
    """Save a checkpoint at every multiple of this training fraction."""
    threads: int = 1
    """Intra-op CPU threads of the trial, pinned by the runner around `train` (0 leaves torch's setting)."""
    seed: int = 0
    """Seed of the task split, the adapter initialisation, the batches and CAR's scheme draws."""


def smoke() -> Config:
    """A CPU-sized CAR trial on tiny-local, a few seconds: 20 steps x 4, evaluated on the base
    under every scheme of the smoke reproduction and on the drifted base (built once, cached, shared
    with the reproduction). It reports every 10 steps, more often than it checkpoints (every 20)."""
    return Config(steps=20, schemes=SMOKE_SCHEMES, drift_schemes=False, log_every=10)


SMOKE_SCHEMES = (*Config().schemes, SMOKE_QUANT)
"""The smoke reproduction's in-set schemes: the paper's kinds and the quantiser that hurts at tiny size."""


def train_schemes(cfg: Config) -> tuple[str, ...]:
    """The schemes an adapter trains on: one per step, drawn uniformly."""
    if cfg.adapter == "plain":
        return ("none",)
    if cfg.adapter == "car":
        return (("none",) if cfg.car_identity else ()) + tuple(cfg.schemes)
    return (cfg.adapter,)


def total_steps(cfg: Config) -> int:
    return max(1, round(cfg.steps * cfg.car_steps_factor)) if cfg.adapter == "car" else cfg.steps


def eval_schemes(cfg: Config) -> tuple[str, ...]:
    return tuple(dict.fromkeys(("none", *cfg.schemes, cfg.heldout_scheme)))


def validate(cfg: Config, world_size: int = 1) -> None:
    """Checks that need no training: raised before anything is launched."""
    if problems := task_problems(cfg):
        raise ValueError("; ".join(problems))
    known = [s for s in SCHEME_NAMES if s != "none"]
    bad = [s for s in (*cfg.schemes, cfg.heldout_scheme) if s not in known]
    if bad:
        raise ValueError(f"unknown compression scheme(s) {bad}; choose among {known}")
    if not cfg.schemes or len(set(cfg.schemes)) != len(cfg.schemes):
        raise ValueError(f"schemes must list distinct schemes, at least one; got {cfg.schemes}")
    if cfg.heldout_scheme in cfg.schemes:
        raise ValueError(f"heldout_scheme={cfg.heldout_scheme!r} is also in schemes: remove it there, or hold out another scheme")
    if cfg.adapter not in ADAPTERS and cfg.adapter not in known:
        raise ValueError(f"adapter must be 'plain', 'car' or a scheme name among {known}, got {cfg.adapter!r}")
    if cfg.schedule not in ("constant", "cosine"):
        raise ValueError(f"schedule must be 'constant' or 'cosine', got {cfg.schedule!r}")
    if cfg.task not in data.TASKS:
        raise ValueError(f"task must be one of {data.TASKS}, got {cfg.task!r}")
    if cfg.backward not in BACKWARDS:
        raise ValueError(f"backward must be one of {BACKWARDS}, got {cfg.backward!r}")
    if cfg.task_format not in data.FORMATS:
        raise ValueError(f"task_format must be one of {data.FORMATS}, got {cfg.task_format!r}")
    bad_bnb = [s for s in cfg.bnb_schemes if s not in bnb.BNB_SCHEMES]
    if bad_bnb or len(set(cfg.bnb_schemes)) != len(cfg.bnb_schemes):
        raise ValueError(f"bnb_schemes must list distinct names among {bnb.BNB_SCHEMES}, got {cfg.bnb_schemes}")
    if cfg.drift and not cfg.drift_path and parse_tiny(cfg.base) is None:
        raise ValueError(f"drift=True on base {cfg.base!r} needs drift_path, a text corpus to continue it on (the "
                         f"shifted tiny-world corpus is tiny-local's own): set drift_path, or drift=False")
    if cfg.eval_limit < 0 or cfg.gen_tokens < 0 or cfg.eval_batch <= 0:
        raise ValueError("eval_limit and gen_tokens must be >= 0 and eval_batch positive")
    if cfg.mx_impl not in ("auto", "reference", "triton"):
        raise ValueError(f"mx_impl must be auto, reference or triton, got {cfg.mx_impl!r}")
    if cfg.drift_rank < 0:
        raise ValueError(f"drift_rank must be >= 0 (0: continue every weight), got {cfg.drift_rank}")
    for name in ("steps", "batch", "lora_r", "nf4_block", "log_every", "drift_batch", "drift_seq_len"):
        if getattr(cfg, name) <= 0:
            raise ValueError(f"{name} must be positive, got {getattr(cfg, name)}")
    if cfg.drift_steps < 0:
        raise ValueError(f"drift_steps must be >= 0, got {cfg.drift_steps}")
    for name in ("lr", "lora_alpha", "car_steps_factor", "drift_alpha"):
        if not getattr(cfg, name) > 0:
            raise ValueError(f"{name} must be positive, got {getattr(cfg, name)}")
    if cfg.drift_lr < 0 or cfg.weight_decay < 0:
        raise ValueError("drift_lr and weight_decay must be >= 0")
    if not 0 <= cfg.lora_dropout < 1:
        raise ValueError(f"lora_dropout must lie in [0, 1), got {cfg.lora_dropout}")
    if not 0 < cfg.heldout_frac < 1:
        raise ValueError(f"heldout_frac must lie in (0, 1), got {cfg.heldout_frac}")
    if not 0 <= cfg.prune_frac < 1:
        raise ValueError(f"prune_frac must lie in [0, 1), got {cfg.prune_frac}")
    if cfg.mx_block not in (8, 16, 32, 64, 128, 256):
        raise ValueError(f"mx_block must be one of 8, 16, 32, 64, 128, 256 (kernels.mx block sizes), got {cfg.mx_block}")
    if not 2 <= cfg.arith_modulus <= 100 or not 2 <= cfg.drift_modulus <= 100:
        raise ValueError("arith_modulus and drift_modulus must lie in [2, 100] (numbers are single words of the world)")
    if not 0 < cfg.checkpoint_every_frac <= 1:
        raise ValueError(f"checkpoint_every_frac must lie in (0, 1], got {cfg.checkpoint_every_frac}")
    if cfg.threads < 0:
        raise ValueError(f"threads must be >= 0 (0: torch's own setting), got {cfg.threads}")


def lora_targets(cfg: Config) -> str | list[str]:
    return cfg.lora_targets if cfg.lora_targets == "all-linear" else [t.strip() for t in cfg.lora_targets.split(",")]


def preflight(cfg: Config) -> None:
    """Checks of the machine that runs it, every problem in one error: the base is a folder or a
    cached hub id whose projection kinds include `lora_targets`; the task, eval and drift files
    read with their fields; bitsandbytes and a GPU are there when `bnb_schemes` asks for them."""
    def read(path: str, split: str, what: str) -> None:
        data.file_examples(path, fmt=cfg.task_format, split=split, prompt_field=cfg.prompt_field,
                           answer_field=cfg.answer_field, what=what)

    problems = task_problems(cfg, machine=True, targets=lora_targets(cfg), check=read)
    if cfg.drift and cfg.drift_path:
        try:
            data.drift_texts(cfg.drift_path, field=cfg.drift_field, split=cfg.drift_split)
        except ValueError as exc:
            problems.append(str(exc))
    if cfg.bnb_schemes and bnb.problem(cfg.bnb_schemes):
        problems.append(bnb.problem(cfg.bnb_schemes))
    if problems:
        raise ValueError("; ".join(problems))


def adapted(cfg: Config, path: str, device: torch.device) -> tuple[Any, Any, Compressor]:
    """(peft model, tokenizer, compressor) of the base at `path` (a name or a folder) with a fresh adapter."""
    dtype = None if cfg.dtype == "auto" else cfg.dtype
    model, tok = load_base(path, seed=cfg.base_seed, dtype=dtype, device=device)
    projs = projections(model)  # before peft adds its own linears (lora_A, lora_B)
    peft_model = lora(model, lora_targets(cfg), r=cfg.lora_r, alpha=cfg.lora_alpha, dropout=cfg.lora_dropout)
    schemes = make_schemes(nf4_block=cfg.nf4_block, mx_block=cfg.mx_block, prune_frac=cfg.prune_frac, mx_impl=cfg.mx_impl)
    comp = Compressor(peft_model, schemes, skip_layer=cfg.skip_layer, backward=cfg.backward, cache=cfg.cache_compressed,
                      projs=projs)
    return peft_model, tok, comp


def task_split(cfg: Config) -> tuple[list[Example], list[Example]]:
    """(adapter-training, held-out) examples: the tiny world's `task`, or the task file's records
    (held out: `eval_path`, else a `heldout_frac` share drawn from `seed`), the first `eval_limit` held out."""
    if not cfg.task_path:
        train_ex, held_ex = data.task_examples(base_world(cfg.base, seed=cfg.base_seed), cfg.task,
                                               heldout_frac=cfg.heldout_frac, seed=cfg.seed, modulus=cfg.arith_modulus)
    else:
        read = dict(fmt=cfg.task_format, prompt_field=cfg.prompt_field, answer_field=cfg.answer_field)
        pool = data.file_examples(cfg.task_path, split=cfg.task_split, **read)
        if cfg.eval_path:
            train_ex, held_ex = pool, data.file_examples(cfg.eval_path, split=cfg.eval_split, what="eval_path", **read)
        else:
            order = list(range(len(pool)))
            random.Random(f"car-lora-split-file-{cfg.seed}").shuffle(order)
            n_held = max(1, round(cfg.heldout_frac * len(pool)))
            if n_held >= len(pool):
                raise ValueError(f"task_path={cfg.task_path!r} holds {len(pool)} records: too few to hold out {n_held}")
            train_ex, held_ex = [pool[i] for i in order[n_held:]], [pool[i] for i in order[:n_held]]
    return train_ex, held_ex[: cfg.eval_limit] if cfg.eval_limit else held_ex


def generates(cfg: Config) -> bool:
    """GSM8K scored by generating the solution (its final number), not by teacher forcing."""
    return bool(cfg.task_path) and cfg.task_format == "gsm8k" and cfg.gen_tokens > 0


def adapter_state(model: Any) -> dict[str, torch.Tensor]:
    from peft import get_peft_model_state_dict

    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}


class Scorer:
    """The held-out scores of one model as it stands: answer-token accuracy (or, for GSM8K with
    `gen_tokens`, the generated final number's) and answer-token loss."""

    def __init__(self, cfg: Config, tok: Any, examples: list[Example], batch: Any) -> None:
        self.cfg, self.tok, self.examples, self.batch = cfg, tok, examples, batch

    def __call__(self, model: Any) -> tuple[float, float]:
        acc, loss = data.answer_scores(model, self.batch, chunk=self.cfg.eval_batch)
        if generates(self.cfg):
            acc = data.generated_final_match(model, self.tok, self.examples, max_new=self.cfg.gen_tokens,
                                             chunk=min(self.cfg.eval_batch, 64))
        return acc, loss


def evaluate(model: Any, comp: Compressor | None, score: Any, names: tuple[str, ...], prefix: str) -> dict[str, float]:
    """`{prefix}/<scheme>` accuracy and `{prefix.replace('acc', 'loss')}/<scheme>` loss under each scheme."""
    out = {}
    for name in names:
        if comp is not None:
            comp.use(name)
        acc, loss = score(model)
        out[f"{prefix}/{name}"] = acc
        out[f"{prefix.replace('acc', 'loss')}/{name}"] = loss
    if comp is not None:
        comp.use("none")
    return out


def train(cfg: Config, run) -> dict[str, float]:
    validate(cfg, run.world_size)
    from peft import set_peft_model_state_dict

    if cfg.bnb_schemes and bnb.problem(cfg.bnb_schemes):
        raise ValueError(bnb.problem(cfg.bnb_schemes))
    dev = run.device
    train_ex, held_ex = task_split(cfg)
    drifted = ensure_drifted(cfg, dev) if cfg.drift else None  # cached: built by the first trial only
    torch.manual_seed(cfg.seed)  # the adapter's initialisation
    model, tok, comp = adapted(cfg, cfg.base, dev)
    encode = data.encode_file if cfg.task_path else data.encode
    train_b, held_b = encode(train_ex, tok), encode(held_ex, tok)
    if cfg.task_path:  # the fit check reads as many training examples as are held out
        fit_b = tuple(t[: len(held_ex)] for t in train_b)
    else:
        fit_b = train_b
    pool = train_schemes(cfg)
    total = total_steps(cfg)
    save_at = {min(total, max(1, round(j * cfg.checkpoint_every_frac * total)))
               for j in range(1, math.ceil(1 / cfg.checkpoint_every_frac) + 1)}
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    gen = torch.Generator().manual_seed(cfg.seed)  # batches and scheme draws, checkpointed
    start, drawn = 0, {name: 0 for name in pool}
    state = run.restore()
    if state is not None:
        set_peft_model_state_dict(model, state["adapter"])
        opt.load_state_dict(state["optimizer"])
        gen.set_state(state["gen"])
        if "torch_rng" in state:  # adapter dropout draws from torch's global generator
            torch.set_rng_state(state["torch_rng"])
        start, drawn = state["step"], state["drawn"]

    model.train()
    loss_value, window_start, window_steps, steps_per_s = math.nan, devices.clock(dev), 0, math.nan
    for step in range(start + 1, total + 1):
        if cfg.schedule == "cosine":
            for group in opt.param_groups:
                group["lr"] = cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - 1) / total)))
        # Outer loop: draw an operator C_j and compute with C_j(W0) (cached: W0 is frozen); inner: a LoRA step.
        name = pool[int(torch.randint(len(pool), (1,), generator=gen))]
        comp.use(name)
        drawn[name] += 1
        idx = torch.randint(len(train_b[0]), (cfg.batch,), generator=gen)
        ids, mask, labels = (t[idx].to(dev) for t in train_b)
        loss = data.answer_loss(model(input_ids=ids, attention_mask=mask).logits, labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss_value = loss.item()
        window_steps += 1
        if step % cfg.log_every == 0 or step == total:
            now = devices.clock(dev)
            steps_per_s = window_steps / max(now - window_start, 1e-9)
            window_start, window_steps = now, 0
            run.report({"train/loss": loss_value, "perf/steps_per_s": steps_per_s, "progress": step / total}, step=step)
        if step in save_at:
            run.save({"step": step, "adapter": adapter_state(model), "optimizer": opt.state_dict(),
                      "gen": gen.get_state(), "torch_rng": torch.get_rng_state(), "drawn": drawn})
    model.eval()
    comp.use("none")

    names = eval_schemes(cfg)
    score = Scorer(cfg, tok, held_ex, held_b)
    out = evaluate(model, comp, score, names, "eval/acc")
    # Training queries, under what this adapter trained on: did it fit them? (teacher-forced)
    fit = Scorer(dataclasses.replace(cfg, gen_tokens=0), tok, [], fit_b)
    out.update(evaluate(model, comp, fit, ("none", *pool), "eval/train_acc"))
    with model.disable_adapter():  # the base alone cannot do the task
        out["eval/base_acc"], out["eval/base_loss"] = score(model)
    trained = adapter_state(model)
    del model, comp, opt, params  # one base in memory at a time from here on
    if drifted is not None:
        d_model, _, d_comp = adapted(cfg, str(drifted), dev)
        set_peft_model_state_dict(d_model, trained)  # the same adapter, ported to the new base
        d_model.eval()
        out.update(evaluate(d_model, d_comp, score, names if cfg.drift_schemes else ("none",), "eval/drift_acc"))
        with d_model.disable_adapter():
            out["eval/drift_base_acc"], out["eval/drift_base_loss"] = score(d_model)
        del d_model, d_comp
    for name in cfg.bnb_schemes:  # the base compressed for real (bitsandbytes), the adapter unchanged
        q_model, _ = bnb.load(cfg.base, name, seed=cfg.base_seed, dtype=cfg.dtype)
        q_model = lora(q_model, lora_targets(cfg), r=cfg.lora_r, alpha=cfg.lora_alpha, dropout=cfg.lora_dropout)
        set_peft_model_state_dict(q_model, trained)
        q_model.eval()
        out.update(evaluate(q_model, None, score, (f"bnb_{name}",), "eval/acc"))
        del q_model
    out.update({f"diag/drawn/{k}": float(v) for k, v in drawn.items()})
    out.update({"train/loss": loss_value, "perf/steps_per_s": steps_per_s, "diag/steps": float(total)})
    run.report({**out, "progress": 1.0}, step=total)
    return out
