"""Answer-masked batches for fine-tuning a causal LM on `prompt answer` pairs.

The loss is the next-token loss of the answer's tokens only, so the same code serves a word-level
tokenizer (one answer token) and a sub-word one (several).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class AnswerBatch:
    ids: torch.Tensor
    """[N, T] right-padded token ids"""
    mask: torch.Tensor
    """[N, T] attention mask"""
    labels: torch.Tensor
    """[N, T] the answer tokens' ids, -100 elsewhere (aligned with ids: shifted at the loss)"""

    def __len__(self) -> int:
        return self.ids.shape[0]

    def rows(self, index: torch.Tensor) -> "AnswerBatch":
        return AnswerBatch(self.ids[index], self.mask[index], self.labels[index])

    def to(self, device: torch.device) -> "AnswerBatch":
        return AnswerBatch(self.ids.to(device), self.mask.to(device), self.labels.to(device))


def encode_answers(pairs: list[tuple[str, str]], tokenizer: Any) -> AnswerBatch:
    """Right-padded ids of `prompt answer` for each (prompt, answer), labels on the answer tokens.
    Raises ValueError when the tokenizer does not keep the prompt's tokens as a prefix."""
    rows, starts = [], []
    for prompt_text, answer in pairs:
        prompt = tokenizer(prompt_text).input_ids
        full = tokenizer(f"{prompt_text} {answer}").input_ids
        if full[: len(prompt)] != prompt or len(full) == len(prompt):
            raise ValueError(f"the tokenizer does not keep {prompt_text!r} as a prefix of its answer's text; "
                             f"cannot tell the answer tokens apart")
        rows.append(full)
        starts.append(len(prompt))
    width = max(map(len, rows))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0  # padding is masked out
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (r, s) in enumerate(zip(rows, starts)):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
        labels[i, s: len(r)] = torch.tensor(r[s:])
    return AnswerBatch(ids, mask, labels)


def answer_loss(model: Any, batch: AnswerBatch) -> torch.Tensor:
    """Mean next-token cross-entropy over the answer tokens."""
    logits = model(input_ids=batch.ids, attention_mask=batch.mask).logits  # [N, T, V]
    return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), batch.labels[:, 1:].flatten())


@torch.no_grad()
def answer_metrics(model: Any, batch: AnswerBatch, chunk: int = 256) -> dict[str, float]:
    """Answer-token loss and exact-answer accuracy (every answer token greedy-correct), `chunk`
    rows at a time."""
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
