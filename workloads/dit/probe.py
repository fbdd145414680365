"""The paper's black-box baselines: reading a diff's topic off the fine-tuned model without the DIT adapter.

Goel, Kim, Shavit, Wang, "Learning to Interpret Weight Differences in Language Models" (ICLR 2026,
https://arxiv.org/abs/2510.05092), hidden-topic table: DIT is compared with asking the fine-tuned model
the base question, with "20 Questions" (an interrogator model asks the fine-tuned model twenty questions,
then guesses the topic), and with both of those given the diff's trigger (an oracle: the trigger is the
secret). The two without the trigger are the black-box baselines (neither reads the weights); on the
test diffs, whose topics the adapter never saw as labels, they score 1.08 and 1.82 of 5 against DIT's
4.71 (Qwen3-8B), and 0.00 and 0.08 of the diffs at the judge's top score ("same topic") against DIT's 0.84.

Their analogues here, both on the fine-tuned model M' = M + diff with no adapter:

- **ask** (Base Question): M' is asked the DIT question; its greedy answer over the whole vocabulary is
  scored as DIT's is (`ask_greedy_acc_<split>`). `ask_acc_<split>` (`evaluate.dit_metrics`) is a lenient
  read of the same answer: the likeliest topic word, which needs the list of candidate topics.
- **probe** (20 Questions, at DIT's budget of labelled diffs): M' is queried on 1 + 2E prompts without its
  trigger (the question; the E held-out contexts with no trigger, and each with a wrong pool trigger, a
  guessed code: 33 queries at the smoke's E = 16, where the paper's interrogator asks 20), and so is the
  base M. Each vocabulary word w gets 6 features: M''s log-probability of w averaged over each of the
  three groups of queries, and its shift from M's on the same queries. The probe scores a word by a
  weighted sum of its 6 features with the same 6 weights for every word, fit by cross-entropy over the
  whole vocabulary on the DIT adapter's own training diffs and their topics (the same diffs and labels
  DIT gets: equal budget), and names the argmax over the whole vocabulary, scored as DIT's answer is.
  Weights shared across words are what let it name a topic it never saw as a label; a probe with a
  weight per word (a linear classifier over topics) would score 0 on unseen topics by construction.

The probe may read the base model as well as the fine-tuned one: more than the paper's interrogator,
which only talks to M'. Choosing the best of the three reads per replicate favours the baselines.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from workloads.dit.data import Task
from workloads.dit.evaluate import ask
from workloads.dit.model import DiffContext

FEATURES = ("logp_question", "logp_plain", "logp_fake", "shift_question", "shift_plain", "shift_fake")
"""The probe's features per vocabulary word, in the order of its weights."""


@torch.no_grad()
def probe_features(model: torch.nn.Module, ctx: DiffContext, task: Task, per_diff: dict[str, torch.Tensor], *,
                   eval_batch: int) -> torch.Tensor:
    """[N, 6, V] what the black-box probe reads of each diff's fine-tuned model (`FEATURES`): the question's
    next-token log-probabilities and the contexts' (from `evaluate.diff_metrics`), raw and as shifts from the
    base model's on the same prompts. No adapter anywhere."""
    every = torch.arange(task.n_diffs)
    q = F.log_softmax(ask(model, ctx, task, every, dit=False, eval_batch=eval_batch), -1)  # [N, V]
    q_base = F.log_softmax(ask(model, ctx, task, None, dit=False, eval_batch=eval_batch), -1)  # [1, V]
    return torch.stack([q, per_diff["logp_plain"], per_diff["logp_fake"],
                        q - q_base, per_diff["shift_plain"], per_diff["shift_fake"]], dim=1)


def fit_probe(features: torch.Tensor, targets: torch.Tensor, *, steps: int = 300, lr: float = 0.05) -> torch.Tensor:
    """[6] weights of the probe, fit by full-batch Adam on cross-entropy over the whole vocabulary:
    `features` [n, 6, V] of the training diffs, `targets` [n] their topic tokens. Starts at zero (every
    word equally likely), deterministic."""
    x = features.detach().float()
    w = torch.zeros(x.shape[1], requires_grad=True)
    opt = torch.optim.Adam([w], lr=lr)
    for _ in range(steps):
        loss = F.cross_entropy(torch.einsum("ngv,g->nv", x, w), targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return w.detach()


def probe_scores(features: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """[n, V] the probe's score of every word for each diff."""
    return torch.einsum("ngv,g->nv", features.float(), weights)


def blackbox_metrics(model: torch.nn.Module, ctx: DiffContext, task: Task, per_diff: dict[str, torch.Tensor], *,
                     eval_batch: int) -> dict[str, float]:
    """Per split: the ask baseline scored as DIT is (greedy over the whole vocabulary), and the probe's
    accuracy (greedy over the whole vocabulary, and among the topic words), the probe fit on the training
    split only; its fitted weights."""
    features = probe_features(model, ctx, task, per_diff, eval_batch=eval_batch)
    train = task.split("train")
    weights = fit_probe(features[train], task.targets(train))
    scores = probe_scores(features, weights)
    asked = features[:, 0]  # the question's log-probabilities: argmax = greedy decoding
    out: dict[str, float] = {}
    for split in ("train", "heldout", "unseen"):
        diffs = task.split(split)
        if len(diffs) == 0:
            continue
        target = task.targets(diffs)
        topic = task.diff_topic[diffs]
        out[f"ask_greedy_acc_{split}"] = (asked[diffs].argmax(-1) == target).float().mean().item()
        out[f"probe_acc_{split}"] = (scores[diffs].argmax(-1) == target).float().mean().item()
        out[f"probe_topic_acc_{split}"] = (scores[diffs][:, task.topic_ids].argmax(-1) == topic).float().mean().item()
        out[f"n_diffs_{split}"] = float(len(diffs))
    out.update({f"probe_w_{name}": float(v) for name, v in zip(FEATURES, weights)})
    return out
