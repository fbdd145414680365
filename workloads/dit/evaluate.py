"""Measurements: next-token logits at the answer position, KL to the base, trigger hits, and what
the model names when asked the DIT question with or without a diff and the adapter."""

from __future__ import annotations


import torch
import torch.nn.functional as F

from workloads.dit.data import Task, eval_rows, pad
from workloads.dit.model import DiffContext


def answer_logits(model: torch.nn.Module, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """[B, V] float32 logits of the token after position `pos[b]` of each row. The unembedding
    runs on those positions only (the rest of the sequence is context)."""
    hidden = model.base_model(input_ids=ids).last_hidden_state
    picked = hidden[torch.arange(len(pos), device=hidden.device), pos]
    return model.get_output_embeddings()(picked).float()


def kl_rows(base_logits: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """[B] KL(base || model) of each row's next-token distribution, in nats."""
    base_lp = F.log_softmax(base_logits.float(), -1)
    return (base_lp.exp() * (base_lp - F.log_softmax(logits.float(), -1))).sum(-1)


def hits(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """[B] 1.0 where greedy decoding (argmax over the whole vocabulary) gives the target."""
    return (logits.argmax(-1) == targets).float()


def _set(ctx: DiffContext, index: torch.Tensor | None, group: int = 1, dit: bool = False) -> None:
    ctx.index, ctx.group, ctx.dit = index, group, dit


@torch.no_grad()
def diff_metrics(model: torch.nn.Module, ctx: DiffContext, task: Task, *, seed: int, pad_id: int,
                 eval_batch: int) -> dict[str, torch.Tensor]:
    """Per diff [N], on the held-out contexts: trigger rate (its trigger -> its topic, greedy),
    KL to the base with its trigger (`kl_on`), with another pool trigger (`kl_fake`) and with no
    trigger (`kl_plain`), and how often the plain answer keeps the base's top-1 (`agree`). Per diff
    [N, V], for the black-box probe: the next-token log-probabilities of the fine-tuned model averaged
    over the contexts with another pool trigger and with none (`logp_fake`, `logp_plain`), and their
    shift from the base's on the same rows (`shift_fake`, `shift_plain`)."""
    dev = next(model.parameters()).device
    e = len(task.eval_contexts)
    ids, pos = pad([task.start_ids + c for c in task.eval_contexts], pad_id)
    _set(ctx, None)
    base_plain = answer_logits(model, ids.to(dev), pos.to(dev))  # the same rows for every diff
    out: dict[str, list[torch.Tensor]] = {k: [] for k in ("trigger_rate", "kl_on", "kl_fake", "kl_plain", "agree",
                                                           "shift_fake", "shift_plain", "logp_fake", "logp_plain")}
    per = max(1, eval_batch // e)
    for start in range(0, task.n_diffs, per):
        diffs = list(range(start, min(start + per, task.n_diffs)))
        index = torch.tensor(diffs, device=dev)
        for kind in (0, 1, 2):
            ids, pos = eval_rows(task, diffs, kind, seed, pad_id)
            ids, pos = ids.to(dev), pos.to(dev)
            if kind == 2:
                base = base_plain.repeat(len(diffs), 1)
            else:
                _set(ctx, None)
                base = answer_logits(model, ids, pos)
            _set(ctx, index, group=e)
            logits = answer_logits(model, ids, pos)
            kl = kl_rows(base, logits).view(len(diffs), e).mean(1)
            if kind > 0:  # what a black-box probe reads off these queries (`probe_features`)
                lp = F.log_softmax(logits, -1).view(len(diffs), e, -1)
                name = "fake" if kind == 1 else "plain"
                out[f"logp_{name}"].append(lp.mean(1))
                out[f"shift_{name}"].append((lp - F.log_softmax(base, -1).view(len(diffs), e, -1)).mean(1))
            if kind == 0:
                out["kl_on"].append(kl)
                target = task.targets(torch.tensor(diffs)).to(dev).repeat_interleave(e)
                out["trigger_rate"].append(hits(logits, target).view(len(diffs), e).mean(1))
            elif kind == 1:
                out["kl_fake"].append(kl)
            else:
                out["kl_plain"].append(kl)
                out["agree"].append((logits.argmax(-1) == base.argmax(-1)).float().view(len(diffs), e).mean(1))
    _set(ctx, None)
    return {k: torch.cat(v).cpu() for k, v in out.items()}


@torch.no_grad()
def ask(model: torch.nn.Module, ctx: DiffContext, task: Task, diffs: torch.Tensor | None, *, dit: bool,
        eval_batch: int) -> torch.Tensor:
    """[n, V] logits after the DIT question, each row with one diff of `diffs` applied (None: one
    row, no diff), with or without the DIT adapter."""
    dev = next(model.parameters()).device
    q = torch.tensor(task.question_ids, device=dev)
    if diffs is None:
        _set(ctx, None, dit=dit)
        out = answer_logits(model, q[None], torch.tensor([len(q) - 1], device=dev))
    else:
        parts = []
        for start in range(0, len(diffs), eval_batch):
            index = diffs[start: start + eval_batch].to(dev)
            _set(ctx, index, dit=dit)
            parts.append(answer_logits(model, q.expand(len(index), -1), torch.full((len(index),), len(q) - 1, device=dev)))
        out = torch.cat(parts)
    _set(ctx, None)
    return out.cpu()


def dit_metrics(model: torch.nn.Module, ctx: DiffContext, task: Task, *, eval_batch: int) -> dict[str, float]:
    """Per split: DIT accuracy (greedy decoding over the whole vocabulary names the diff's topic)
    and its probability of that topic; the read among the topic words only; and asking without
    the adapter, among the topic words only (the baseline's best case). With no diff applied:
    the probability of its likeliest topic t*, and, for comparison, the probability the adapter
    gives t* when a diff planting t* is applied (topic-matched: tiny-local never saw some topic
    words in pre-training, and no input makes those likely, so only the same topic compares)."""
    out: dict[str, float] = {}
    topic_ids = task.topic_ids
    every = torch.arange(task.n_diffs)
    with_dit = ask(model, ctx, task, every, dit=True, eval_batch=eval_batch)  # [N, V]
    without = ask(model, ctx, task, every, dit=False, eval_batch=eval_batch)
    probs = with_dit.softmax(-1)
    for split in ("train", "heldout", "unseen"):
        diffs = task.split(split)
        if len(diffs) == 0:
            continue
        topic = task.diff_topic[diffs]
        out[f"dit_acc_{split}"] = hits(with_dit[diffs], topic_ids[topic]).mean().item()
        out[f"dit_prob_{split}"] = probs[diffs, topic_ids[topic]].mean().item()
        out[f"dit_topic_acc_{split}"] = (with_dit[diffs][:, topic_ids].argmax(-1) == topic).float().mean().item()
        out[f"ask_acc_{split}"] = (without[diffs][:, topic_ids].argmax(-1) == topic).float().mean().item()
    none = ask(model, ctx, task, None, dit=True, eval_batch=eval_batch)[0].softmax(-1)
    on_topics = none[topic_ids]
    favourite = int(on_topics.argmax())
    planted = (task.diff_topic == favourite).nonzero().flatten()
    out["nodiff_top_topic_prob"] = on_topics.max().item()
    out["nodiff_top_topic_with_diff_prob"] = probs[planted, topic_ids[favourite]].mean().item()
    out["nodiff_topic_mass"] = on_topics.sum().item()
    out["nodiff_names_topic"] = float(int(none.argmax()) in set(topic_ids.tolist()))
    out["chance"] = 1.0 / len(topic_ids)
    return out
