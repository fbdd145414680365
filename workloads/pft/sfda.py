"""pft's source-free domain adaptation baselines, run on the same neutral-only target frames as PFT.

The paper compares PFT with state-of-the-art SFDA methods, which assume unlabelled target data of
every class; here they get what PFT gets: the target subject's unlabelled neutral frames, the
frozen source model, the same steps, batch, learning rate and minibatch draws.

- SHOT: Liang, Hu, Feng, "Do We Really Need to Access the Source Data? Source Hypothesis Transfer
  for Unsupervised Domain Adaptation", ICML 2020, https://arxiv.org/abs/2002.08546. The classifier
  (the source hypothesis) is frozen; the feature extractor is trained with information
  maximisation (mean per-frame entropy minus the entropy of the mean prediction) plus
  cross-entropy against self-supervised pseudo-labels, the nearest class centroid (cosine) of the
  features, the centroids weighted by the predictions and refined once with hard labels, refreshed
  15 times over the adaptation as in the released code (cls_par 0.3, ent_par 1).
- AaD: Yang, Wang, Wang, Jui, van de Weijer, "Attracting and Dispersing: A Simple Approach for
  Source-free Domain Adaptation", NeurIPS 2022, https://arxiv.org/abs/2205.04183. Memory banks of
  every target frame's normalised feature and prediction; a frame's prediction is attracted to
  those of its K nearest bank neighbours (-p_i . s_j) and dispersed from the other frames of its
  batch (+alpha p_i . p_j), alpha = alpha0 (1 + 10 t / T)^-beta; feature extractor and classifier
  are trained, as in the released tar_adaptation.py (K 5, alpha0 1, beta 5).

Both use Adam at PFT's learning rate instead of the released SGD schedules, so that every arm has
the same optimiser and budget.
"""

from __future__ import annotations

import torch
import torch.nn.functional as nnf
from torch import nn

SHOT_REFRESHES = 15
"""Pseudo-label refreshes over one adaptation (the released SHOT code's `interval`)."""
EPS = 1e-5
"""SHOT's epsilon inside the logarithms."""


def entropy(p: torch.Tensor) -> torch.Tensor:
    """[N, K] probabilities -> [N] entropies (natural log)."""
    return -(p * torch.log(p + EPS)).sum(-1)


def information_maximisation(logits: torch.Tensor) -> torch.Tensor:
    """SHOT's L_ent + L_div: mean per-frame entropy (confident predictions) minus the entropy of
    the batch's mean prediction (diverse predictions). Minimal for one-hot predictions spread
    evenly over the classes, which neutral-only data cannot satisfy without mislabelling."""
    p = logits.softmax(-1)
    return entropy(p).mean() - entropy(p.mean(0, keepdim=True)).squeeze(0)


@torch.no_grad()
def shot_pseudo_labels(x: torch.Tensor, encoder: nn.Module, classifier: nn.Module) -> torch.Tensor:
    """SHOT's self-supervised labels of every target frame: the nearest (cosine) class centroid,
    first weighted by the softmax, then once more with the hard labels; only classes predicted for
    at least one frame get a centroid (the released code's threshold 0)."""
    h = encoder(x)
    p = classifier(h).softmax(-1)  # [N, K]
    f = torch.cat([h, torch.ones(len(h), 1)], 1)  # the released code appends a constant 1
    f = f / f.norm(dim=1, keepdim=True)
    present = torch.bincount(p.argmax(1), minlength=p.shape[1]) > 0  # [K]
    weights = p
    for _ in range(2):
        centroids = weights.T @ f / (1e-8 + weights.sum(0)[:, None])  # [K, d+1]
        centroids = centroids / centroids.norm(dim=1, keepdim=True).clamp_min(1e-12)
        sim = f @ centroids.T  # [N, K]: cosine; absent classes can never be chosen
        sim[:, ~present] = -torch.inf
        labels = sim.argmax(1)
        weights = nnf.one_hot(labels, p.shape[1]).float()
    return labels


def shot_loss(x: torch.Tensor, labels: torch.Tensor, encoder: nn.Module, classifier: nn.Module, *,
              cls_weight: float) -> torch.Tensor:
    """SHOT on a batch: cls_weight * CE(pseudo-labels) + information maximisation; the classifier is
    frozen by the caller, so the gradient trains the encoder only."""
    logits = classifier(encoder(x))
    return cls_weight * nnf.cross_entropy(logits, labels) + information_maximisation(logits)


@torch.no_grad()
def aad_banks(x: torch.Tensor, encoder: nn.Module, classifier: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """AaD's memory banks before adaptation: normalised features [N, feat] and predictions [N, K]."""
    h = encoder(x)
    return nnf.normalize(h, dim=1), classifier(h).softmax(-1)


def aad_alpha(step: int, steps: int, *, alpha: float, beta: float) -> float:
    """The dispersion weight at adaptation step `step` (from 0) of `steps`: alpha (1 + 10 t/T)^-beta."""
    return alpha * (1 + 10 * step / steps) ** (-beta)


def aad_loss(x: torch.Tensor, idx: torch.Tensor, feats: torch.Tensor, scores: torch.Tensor, encoder: nn.Module,
             classifier: nn.Module, *, k: int, alpha: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """AaD on a batch of frames x (bank rows idx): (loss, updated feature bank, updated score bank).

    The banks are written with the batch first, so a frame's nearest bank entry is itself, which
    the K + 1 nearest drop; new banks are returned (not written in place) so that a checkpoint
    taken earlier keeps its own.
    """
    h = encoder(x)
    p = classifier(h).softmax(-1)  # [B, K]
    with torch.no_grad():
        f = nnf.normalize(h, dim=1)
        feats, scores = feats.clone(), scores.clone()
        feats[idx], scores[idx] = f, p
        near = (f @ feats.T).topk(min(k + 1, len(feats)), dim=1).indices[:, 1:]  # [B, k]
        s_near = scores[near]  # [B, k, K]
    attract = -(p[:, None, :] * s_near).sum(-1).sum(1).mean()
    off_diagonal = 1.0 - torch.eye(len(x))
    disperse = ((p @ p.T) * off_diagonal).sum(-1).mean()
    return attract + alpha * disperse, feats, scores
