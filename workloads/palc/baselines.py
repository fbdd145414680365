"""The test-time alignment baselines PALC is compared with, on the same frozen base, the same
training pairs and the same held-out prompts: a Bradley-Terry reward model, best-of-N sampling
scored by it, and reward-guided decoding in the style of ARGS.

- Reward model: a linear head r(x, y) = w . h + b on the frozen base's last hidden state h at the
  response's last token (`pool='last'`, the usual reward-model head; `pool='mean'`: h averaged over
  the response tokens' positions), fitted with the Bradley-Terry loss
  -log sigmoid(r(x, y_w) - r(x, y_l)) (Bradley & Terry 1952; the reward model of Ouyang et al.
  2022 with a frozen trunk) on the pairs PALC trains on.
- Best-of-N (e.g. Stiennon et al. 2020; Nakano et al. 2021): N samples of the base at temperature
  1 per prompt, the one of highest reward kept. The reward reads a sample up to its first '.',
  where the generation metric stops reading too.
- ARGS (Khanov, Burapacheep, Li, "ARGS: Alignment as Reward-Guided Search", ICLR 2024), its greedy
  variant: at each step the base's top-k next tokens v are re-scored by logit(v) + w r(x, y_<t v),
  the reward of the prefix continued by v, and the highest score is taken. w = 0 is greedy decoding
  of the base. The paper's HH-RLHF settings are k = 10, w = 1.5.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from workloads.palc.data import Pair, pair_batch
from workloads.palc.model import generate


class RewardHead(nn.Module):
    """r = w . pooled h + b: H + 1 parameters on the frozen base's last hidden state."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.lin = nn.Linear(hidden, 1)
        nn.init.zeros_(self.lin.weight)
        nn.init.zeros_(self.lin.bias)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:  # [N, H] -> [N]
        return self.lin(pooled.float()).squeeze(-1)


@torch.no_grad()
def pooled_features(base: nn.Module, tok: Any, pairs: list[Pair], max_len: int, dev: torch.device,
                    chunk: int = 256, pool: str = "last") -> torch.Tensor:
    """[2, N, H]: each response's last hidden state at its last token ('last') or averaged over its
    token positions ('mean'), chosen then rejected."""
    out = []
    for i in range(0, len(pairs), chunk):
        piece = pairs[i: i + chunk]
        b = {k: v.to(dev) for k, v in pair_batch(tok, piece, max_len).items()}
        h = base(input_ids=b["ids"], attention_mask=b["attn"], output_hidden_states=True).hidden_states[-1].float()
        mask = torch.zeros_like(b["resp"])
        mask[:, 1:] = b["resp"][:, :-1]  # resp marks the positions *before* response tokens
        pooled = _pool(h, mask, pool)
        n = len(piece)
        out.append(torch.stack([pooled[:n], pooled[n:]]))
    return torch.cat(out, dim=1)


@torch.enable_grad()
def fit_reward(features: torch.Tensor, steps: int, lr: float, weight_decay: float, seed: int) -> RewardHead:
    """A Bradley-Terry fit of a RewardHead on [2, N, H] features (chosen, rejected): full-batch AdamW."""
    torch.manual_seed(seed)
    head = RewardHead(features.shape[-1]).to(features.device)
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=weight_decay)
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = -nn.functional.logsigmoid(head(features[0]) - head(features[1])).mean()
        loss.backward()
        opt.step()
    head.eval()
    for p in head.parameters():
        p.requires_grad_(False)
    return head


@torch.no_grad()
def reward_accuracy(head: RewardHead, features: torch.Tensor) -> tuple[float, float]:
    """(share of pairs whose chosen response the head scores higher, mean reward margin)."""
    d = head(features[0]) - head(features[1])
    return float((d > 0).float().mean()), float(d.mean())


def _pool(h: torch.Tensor, mask: torch.Tensor, pool: str) -> torch.Tensor:
    """[N, T, H] hidden states, [N, T] response positions (contiguous) -> [N, H]."""
    if pool == "last":
        last = (mask.long() * torch.arange(mask.shape[1], device=mask.device)).max(1).values
        return h[torch.arange(h.shape[0], device=h.device), last]
    if pool != "mean":
        raise ValueError(f"pool={pool!r}: choose 'last' or 'mean'")
    m = mask.float().unsqueeze(-1)
    return (h * m).sum(1) / m.sum(1).clamp_min(1)


def until_stop(tokens: torch.Tensor, stop_id: int | None) -> torch.Tensor:
    """[N, T] bool: the generated positions up to and including the first `stop_id` (all without one)."""
    if stop_id is None:
        return torch.ones_like(tokens, dtype=torch.bool)
    hit = (tokens == stop_id).long()
    before = hit.cumsum(1) - hit  # stops strictly before each position
    return before == 0


@torch.no_grad()
def score_samples(base: nn.Module, head: RewardHead, prompts: torch.Tensor, samples: torch.Tensor,
                  stop_id: int | None, pool: str = "last") -> torch.Tensor:
    """Reward [N] of each prompt row [N, T0] continued by its sample [N, T] (read up to its first stop)."""
    ids = torch.cat([prompts, samples], dim=1)
    h = base(input_ids=ids, output_hidden_states=True).hidden_states[-1].float()[:, prompts.shape[1]:]
    return head(_pool(h, until_stop(samples, stop_id), pool))


@torch.no_grad()
def best_of_n(base: nn.Module, head: RewardHead, ids: torch.Tensor, n: int, new_tokens: int,
              generator: torch.Generator, stop_id: int | None, pool: str = "last") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(chosen continuation [P, T], all samples [P, n, T], their rewards [P, n]) for prompts [P, T0]."""
    rows = ids.repeat_interleave(n, 0)
    samples = generate(base, None, rows, new_tokens, generator=generator)
    rewards = score_samples(base, head, rows, samples, stop_id, pool).view(ids.shape[0], n)
    samples = samples.view(ids.shape[0], n, -1)
    best = rewards.argmax(1)
    return samples[torch.arange(ids.shape[0]), best], samples, rewards


@torch.no_grad()
def args_decode(base: nn.Module, head: RewardHead, ids: torch.Tensor, new_tokens: int, k: int, w: float,
                pool: str = "last") -> torch.Tensor:
    """ARGS-greedy: [P, T] tokens after equal-length prompts [P, T0]. Each step feeds the k
    candidates of every row in one KV-cached forward (the cache repeated k times), scores them by
    logit + w * reward of the prefix continued by the candidate (the head on the candidate's hidden
    state, or with pool='mean' on the mean over the response's, the candidate's included), keeps the
    best row per prompt."""
    o = base(input_ids=ids, use_cache=True)
    past, logits = o.past_key_values, o.logits[:, -1].float()
    p = ids.shape[0]
    total = torch.zeros(p, head.lin.in_features, device=ids.device)
    out = []
    for t in range(new_tokens):
        vals, cand = logits.topk(k, dim=-1)  # [P, k], descending
        past.batch_repeat_interleave(k)
        o = base(input_ids=cand.reshape(-1, 1), past_key_values=past, use_cache=True, output_hidden_states=True)
        h = o.hidden_states[-1][:, -1].float()  # [P k, H]
        feat = h if pool == "last" else (total.repeat_interleave(k, 0) + h) / (t + 1)
        reward = head(feat).view(p, k)
        pick = (vals + w * reward).argmax(1)
        rows = torch.arange(p, device=ids.device) * k + pick
        past = o.past_key_values
        past.batch_select_indices(rows)
        logits = o.logits[rows, -1].float()
        total = total + h[rows]
        out.append(cand[torch.arange(p, device=ids.device), pick].unsqueeze(1))
    return torch.cat(out, dim=1)
