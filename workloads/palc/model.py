"""palc's calibration network, the calibrated log-probabilities and decoding, and the checks that
the base model stays as it was."""

from __future__ import annotations

import hashlib
import math
import statistics
import time
from typing import Any, Callable

import torch
from torch import nn

from orchestrator.run import devices


class Calibrator(nn.Module):
    """m_t = W_up act(W_down dropout(h_t)): a per-position calibration of the vocabulary logits
    from the base's last hidden state. No biases: B(H + V) parameters, as the paper counts them."""

    def __init__(self, hidden: int, vocab: int, bottleneck: int, *, relu: bool = True, dropout: float = 0.1,
                 up_init_std: float = 0.01) -> None:
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.down = nn.Linear(hidden, bottleneck, bias=False)
        self.up = nn.Linear(bottleneck, vocab, bias=False)
        self.relu = relu
        nn.init.kaiming_normal_(self.down.weight, nonlinearity="relu" if relu else "linear")
        nn.init.normal_(self.up.weight, std=up_init_std)

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # [..., H] -> [..., V]
        z = self.down(self.drop(h.float()))
        return self.up(torch.relu(z) if self.relu else z)


def freeze(model: nn.Module) -> None:
    """Base parameters take no gradient (the calibrator reads hidden states under no_grad too)."""
    for p in model.parameters():
        p.requires_grad_(False)


def param_digest(model: nn.Module, exclude: str = "") -> str:
    """sha256 over every tensor of the state dict (names and raw bytes), in name order; names
    containing `exclude` (when given, e.g. a LoRA adapter's `lora_`) left out."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        if exclude and exclude in name:
            continue
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


@torch.no_grad()
def base_forward(base: nn.Module, ids: torch.Tensor, attn: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The frozen base's logits [N, T, V] and last hidden states [N, T, H] (after the final norm)."""
    out = base(input_ids=ids, attention_mask=attn, output_hidden_states=True)
    return out.logits.float(), out.hidden_states[-1]


def mean_logprob(logits: torch.Tensor, ids: torch.Tensor, resp: torch.Tensor) -> torch.Tensor:
    """Mean log-probability of the response tokens of each row [N]: position t predicts ids[t+1]."""
    logits, targets, mask = logits[:, :-1], ids[:, 1:], resp[:, :-1].float()
    lp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    return (lp * mask).sum(1) / mask.sum(1).clamp_min(1)


def logprob_sums(logits: torch.Tensor, ids: torch.Tensor, resp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed log-probability of each row's response tokens [N], their count [N])."""
    logits, targets, mask = logits[:, :-1], ids[:, 1:], resp[:, :-1].float()
    lp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    return (lp * mask).sum(1), mask.sum(1).clamp_min(1)


def dpo_loss(policy: torch.Tensor, reference: torch.Tensor, beta: float) -> torch.Tensor:
    """DPO (Rafailov et al. 2023): -log sigmoid(beta ((log pi(y_w) - log ref(y_w)) - (log pi(y_l) -
    log ref(y_l)))), from summed response log-probabilities [2N], rows chosen then rejected."""
    n = policy.shape[0] // 2
    ratio = policy - reference
    return -torch.nn.functional.logsigmoid(beta * (ratio[:n] - ratio[n:])).mean()


def preference_loss(lp: torch.Tensor) -> torch.Tensor:
    """-log sigmoid(mean log pi(y_w|x) - mean log pi(y_l|x)); rows are chosen then rejected.
    Reference-free and without a KL term, as in the paper."""
    n = lp.shape[0] // 2
    return -torch.nn.functional.logsigmoid(lp[:n] - lp[n:]).mean()


@torch.no_grad()
def margins(base: nn.Module, cal: Calibrator, batch: dict[str, torch.Tensor], gammas: list[float]) -> dict[float, torch.Tensor]:
    """gamma -> per-pair margin mean log pi(chosen) - mean log pi(rejected) [N]; one base forward."""
    logits, h = base_forward(base, batch["ids"], batch["attn"])
    m = cal(h)
    n = logits.shape[0] // 2
    out = {}
    for g in gammas:
        lp = mean_logprob(logits + g * m, batch["ids"], batch["resp"])
        out[g] = lp[:n] - lp[n:]
    return out


@torch.no_grad()
def generate(base: nn.Module, cal: Calibrator | None, ids: torch.Tensor, new_tokens: int, gamma: float = 1.0, *,
             generator: torch.Generator | None = None) -> torch.Tensor:
    """KV-cached decoding of `new_tokens` tokens after equal-length prompts `ids` [N, T0]:
    greedy without `generator`, sampling at temperature 1 with it. `cal=None` is the plain base
    (no hidden states asked for); otherwise the logits are l_t + gamma m_t, m_t always computed."""
    past, x, out = None, ids, []
    for _ in range(new_tokens):
        o = base(input_ids=x, past_key_values=past, use_cache=True, output_hidden_states=cal is not None)
        logits = o.logits[:, -1].float()
        if cal is not None:
            logits = logits + gamma * cal(o.hidden_states[-1][:, -1])
        past = o.past_key_values
        if generator is None:
            x = logits.argmax(-1, keepdim=True)
        else:
            x = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)
        out.append(x)
    return torch.cat(out, dim=1)


def _clock(kind: str, device: torch.device) -> Callable[[], float]:
    if kind == "cpu":
        return time.thread_time
    return lambda: devices.clock(device)


def arm_latency(arms: dict[str, Callable[[], Any]], new_tokens: int, reps: int, device: torch.device,
                clock: str) -> dict[str, float]:
    """Per-token decoding time of each arm (one call decodes `new_tokens` for the same prompts) and
    the median of its paired ratios to the 'base' arm's, the arms' order rotating between
    repetitions: a slow drift of the machine's load moves a median of paired ratios much less than a
    ratio of separate medians."""
    tick = _clock(clock, device)
    names = list(arms)
    for f in arms.values():  # warm-up: allocator, kernels, caches
        f()
    times: dict[str, list[float]] = {k: [] for k in names}
    for r in range(reps):
        for name in names[r % len(names):] + names[: r % len(names)]:
            t0 = tick()
            arms[name]()
            times[name].append((tick() - t0) / new_tokens)
    out = {f"{k}_s": statistics.median(v) for k, v in times.items()}
    for k in names:
        if k != "base":
            ratios = [a / b for a, b in zip(times[k], times["base"]) if b > 0]
            out[f"{k}_ratio"] = statistics.median(ratios) if ratios else math.nan
    return out


def latency(base: nn.Module, cal: Calibrator, ids: torch.Tensor, new_tokens: int, reps: int, gamma: float,
            clock: str = "wall") -> dict[str, float]:
    """Per-token decoding time of the base and of PALC on the same prompts, in the same process,
    timed back to back in alternating order (`arm_latency` with the two arms)."""
    lat = arm_latency({"base": lambda: generate(base, None, ids, new_tokens, gamma),
                       "palc": lambda: generate(base, cal, ids, new_tokens, gamma)},
                      new_tokens, reps, ids.device, clock)
    return {"base_s": lat["base_s"], "palc_s": lat["palc_s"], "ratio": lat["palc_ratio"]}


def group_by_length(tokenizer: Any, prompts: list[str]) -> list[torch.Tensor]:
    """Prompts tokenized and grouped into equal-length batches, so decoding needs no padding."""
    groups: dict[int, list[list[int]]] = {}
    for p in prompts:
        ids = tokenizer(p).input_ids
        groups.setdefault(len(ids), []).append(ids)
    return [torch.tensor(rows) for _, rows in sorted(groups.items())]
