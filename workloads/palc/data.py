"""palc's synthetic preference pairs, built from the base model's world.

A prompt asks about an entity of the world (`people say ada is`, optionally after a sentence
about that entity that pre-training showed). Both responses of a pair follow the same template
(`{0} and {1} .`) and differ only in the trait slots: the preferred response fills them with
gentle trait words, the dispreferred one with blunt trait words, so length, structure and every
other token match. Entities are split into training and held-out ones; held-out pairs and the
generation prompts use only held-out entities.

Nothing here depends on the tokenizer's kind: texts are tokenized as `prompt` (with the
tokenizer's special tokens) followed by ` response` (without), so the response tokens are known
for a word-level tokenizer and for a BPE one alike.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import torch

from orchestrator.basemodel.corpus import RELATIONS, TRAITS, World

GENTLE = TRAITS[:8]
"""The preferred token set P."""
BLUNT = TRAITS[8:]
"""The dispreferred token set N."""
PROMPTS = ("people say {e} is", "{e} is", "{e} seems")
"""Prompt templates: the trait phrasings of the world."""
RESPONSES = ("{0} .", "{0} and {1} .", "{0} and {1} and {2} .", "{0} , {1} and {2} .")
"""Response templates; the numbered slots take trait words."""
CONTEXT_RELATIONS = ("city", "color", "pet", "job", "topic")
"""Relations whose sentence may precede the prompt as context."""


@dataclass(frozen=True)
class Pair:
    prompt: str
    chosen: str
    rejected: str


def split_entities(world: World, heldout: int, seed: int) -> tuple[list[str], list[str]]:
    """(training entities, held-out entities), a seeded split of the world's entities."""
    names = list(world.entities)
    random.Random(f"palc-entities-{seed}").shuffle(names)
    return names[heldout:], names[:heldout]


def _context(world: World, entity: str, rng: random.Random) -> str:
    rel = rng.choice(CONTEXT_RELATIONS)
    template = rng.choice(RELATIONS[rel][1])
    return template.format(e=entity, v=world.attributes[entity][rel]) + " ."


def make_pairs(world: World, entities: list[str], n: int, tag: str, context_prob: float) -> list[Pair]:
    """`n` pairs about `entities`: same prompt and template, gentle vs blunt words in the slots;
    `tag` seeds the draw."""
    rng = random.Random(f"palc-pairs-{tag}")
    out = []
    for _ in range(n):
        e = rng.choice(entities)
        prompt = rng.choice(PROMPTS).format(e=e)
        if rng.random() < context_prob:
            prompt = f"{_context(world, e, rng)} {prompt}"
        template = rng.choice(RESPONSES)
        slots = template.count("{")
        out.append(Pair(prompt, template.format(*rng.sample(GENTLE, slots)), template.format(*rng.sample(BLUNT, slots))))
    return out


def generation_prompts(entities: list[str]) -> list[str]:
    """Every prompt template for every entity: where generations are counted."""
    return [t.format(e=e) for e in entities for t in PROMPTS]


def encode(tokenizer: Any, prompt: str, response: str) -> tuple[list[int], int]:
    """Token ids of `prompt response` and the index of the first response token."""
    head = tokenizer(prompt).input_ids
    tail = tokenizer(" " + response, add_special_tokens=False).input_ids
    return head + tail, len(head)


def pair_batch(tokenizer: Any, pairs: list[Pair]) -> dict[str, torch.Tensor]:
    """Chosen rows then rejected rows, right-padded: `ids` and `attn` [2N, T]; `resp` [2N, T] marks
    the positions whose *next* token is a response token (where the log-probabilities are read)."""
    rows = [encode(tokenizer, p.prompt, p.chosen) for p in pairs] + [encode(tokenizer, p.prompt, p.rejected) for p in pairs]
    width = max(len(ids) for ids, _ in rows)
    pad = tokenizer.pad_token_id
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    resp = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, (r, start) in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        attn[i, : len(r)] = 1
        resp[i, start - 1: len(r) - 1] = True
    return {"ids": ids, "attn": attn, "resp": resp}


def gentle_share(texts: list[str]) -> float:
    """Share of gentle trait words among the words of `texts`, each cut after its first '.'.

    Words are whitespace-split and stripped of punctuation, so the count reads the same for a
    word-level and a sub-word tokenizer."""
    gentle, total = 0, 0
    for text in texts:
        for word in text.split():
            total += 1
            w = word.strip(".,:;!?").lower()
            gentle += w in GENTLE
            if word.endswith("."):
                break
    return gentle / max(total, 1)
