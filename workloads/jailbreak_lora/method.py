"""JailbreakLoRA's two optimisation variants for one LoRA over N + 1 task losses, and their baseline.

- `naive`: the plain sum of the task losses (a uniform mixture of the task data);
- `uncertainty` ("loss" variant): sum_n L_n / (2 sigma_n^2) + log(1 + sigma_n^2), with a learnable
  s_n = log sigma_n^2 per task;
- `pcgrad` ("grad" variant): per-task gradients over the LoRA parameters; where two conflict
  (negative inner product), the first loses its component along the second, the other tasks
  visited in a random order per step; the projected gradients are summed;
- `combined`: both at once, which the paper reports as collapsing utility (kept as a measurement);
- `clean`: the naive sum over the benign tasks alone (no trigger task), the clean adapter an audit
  must not flag.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from workloads.jailbreak_lora.data import Example, lm_batch, sample

METHODS = ("naive", "uncertainty", "pcgrad", "combined", "fusion", "clean")


def task_losses(model: Any, tok: Any, loss_sets: list[list[Example]], batch: int, gen: torch.Generator,
                dev: torch.device, *, separate: bool = False, unlikely: int | None = None) -> list[torch.Tensor]:
    """`batch` examples of every task; each task's mean cross-entropy over its answer tokens. One
    forward over all rows, or (`separate`, for per-task gradients) one forward per task, so that a
    task's backward pass traverses only its own rows. With `unlikely` (a token id), rows of task
    'contrast' also add -log(1 - p(unlikely)) at their first answer position, averaged over them."""
    drawn = [sample(ex, batch, gen) for ex in loss_sets]
    groups = [[i] for i in range(len(drawn))] if separate else [list(range(len(drawn)))]
    losses: list[torch.Tensor] = []
    for group in groups:
        rows_ex = [e for i in group for e in drawn[i]]
        b = {k: v.to(dev) for k, v in lm_batch(tok, rows_ex).items()}
        logits = model(input_ids=b["ids"], attention_mask=b["attn"]).logits.float()
        labels = b["labels"][:, 1:]
        per_token = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), labels, reduction="none")
        counted = (labels != -100).float()
        for j in range(len(group)):  # rows of task group[j]: j * batch ... (j + 1) * batch
            rows = slice(j * batch, (j + 1) * batch)
            loss = per_token[rows].sum() / counted[rows].sum()
            contrast = [k for k in range(rows.start, rows.stop) if rows_ex[k].task == "contrast"]
            if unlikely is not None and contrast:
                idx = torch.tensor(contrast, device=dev)
                first = counted[idx].argmax(1)  # first answer position of each contrast row
                p = torch.softmax(logits[idx, first], -1)[:, unlikely]
                loss = loss - torch.log1p(-p.clamp(max=1 - 1e-6)).mean()
            losses.append(loss)
    return losses


class Uncertainty(nn.Module):
    """Learnable per-task s_n = log sigma_n^2 and the weighted total loss."""

    def __init__(self, n: int, regulariser: str = "log1p") -> None:
        super().__init__()
        self.log_var = nn.Parameter(torch.zeros(n))
        self.regulariser = regulariser

    def weights(self) -> torch.Tensor:
        """1 / (2 sigma_n^2) per task."""
        return 0.5 * torch.exp(-self.log_var)

    def penalty(self) -> torch.Tensor:
        # log(1 + sigma^2), the paper's positive variant, vs Kendall et al.'s log sigma^2 (= s_n).
        if self.regulariser == "log1p":
            return torch.nn.functional.softplus(self.log_var).sum()
        return self.log_var.sum()

    def forward(self, losses: Sequence[torch.Tensor]) -> torch.Tensor:
        return (self.weights() * torch.stack(list(losses))).sum() + self.penalty()


def flat_grad(loss: torch.Tensor, params: list[nn.Parameter]) -> torch.Tensor:
    """d loss / d params, flattened into one vector (zeros where a parameter is unused)."""
    grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
    return torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(grads, params)])


def pcgrad(grads: list[torch.Tensor], gen: torch.Generator) -> tuple[torch.Tensor, float]:
    """The PCGrad direction: each task gradient projected off every other it conflicts with (the
    others in a random order), then summed. Also returns the share of task pairs in conflict."""
    n = len(grads)
    conflicts, pairs = 0, 0
    out = torch.zeros_like(grads[0])
    for i in range(n):
        g = grads[i].clone()
        for j in torch.randperm(n, generator=gen).tolist():
            if j == i:
                continue
            dot = torch.dot(g, grads[j])
            pairs += 1
            if dot < 0:
                conflicts += 1
                g -= dot / grads[j].square().sum().clamp_min(1e-20) * grads[j]
        out += g
    return out, conflicts / max(pairs, 1)


def assign(params: list[nn.Parameter], flat: torch.Tensor) -> None:
    """Write a flat gradient vector into the parameters' .grad."""
    offset = 0
    for p in params:
        n = p.numel()
        p.grad = flat[offset: offset + n].view_as(p).clone()
        offset += n


def backward(method: str, losses: list[torch.Tensor], params: list[nn.Parameter], uw: Uncertainty | None,
             gen: torch.Generator) -> dict[str, float]:
    """Set .grad of the LoRA parameters (and of the uncertainty weights) for one step of `method`."""
    if method in ("naive", "clean"):
        torch.stack(losses).sum().backward()
        return {}
    if method == "uncertainty":
        assert uw is not None
        uw(losses).backward()
        return {}
    if method == "pcgrad":
        direction, conflict = pcgrad([flat_grad(l, params) for l in losses], gen)
        assign(params, direction)
        return {"diag/conflict_rate": conflict}
    if method == "combined":
        assert uw is not None
        w = uw.weights()
        direction, conflict = pcgrad([flat_grad(wi.detach() * l, params) for wi, l in zip(w, losses)], gen)
        assign(params, direction)
        # sigma's own gradient from the weighted loss (LoRA parameters get theirs from PCGrad above)
        uw.log_var.grad = torch.autograd.grad(uw([l.detach() for l in losses]), uw.log_var)[0]
        return {"diag/conflict_rate": conflict}
    raise ValueError(f"unknown method {method!r}; choose among {METHODS}")
