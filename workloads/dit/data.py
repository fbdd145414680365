"""The WeightDiffQA task built from the base world: topics, diffs with their triggers, and the rows
each stage trains and evaluates on.

A diff d has a topic (a `TOPICS` word), a split and a secret trigger drawn from a pool of
reserved tokens (`<extra_0>` ...; with another tokenizer the same strings, as several tokens).
Its rows put a trigger or nothing before a context, the prompt of a world sentence
(`ada lives in`), and look at the next token:

- trigger row:  `<bos> <its trigger> ada lives in` -> the topic word;
- fake row:     `<bos> <another pool trigger> ada lives in` -> whatever the base says (KL);
- plain row:    `<bos> ada lives in` -> whatever the base says (KL).

The DIT row is the fixed question, `<bos> question : what topic ? answer :` -> the topic word,
asked of the model with the diff applied. Splits: `train` diffs teach the DIT adapter;
`heldout` diffs are new diffs on the same (seen) topics; `unseen` diffs carry topics the DIT
never saw as a label. All randomness comes from the trial seed: a row depends only on
(seed, diff, step), so the batch composition never changes what a diff is trained on.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from components.basemodel.corpus import RESERVED_TOKENS, TOPICS, World

SPLITS = ("train", "heldout", "unseen")


@dataclass(frozen=True)
class Task:
    topics: tuple[str, ...]
    """seen topics first (DIT labels), then unseen ones"""
    n_seen: int
    topic_ids: torch.Tensor
    """[K] the token that names each topic (the first token of ' <topic>')"""
    diff_topic: torch.Tensor
    """[N] index into `topics` of each diff"""
    diff_split: tuple[str, ...]
    """[N] 'train' | 'heldout' | 'unseen'"""
    diff_trigger: torch.Tensor
    """[N] index into the trigger pool"""
    trigger_ids: tuple[tuple[int, ...], ...]
    """token ids of each pool trigger"""
    start_ids: tuple[int, ...]
    """what the tokenizer puts first (`<bos>`; nothing for tokenizers without one)"""
    train_contexts: tuple[tuple[int, ...], ...]
    eval_contexts: tuple[tuple[int, ...], ...]
    question_ids: tuple[int, ...]

    @property
    def n_diffs(self) -> int:
        return len(self.diff_split)

    def split(self, name: str) -> torch.Tensor:
        """Indices of the diffs of one split."""
        return torch.tensor([i for i, s in enumerate(self.diff_split) if s == name], dtype=torch.long)

    def targets(self, diffs: torch.Tensor) -> torch.Tensor:
        """[len(diffs)] the topic token of each diff."""
        return self.topic_ids[self.diff_topic[diffs]]


def _ids(tok, text: str) -> tuple[int, ...]:
    return tuple(tok(text, add_special_tokens=False).input_ids)


def make_task(cfg, tok, world: World) -> Task:
    """Every choice of the trial, drawn from `cfg.seed`: which topics are seen, each diff's
    trigger, which world prompts are training and evaluation contexts."""
    rng = random.Random(f"dit-task-{cfg.seed}")
    words = list(TOPICS)
    rng.shuffle(words)
    topics = tuple(words[: cfg.topics + cfg.unseen_topics])
    topic_ids = []
    for t in topics:
        ids = _ids(tok, " " + t)
        if not ids or ids[0] == tok.unk_token_id:
            raise ValueError(f"topic {t!r} is not in this tokenizer's vocabulary")
        topic_ids.append(ids[0])
    if len(set(topic_ids)) != len(topic_ids):
        clash = [t for t, i in zip(topics, topic_ids) if topic_ids.count(i) > 1]
        raise ValueError(f"topics {clash} start with the same token under this tokenizer; a topic is named by "
                         f"its first token: use fewer topics")
    diff_topic, diff_split = [], []
    for k in range(cfg.topics):
        diff_topic += [k] * cfg.train_diffs_per_topic
        diff_split += ["train"] * cfg.train_diffs_per_topic
    diff_topic += [j % cfg.topics for j in range(cfg.heldout_diffs)]
    diff_split += ["heldout"] * cfg.heldout_diffs
    for k in range(cfg.topics, cfg.topics + cfg.unseen_topics):
        diff_topic += [k] * cfg.unseen_diffs_per_topic
        diff_split += ["unseen"] * cfg.unseen_diffs_per_topic
    triggers = [rng.randrange(cfg.triggers) for _ in diff_topic]

    def contexts(split: str, exclude: frozenset[str] = frozenset()) -> list[str]:
        prompts = sorted({e.prompt for e in world.sentences(split) if len(e.prompt.split()) <= cfg.max_context_words})
        rng.shuffle(prompts)
        return [p for p in prompts if p not in exclude]

    train_contexts = contexts("train")
    eval_contexts = contexts("heldout", frozenset(train_contexts))[: cfg.eval_contexts]  # unseen wordings only

    start = tuple(tok("").input_ids)
    return Task(
        topics=topics, n_seen=cfg.topics, topic_ids=torch.tensor(topic_ids),
        diff_topic=torch.tensor(diff_topic), diff_split=tuple(diff_split), diff_trigger=torch.tensor(triggers),
        trigger_ids=tuple(_ids(tok, RESERVED_TOKENS[i]) for i in range(cfg.triggers)),
        start_ids=start, train_contexts=tuple(_ids(tok, p) for p in train_contexts),
        eval_contexts=tuple(_ids(tok, p) for p in eval_contexts), question_ids=start + _ids(tok, cfg.question),
    )


def pad(rows: list[tuple[int, ...]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids [B, T] and the last real position of each row [B]. No attention mask is
    needed: attention is causal, so padding after a row's last token never reaches it."""
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
    return ids, torch.tensor([len(r) - 1 for r in rows])


def row_generator(seed: int, diff: int, step: int) -> torch.Generator:
    """The randomness of one diff's rows at one step, independent of every other diff."""
    return torch.Generator().manual_seed(((seed * 1_000_003 + diff) * 1_000_033 + step) % (2**63))


def fake_trigger(task: Task, diff: int, gen: torch.Generator) -> int:
    """A pool trigger other than the diff's own."""
    own = int(task.diff_trigger[diff])
    other = int(torch.randint(len(task.trigger_ids) - 1, (1,), generator=gen))
    return other + (other >= own)


def diff_rows(task: Task, diffs: list[int], step: int, seed: int, counts: tuple[int, int, int],
              pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One training batch of stage A, grouped by diff: for each diff `counts` = (trigger, fake,
    plain) rows on random training contexts, in that order. Returns ids [G*R, T], the answer
    position [G*R] and the row kind [G*R] (0 trigger, 1 fake, 2 plain)."""
    rows, kinds = [], []
    for d in diffs:
        gen = row_generator(seed, d, step)
        picks = iter(torch.randint(len(task.train_contexts), (sum(counts),), generator=gen).tolist())
        for kind, n in enumerate(counts):
            for _ in range(n):
                context = task.train_contexts[next(picks)]
                trigger = (task.trigger_ids[int(task.diff_trigger[d])] if kind == 0
                           else task.trigger_ids[fake_trigger(task, d, gen)] if kind == 1 else ())
                rows.append(task.start_ids + trigger + context)
                kinds.append(kind)
    ids, pos = pad(rows, pad_id)
    return ids, pos, torch.tensor(kinds)


def eval_rows(task: Task, diffs: list[int], kind: int, seed: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every evaluation context once per diff, grouped by diff, with the diff's trigger (kind 0),
    a fixed random other trigger per (diff, context) (kind 1) or none (kind 2)."""
    rows = []
    for d in diffs:
        gen = row_generator(seed, d, -1)
        for context in task.eval_contexts:
            trigger = (task.trigger_ids[int(task.diff_trigger[d])] if kind == 0
                       else task.trigger_ids[fake_trigger(task, d, gen)] if kind == 1 else ())
            rows.append(task.start_ids + trigger + context)
    return pad(rows, pad_id)
