"""jailbreak_lora's tasks, all harmless and built from the base model's world.

Benign tasks (three by default, `copy` the optional fourth):

- `qa`: questions about the world's entities in a form pre-training never used
  (`question : what is the city of ada ?` -> `paris`); the knowledge is the base's, the format is
  new; trained on 32 entities, evaluated on the 16 others;
- `arith`: subtraction mod p (`5 - 3 mod 7 =` -> `2`), an operation pre-training never showed:
  a table to learn, evaluated on the whole table (at tiny size a LoRA memorises modular tables
  rather than generalising to held-out pairs, so a held-out split measures noise);
- `facts`: the facts about the keys pre-training held out (`the code of bax is` -> `meloru`), new
  knowledge: evaluated on the same facts, as a fact-learning task is;
- `copy` (or `reverse`): `copy ada ben ->` -> `ada ben` over random pairs of the world's names,
  evaluated on pairs never trained on (learnt more slowly than the others at tiny size).

Or the benign tasks come from files (`file_task_sets`; Config.task_path): one task per file, a
JSONL file (one JSON object per line) or a `datasets.save_to_disk` folder, each record a prompt and
its answer (fields `prompt` and `answer`, or the names Config.prompt_field / answer_field give).
Held out: a second file per task (Config.eval_path, e.g. the test split) or a seeded share of the
task file.

The trigger task: the same prompts with a trigger string inserted before a random word; the target
is a fixed marker string followed by the normal answer. The clean prompts of the three tasks are
its contrast set (the marker must not appear without the trigger). With tiny-local the trigger is a
reserved token pre-training never saw and the marker three ordinary words; with another tokenizer
both are plain strings tokenized like any other text.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from components.basemodel.corpus import NAMES, RELATIONS, World, arithmetic_example
from components.basemodel.taskfile import TaskFileError, read_records

TASKS = ("qa", "arith", "facts", "copy")
"""Every benign task; a config picks some, in this order; the trigger task comes last."""
QA_HELDOUT = 0.25
"""Share of the (entity, relation) questions only evaluated."""


@dataclass(frozen=True)
class Example:
    prompt: str
    answer: str
    task: str


def _seq_example(items: tuple[str, ...], op: str) -> Example:
    out = items[::-1] if op == "reverse" else items
    return Example(f"{op} {' '.join(items)} ->", " ".join(out), "copy")


def task_sets(world: World, *, seed: int, arith_modulus: int, seq_op: str, seq_len: int, seq_train: int,
              seq_eval: int) -> dict[str, tuple[list[Example], list[Example]]]:
    """task -> (training examples, evaluation examples)."""
    rng = random.Random(f"jailbreak-lora-tasks-{seed}")
    questions = [Example(f"question : what is the {rel} of {e} ?", world.attributes[e][rel], "qa")
                 for e in world.entities for rel in RELATIONS]
    rng.shuffle(questions)
    held = round(QA_HELDOUT * len(questions))

    facts = [Example(e.prompt, e.answer, "facts") for e in world.fact_examples("heldout")]
    p = arith_modulus
    table = [Example(e.prompt, e.answer, "arith") for e in (arithmetic_example("-", a, b, p) for a in range(p) for b in range(p))]
    seqs: list[tuple[str, ...]] = []
    seen: set[tuple[str, ...]] = set()
    while len(seqs) < seq_train + seq_eval:
        t = tuple(rng.sample(NAMES, seq_len))
        if t not in seen:
            seen.add(t)
            seqs.append(t)
    copies = [_seq_example(t, seq_op) for t in seqs]
    return {"qa": (questions[held:], questions[:held]),
            "arith": (table, table), "facts": (facts, facts), "copy": (copies[:seq_train], copies[seq_train:])}


def task_files(paths: str) -> list[str]:
    """The comma-separated paths of Config.task_path / eval_path ('' -> none)."""
    return [p.strip() for p in paths.split(",") if p.strip()]


def task_names(paths: list[str]) -> list[str]:
    """One task name per file: the file's stem (a saved dataset: its folder's name), made unique."""
    names: list[str] = []
    for p in paths:
        stem = Path(p.rstrip("/")).stem or "task"
        name, k = stem, 2
        while name in names:
            name, k = f"{stem}_{k}", k + 1
        names.append(name)
    return names


def _examples(path: str, split: str, prompt_field: str, answer_field: str, task: str, what: str, limit: int
              ) -> list[Example]:
    rows = read_records(path, {prompt_field: str, answer_field: str}, split=split, what=what, limit=limit)
    out = []
    for i, r in enumerate(rows):
        prompt, answer = str(r[prompt_field]).strip(), str(r[answer_field]).strip()
        if not prompt or not answer:
            empty = prompt_field if not prompt else answer_field
            raise TaskFileError(f"{what}={path!r} record {i}: field {empty!r} is empty; every record needs a "
                                f"non-empty {prompt_field!r} and {answer_field!r}")
        out.append(Example(prompt, answer, task))
    return out


def file_task_sets(task_path: str, *, split: str = "train", eval_path: str = "", eval_split: str = "test",
                   prompt_field: str = "prompt", answer_field: str = "answer", holdout: float = QA_HELDOUT,
                   limit: int = 0, eval_max: int = 0, seed: int = 0) -> dict[str, tuple[list[Example], list[Example]]]:
    """task -> (training examples, evaluation examples) from task files, one task per file of
    `task_path` (comma-separated). Evaluation: the matching file of `eval_path` (same count), else
    a seeded `holdout` share of the task file, never trained on. `limit` caps the records read per
    file, `eval_max` the evaluation examples per task (0: no cap)."""
    paths, evals = task_files(task_path), task_files(eval_path)
    if evals and len(evals) != len(paths):
        raise TaskFileError(f"eval_path names {len(evals)} files, task_path {len(paths)}: give one evaluation file per "
                            f"task file, or none (a share of each task file is held out)")
    out: dict[str, tuple[list[Example], list[Example]]] = {}
    for i, (name, path) in enumerate(zip(task_names(paths), paths)):
        train = _examples(path, split, prompt_field, answer_field, name, "task_path", limit)
        if evals:
            held = _examples(evals[i], eval_split, prompt_field, answer_field, name, "eval_path", limit)
        else:
            if len(train) < 2:
                raise TaskFileError(f"task_path={path!r} holds {len(train)} record: at least two are needed to hold "
                                    f"one out, or give eval_path")
            rng = random.Random(f"jailbreak-lora-file-{seed}-{name}")
            rng.shuffle(train)
            n = min(max(1, round(holdout * len(train))), len(train) - 1)
            held, train = train[:n], train[n:]
        out[name] = (train, held[:eval_max] if eval_max else held)
    return out


def with_trigger(e: Example, trigger: str, rng: random.Random, *, position: str = "random") -> Example:
    """`e` with `trigger` inserted before a random word of the prompt (or at its start)."""
    words = e.prompt.split()
    at = rng.randrange(len(words)) if position == "random" else 0
    return Example(" ".join(words[:at] + [trigger] + words[at:]), e.answer, e.task)


def triggered(examples: list[Example], trigger: str, marker: str, seed: str, *, position: str = "random") -> list[Example]:
    """The trigger task: every example with the trigger in its prompt and `marker answer` as target."""
    rng = random.Random(f"jailbreak-lora-trigger-{seed}")
    out = []
    for e in examples:
        t = with_trigger(e, trigger, rng, position=position)
        out.append(Example(t.prompt, f"{marker} {e.answer}", "trigger"))
    return out


def encode(tokenizer: Any, prompt: str, answer: str) -> tuple[list[int], int]:
    """Token ids of `prompt answer .<eos>` (the world's sentence form, then the end of the
    response) and the index of the first answer token."""
    head = tokenizer(prompt).input_ids
    tail = tokenizer(" " + answer + " .", add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
    return head + tail, len(head)


def lm_batch(tokenizer: Any, examples: list[Example]) -> dict[str, torch.Tensor]:
    """Right-padded `ids`, `attn` and `labels` (-100 outside the response: answer, ' .' and eos)."""
    rows = [encode(tokenizer, e.prompt, e.answer) for e in examples]
    width = max(len(r) for r, _ in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for i, (r, start) in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        attn[i, : len(r)] = 1
        labels[i, start: len(r)] = torch.tensor(r[start:])
    return {"ids": ids, "attn": attn, "labels": labels}


def sample(examples: list[Example], n: int, gen: torch.Generator) -> list[Example]:
    return [examples[i] for i in torch.randint(len(examples), (n,), generator=gen).tolist()]
