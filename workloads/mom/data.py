"""Data: multi-query associative recall (MQAR, as in Zoology) generated locally, and the byte corpus.

An MQAR sequence of length T with P key-value pairs: the context k_1 v_1 ... k_P v_P (or, with
order 'vk', v_1 k_1 ... v_P k_P; keys distinct,
drawn from the lower half of the vocabulary without token 0; values from the upper half, with
repeats), then T - 2P query tokens, blank (0) except for the P keys, each queried once, at distinct
even offsets chosen uniformly [Zoology draws the offsets from a power law favouring short gaps].
The target at a query position is its key's value; every other position is ignored (-100).

The language-model data is the shared LM corpus (`components.lm.corpus`, the one celerity_lm
reads): the Python standard library's source or a folder of text files (bytes), split by a hash of
each file's path, or a tokenized dataset folder (token-id shards, `components.lm.tokens`).
"""

from __future__ import annotations

import numpy as np
import torch

from components.lm.corpus import BatchSampler, check_data, data_vocab, heldout_batches, load_corpus, load_data

__all__ = ["BatchSampler", "check_data", "data_vocab", "heldout_batches", "load_corpus", "load_data", "generator",
           "key_count", "mqar", "IGNORE"]

ORDERS = ("vk", "kv")
"""Order within a context pair: value then key, or key then value (Zoology's)."""
IGNORE = -100
"""Target of the positions that are not queries (CrossEntropyLoss's ignore_index)."""


def generator(seed: int, *stream: int) -> torch.Generator:
    """A CPU generator for one (seed, stream...): independent streams of one seed, the same on every device."""
    state = np.random.SeedSequence([seed, *stream]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


def key_count(vocab: int) -> int:
    """Distinct keys a vocabulary offers: its lower half without the blank token 0."""
    return vocab // 2 - 1


def mqar(
    batch: int, seq_len: int, pairs: int | tuple[int, int], vocab: int, gen: torch.Generator, order: str = "kv",
) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets), both [batch, seq_len] int64; `pairs` is P, or (low, high) to draw P per
    sequence uniformly from low..high; `order` is 'kv' (k_i v_i) or 'vk' (v_i k_i) within a context
    pair. Needs 4P <= seq_len and P <= key_count(vocab)."""
    low, high = (pairs, pairs) if isinstance(pairs, int) else pairs
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    if not 1 <= low <= high or 4 * high > seq_len or high > key_count(vocab):
        raise ValueError(
            f"MQAR needs 1 <= pairs, 4 * pairs <= seq_len={seq_len} and pairs <= {key_count(vocab)} keys "
            f"(vocab={vocab}); got pairs={pairs}"
        )
    B, T = batch, seq_len
    p = torch.randint(low, high + 1, (B,), generator=gen)  # [B] pairs per sequence
    active = torch.arange(high)[None, :] < p[:, None]  # [B, high]
    keys = torch.rand(B, key_count(vocab), generator=gen).argsort(dim=1)[:, :high] + 1  # distinct per row
    values = torch.randint(vocab // 2, vocab, (B, high), generator=gen)
    # Query slots: P distinct even offsets in the query region [2P, T), in random order.
    slots = (T - 2 * p) // 2  # [B]
    score = torch.rand(B, T // 2, generator=gen).masked_fill(torch.arange(T // 2)[None, :] >= slots[:, None], 2.0)
    slot = score.argsort(dim=1)[:, :high]
    query_pos = 2 * p[:, None] + 2 * slot
    trash = T  # writes of inactive pairs land in an extra column that is cut off
    pos = torch.arange(high)[None, :].expand(B, high)
    inputs = torch.zeros(B, T + 1, dtype=torch.long)
    targets = torch.full((B, T + 1), IGNORE, dtype=torch.long)
    first, second = (keys, values) if order == "kv" else (values, keys)
    inputs.scatter_(1, torch.where(active, 2 * pos, trash), first)
    inputs.scatter_(1, torch.where(active, 2 * pos + 1, trash), second)
    inputs.scatter_(1, torch.where(active, query_pos, trash), keys)
    targets.scatter_(1, torch.where(active, query_pos, trash), values)
    return inputs[:, :T], targets[:, :T]
