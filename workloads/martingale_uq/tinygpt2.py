"""The paper's text setting at smoke size: a tiny GPT-2 trained here, then frozen, scoring held-out text.

The paper's headline is GPT-2's NLL per token of WikiText-2 texts, with GPT-2's own generations as
the frozen prior Q. Nothing is downloaded here, so the GPT-2 is built and trained on this machine:
transformers' `GPT2LMHeadModel` from a small `GPT2Config` with a byte-level BPE tokenizer
(`components.basemodel.toy.save_tiny_gpt2`), trained for `steps` Adam steps on the training files
of the standard-library corpus (the byte model's corpus, shipped with Python), then written with
`save_pretrained`, so the workload's `causal_lm` path (`textlm`) loads, samples and scores it as it
would GPT-2. Deployed texts are windows of the held-out files: the prior is misspecified by the
model's errors and by the file shift, as GPT-2's generations are for WikiText-2.

Every training window starts with the start token, as scored and generated texts do, so the
model has learnt the first token's distribution it is asked for. The folder is cached under
`$LADDER_CACHE/martingale_uq/` per (recipe, seed): the smoke's trials that differ only in the
metric or the sampling temperature train it once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from components.cache import cache_root
from workloads.martingale_uq import bytemodel, textlm

CODE_VERSION = 1
"""Bump when a change here changes what a build produces (it is in the cache key)."""
META_FILE = "ladder_fit.json"


@dataclass(frozen=True)
class Recipe:
    """Everything a build depends on besides the seed (all of it is in the cache key)."""

    layers: int = 2
    hidden: int = 64
    heads: int = 2
    vocab: int = 512
    """BPE vocabulary (the 256 bytes, the end-of-text token and merges)."""
    seq: int = 64
    """Tokens per training window after the start token (texts scored must be no longer)."""
    batch: int = 16
    steps: int = 300
    lr: float = 3e-3
    corpus_bytes: int = 400_000
    heldout_frac: float = 0.25


def folder_of(recipe: Recipe, seed: int) -> Path:
    blob = json.dumps({**dataclasses.asdict(recipe), "seed": seed, "code": CODE_VERSION}, sort_keys=True)
    return cache_root() / "martingale_uq" / f"tiny-gpt2-{hashlib.sha256(blob.encode()).hexdigest()[:16]}"


def texts(recipe: Recipe) -> tuple[str, str]:
    """(training text, held-out text) of the standard-library corpus, split by file."""
    train, held = bytemodel.corpus(recipe.heldout_frac, recipe.corpus_bytes)
    decode = lambda t: bytes(t.to(torch.uint8).tolist()).decode("utf-8", errors="replace")  # noqa: E731
    return decode(train), decode(held)


def _train(recipe: Recipe, seed: int, folder: Path, report: Callable[[int, float], None]) -> float:
    """Write the tokenizer and a seeded GPT-2 into `folder`, train it, save it; its last loss."""
    from components.basemodel.toy import save_tiny_gpt2
    from transformers import AutoTokenizer, GPT2LMHeadModel

    train_text, _ = texts(recipe)
    lines = [line for line in train_text.splitlines() if line.strip()]
    save_tiny_gpt2(folder, lines, vocab_size=recipe.vocab, layers=recipe.layers, hidden=recipe.hidden,
                   heads=recipe.heads, positions=recipe.seq + 1, seed=seed)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = GPT2LMHeadModel.from_pretrained(str(folder)).train()
    ids = textlm.tokenize(tokenizer, train_text)
    start = int(tokenizer.eos_token_id)
    gen = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=recipe.lr)
    offsets = torch.arange(recipe.seq)
    for step in range(1, recipe.steps + 1):
        pos = torch.randint(0, len(ids) - recipe.seq, (recipe.batch,), generator=gen)
        x = torch.cat([torch.full((recipe.batch, 1), start), ids[pos[:, None] + offsets]], 1)  # [B, 1 + seq]
        # labels = inputs: the model shifts them; the start token itself is never a target.
        loss = model(input_ids=x, labels=x).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        report(step, loss.item())
    model.eval().save_pretrained(str(folder), safe_serialization=True)
    return loss.item()


def ensure_built(recipe: Recipe, seed: int, report: Callable[[int, float], None]) -> tuple[Path, float, bool]:
    """(the cached folder, its last training loss, whether this call trained it); built once,
    whoever asks concurrently (a file lock, a temporary folder renamed into place)."""
    from filelock import FileLock

    final = folder_of(recipe, seed)
    meta = final / META_FILE
    if not meta.is_file():
        final.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(final) + ".lock"):
            if not meta.is_file():  # nobody built it while we waited
                tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
                try:
                    loss = _train(recipe, seed, tmp, report)
                    (tmp / META_FILE).write_text(json.dumps({"loss": loss, "recipe": dataclasses.asdict(recipe),
                                                             "seed": seed, "code": CODE_VERSION}))
                    os.chmod(tmp, 0o755)
                    if final.exists():  # half made by a builder killed without the lock
                        shutil.rmtree(final)
                    os.rename(tmp, final)
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
                return final, loss, True
    return final, float(json.loads(meta.read_text())["loss"]), False
