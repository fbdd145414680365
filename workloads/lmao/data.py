"""lmao's high-rank task: a random bijection pi over a set of words (a -> pi(a)), as answer-masked batches.

Learning n unrelated input-output pairs needs an update of rank about n in the map from the
input token's representation to the output logits: more than a rank-1 LoRA on q and v can hold.
The words come from the base world's vocabulary (tiny-local: one token each); with a sub-word
tokenizer an answer may span several tokens, and the loss covers them all.
"""

from __future__ import annotations

import random
from typing import Any

from orchestrator.basemodel import corpus
from orchestrator.basemodel.answers import AnswerBatch as Batch
from orchestrator.basemodel.answers import answer_loss, encode_answers
from orchestrator.basemodel.answers import answer_metrics as evaluate

__all__ = ["POOLS", "Batch", "answer_loss", "bijection", "encode", "evaluate"]

POOLS = {"topics": corpus.TOPICS, "names": corpus.NAMES, "keys": corpus.KEYS}
"""Word sets the bijection is drawn over (63, 48 and 128 words; 32 of the keys are never seen in tiny-local's pre-training)."""


def bijection(pool: str, n: int, seed: int) -> list[tuple[str, str]]:
    """n (a, pi(a)) pairs: n words of `pool` and a uniformly random permutation of them, from `seed`."""
    rng = random.Random(f"lmao-bijection-{pool}-{seed}")
    words = rng.sample(list(POOLS[pool]), n)
    image = list(words)
    rng.shuffle(image)
    return list(zip(words, image))


def encode(pairs: list[tuple[str, str]], tokenizer: Any, arrow: str = "->") -> Batch:
    """`a -> pi(a)` rows with labels on pi(a)'s tokens."""
    return encode_answers([(f"{a} {arrow}", b) for a, b in pairs], tokenizer)
