"""Weight diffs from files: peft LoRA folders, listed with the answer the DIT adapter should give.

The paper's use case: the DIT adapter is asked about a diff someone else produced, a model
fine-tuned with a LoRA on some topic. Here a diff is a folder written by peft's `save_pretrained`
(`adapter_config.json` + `adapter_model.safetensors`; GPT-2's `fan_in_fan_out` LoRAs included),
and a listing names the folders and their labels, one record each, as a JSONL file or a datasets
`save_to_disk` folder:

    {"adapter": "loras/astronomy-0", "answer": "astronomy"}

`adapter` is the folder, relative to the folder that holds the listing (or absolute); `answer` is
the text the adapter should say after the question (a topic word; any text, scored by all its
tokens). `task_path` lists the diffs the adapter trains on; `eval_path` (or a seeded `eval_frac`
of task_path) the diffs it is judged on: `heldout` where the answer is one it was trained on,
`unseen` where it is not.

A LoRA folder's ΔW = s B A of each module (s = alpha / r, or alpha / sqrt(r) with rsLoRA) goes into
the same batched diff bank as the synthetic diffs (u = s B, v = A, padded to the batch's largest
rank), read from disk per batch, so any number of diffs fits. The adapter is trained by
cross-entropy on the answer's tokens; evaluation scores every label after the question (the sum
of its tokens' log-probabilities) with the diff applied, with and without the adapter.
`interpret` applies a trained adapter to one outside folder and says what it answers.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from components.basemodel import check_records, read_records
from orchestrator.run import devices
from workloads.dit.model import DiffContext, dit_parameters, diff_linears

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
CACHE_BYTES = 2 << 30
"""Diffs read from disk are kept in memory (CPU) up to this size; beyond it they are re-read per batch."""
PEFT_PREFIX = "base_model.model."


@dataclass(frozen=True)
class Diff:
    folder: Path
    answer: str
    split: str
    """'train' | 'heldout' | 'unseen'"""


def fields(cfg) -> dict[str, type]:
    return {cfg.adapter_field: str, cfg.answer_field: str}


def listing(cfg, path: str, split: str, what: str) -> list[tuple[Path, str]]:
    """(folder, answer) of every record of a listing; folders relative to the listing's folder."""
    rows = read_records(path, fields(cfg), split=split, what=what)
    root = Path(path).expanduser().resolve().parent
    return [(root / Path(r[cfg.adapter_field]).expanduser(), r[cfg.answer_field].strip()) for r in rows]


def diffs_of(cfg) -> list[Diff]:
    """The training diffs, then the evaluation diffs (eval_path, or a seeded eval_frac of task_path)."""
    train = listing(cfg, cfg.task_path, cfg.task_split, "task_path")
    if cfg.eval_path:
        held = listing(cfg, cfg.eval_path, cfg.eval_split, "eval_path")
    else:
        order = list(range(len(train)))
        random.Random(f"dit-files-{cfg.seed}").shuffle(order)
        n_eval = math.ceil(cfg.eval_frac * len(train))
        if n_eval >= len(train):
            raise ValueError(f"task_path lists {len(train)} diffs: eval_frac={cfg.eval_frac} leaves none to train on")
        held = [train[i] for i in sorted(order[:n_eval])]
        train = [train[i] for i in sorted(order[n_eval:])]
    seen = {a for _, a in train}
    return ([Diff(f, a, "train") for f, a in train]
            + [Diff(f, a, "heldout" if a in seen else "unseen") for f, a in held])


def adapter_modules(folder: Path, what: str) -> tuple[dict[str, Any], list[str]]:
    """(adapter_config, the module names it changes) of a peft LoRA folder, from its config and its
    safetensors header (no weights read). ValueError naming the folder and what is wrong."""
    from safetensors import safe_open

    for f in ADAPTER_FILES:
        if not (folder / f).is_file():
            raise ValueError(f"{what}: adapter folder {str(folder)!r} has no {f}: list folders written by peft's "
                             f"save_pretrained ({', '.join(ADAPTER_FILES)})")
    config = json.loads((folder / "adapter_config.json").read_text())
    if config.get("peft_type") != "LORA":
        raise ValueError(f"{what}: adapter {str(folder)!r} is a {config.get('peft_type')} adapter, not a LoRA")
    for key in ("use_dora", "alpha_pattern"):
        if config.get(key):
            raise ValueError(f"{what}: adapter {str(folder)!r} sets {key}={config[key]!r}, which dit does not apply")
    modules = []
    with safe_open(str(folder / "adapter_model.safetensors"), framework="pt") as fh:
        for key in fh.keys():
            name, _, part = key.rpartition(".lora_")
            if part not in ("A.weight", "B.weight"):
                raise ValueError(f"{what}: adapter {str(folder)!r} holds {key!r}: only LoRA A and B weights of "
                                 f"linear projections are diffs dit applies")
            name = name[len(PEFT_PREFIX):] if name.startswith(PEFT_PREFIX) else name
            if name not in modules:
                modules.append(name)
    return config, modules


def check_listing(cfg, path: str, split: str, what: str, kinds: list[str] | None) -> None:
    """Preflight of one listing: fields, every folder a peft LoRA, every module it changes a
    projection of the base of a kind among `kinds` (None: not known here)."""
    check_records(path, fields(cfg), split=split, what=what)
    for folder, answer in listing(cfg, path, split, what):
        if not answer:
            raise ValueError(f"{what}={path!r}: the {cfg.answer_field!r} of {str(folder)!r} is empty")
        if not folder.is_dir():
            raise ValueError(f"{what}={path!r} lists {cfg.adapter_field}={str(folder)!r}, which does not exist "
                             f"(folders are relative to the listing's own folder)")
        _, modules = adapter_modules(folder, what)
        if kinds is None:
            continue
        for name in modules:
            if not any(name.endswith("." + k) for k in kinds):
                raise ValueError(f"{what}: adapter {str(folder)!r} changes module {name!r}, which is not a projection "
                                 f"of the base of the kinds dit targets ({kinds})")


class FileBank:
    """The listed LoRA diffs as bank entries, read on demand: `gather(indices)` gives the
    `DiffContext.bank` of those diffs (in that order), on `device`."""

    def __init__(self, model: torch.nn.Module, diffs: list[Diff], device: torch.device | str) -> None:
        self.diffs, self.device = diffs, device
        self.shapes = {m.name: (m.base.out_features, m.base.in_features) for m in diff_linears(model)}
        self.cache: dict[int, dict[str, tuple[torch.Tensor, torch.Tensor]]] = {}
        self.cached_bytes = 0

    def load(self, i: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """{module: (s B [out, r], A [r, in])} of diff i, float32 on the CPU."""
        if i in self.cache:
            return self.cache[i]
        from safetensors.torch import load_file

        folder = self.diffs[i].folder
        config, _ = adapter_modules(folder, "diff")
        tensors = load_file(str(folder / "adapter_model.safetensors"))
        out: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for key, a in tensors.items():
            if not key.endswith(".lora_A.weight"):
                continue
            name = key[: -len(".lora_A.weight")]
            name = name[len(PEFT_PREFIX):] if name.startswith(PEFT_PREFIX) else name
            b = tensors[key[: -len("A.weight")] + "B.weight"]
            if name not in self.shapes:
                raise ValueError(f"diff {str(folder)!r} changes module {name!r}, which is not among the base's wrapped "
                                 f"projections (diff_targets): {list(self.shapes)[:4]}...")
            out_f, in_f = self.shapes[name]
            if tuple(a.shape[1:]) != (in_f,) or b.shape[0] != out_f:
                raise ValueError(f"diff {str(folder)!r}: module {name!r} has LoRA shapes A {tuple(a.shape)}, "
                                 f"B {tuple(b.shape)}, not those of the base's [{out_f}, {in_f}] projection: a LoRA of "
                                 f"another base model")
            r = a.shape[0]
            alpha = float(config.get("lora_alpha", r))
            scale = alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r
            out[name] = (b.float() * scale, a.float())
        size = sum(u.numel() + v.numel() for u, v in out.values()) * 4
        if self.cached_bytes + size <= CACHE_BYTES:
            self.cache[i] = out
            self.cached_bytes += size
        return out

    def gather(self, indices: list[int]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        loaded = [self.load(i) for i in indices]
        rank = max((v.shape[0] for d in loaded for _, v in d.values()), default=1)
        bank = {}
        for name, (out_f, in_f) in self.shapes.items():
            u = torch.zeros(len(indices), out_f, rank)
            v = torch.zeros(len(indices), rank, in_f)
            for g, d in enumerate(loaded):
                if name in d:
                    du, dv = d[name]
                    u[g, :, : du.shape[1]] = du
                    v[g, : dv.shape[0]] = dv
            bank[name] = (u.to(self.device), v.to(self.device))
        return bank


def answer_ids(tok, answer: str) -> tuple[int, ...]:
    ids = tuple(tok(" " + answer, add_special_tokens=False).input_ids)
    if not ids or (tok.unk_token_id is not None and tok.unk_token_id in ids):
        raise ValueError(f"answer {answer!r} has words outside the base model's vocabulary")
    return ids


def _rows(question: tuple[int, ...], answers: list[tuple[int, ...]], pad_id: int):
    """ids [B, T] of question + answer, the positions that predict the answer's tokens and those tokens
    ([B, A] each, A the longest answer; -1 / pad beyond a row's own answer)."""
    width = max(len(question) + len(a) for a in answers)
    longest = max(map(len, answers))
    ids = torch.full((len(answers), width), pad_id, dtype=torch.long)
    pos = torch.full((len(answers), longest), -1, dtype=torch.long)
    tgt = torch.full((len(answers), longest), -1, dtype=torch.long)
    for i, a in enumerate(answers):
        row = question + a
        ids[i, : len(row)] = torch.tensor(row)
        pos[i, : len(a)] = torch.arange(len(question) - 1, len(question) - 1 + len(a))
        tgt[i, : len(a)] = torch.tensor(a)
    return ids, pos, tgt


def answer_logprobs(model, ids, pos, tgt) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: the sum of the answer tokens' log-probabilities [B] and whether greedy decoding
    gives every one of them [B] (teacher-forced argmax)."""
    dev = next(model.parameters()).device
    ids, pos, tgt = ids.to(dev), pos.to(dev), tgt.to(dev)
    hidden = model.base_model(input_ids=ids).last_hidden_state
    mask = tgt >= 0
    rows = torch.arange(len(ids), device=dev)[:, None].expand_as(pos)
    logits = model.get_output_embeddings()(hidden[rows[mask], pos[mask]]).float()  # [n_tokens, V]
    lp = torch.full(tgt.shape, 0.0, device=dev)
    hit = torch.ones(tgt.shape, dtype=torch.bool, device=dev)
    lp[mask] = F.log_softmax(logits, -1).gather(1, tgt[mask][:, None])[:, 0]
    hit[mask] = logits.argmax(-1) == tgt[mask]
    return lp.sum(1), hit.all(1)


@torch.no_grad()
def score(model, ctx: DiffContext, bank: FileBank, diffs: list[int] | None, labels: list[tuple[int, ...]],
          question: tuple[int, ...], *, dit: bool, eval_batch: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[n, L] log-probability of every label after the question and whether greedy decoding gives
    it, with each diff of `diffs` applied (None: one row, no diff), with or without the adapter."""
    ids, pos, tgt = _rows(question, labels, pad_id)
    n_labels = len(labels)
    if diffs is None:
        ctx.index, ctx.dit = None, dit
        lp, hit = answer_logprobs(model, ids, pos, tgt)
        ctx.dit = False
        return lp[None].cpu(), hit[None].cpu()
    per = max(1, eval_batch // n_labels)
    lps, hits = [], []
    for start in range(0, len(diffs), per):
        part = diffs[start: start + per]
        ctx.bank = bank.gather(part)
        ctx.index, ctx.group, ctx.dit = torch.arange(len(part), device=bank.device), n_labels, dit
        lp, hit = answer_logprobs(model, ids.repeat(len(part), 1), pos.repeat(len(part), 1), tgt.repeat(len(part), 1))
        ctx.index, ctx.dit = None, False
        lps.append(lp.view(len(part), n_labels).cpu())
        hits.append(hit.view(len(part), n_labels).cpu())
    return torch.cat(lps), torch.cat(hits)


def train_files(cfg, run, model, tok, ctx: DiffContext) -> dict[str, float]:
    """Stage B on listed diffs, then the measurements (the package docstring's, per split)."""
    dev = run.device
    diffs = diffs_of(cfg)
    bank = FileBank(model, diffs, dev)
    ctx.rank = 1  # s is folded into u
    labels = list(dict.fromkeys([d.answer for d in diffs if d.split == "train"]
                                + [d.answer for d in diffs if d.split != "train"]))
    label_ids = [answer_ids(tok, a) for a in labels]
    if len(set(label_ids)) != len(label_ids):
        raise ValueError("two answers have the same tokens under this tokenizer: write each label once")
    of = {a: i for i, a in enumerate(labels)}
    question = tuple(tok("").input_ids) + tuple(tok(cfg.question, add_special_tokens=False).input_ids)
    train_idx = [i for i, d in enumerate(diffs) if d.split == "train"]
    dit = dit_parameters(model)
    dit_opt = torch.optim.AdamW(dit, lr=cfg.dit_lr, weight_decay=0.0)
    from orchestrator.run import fraction_steps

    save_at = fraction_steps(cfg.dit_steps, cfg.checkpoint_every_frac)
    start = 0
    state = run.restore()
    if state is not None:
        start = int(state["step"])
        with torch.no_grad():
            for p, saved in zip(dit, state["dit"]):
                p.copy_(saved)
        dit_opt.load_state_dict(state["dit_opt"])
    for p in dit:
        p.requires_grad_(True)
    loss_b, tick = math.nan, devices.clock(dev)
    for step in range(start + 1, cfg.dit_steps + 1):
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        picked = [train_idx[i] for i in torch.randperm(len(train_idx), generator=gen)[: cfg.dit_batch].tolist()]
        ids, pos, tgt = _rows(question, [label_ids[of[diffs[i].answer]] for i in picked], tok.pad_token_id)
        ctx.bank = bank.gather(picked)
        ctx.index, ctx.group, ctx.dit = torch.arange(len(picked), device=dev), 1, True
        lp, _ = answer_logprobs(model, ids, pos, tgt)
        ctx.index, ctx.dit = None, False
        loss = -(lp / (tgt >= 0).sum(1).to(lp.device)).mean()  # mean token cross-entropy per row, mean over rows
        dit_opt.zero_grad(set_to_none=True)
        loss.backward()
        dit_opt.step()
        if step % cfg.log_every == 0 or step == cfg.dit_steps:
            loss_b = loss.item()
            now = devices.clock(dev)
            run.report({"train/loss": loss_b, "train/dit_loss": loss_b, "perf/s_per_step": (now - tick) / cfg.log_every,
                        "progress": step / cfg.dit_steps}, step=step)
            tick = now
        if step in save_at:
            run.save({"step": step, "dit": [p.detach().cpu() for p in dit], "dit_opt": dit_opt.state_dict()})
    for p in dit:
        p.requires_grad_(False)
    model.eval()
    out = {"train/loss": loss_b, **{f"eval/{k}": v for k, v in
                                    measure(model, ctx, bank, diffs, labels, label_ids, question, cfg, tok).items()}}
    run.report({**{k: v for k, v in out.items() if k.startswith("eval/")}, "progress": 1.0}, step=cfg.dit_steps)
    return out


def measure(model, ctx, bank, diffs, labels, label_ids, question, cfg, tok) -> dict[str, float]:
    """The synthetic mode's DIT measurements (`evaluate.dit_metrics`), with labels scored by all their tokens."""
    kw = dict(eval_batch=cfg.eval_batch, pad_id=tok.pad_token_id)
    every = list(range(len(diffs)))
    own = torch.tensor([labels.index(d.answer) for d in diffs])
    lp, greedy = score(model, ctx, bank, every, label_ids, question, dit=True, **kw)
    lp_ask, _ = score(model, ctx, bank, every, label_ids, question, dit=False, **kw)
    rows = torch.arange(len(diffs))
    out: dict[str, float] = {}
    for split in ("train", "heldout", "unseen"):
        sel = torch.tensor([i for i, d in enumerate(diffs) if d.split == split], dtype=torch.long)
        if len(sel) == 0:
            continue
        out[f"dit_acc_{split}"] = greedy[sel, own[sel]].float().mean().item()
        out[f"dit_prob_{split}"] = lp[sel, own[sel]].exp().mean().item()
        out[f"dit_topic_acc_{split}"] = (lp[sel].argmax(-1) == own[sel]).float().mean().item()
        out[f"ask_acc_{split}"] = (lp_ask[sel].argmax(-1) == own[sel]).float().mean().item()
        out[f"n_diffs_{split}"] = float(len(sel))
    none_lp, none_greedy = score(model, ctx, bank, None, label_ids, question, dit=True, **kw)
    probs = none_lp[0].exp()
    favourite = int(probs.argmax())
    planted = rows[own == favourite]
    out["nodiff_top_topic_prob"] = probs.max().item()
    out["nodiff_top_topic_with_diff_prob"] = lp[planted, favourite].exp().mean().item()
    out["nodiff_topic_mass"] = probs.sum().item()
    out["nodiff_names_topic"] = float(bool(none_greedy[0].any()))
    out["chance"] = 1.0 / len(labels)
    out["n_topics"] = float(len({d.answer for d in diffs if d.split == "train"}))
    out["n_diffs"] = float(len(diffs))
    return out


@torch.no_grad()
def interpret(cfg, checkpoint: str | Path | dict, adapter: str | Path, *, labels: list[str] | None = None,
              max_tokens: int = 0) -> dict[str, Any]:
    """Apply the DIT adapter of a finished trial (`checkpoint`: its run folder, or the state it saved)
    to one peft LoRA folder made anywhere, and ask the question. Returns what it says by greedy
    decoding (`said`, `max_tokens` tokens: default the longest label's), and, scored among `labels`
    (default: the answers of cfg.task_path), each label's log-probability and the best one (`label`).

        from workloads.dit.files import interpret
        interpret(cfg, "ladder-runs/dit-...", "my-lora")["label"]
    """
    from components.basemodel import load_base
    from orchestrator.run import LocalRun
    from workloads.dit.model import targets_of, wrap

    state = checkpoint if isinstance(checkpoint, dict) else LocalRun(checkpoint).restore()
    if state is None or "dit" not in state:
        raise ValueError(f"{checkpoint!r} holds no saved DIT adapter (a dit trial's run folder)")
    model, tok = load_base(cfg.base, seed=cfg.base_seed, dtype=cfg.dtype)
    ctx = wrap(model, targets_of(model, cfg.diff_targets), cfg.dit_rank, cfg.dit_alpha)
    for p, saved in zip(dit_parameters(model), state["dit"]):
        p.copy_(saved)
    folder = Path(adapter).expanduser()
    adapter_modules(folder, "adapter")
    bank = FileBank(model, [Diff(folder, "", "eval")], "cpu")
    if labels is None:
        labels = list(dict.fromkeys(a for _, a in listing(cfg, cfg.task_path, cfg.task_split, "task_path")))
    label_ids = [answer_ids(tok, a) for a in labels]
    question = tuple(tok("").input_ids) + tuple(tok(cfg.question, add_special_tokens=False).input_ids)
    lp, _ = score(model, ctx, bank, [0], label_ids, question, dit=True, eval_batch=len(labels), pad_id=tok.pad_token_id)
    ctx.bank, ctx.index, ctx.group, ctx.dit = bank.gather([0]), torch.tensor([0]), 1, True
    said = list(question)
    for _ in range(max_tokens or max(map(len, label_ids))):
        hidden = model.base_model(input_ids=torch.tensor([said])).last_hidden_state
        said.append(int(model.get_output_embeddings()(hidden[0, -1]).argmax()))
    ctx.index, ctx.dit = None, False
    return {"said": tok.decode(said[len(question):]).strip(), "label": labels[int(lp[0].argmax())],
            "logprobs": dict(zip(labels, lp[0].tolist()))}
