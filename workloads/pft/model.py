"""pft: the source model (encoder F, classifier C), the latent translator T and the PFT losses.

The released code's source model is a ResNet-18 trunk F, a bottleneck B (Linear + BN) and a
weight-normed linear classifier C, and its translator is a second trainable trunk plus an MLP on
the images. Here the frames already live in a latent space, so F is an MLP, B and C are one
linear head, and T is an MLP on F's features (a latent translator): the prediction is C(T(F(x))).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as nnf
from torch import nn


class Encoder(nn.Module):
    """F: frames [N, dim] -> features [N, feat]."""

    def __init__(self, dim: int, hidden: int, feat: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, feat))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class Translator(nn.Module):
    """T: features -> features, h + W2 relu(W1 h + b1) + b2 (residual) or W2 relu(W1 h + b1) + b2.

    With `identity_init` the last layer starts at zero, so a residual translator starts as the
    identity: before any training, C(T(F(x))) is the source model's own prediction.
    """

    def __init__(self, feat: int, hidden: int, *, residual: bool = True, identity_init: bool = True) -> None:
        super().__init__()
        self.residual = residual
        self.inp = nn.Linear(feat, hidden)
        self.out = nn.Linear(hidden, feat)
        if identity_init:
            nn.init.zeros_(self.out.weight)
            nn.init.zeros_(self.out.bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        delta = self.out(torch.relu(self.inp(h)))
        return h + delta if self.residual else delta


StyleLoss = Literal["gram", "meanvar", "moments"]
ExpLoss = Literal["ce", "mse", "kl"]


def gram(h: torch.Tensor) -> torch.Tensor:
    """[N, feat] -> [feat, feat]: the second moment of one subject's features, H^T H / (N * feat).

    Frames of one subject play the role of a feature map's positions, and the division by the
    feature count is the released code's division of a Gram by C * H * W.
    """
    return h.T @ h / (h.shape[0] * h.shape[1])


def style_distance(a: torch.Tensor, b: torch.Tensor, kind: StyleLoss) -> torch.Tensor:
    """Distance between the styles of two batches of features, each from one subject.

    'gram': MSE of the (uncentred) Gram matrices, as in the released code; 'meanvar': MSE of the
    per-feature means plus MSE of the per-feature standard deviations (AdaIN statistics);
    'moments': MSE of the means plus MSE of the centred covariances.
    """
    if kind == "gram":
        return nnf.mse_loss(gram(a), gram(b))
    if kind == "meanvar":
        return nnf.mse_loss(a.mean(0), b.mean(0)) + nnf.mse_loss(a.std(0), b.std(0))
    if kind == "moments":
        return nnf.mse_loss(a.mean(0), b.mean(0)) + nnf.mse_loss(torch.cov(a.T), torch.cov(b.T))
    raise ValueError(f"unknown style loss {kind!r}")


def expression_loss(frozen_logits: torch.Tensor, logits: torch.Tensor, kind: ExpLoss) -> torch.Tensor:
    """L_exp: the translated frame's prediction against the frozen source model's.

    'ce': cross-entropy against the frozen argmax (the released code's default); 'mse': MSE of
    the logits; 'kl': KL(frozen softmax || translated softmax).
    """
    frozen_logits = frozen_logits.detach()
    if kind == "ce":
        return nnf.cross_entropy(logits, frozen_logits.argmax(1))
    if kind == "mse":
        return nnf.mse_loss(logits, frozen_logits)
    if kind == "kl":
        return nnf.kl_div(nnf.log_softmax(logits, 1), nnf.log_softmax(frozen_logits, 1), log_target=True, reduction="batchmean")
    raise ValueError(f"unknown expression loss {kind!r}")


def freeze(*modules: nn.Module) -> None:
    """No gradient and eval mode: these parameters must stay bit-identical."""
    for m in modules:
        m.eval()
        m.requires_grad_(False)


@torch.no_grad()
def predict(x: torch.Tensor, encoder: nn.Module, classifier: nn.Module, translator: nn.Module | None = None) -> torch.Tensor:
    h = encoder(x)
    if translator is not None:
        h = translator(h)
    return classifier(h).argmax(1)


def accuracy_report(pred: torch.Tensor, labels: torch.Tensor, classes: int) -> dict[str, float]:
    """Accuracy, neutral recall and the macro recall of the non-neutral classes."""
    recalls = [float((pred[labels == k] == k).float().mean()) for k in range(classes)]
    return {
        "acc": float((pred == labels).float().mean()),
        "recall_neutral": recalls[0],
        "recall_expr": sum(recalls[1:]) / (classes - 1),
    }


def changed_tensors(before: dict[str, torch.Tensor], module: nn.Module) -> int:
    """How many of `module`'s parameters and buffers are not bit-identical to `before` (a state_dict)."""
    now = module.state_dict()
    return sum(not torch.equal(before[k], now[k]) for k in before)
