"""pica's downstream tasks, built from the base model's world, as answer-masked token batches.

Every example is `prompt answer`; the loss is the next-token loss of the answer's tokens only, so
the same code serves a word-level tokenizer (one answer token) and a sub-word one (several).
"""

from __future__ import annotations

import random
from typing import Any

from components.basemodel import Example, World
from components.basemodel.answers import AnswerBatch as Batch
from components.basemodel.answers import answer_loss, encode_answers
from components.basemodel.answers import answer_metrics as evaluate

__all__ = ["TASKS", "QA_RELATIONS", "Batch", "Example", "answer_loss", "encode", "evaluate", "split", "within",
           "task_examples"]

TASKS = ("qa", "sub", "mul", "facts")
"""qa: a question format pre-training never used (`question : what is the pet of ada ? answer :`)
about attributes it did learn, held out by entity; sub / mul: `a - b` / `a * b mod p = c`,
operations tiny-local never saw (it learnt only `+`); facts: `the code of <key> is <value>` for the
keys pre-training held out (new knowledge: nothing pre-trained to reuse)."""

QA_RELATIONS = {"city": "home", "color": "color", "pet": "pet", "job": "job", "topic": "topic"}
"""relation -> the word the qa task asks with (traits have no noun in the vocabulary)."""


def task_examples(world: World, task: str, modulus: int) -> list[Example]:
    if task == "qa":
        return [Example(f"question : what is the {word} of {e} ? answer :", world.attributes[e][rel], f"qa_{rel}")
                for e in world.entities for rel, word in QA_RELATIONS.items()]
    if task == "sub":
        return world.arithmetic("all", ops=("-",), modulus=modulus)
    if task == "mul":
        return world.arithmetic("all", ops=("*",), modulus=modulus)
    if task == "facts":
        return world.fact_examples("heldout")
    raise ValueError(f"task must be one of {TASKS}, got {task!r}")


def within(examples: list[Example], tokenizer: Any, max_tokens: int) -> list[Example]:
    """The examples whose `prompt answer` takes at most `max_tokens` tokens."""
    return [e for e in examples if len(tokenizer(f"{e.prompt} {e.answer}").input_ids) <= max_tokens]


def split(examples: list[Example], heldout_frac: float, seed: int, by_entity: bool = False) -> tuple[list[Example], list[Example]]:
    """(train, heldout): a fixed shuffle of the task's examples (seeded by the base seed, not the
    trial seed, so every trial of a sweep sees the same split); `by_entity` holds out whole
    entities (the prompt's last word before `?`). heldout_frac = 0: heldout = train."""
    rng = random.Random(f"pica-split-{seed}")
    if by_entity:
        entities = sorted({e.prompt.split(" ? ")[0].rsplit(" ", 1)[-1] for e in examples})
        rng.shuffle(entities)
        held = set(entities[: round(heldout_frac * len(entities))])
        train = [e for e in examples if e.prompt.split(" ? ")[0].rsplit(" ", 1)[-1] not in held]
        heldout = [e for e in examples if e.prompt.split(" ? ")[0].rsplit(" ", 1)[-1] in held]
        return (train, heldout) if held else (train, train)
    order = list(examples)
    rng.shuffle(order)
    n_held = round(heldout_frac * len(order))
    if n_held == 0:
        return order, order
    return order[n_held:], order[:n_held]


def encode(examples: list[Example], tokenizer: Any) -> Batch:
    """Right-padded ids of `prompt answer` with labels on the answer tokens."""
    return encode_answers([(e.prompt, e.answer) for e in examples], tokenizer)
