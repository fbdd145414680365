"""plop's downstream tasks, built from the base world's vocabulary, and their encoding.

Every task asks for something in a form pre-training never showed, so the base model cannot
already do it (its held-out accuracy is reported as `eval/base_acc`):

- `attr_query`: `question : pet of ada ? answer` -> `cat`. The facts are the world's entity
  attributes (home, color, pet, job, topic), which the base model knows from its sentences; the
  question form is new. The held-out set is whole entities: a held-out entity's questions were
  never asked in fine-tuning, so answering them means routing the new form to knowledge the base
  already holds.
- `fact_query`: `question : code of bax ? answer` -> `meloru`, over the key-value facts the base
  saw in pre-training, held out by key.
- `sub_mod`, `mul_mod`: `a - b mod p =` / `a * b mod p =` -> `c` (pre-training only showed `+`),
  held out by (a, b) pair.

A task can also come from a file (`task_path`): supervised fine-tuning data as `prompt` / `answer`
records (field names configurable: MetaMathQA's `query` / `response`, GSM8K's `question` /
`answer`) in a JSONL file or a datasets `save_to_disk` folder, read by `file_split`. The held-out
set is a separate file (`eval_path`, e.g. GSM8K's test split after MetaMathQA) or a seeded
fraction of the records.

Encoding works with any tokenizer: the input is `prompt answer` (with the tokenizer's own
`<bos>` when it adds one), the targets are the tokens after the prompt's tokens. A task's answer
may take several tokens under a subword tokenizer; accuracy is the exact match of all of them.
"""

from __future__ import annotations

import random
from typing import Any

import torch

from components.basemodel.answers import encode_answers
from components.basemodel.corpus import Example, World, arithmetic_example
from components.basemodel.taskfile import read_records

TASKS = ("attr_query", "fact_query", "sub_mod", "mul_mod")
"""The downstream tasks (see the module docstring)."""

QUERY_WORDS = {"city": "home", "color": "color", "pet": "pet", "job": "job", "topic": "topic"}
"""Relation -> the vocabulary word a question names it by (`trait` has no such word)."""


def task_groups(world: World, task: str, modulus: int) -> list[list[Example]]:
    """The task's examples in groups that are split together (an entity's questions, a key, a pair)."""
    if task == "attr_query":
        return [[Example(f"question : {word} of {e} ? answer", world.attributes[e][rel], task)
                 for rel, word in QUERY_WORDS.items()] for e in world.entities]
    if task == "fact_query":
        return [[Example(f"question : code of {k} ? answer", v, task)] for k, v in world.facts.items()
                if k not in world.heldout_keys]
    if task in ("sub_mod", "mul_mod"):
        op = "-" if task == "sub_mod" else "*"
        return [[arithmetic_example(op, a, b, modulus)] for a in range(modulus) for b in range(modulus)]
    raise ValueError(f"unknown task {task!r}; choose among {', '.join(TASKS)}")


def split(world: World, task: str, *, heldout_frac: float, seed: int, modulus: int = 11) -> tuple[list[Example], list[Example]]:
    """(train, heldout) of `task`: groups shuffled by `seed`, `heldout_frac` of them held out."""
    groups = task_groups(world, task, modulus)
    random.Random(f"plop-split-{task}-{seed}").shuffle(groups)
    n_held = max(1, round(heldout_frac * len(groups)))
    if n_held >= len(groups):
        raise ValueError(f"heldout_frac={heldout_frac} leaves no training examples for {task!r}")
    held, train = groups[:n_held], groups[n_held:]
    return [e for g in train for e in g], [e for g in held for e in g]


def file_examples(path: str, prompt_field: str, answer_field: str, *, split: str, what: str) -> list[Example]:
    """The records of a task file as examples (`part` is the file's name)."""
    rows = read_records(path, {prompt_field: str, answer_field: str}, split=split, what=what)
    label = path.rstrip("/").rsplit("/", 1)[-1]
    return [Example(r[prompt_field].strip(), r[answer_field].strip(), label) for r in rows]


def sample(examples: list[Example], limit: int, seed: str) -> list[Example]:
    """`limit` of `examples` drawn without replacement by `seed` (all of them, in order, when limit is 0
    or not smaller)."""
    if not limit or limit >= len(examples):
        return examples
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    return [examples[i] for i in sorted(order[:limit])]


def file_split(task_path: str, *, task_split: str, eval_path: str, eval_split: str, prompt_field: str,
               answer_field: str, eval_prompt_field: str, eval_answer_field: str, heldout_frac: float,
               seed: int, task_limit: int = 0, eval_limit: int = 0) -> tuple[list[Example], list[Example]]:
    """(train, heldout) of a file task: the held-out set is `eval_path` when given, else a fraction
    `heldout_frac` of `task_path`'s records held out by `seed`; `task_limit` / `eval_limit` draw that
    many of each (seeded; 0 keeps all)."""
    records = file_examples(task_path, prompt_field, answer_field, split=task_split, what="task_path")
    if eval_path:
        train = records
        held = file_examples(eval_path, eval_prompt_field or prompt_field, eval_answer_field or answer_field,
                             split=eval_split, what="eval_path")
    else:
        order = list(range(len(records)))
        random.Random(f"plop-split-file-{seed}").shuffle(order)
        n_held = max(1, round(heldout_frac * len(records)))
        if n_held >= len(records):
            raise ValueError(f"task_path={task_path!r} has {len(records)} records: heldout_frac={heldout_frac} leaves "
                             f"none to train on")
        held = [records[i] for i in sorted(order[:n_held])]
        train = [records[i] for i in sorted(order[n_held:])]
    return (sample(train, task_limit, f"plop-train-{seed}"), sample(held, eval_limit, f"plop-eval-{seed}"))


def fits(examples: list[Example], tokenizer: Any, max_tokens: int) -> list[Example]:
    """The examples whose `prompt answer` takes at most `max_tokens` tokens (all when 0)."""
    if not max_tokens:
        return examples
    lengths = tokenizer([f"{e.prompt} {e.answer}" for e in examples], add_special_tokens=True).input_ids
    return [e for e, ids in zip(examples, lengths) if len(ids) <= max_tokens]


def encode(examples: list[Example], tokenizer: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids [N, T] of `prompt answer`, their attention mask [N, T], and the target
    mask [N, T]: True where the token is part of the answer (predicted from the position before)."""
    batch = encode_answers([(e.prompt, e.answer) for e in examples], tokenizer)
    return batch.ids, batch.mask, batch.labels != -100


def answer_loss(logits: torch.Tensor, ids: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean cross-entropy over answer tokens, per-row exact match [N] of the greedy answer)."""
    logits, labels, tmask = logits[:, :-1].float(), ids[:, 1:], target[:, 1:]  # position t predicts t + 1
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels, reduction="none")  # [N, T-1]
    loss = (nll * tmask).sum() / tmask.sum().clamp_min(1)
    wrong = (logits.argmax(-1) != labels) & tmask
    return loss, ~wrong.any(dim=1)


@torch.no_grad()
def evaluate(model: torch.nn.Module, data: tuple[torch.Tensor, torch.Tensor, torch.Tensor], batch: int = 256) -> dict[str, float]:
    """Answer loss (token mean) and exact-match accuracy over an encoded set."""
    was_training = model.training
    model.eval()
    ids, mask, target = data
    dev = next(model.parameters()).device
    nll_sum, tokens, correct = 0.0, 0, 0
    for s in range(0, len(ids), batch):
        width = int(mask[s: s + batch].sum(1).max())  # the chunk's longest row: padding beyond it is never read
        i, m, t = (x[s: s + batch, :width].to(dev) for x in (ids, mask, target))
        loss, exact = answer_loss(model(input_ids=i, attention_mask=m).logits, i, t)
        n = int(t[:, 1:].sum())
        nll_sum += float(loss) * n
        tokens += n
        correct += int(exact.sum())
    model.train(was_training)
    return {"loss": nll_sum / max(tokens, 1), "acc": correct / max(len(ids), 1)}
