"""Which module kinds get LoRA, and at which ranks, so that every compared placement trains the
same number of parameters.

A LoRA adapter of rank r on a linear d_in -> d_out trains r (d_in + d_out) parameters. A
placement gives each of its module types one rank (the same in every layer), so its count is
sum_t r_t c_t with c_t = sum over the modules of type t of (d_in + d_out). Counts of different
placements are equal only on common multiples of their costs' divisors, so uniform ranks rarely
match: `match_ranks` lets each type's rank move up to `window` away from its placement's uniform
rank and picks the count every placement reaches exactly, with the most uniform ranks (smallest
largest-minus-smallest rank), then the count nearest the target. Every type of a placement has
rank >= 1, so the target is first raised to the largest count a placement has at all ranks 1.
When no count is common, each placement takes its nearest count and the difference is reported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from components.basemodel import projections
from workloads.plop.nfn import select

PLACEMENTS = ("plop", "plop_inverse", "attention", "mlp", "all")
"""'plop': the `n_types` kinds of lowest NFN (the paper's rule); 'plop_inverse': the highest
(PLoP^-1, the paper's sanity control); 'attention': every kind inside the attention block;
'mlp': every kind inside the MLP block (or the kinds a config names for either); 'all': every
projection kind of the model (the common "all linear layers" LoRA default, PEFT's
target_modules="all-linear", from "QLoRA: Efficient Finetuning of Quantized LLMs",
https://arxiv.org/abs/2305.14314, which found LoRA on every linear layer needed to match full
fine-tuning; the third usual placement the headline compares PLoP with)."""

BLOCK_WORDS = {"attention": ("attn", "attention"), "mlp": ("mlp", "ffn", "feed_forward")}
"""A projection is in the attention (MLP) block when the module holding it is named with one of
these words: Llama/Qwen `self_attn`/`mlp`, GPT-2 `attn`/`mlp`, GPT-NeoX `attention`. A model whose
projections sit elsewhere (OPT's fc1/fc2 in the layer itself) names its kinds in the config."""


def type_costs(model: torch.nn.Module) -> dict[str, int]:
    """Module kind -> LoRA parameters per unit of rank, summed over the layers."""
    costs: dict[str, int] = {}
    for p in projections(model).values():
        costs[p.kind] = costs.get(p.kind, 0) + p.in_features + p.out_features
    return costs


def block_types(model: torch.nn.Module, block: str) -> list[str]:
    """The projection kinds inside the attention ('attention') or MLP ('mlp') blocks, in
    first-seen order: those whose parent module's name has a word of BLOCK_WORDS[block]."""
    words = BLOCK_WORDS[block]
    out: dict[str, None] = {}
    for name, p in projections(model).items():
        parent = name.rsplit(".", 1)[0].rsplit(".", 1)[-1]
        if any(w in parent for w in words):
            out.setdefault(p.kind, None)
    if not out:
        raise ValueError(f"no linear projection of this model sits in a module named like {' or '.join(map(repr, words))}; "
                         f"placement {block!r} needs one: name its kinds in the config ({block}_kinds)")
    return list(out)


def placement_types(placement: str, model: torch.nn.Module, type_scores: dict[str, float], n_types: int,
                    fixed: dict[str, tuple[str, ...]] | None = None) -> list[str]:
    """The kinds `placement` puts LoRA on; `fixed` (placement -> kinds) replaces the attention /
    MLP blocks' kinds found by name."""
    if placement == "plop":
        return select(type_scores, n_types, rule="lowest")
    if placement == "plop_inverse":
        return select(type_scores, n_types, rule="highest")
    if placement in ("attention", "mlp"):
        named = (fixed or {}).get(placement)
        return list(named) if named else block_types(model, placement)
    if placement == "all":
        return list(type_costs(model))  # every kind the scorer sees, so PLoP's choice is a subset of it
    raise ValueError(f"unknown placement {placement!r}; choose among {', '.join(PLACEMENTS)}")


@dataclass(frozen=True)
class Match:
    """The ranks of every compared placement and what they train."""

    target: int
    """What the counts aim for: PLoP's count at the nominal uniform rank, raised to the largest
    count of a placement at all ranks 1 when that is more."""
    ranks: dict[str, dict[str, int]]
    """placement -> module type -> rank"""
    counts: dict[str, int]
    """placement -> trainable LoRA parameters"""

    @property
    def exact(self) -> bool:
        return len(set(self.counts.values())) == 1

    @property
    def max_rel_diff(self) -> float:
        """(largest - smallest count) / smallest: 0 when the counts are equal."""
        return (max(self.counts.values()) - min(self.counts.values())) / min(self.counts.values())


def reachable(costs: list[int], target: float, window: int) -> dict[int, tuple[int, ...]]:
    """Count -> the rank vector reaching it with the smallest spread (max - min rank), then the
    smallest total distance from the uniform rank `target / sum(costs)`; ranks >= 1 and within
    `window` of that uniform rank. Exact: a dynamic programme over (count, min rank, max rank)."""
    uniform = target / sum(costs)
    lo = max(1, math.floor(uniform) - window)
    options = range(lo, max(lo, math.ceil(uniform)) + window + 1)
    # state (count, min rank, max rank) -> (distance from uniform, ranks)
    states: dict[tuple[int, int, int], tuple[float, tuple[int, ...]]] = {(0, 10**9, -1): (0.0, ())}
    for c in costs:
        nxt: dict[tuple[int, int, int], tuple[float, tuple[int, ...]]] = {}
        for (count, rmin, rmax), (dist, ranks) in states.items():
            for r in options:
                key = (count + r * c, min(rmin, r), max(rmax, r))
                cand = (dist + abs(r - uniform), ranks + (r,))
                if key not in nxt or cand < nxt[key]:
                    nxt[key] = cand
        states = nxt
    best: dict[int, tuple[tuple[int, float], tuple[int, ...]]] = {}
    for (count, rmin, rmax), (dist, ranks) in states.items():
        score = (rmax - rmin, dist)
        if count not in best or score < best[count][0]:
            best[count] = (score, ranks)
    return {count: ranks for count, (_, ranks) in best.items()}


def match_ranks(costs: dict[str, int], placements: dict[str, list[str]], target: int, window: int) -> Match:
    """Ranks for every placement (name -> its types) so that all train the same parameter count,
    near `target` (see the module docstring)."""
    target = max(target, *(sum(costs[t] for t in types) for types in placements.values()))
    options = {p: reachable([costs[t] for t in types], target, window) for p, types in placements.items()}
    common = set.intersection(*(set(o) for o in options.values()))

    def spread(p: str, count: int) -> int:
        r = options[p][count]
        return max(r) - min(r)

    if common:
        count = min(common, key=lambda n: (max(spread(p, n) for p in options), abs(n - target), n))
        chosen = {p: count for p in options}
    else:  # no common count in the window: each placement as near the target as it gets
        chosen = {p: min(o, key=lambda n: (abs(n - target), spread(p, n), n)) for p, o in options.items()}
    ranks = {p: dict(zip(placements[p], options[p][n])) for p, n in chosen.items()}
    return Match(target=target, ranks=ranks, counts=chosen)
