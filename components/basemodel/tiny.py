"""Build `tiny-local`: a small `LlamaForCausalLM` pre-trained here on `corpus`, cached on disk.

The artefact is an ordinary Hugging Face folder (`config.json`, `model.safetensors`, tokenizer
files) plus `ladder_base.json` (recipe, seed, held-out metrics, build time). It lives in
`$LADDER_CACHE/basemodel/tiny-local-<hash>/` (default `~/.cache/ladder`), where the hash covers
the recipe, the seed and `CODE_VERSION`: change the generator or the training loop and bump it.
Builders write into a temporary folder and rename it into place, under a file lock, so a
concurrent reader (another pytest process, a Ray trial) sees a whole model or none.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from components.basemodel.corpus import Example, World, make_world
from components.cache import cache_root

CODE_VERSION = 1
"""Bump when a change to corpus.py, tokenizer.py or this file changes what a build produces."""
META_FILE = "ladder_base.json"


@dataclass(frozen=True)
class TinyRecipe:
    """Everything a tiny-local build depends on besides the seed (all of it is in the cache key)."""

    hidden: int = 64
    """hidden size"""
    layers: int = 4
    """decoder layers"""
    heads: int = 4
    """attention heads"""
    kv_heads: int = 2
    """key/value heads (grouped-query attention, as in Llama-3)"""
    intermediate: int = 176
    """MLP width"""
    seq_len: int = 64
    """packed training row length in tokens"""
    batch: int = 32
    """rows per step"""
    steps: int = 800
    """AdamW steps"""
    lr: float = 5e-3
    """peak learning rate (linear warm-up, cosine decay to 10%)"""
    weight_decay: float = 0.01
    """AdamW weight decay"""
    modulus: int = 11
    """p of the arithmetic part"""
    ops: str = "+"
    """arithmetic operations in pre-training, each a character of `+-*`"""
    arith_holdout: float = 0.2
    """fraction of (op, a, b) triples never seen in pre-training"""
    mix_arith: float = 0.5
    """share of arithmetic sentences in the stream (the rest: attribute sentences and facts, by count)"""

    def world(self, seed: int) -> World:
        return make_world(seed, modulus=self.modulus, ops=tuple(self.ops), arith_holdout=self.arith_holdout)

    def config(self, vocab_size: int, bos: int, eos: int, pad: int) -> Any:
        from transformers import LlamaConfig

        return LlamaConfig(
            vocab_size=vocab_size, hidden_size=self.hidden, intermediate_size=self.intermediate,
            num_hidden_layers=self.layers, num_attention_heads=self.heads, num_key_value_heads=self.kv_heads,
            max_position_embeddings=512, bos_token_id=bos, eos_token_id=eos, pad_token_id=pad,
            tie_word_embeddings=False, rope_theta=10000.0,
        )


def build_key(recipe: TinyRecipe, seed: int) -> str:
    blob = json.dumps({"recipe": dataclasses.asdict(recipe), "seed": seed, "code": CODE_VERSION}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def artefact_dir(recipe: TinyRecipe, seed: int) -> Path:
    return cache_root() / "basemodel" / f"tiny-local-{build_key(recipe, seed)}"


def ensure_built(recipe: TinyRecipe, seed: int, *, log: bool = False) -> Path:
    """The cached artefact's folder, built first when missing (once, whoever asks concurrently)."""
    from filelock import FileLock

    final = artefact_dir(recipe, seed)
    if (final / META_FILE).exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(final) + ".lock"):
        if (final / META_FILE).exists():  # another process built it while we waited
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
        try:
            build(recipe, seed, tmp, log=log)
            os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache may be shared
            if final.exists():  # a half-made folder from a killed builder without the lock
                shutil.rmtree(final)
            os.rename(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _pack(examples: list[Example], tokenizer: Any, weights: torch.Tensor, n_rows: int, seq_len: int,
          gen: torch.Generator) -> torch.Tensor:
    """[n_rows, seq_len] rows of `<bos> sentence <eos> <bos> sentence <eos> ...`, sentences drawn
    with `weights`, the last one cut at the row's end (every token is a training target)."""
    ids = [tokenizer(e.text).input_ids + [tokenizer.eos_token_id] for e in examples]
    need = n_rows * seq_len
    stream: list[int] = []
    while len(stream) < need:
        for i in torch.multinomial(weights, 4096, replacement=True, generator=gen).tolist():
            stream.extend(ids[i])
    return torch.tensor(stream[:need]).view(n_rows, seq_len)


def answer_batch(examples: list[Example], tokenizer: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded `<bos> prompt answer .` ids [N, T], their attention mask, and the position of
    the token that predicts the answer [N]."""
    rows = [tokenizer(e.text).input_ids for e in examples]
    pos = torch.tensor([len(tokenizer(e.prompt).input_ids) - 1 for e in examples])
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
    return ids, mask, pos


@torch.no_grad()
def score(model: Any, tokenizer: Any, examples: list[Example], batch: int = 512) -> dict[str, float]:
    """Mean next-token loss over whole sentences and greedy accuracy of the answer token."""
    was_training = model.training
    model.eval()
    total_loss, total_tokens, correct = 0.0, 0, 0
    dev = next(model.parameters()).device
    for start in range(0, len(examples), batch):
        ids, mask, pos = answer_batch(examples[start: start + batch], tokenizer)
        ids, mask = ids.to(dev), mask.to(dev)
        logits = model(input_ids=ids, attention_mask=mask).logits.float()  # [N, T, V]
        targets = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), targets, reduction="sum")
        total_loss += loss.item()
        total_tokens += int((targets != -100).sum())
        rows = torch.arange(len(pos))
        pred = logits[rows, pos.to(dev)].argmax(-1)
        correct += int((pred == ids[rows, pos.to(dev) + 1]).sum())
    model.train(was_training)
    return {"loss": total_loss / max(total_tokens, 1), "acc": correct / max(len(examples), 1)}


def eval_sets(world: World) -> dict[str, list[Example]]:
    """The sets tiny-local's metrics are measured on; `*_heldout` were never trained on."""
    return {
        "sent_train": world.sentences("train"),
        "sent_heldout": world.sentences("heldout"),
        "arith_train": world.arithmetic("train"),
        "arith_heldout": world.arithmetic("heldout"),
        "facts_train": world.fact_examples("train"),
        "facts_heldout": world.fact_examples("heldout"),
    }


def evaluate(model: Any, tokenizer: Any, world: World) -> dict[str, float]:
    out = {}
    for name, examples in eval_sets(world).items():
        for k, v in score(model, tokenizer, examples).items():
            out[f"{name}/{k}"] = v
    return out


def build(recipe: TinyRecipe, seed: int, out_dir: Path, *, log: bool = False) -> dict[str, Any]:
    """Pre-train tiny-local from `seed` and save it into `out_dir`; returns the metadata written.

    Runs on one CPU thread (restored afterwards): the result is bit-reproducible on one machine
    and the build does not crowd out other processes."""
    from transformers import LlamaForCausalLM

    from components.basemodel.tokenizer import build_tokenizer

    cpu0, wall0 = time.process_time(), time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tokenizer = build_tokenizer()
        world = recipe.world(seed)
        torch.manual_seed(seed)
        gen = torch.Generator().manual_seed(seed)
        cfg = recipe.config(len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id)
        model = LlamaForCausalLM(cfg)
        init_metrics = evaluate(model, tokenizer, world)

        examples = world.train_examples()
        is_arith = torch.tensor([e.part == "arith" for e in examples], dtype=torch.float64)
        n_arith = is_arith.sum()
        weights = torch.where(is_arith > 0, recipe.mix_arith / n_arith, (1 - recipe.mix_arith) / (len(examples) - n_arith))
        opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay, betas=(0.9, 0.98))
        warmup = max(1, recipe.steps // 20)

        def lr_at(step: int) -> float:
            if step < warmup:
                return recipe.lr * (step + 1) / warmup
            frac = (step - warmup) / max(1, recipe.steps - warmup)
            return recipe.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))

        model.train()
        chunk = 100  # steps per packed chunk, so memory stays small for any step count
        for step in range(recipe.steps):
            if step % chunk == 0:
                data = _pack(examples, tokenizer, weights, chunk * recipe.batch, recipe.seq_len, gen)
            rows = data[(step % chunk) * recipe.batch: (step % chunk + 1) * recipe.batch]
            for group in opt.param_groups:
                group["lr"] = lr_at(step)
            loss = model(input_ids=rows, labels=rows).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            if log and (step % 250 == 0 or step == recipe.steps - 1):
                print(f"tiny-local build: step {step}/{recipe.steps} loss {loss.item():.3f}", flush=True)
        model.eval()
        metrics = evaluate(model, tokenizer, world)
    finally:
        torch.set_num_threads(threads)

    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    meta = {
        "name": "tiny-local",
        "seed": seed,
        "code_version": CODE_VERSION,
        "recipe": dataclasses.asdict(recipe),
        "params": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
        "metrics": metrics,
        "init_metrics": init_metrics,
        "build_cpu_s": time.process_time() - cpu0,
        "build_wall_s": time.perf_counter() - wall0,
        "torch": torch.__version__,
    }
    (out_dir / META_FILE).write_text(json.dumps(meta, indent=1, sort_keys=True))
    return meta
