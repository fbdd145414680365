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

Pairs can also come from a preference file (`pairs_from_records`): a prompt and a chosen and a
rejected response per record, or HH-RLHF's whole dialogues, whose prompt is split off.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import torch

from components.basemodel.corpus import RELATIONS, TRAITS, World

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


def _pieces(tokenizer: Any, prompt: str, response: str) -> tuple[list[int], list[int]]:
    # A space joins prompt and response unless one of them already has whitespace there (an
    # HH-RLHF prompt ends in "Assistant:", its response starts with " ").
    sep = "" if prompt[-1:].isspace() or response[:1].isspace() else " "
    return tokenizer(prompt).input_ids, tokenizer(sep + response, add_special_tokens=False).input_ids


def encode(tokenizer: Any, prompt: str, response: str) -> tuple[list[int], int]:
    """Token ids of `prompt response` and the index of the first response token."""
    head, tail = _pieces(tokenizer, prompt, response)
    return head + tail, len(head)


def encode_pair(tokenizer: Any, pair: Pair, max_len: int = 0) -> list[tuple[list[int], int]]:
    """[(chosen ids, response start), (rejected ids, response start)], each at most `max_len`
    tokens (0: no limit): the prompt keeps its last tokens (at least half the budget, the same for
    both responses), then the responses are cut at the end."""
    head, chosen = _pieces(tokenizer, pair.prompt, pair.chosen)
    _, rejected = _pieces(tokenizer, pair.prompt, pair.rejected)
    if max_len and len(head) + max(len(chosen), len(rejected)) > max_len:
        head = head[-max(max_len - max(len(chosen), len(rejected)), max_len // 2):]
        room = max_len - len(head)
        chosen, rejected = chosen[:room], rejected[:room]
    return [(head + chosen, len(head)), (head + rejected, len(head))]


def pair_batch(tokenizer: Any, pairs: list[Pair], max_len: int = 0) -> dict[str, torch.Tensor]:
    """Chosen rows then rejected rows, right-padded: `ids` and `attn` [2N, T]; `resp` [2N, T] marks
    the positions whose *next* token is a response token (where the log-probabilities are read).
    `max_len` bounds a row's tokens (see `encode_pair`)."""
    encoded = [encode_pair(tokenizer, p, max_len) for p in pairs]
    rows = [e[0] for e in encoded] + [e[1] for e in encoded]
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


# --- preference pairs from a file ----------------------------------------------------------------

HH_MARKER = "\n\nAssistant:"
"""Where an HH-RLHF dialogue's last assistant turn starts: the prompt is everything up to and
including the last one, the response what follows it."""


def file_fields(prompt_field: str, chosen_field: str, rejected_field: str) -> dict[str, Any]:
    """The fields a preference file must have and their types: responses are strings or chat
    message lists (UltraFeedback-binarized's `[{"role", "content"}, ...]`, the last message's
    content being the response); no prompt field when the prompt is split off the dialogues."""
    fields: dict[str, Any] = {}
    if prompt_field:
        fields[prompt_field] = str
    fields[chosen_field] = (str, list)
    fields[rejected_field] = (str, list)
    return fields


def _response_text(value: Any, at: str, field: str) -> str:
    if isinstance(value, str):
        return value
    if value and isinstance(value[-1], dict) and isinstance(value[-1].get("content"), str):
        return value[-1]["content"]
    raise ValueError(f"{at}: field {field!r} is a list but not a chat message list whose last message has a string "
                     f"'content' (UltraFeedback-binarized's form): expected a string or such a list")


def split_dialogue(text: str, marker: str = HH_MARKER) -> tuple[str, str] | None:
    """(prompt, response) of a whole dialogue cut after its last `marker`, or None without one."""
    i = text.rfind(marker)
    if i < 0:
        return None
    return text[: i + len(marker)], text[i + len(marker):]


def pairs_from_records(records: list[dict[str, Any]], *, prompt_field: str, chosen_field: str, rejected_field: str,
                       what: str) -> tuple[list[Pair], int]:
    """(pairs, skipped): the records as Pairs. With a prompt field, the prompt is read from it;
    without (`prompt_field=""`, HH-RLHF as Anthropic publishes it) chosen and rejected are whole
    dialogues, each cut after its last `\\n\\nAssistant:`; a record whose two cuts leave different
    prompts is not a pair over one prompt and is skipped (counted), one with no marker is refused.
    A record with an empty prompt or an empty response is skipped too."""
    out, skipped = [], 0
    for i, r in enumerate(records):
        at = f"{what} record {i}"
        chosen = _response_text(r[chosen_field], at, chosen_field)
        rejected = _response_text(r[rejected_field], at, rejected_field)
        if prompt_field:
            prompt = r[prompt_field]
        else:
            cut_c, cut_r = split_dialogue(chosen), split_dialogue(rejected)
            if cut_c is None or cut_r is None:
                field = chosen_field if cut_c is None else rejected_field
                raise ValueError(f"{at}: field {field!r} has no {HH_MARKER!r} to split the prompt off (prompt_field='' "
                                 f"reads HH-RLHF dialogues); name the prompt field with prompt_field")
            if cut_c[0] != cut_r[0]:
                skipped += 1
                continue
            prompt, chosen, rejected = cut_c[0], cut_c[1], cut_r[1]
        if not prompt.strip() or not chosen.strip() or not rejected.strip():
            skipped += 1
            continue
        out.append(Pair(prompt, chosen, rejected))
    return out, skipped
