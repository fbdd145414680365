"""pica's downstream tasks, built from the base model's world, as answer-masked token batches.

Every example is `prompt answer`; the loss is the next-token loss of the answer's tokens only, so
the same code serves a word-level tokenizer (one answer token) and a sub-word one (several).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import torch

from orchestrator.basemodel import Example, World

TASKS = ("qa", "sub", "mul", "facts")
"""qa: a question format pre-training never used (`question : what is the pet of ada ? answer :`)
about attributes it did learn, held out by entity; sub / mul: `a - b` / `a * b mod p = c`,
operations tiny-local never saw (it learnt only `+`); facts: `the code of <key> is <value>` for the
keys pre-training held out (new knowledge: nothing pre-trained to reuse)."""

QA_RELATIONS = {"city": "home", "color": "color", "pet": "pet", "job": "job", "topic": "topic"}
"""relation -> the word the qa task asks with (traits have no noun in the vocabulary)."""


@dataclass
class Batch:
    ids: torch.Tensor
    """[N, T] right-padded token ids"""
    mask: torch.Tensor
    """[N, T] attention mask"""
    labels: torch.Tensor
    """[N, T] the answer tokens' ids, -100 elsewhere (already aligned with ids: shift at the loss)"""

    def __len__(self) -> int:
        return self.ids.shape[0]

    def rows(self, index: torch.Tensor) -> "Batch":
        return Batch(self.ids[index], self.mask[index], self.labels[index])

    def to(self, device: torch.device) -> "Batch":
        return Batch(self.ids.to(device), self.mask.to(device), self.labels.to(device))


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
    rows, starts = [], []
    for e in examples:
        prompt = tokenizer(e.prompt).input_ids
        full = tokenizer(f"{e.prompt} {e.answer}").input_ids
        if full[: len(prompt)] != prompt or len(full) == len(prompt):
            raise ValueError(f"the tokenizer does not keep {e.prompt!r} as a prefix of its answer's text; "
                             f"cannot tell the answer tokens apart")
        rows.append(full)
        starts.append(len(prompt))
    width = max(map(len, rows))
    pad = tokenizer.pad_token_id
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (r, s) in enumerate(zip(rows, starts)):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
        labels[i, s: len(r)] = torch.tensor(r[s:])
    return Batch(ids, mask, labels)


def answer_loss(model: Any, batch: Batch) -> torch.Tensor:
    """Mean next-token cross-entropy over the answer tokens."""
    logits = model(input_ids=batch.ids, attention_mask=batch.mask).logits  # [N, T, V]
    return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), batch.labels[:, 1:].flatten())


@torch.no_grad()
def evaluate(model: Any, batch: Batch, chunk: int = 256) -> dict[str, float]:
    """Answer-token loss and exact-answer accuracy (every answer token greedy-correct)."""
    total, tokens, correct = 0.0, 0, 0
    for start in range(0, len(batch), chunk):
        b = batch.rows(torch.arange(start, min(start + chunk, len(batch))))
        logits = model(input_ids=b.ids, attention_mask=b.mask).logits[:, :-1].float()
        target = b.labels[:, 1:]
        keep = target != -100
        total += float(torch.nn.functional.cross_entropy(logits[keep], target[keep], reduction="sum"))
        tokens += int(keep.sum())
        hit = (logits.argmax(-1) == target) | ~keep
        correct += int(hit.all(dim=1).sum())
    return {"loss": total / max(tokens, 1), "acc": correct / max(len(batch), 1)}
