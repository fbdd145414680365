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
"""

from __future__ import annotations

import random
from typing import Any

import torch

from orchestrator.basemodel import Example, World
from orchestrator.basemodel.corpus import RELATIONS, arithmetic_example

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
