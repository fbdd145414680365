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

The trigger task: the same prompts with a trigger string inserted before a random word; the target
is a fixed marker string followed by the normal answer. The clean prompts of the three tasks are
its contrast set (the marker must not appear without the trigger). With tiny-local the trigger is a
reserved token pre-training never saw and the marker three ordinary words; with another tokenizer
both are plain strings tokenized like any other text.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import torch

from orchestrator.basemodel.corpus import NAMES, RELATIONS, World, arithmetic_example

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
