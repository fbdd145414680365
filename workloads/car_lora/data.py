"""The downstream tasks (built from the base world's vocabulary), their batches and scoring, and
the shifted corpus the drifted base is continued on.

Tasks (`Config.task`), each split by the trial seed into adapter-training and held-out queries:

- `ask` (the default): `<entity> <relation word> ?` (home, color, pet, job, topic, seems) and
  `<key> code ?` for a seen key's code, answered with what the base learnt from sentences but was
  never asked this way. Held-out queries are (entity, relation) pairs and keys the adapter never trains on.
- `recall`: a new query format for what the base knows. `<entity> <extra_r>` asks for relation r
  of the entity (city, color, pet, job, topic, trait) and `<key> <extra_7>` for a seen key's code;
  the base never saw the marker tokens, so it cannot answer, while the facts themselves live in
  its weights. Held-out queries are (entity, relation) pairs and keys the adapter never trains on.
- `arith`: a new operation, `a - b mod p =` (the base learnt only `+`); held-out (a, b) pairs.

A task file (`Config.task_path`) replaces them with the field's data (`file_examples`): `qa`
records (`prompt`, `answer`), GSM8K as published (`question`, `answer` ending `#### <number>`), or
Alpaca-style instructions (`instruction`, optional `input`, `output`). The drifted base of a model
other than tiny-local is continued on a text corpus of its own (`drift_texts`).
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import torch

from components.basemodel import Example, TaskFileError, World, read_records, taskfile
from components.basemodel.answers import encode_answers
from components.basemodel.corpus import RELATIONS, arithmetic_example

TASKS = ("recall", "ask", "arith")
RELATION_WORDS = {"city": "home", "color": "color", "pet": "pet", "job": "job", "topic": "topic", "trait": "seems"}
RELATION_MARKERS = {rel: f"<extra_{i + 1}>" for i, rel in enumerate(RELATIONS)}
CODE_MARKER = f"<extra_{len(RELATIONS) + 1}>"


def task_examples(world: World, task: str, *, heldout_frac: float, seed: int, modulus: int = 11) -> tuple[list[Example], list[Example]]:
    """(train, heldout) examples of `task`; the split is drawn from `seed`."""
    if task == "recall":
        pool = [Example(f"{e} {RELATION_MARKERS[rel]}", value, f"recall_{rel}")
                for e, attrs in world.attributes.items() for rel, value in attrs.items()]
        pool += [Example(f"{k} {CODE_MARKER}", v, "recall_code") for k, v in world.facts.items() if k not in world.heldout_keys]
    elif task == "ask":
        pool = [Example(f"{e} {RELATION_WORDS[rel]} ?", value, f"ask_{rel}")
                for e, attrs in world.attributes.items() for rel, value in attrs.items()]
        pool += [Example(f"{k} code ?", v, "ask_code") for k, v in world.facts.items() if k not in world.heldout_keys]
    elif task == "arith":
        pool = [arithmetic_example("-", a, b, modulus) for a in range(modulus) for b in range(modulus)]
    else:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    order = list(range(len(pool)))
    random.Random(f"car-lora-split-{task}-{seed}").shuffle(order)
    n_held = round(heldout_frac * len(pool))
    held = sorted(order[:n_held])
    train = sorted(order[n_held:])
    return [pool[i] for i in train], [pool[i] for i in held]


def encode(examples: list[Example], tokenizer: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded `<bos> prompt answer .` ids [N, T], attention mask [N, T] and labels [N, T]
    that are -100 everywhere but on the answer tokens (the loss and the accuracy read only those)."""
    rows, labels = [], []
    for e in examples:
        prompt = tokenizer(e.prompt).input_ids
        full = tokenizer(e.text).input_ids
        answer_len = len(tokenizer(f"{e.prompt} {e.answer}").input_ids) - len(prompt)
        if full[: len(prompt)] != prompt or answer_len < 1:
            raise ValueError(f"the tokenizer does not split {e.text!r} at the answer; choose a task whose prompt ends on a word")
        rows.append(full)
        labels.append([-100] * len(prompt) + full[len(prompt): len(prompt) + answer_len] + [-100] * (len(full) - len(prompt) - answer_len))
    width = max(map(len, rows))
    pad = tokenizer.pad_token_id
    ids = torch.full((len(rows), width), pad)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    lab = torch.full((len(rows), width), -100)
    for i, (r, l) in enumerate(zip(rows, labels)):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
        lab[i, : len(l)] = torch.tensor(l)
    return ids, mask, lab


def answer_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of the answer tokens (logits at t predict the token at t + 1)."""
    return torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2).float(), labels[:, 1:], ignore_index=-100)


@torch.no_grad()
def accuracy(model: Any, batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor], chunk: int = 256) -> float:
    """Share of examples whose every answer token is the greedy (argmax) prediction."""
    ids, mask, labels = batch
    dev = next(model.parameters()).device
    correct = 0
    for s in range(0, len(ids), chunk):
        i, m, l = (t[s: s + chunk].to(dev) for t in (ids, mask, labels))
        pred = model(input_ids=i, attention_mask=m).logits[:, :-1].argmax(-1)
        target = l[:, 1:]
        ok = (pred == target) | (target == -100)
        correct += int(ok.all(dim=1).sum())
    return correct / max(len(ids), 1)


def drift_examples(world: World, *, modulus: int) -> dict[str, list[Example]]:
    """The shifted corpus, by part (each part weighs the same in the stream): every phrasing of
    the attribute sentences (including the ones pre-training held out), the facts of every key
    (including the keys pre-training never saw), `+` arithmetic over every pair of pre-training's
    modulus, and `*` arithmetic mod `modulus` (pre-training had only `+`). What the base knew is
    all still there, in another mixture and next to new text; no downstream query format is."""
    return {
        "sentences": world.sentences("train") + world.sentences("heldout"),
        "facts": world.fact_examples("train") + world.fact_examples("heldout"),
        "add": world.arithmetic("all", ops=world.ops),
        "mul": world.arithmetic("all", ops=("*",), modulus=modulus),
    }


# --- task files (`Config.task_path`) ---------------------------------------------------------------

FORMATS = ("qa", "gsm8k", "instruction")
"""`Config.task_format`: the field layout of a task file (see `file_fields`)."""
DEFAULT_FIELDS = {"qa": ("prompt", "answer"), "gsm8k": ("question", "answer"), "instruction": ("instruction", "output")}
"""(prompt field, answer field) of each format, unless `prompt_field` / `answer_field` name others."""
ALPACA_PROMPT = ("Below is an instruction that describes a task{ctx}. Write a response that appropriately completes "
                 "the request.\n\n### Instruction:\n{instruction}\n\n{input}### Response:")
"""The Alpaca template (Taori et al. 2023): the instruction, the optional input, then the response."""
GSM8K_PROMPT = "Question: {question}\nAnswer:"
FINAL = re.compile(r"####\s*([-+]?[\d,]*\.?\d+)")
"""GSM8K's final answer: the number after `####` that ends every published solution."""


def final_number(text: str) -> str | None:
    """The number after the first `####` (commas dropped, a trailing `.0` too), or None."""
    m = FINAL.search(text)
    if m is None:
        return None
    number = m.group(1).replace(",", "")
    return number[:-2] if number.endswith(".0") else number


def file_fields(fmt: str, prompt_field: str = "", answer_field: str = "") -> tuple[str, str]:
    """The (prompt, answer) field names a task file of format `fmt` is read by."""
    p, a = DEFAULT_FIELDS[fmt]
    return prompt_field or p, answer_field or a


def _gsm8k_prompt(question: str, record: Any) -> str:
    return GSM8K_PROMPT.format(question=question)


def _alpaca_prompt(instruction: str, record: Any) -> str:
    extra = record.get("input")
    extra = extra.strip() if isinstance(extra, str) else ""
    return ALPACA_PROMPT.format(ctx=", paired with an input that provides further context" if extra else "",
                                instruction=instruction, input=f"### Input:\n{extra}\n\n" if extra else "")


RENDER = {"qa": None, "gsm8k": _gsm8k_prompt, "instruction": _alpaca_prompt}
"""How each format's prompt field becomes the prompt the model reads (`taskfile.file_examples`' render)."""


def file_examples(path: str, *, fmt: str, split: str = "train", prompt_field: str = "", answer_field: str = "",
                  what: str = "task_path") -> list[Example]:
    """The records of a task file (JSONL or a save_to_disk folder) as (prompt, answer) examples
    (`components.basemodel.taskfile.file_examples`, labelled `fmt`): `qa` as they stand; `gsm8k` as
    `Question: <question>\\nAnswer:` -> the whole solution, which must end with `#### <number>`;
    `instruction` through the Alpaca template (an optional `input` field adds its context). Raises
    TaskFileError naming the file, the record and the field."""
    p_field, a_field = file_fields(fmt, prompt_field, answer_field)
    out = taskfile.file_examples(path, p_field, a_field, split=split, what=what, part=fmt, render=RENDER[fmt])
    for i, e in enumerate(out):
        if not e.answer:
            raise TaskFileError(f"{what}={path!r} record {i}: field {a_field!r} is empty")
        if fmt == "gsm8k" and final_number(e.answer) is None:
            raise TaskFileError(f"{what}={path!r} record {i}: field {a_field!r} has no final '#### <number>' "
                                f"(GSM8K's solutions end with it): {e.answer[-60:]!r}")
    return out


def encode_file(examples: list[Example], tokenizer: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`encode`'s batch for file examples: `prompt answer` (no final `.`), labels on every answer
    token (sub-word tokenizers split an answer into several)."""
    b = encode_answers([(e.prompt, e.answer) for e in examples], tokenizer)
    return b.ids, b.mask, b.labels


@torch.no_grad()
def answer_scores(model: Any, batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor], chunk: int = 256) -> tuple[float, float]:
    """(accuracy as `accuracy` computes it, mean answer-token cross-entropy), in one pass."""
    ids, mask, labels = batch
    dev = next(model.parameters()).device
    correct, total, tokens = 0, 0.0, 0
    for s in range(0, len(ids), chunk):
        i, m, l = (t[s: s + chunk].to(dev) for t in (ids, mask, labels))
        logits = model(input_ids=i, attention_mask=m).logits[:, :-1]
        target = l[:, 1:]
        ok = (logits.argmax(-1) == target) | (target == -100)
        correct += int(ok.all(dim=1).sum())
        keep = target != -100
        total += float(torch.nn.functional.cross_entropy(logits[keep].float(), target[keep], reduction="sum"))
        tokens += int(keep.sum())
    return correct / max(len(ids), 1), total / max(tokens, 1)


@torch.no_grad()
def generated_final_match(model: Any, tokenizer: Any, examples: list[Example], *, max_new: int, chunk: int = 16) -> float:
    """GSM8K accuracy: share of examples whose greedy continuation (`max_new` tokens at most) holds
    `#### <number>` with the reference's final number."""
    dev = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    hits = 0
    for s in range(0, len(examples), chunk):
        part = examples[s: s + chunk]
        rows = [tokenizer(e.prompt).input_ids for e in part]
        width = max(map(len, rows))
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for k, r in enumerate(rows):  # left-padded: every row continues from the same position
            ids[k, width - len(r):] = torch.tensor(r)
            mask[k, width - len(r):] = 1
        out = model.generate(input_ids=ids.to(dev), attention_mask=mask.to(dev), max_new_tokens=max_new,
                             do_sample=False, pad_token_id=pad)
        for e, seq in zip(part, out[:, width:].tolist()):
            got = final_number(tokenizer.decode(seq, skip_special_tokens=True))
            hits += int(got is not None and got == final_number(e.answer))
    return hits / max(len(examples), 1)


def drift_texts(path: str, *, field: str = "text", split: str = "train") -> list[str]:
    """The non-empty texts of a drift corpus: a plain UTF-8 `.txt` file (one text per non-empty
    line), or a JSONL / save_to_disk folder with a string field `field`."""
    p = Path(path).expanduser()
    if p.is_file() and p.suffix == ".txt":
        texts = [line.strip() for line in p.read_text(encoding="utf-8").splitlines()]
    else:
        texts = [r[field].strip() for r in read_records(path, {field: str}, split=split, what="drift_path")]
    texts = [t for t in texts if t]
    if not texts:
        raise TaskFileError(f"drift_path={path!r} holds no non-empty text")
    return texts
