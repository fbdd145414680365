"""The text scenario: a tiny autoregressive byte model as the frozen generator and the NLL metric.

The model predicts the next byte from the previous `context` bytes (an embedding per position,
one tanh hidden layer: a neural n-gram, small enough to train in seconds on one core). It is
trained on the training part of the byte corpus that celerity_lm reads (the Python standard
library's source, split by file), then frozen. A text is `text_len` bytes that start a line;
its metric value is the model's negative log-likelihood per byte given the bytes before it
(generated texts start from a context of newlines, which is what they were generated from), the
GPT-2-scores-its-own-generations setting of the paper's text experiment.

Deployed ("real") texts come from the held-out files, never seen in training, and the
generator's texts are its own samples at `temperature`: the prior is misspecified twice, by the
model's errors and by the file shift.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from components.lm.corpus import load_corpus

NEWLINE = 10


class ByteModel(torch.nn.Module):
    def __init__(self, context: int, embed: int, hidden: int) -> None:
        super().__init__()
        self.context = context
        self.embed = torch.nn.Embedding(256, embed)
        self.hidden = torch.nn.Linear(context * embed, hidden)
        self.out = torch.nn.Linear(hidden, 256)

    def forward(self, ctx: torch.Tensor) -> torch.Tensor:
        """Next-byte logits from contexts [..., context] -> [..., 256]."""
        return self.out(torch.tanh(self.hidden(self.embed(ctx).flatten(-2))))


def corpus(heldout_frac: float, max_bytes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(training bytes, held-out bytes) of the standard-library corpus, as int64 tensors."""
    train, held = load_corpus("stdlib", heldout_frac=heldout_frac, max_bytes=max_bytes)
    return torch.from_numpy(train.astype(np.int64)), torch.from_numpy(held.astype(np.int64))


def training_batch(data: torch.Tensor, context: int, batch: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(contexts [batch, context], next bytes [batch]) at random positions."""
    pos = torch.randint(context, len(data), (batch,), generator=gen)
    return data[pos[:, None] + torch.arange(-context, 0)], data[pos]


def real_texts(data: torch.Tensor, context: int, length: int, count: int, gen: torch.Generator) -> torch.Tensor:
    """Windows [count, context + length]: `length` bytes starting a line, with the bytes before them.

    Distinct line starts at least `length` apart, so no two texts share a byte; fewer than
    `count` when the data hold fewer.
    """
    starts = torch.nonzero(data[context - 1 : len(data) - length] == NEWLINE).squeeze(1) + context
    keep, last = [], -length
    for s in starts.tolist():  # greedy thinning keeps the texts disjoint
        if s - last >= length:
            keep.append(s)
            last = s
    keep_t = torch.tensor(keep, dtype=torch.long)
    keep_t = keep_t[torch.randperm(len(keep_t), generator=gen)[:count]]
    return data[keep_t[:, None] + torch.arange(-context, length)]


@torch.no_grad()
def generate(model: ByteModel, count: int, length: int, temperature: float, gen: torch.Generator) -> torch.Tensor:
    """Windows [count, context + length] sampled from the model after a context of newlines."""
    c = model.context
    out = torch.full((count, c + length), NEWLINE, dtype=torch.long)
    for t in range(length):
        probs = torch.softmax(model(out[:, t : t + c]) / temperature, dim=-1)
        out[:, c + t] = torch.multinomial(probs, 1, generator=gen).squeeze(1)
    return out


@torch.no_grad()
def nll_per_byte(model: ByteModel, windows: torch.Tensor, batch: int = 512) -> torch.Tensor:
    """Mean NLL (nats) of each window's last bytes given the bytes before them, [N]."""
    c = model.context
    length = windows.shape[1] - c
    idx = torch.arange(length)[:, None] + torch.arange(c)[None, :]  # [L, c]
    out = []
    for i in range(0, len(windows), batch):
        w = windows[i : i + batch]
        logp = F.log_softmax(model(w[:, idx]), dim=-1)  # [b, L, 256]
        out.append(-logp.gather(-1, w[:, c:, None]).squeeze(-1).mean(-1))
    return torch.cat(out)
