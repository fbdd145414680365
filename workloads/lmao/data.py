"""lmao's tasks, as answer-masked batches: the built-in high-rank task, a random bijection pi over
a set of words (a -> pi(a)), and classification through the LM from a task file (SST-2 and the like).

Learning n unrelated input-output pairs needs an update of rank about n in the map from the
input token's representation to the output logits: more than a rank-1 LoRA on q and v can hold.
The words come from the base world's vocabulary (tiny-local: one token each); with a sub-word
tokenizer an answer may span several tokens, and the loss covers them all.
"""

from __future__ import annotations

import functools
import random
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from components.basemodel import TaskFileError, check_records, corpus, read_records
from components.basemodel.answers import AnswerBatch as Batch
from components.basemodel.answers import answer_loss, encode_answers
from components.basemodel.answers import answer_metrics as evaluate

__all__ = [
    "POOLS", "Batch", "Choices", "answer_loss", "bijection", "check_task", "choice_metrics", "encode", "encode_choices",
    "encode_labelled", "evaluate", "read_task", "split_task", "task_fields", "template_fields", "trim",
]

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


# --- classification through the LM, from a task file ---------------------------------------------
#
# As MeZO and LMAO classify with a causal LM: each record becomes a prompt (a template around its
# text fields) and each label a verbalizer word; the training loss is the answer-token loss of the
# record's own label word after the prompt, and the prediction is the label word the model scores
# highest (mean log-probability of its tokens, MeZO's rule), so a word of several sub-word tokens
# competes on equal terms with a one-token word.


@dataclass
class Choices:
    """Every (prompt, label word) pair of some records, record-major: row i * C + c is record i
    followed by label word c; `labels` holds each record's true label."""

    batch: Batch
    labels: torch.Tensor
    """[N] each record's label, an index into the label words"""
    n_choices: int

    def to(self, device: torch.device) -> "Choices":
        return Choices(self.batch.to(device), self.labels.to(device), self.n_choices)


def template_fields(template: str) -> list[str]:
    """The record fields a prompt template names (`{sentence} It was` -> ['sentence']). Raises
    ValueError for a malformed template, one with none, or one with an index, attribute or format spec."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ValueError(f"template={template!r} is not a format string ({exc}): write it as e.g. "
                         f"'{{sentence}} It was'") from None
    names = []
    for _, name, spec, conv in parsed:
        if name is None:
            continue
        if not name.isidentifier() or spec or conv:
            raise ValueError(f"template={template!r}: {{{name}}} must name a record field plainly, as {{sentence}} "
                             f"(no index, attribute, format spec or conversion)")
        names.append(name)
    if not names:
        raise ValueError(f"template={template!r} names no record field: write the text field in braces, e.g. "
                         f"'{{sentence}} It was'")
    return list(dict.fromkeys(names))


def task_fields(template: str, label_field: str) -> dict[str, type]:
    """The fields every task record must have: the template's text fields (strings) and the label (integer)."""
    fields: dict[str, type] = {name: str for name in template_fields(template)}
    fields[label_field] = int
    return fields


def prompt(template: str, record: dict[str, Any]) -> str:
    """The template filled with the record's fields, each stripped of surrounding white space."""
    return template.format(**{k: v.strip() if isinstance(v, str) else v for k, v in record.items()})


def read_task(path: str, split: str, template: str, label_field: str, n_labels: int,
              what: str = "task_path") -> list[tuple[str, int]]:
    """(prompt, label) per record of a JSONL file or save_to_disk folder; a record whose label is
    not in [0, n_labels) (e.g. GLUE's unlabelled test rows, -1) is refused naming the row."""
    fields = task_fields(template, label_field)
    rows = read_records(path, fields, split=split, what=what)
    out = []
    for i, record in enumerate(rows):
        label = record[label_field]
        if not 0 <= label < n_labels:
            raise TaskFileError(f"{what}={path!r} record {i} (split {split!r}): field {label_field!r} is {label}, not "
                                f"a label in [0, {n_labels}) (one per label word)")
        out.append((prompt(template, record), label))
    return out


def check_task(path: str, split: str, template: str, label_field: str, n_labels: int, what: str = "task_path") -> None:
    """`preflight`'s check of a task file: the fields there and typed (`check_records`), then every
    record read and its label checked (remembered per file version: a sweep's trials share files)."""
    check_records(path, task_fields(template, label_field), split=split, what=what)
    target = Path(path).expanduser()
    stamp = max((f.stat().st_mtime_ns for f in [target, *target.rglob("*")]), default=0)
    _checked(path, stamp, split, template, label_field, n_labels, what)


@functools.lru_cache(maxsize=32)
def _checked(path: str, stamp: int, split: str, template: str, label_field: str, n_labels: int, what: str) -> None:
    read_task(path, split, template, label_field, n_labels, what)


def sample(rows: list[Any], n: int, seed: int, salt: str) -> list[Any]:
    """n rows drawn without replacement from `seed` (all of them, shuffled, when n is 0 or at least len(rows))."""
    rng = random.Random(f"lmao-{salt}-{seed}")
    picked = list(rows)
    rng.shuffle(picked)
    return picked[:n] if n else picked


def split_task(train: list[Any], held: list[Any] | None, *, eval_frac: float, n_train: int, n_eval: int,
               seed: int) -> tuple[list[Any], list[Any]]:
    """(training records, evaluation records): from a separate evaluation file when `held` is given,
    else a seeded `eval_frac` of `train` held out; then `n_train` and `n_eval` drawn from each (0: all)."""
    if held is None:
        shuffled = sample(train, 0, seed, "holdout")
        cut = max(1, round(len(shuffled) * eval_frac))
        if cut >= len(shuffled):
            raise ValueError(f"eval_frac={eval_frac} of {len(shuffled)} records leaves none to train on")
        held, train = shuffled[:cut], shuffled[cut:]
    return sample(train, n_train, seed, "train"), sample(held, n_eval, seed, "eval")


def encode_labelled(rows: list[tuple[str, int]], words: tuple[str, ...], tokenizer: Any) -> Batch:
    """`prompt word` rows, the record's own label word as the answer."""
    return encode_answers([(p, words[label]) for p, label in rows], tokenizer)


def encode_choices(rows: list[tuple[str, int]], words: tuple[str, ...], tokenizer: Any) -> Choices:
    """Every record followed by every label word (record-major), for scoring the label words."""
    batch = encode_answers([(p, w) for p, _ in rows for w in words], tokenizer)
    return Choices(batch, torch.tensor([label for _, label in rows], dtype=torch.long), len(words))


def trim(batch: Batch) -> Batch:
    """The batch without the padding columns none of its rows reaches (right padding)."""
    width = int(batch.mask.sum(dim=1).max())
    if width == batch.ids.shape[1]:
        return batch
    return Batch(batch.ids[:, :width], batch.mask[:, :width], batch.labels[:, :width])


@torch.no_grad()
def row_nll(model: Any, batch: Batch, chunk: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed answer-token NLL, answer-token count) per row, `chunk` rows per forward; the
    log-softmax is taken at the answer positions only (a large vocabulary's logits are not kept in float32)."""
    sums, counts = [], []
    for start in range(0, len(batch), chunk):
        b = trim(batch.rows(torch.arange(start, min(start + chunk, len(batch)), device=batch.ids.device)))
        logits = model(input_ids=b.ids, attention_mask=b.mask).logits[:, :-1]
        target = b.labels[:, 1:]
        keep = target != -100
        nll = torch.nn.functional.cross_entropy(logits[keep].float(), target[keep], reduction="none")
        row = keep.nonzero()[:, 0]
        sums.append(torch.zeros(len(b), dtype=torch.float32, device=nll.device).index_add_(0, row, nll))
        counts.append(keep.sum(dim=1))
    return torch.cat(sums), torch.cat(counts)


@torch.no_grad()
def choice_metrics(model: Any, choices: Choices, chunk: int = 64) -> dict[str, float]:
    """The true label word's answer-token loss (per token, over all records) and the accuracy of
    the argmax over the label words' mean log-probabilities."""
    sums, counts = row_nll(model, choices.batch, chunk)
    sums, counts = sums.view(-1, choices.n_choices), counts.view(-1, choices.n_choices)
    pred = (-sums / counts.clamp(min=1)).argmax(dim=1)
    true_sum = sums.gather(1, choices.labels[:, None]).sum()
    true_count = counts.gather(1, choices.labels[:, None]).sum()
    return {"loss": float(true_sum / true_count.clamp(min=1)), "acc": float((pred == choices.labels).float().mean())}
