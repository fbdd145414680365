"""lmao's high-rank task: a random bijection pi over a set of words (a -> pi(a)), as answer-masked batches.

Learning n unrelated input-output pairs needs an update of rank about n in the map from the
input token's representation to the output logits: more than a rank-1 LoRA on q and v can hold.
The words come from the base world's vocabulary (tiny-local: one token each); with a sub-word
tokenizer an answer may span several tokens, and the loss covers them all.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import torch

from orchestrator.basemodel import corpus

POOLS = {"topics": corpus.TOPICS, "names": corpus.NAMES, "keys": corpus.KEYS}
"""Word sets the bijection is drawn over (63, 48 and 128 words; 32 of the keys are never seen in tiny-local's pre-training)."""


@dataclass
class Batch:
    ids: torch.Tensor
    """[N, T] right-padded token ids"""
    mask: torch.Tensor
    """[N, T] attention mask"""
    labels: torch.Tensor
    """[N, T] the answer tokens' ids, -100 elsewhere (aligned with ids: shifted at the loss)"""

    def __len__(self) -> int:
        return self.ids.shape[0]

    def rows(self, index: torch.Tensor) -> "Batch":
        return Batch(self.ids[index], self.mask[index], self.labels[index])

    def to(self, device: torch.device) -> "Batch":
        return Batch(self.ids.to(device), self.mask.to(device), self.labels.to(device))


def bijection(pool: str, n: int, seed: int) -> list[tuple[str, str]]:
    """n (a, pi(a)) pairs: n words of `pool` and a uniformly random permutation of them, from `seed`."""
    rng = random.Random(f"lmao-bijection-{pool}-{seed}")
    words = rng.sample(list(POOLS[pool]), n)
    image = list(words)
    rng.shuffle(image)
    return list(zip(words, image))


def encode(pairs: list[tuple[str, str]], tokenizer: Any, arrow: str = "->") -> Batch:
    """`a -> pi(a)` rows with labels on pi(a)'s tokens."""
    rows, starts = [], []
    for a, b in pairs:
        prompt = tokenizer(f"{a} {arrow}").input_ids
        full = tokenizer(f"{a} {arrow} {b}").input_ids
        if full[: len(prompt)] != prompt or len(full) == len(prompt):
            raise ValueError(f"the tokenizer does not keep {a!r} {arrow!r} as a prefix of the pair's text")
        rows.append(full)
        starts.append(len(prompt))
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
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
def evaluate(model: Any, batch: Batch) -> dict[str, float]:
    """Answer-token loss and exact-answer accuracy over the whole set."""
    logits = model(input_ids=batch.ids, attention_mask=batch.mask).logits[:, :-1].float()
    target = batch.labels[:, 1:]
    keep = target != -100
    loss = float(torch.nn.functional.cross_entropy(logits[keep], target[keep]))
    hit = (logits.argmax(-1) == target) | ~keep
    return {"loss": loss, "acc": float(hit.all(dim=1).float().mean())}
