"""The drifted base: the base continued on a shifted corpus, cached like the base itself.

As in the paper's drift simulation, the continuation is a LoRA (rank `drift_rank`, alpha
`drift_alpha`) on every projection of the transformer blocks, trained with the language-model
loss and merged into the weights. Its text is the shifted tiny-world corpus of
`data.drift_examples` for tiny-local, or `drift_path` (`data.drift_texts`: a .txt file, or a
JSONL / save_to_disk text field) for any base; a base other than tiny-local needs the latter
(`validate` refuses it without one: the tiny world's text says nothing new to a real model). The result is an ordinary
`save_pretrained` folder under `$LADDER_CACHE/car_lora/drift-<hash>/`, the hash covering the base,
its seed and every drift setting, built once (under a file lock) and loaded back through
`load_base` by every trial that asks for the same drift. Its draws come from `drift_seed`, never
from a trial's seed, so all trials of a sweep see the same drifted base.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from components.basemodel import base_world, cache_root, load_base, lora, resolve
from orchestrator.run import devices
from workloads.car_lora.data import drift_examples, drift_texts

DRIFT_VERSION = 1
"""Bump when a change here or in `data.drift_examples` changes what a drift build produces."""
DRIFT_FIELDS = ("base", "base_seed", "dtype", "drift_steps", "drift_lr", "drift_rank", "drift_alpha",
                "drift_batch", "drift_seq_len", "drift_modulus", "drift_seed")
META_FILE = "car_lora_drift.json"


TEXT_FIELDS = ("drift_path", "drift_field", "drift_split")
"""The text source, part of the settings only when `drift_path` is set (a tiny-world drift keeps its key)."""


def drift_settings(cfg: Any) -> dict[str, Any]:
    out = {name: getattr(cfg, name) for name in DRIFT_FIELDS}
    if cfg.drift_path:
        out.update({name: getattr(cfg, name) for name in TEXT_FIELDS})
    return out


def drift_dir(cfg: Any) -> Path:
    settings = drift_settings(cfg)
    settings["base_dtype"] = settings.pop("dtype")  # the field's former name: builds made before the rename stay valid
    settings.update(source=resolve(cfg.base, seed=cfg.base_seed, build=False), version=DRIFT_VERSION)
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
    return cache_root() / "car_lora" / f"drift-{key}"


def ensure_drifted(cfg: Any, device: torch.device | str = "cpu") -> Path:
    """The drifted base's folder, built first when missing (once, whoever asks concurrently)."""
    from filelock import FileLock

    final = drift_dir(cfg)
    if (final / META_FILE).exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(final) + ".lock"):
        if (final / META_FILE).exists():  # built by another process while we waited
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
        try:
            build_drifted(cfg, tmp, device)
            os.chmod(tmp, 0o755)
            if final.exists():  # a half-made folder of a builder killed without the lock
                shutil.rmtree(final)
            os.rename(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def pack(texts: list[list[int]], weights: torch.Tensor, n_rows: int, seq_len: int, eos: int,
         gen: torch.Generator) -> torch.Tensor:
    """[n_rows, seq_len] rows of token ids `sentence <eos> sentence <eos> ...`, sentences drawn
    with `weights`, the last one cut at the row's end."""
    stream: list[int] = []
    while len(stream) < n_rows * seq_len:
        for i in torch.multinomial(weights, 64, replacement=True, generator=gen).tolist():
            stream.extend(texts[i] + [eos])
    return torch.tensor(stream[: n_rows * seq_len]).view(n_rows, seq_len)


def build_drifted(cfg: Any, out_dir: Path, device: torch.device | str = "cpu") -> dict[str, Any]:
    """Continue the base on the shifted corpus and save the merged model into `out_dir`."""
    cpu0, wall0 = time.process_time(), devices.clock(device)
    dtype = None if cfg.dtype == "auto" else cfg.dtype
    model, tok = load_base(cfg.base, seed=cfg.base_seed, dtype=dtype, device=device)
    if cfg.drift_path:  # a corpus of the user's: every text weighs the same, cut to a row's length
        texts = [tok(t).input_ids[: cfg.drift_seq_len] for t in
                 drift_texts(cfg.drift_path, field=cfg.drift_field, split=cfg.drift_split)]
        weights = torch.full((len(texts),), 1.0 / len(texts), dtype=torch.float64)
    else:
        parts = drift_examples(base_world(cfg.base, seed=cfg.base_seed), modulus=cfg.drift_modulus)
        examples = [e for part in parts.values() for e in part]
        # Each part weighs the same in the stream, however many sentences it has.
        weights = torch.cat([torch.full((len(p),), 1.0 / len(p), dtype=torch.float64) for p in parts.values()])
        texts = [tok(e.text).input_ids for e in examples]
    torch.manual_seed(cfg.drift_seed)
    gen = torch.Generator().manual_seed(cfg.drift_seed)
    # drift_rank 0: every weight continues training (cheaper than a LoRA on a small CPU model).
    peft_model = lora(model, r=cfg.drift_rank, alpha=cfg.drift_alpha) if cfg.drift_rank > 0 else model.requires_grad_(True)
    opt = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=cfg.drift_lr, weight_decay=0.0)
    peft_model.train()
    losses = []
    for _ in range(cfg.drift_steps):
        rows = pack(texts, weights, cfg.drift_batch, cfg.drift_seq_len, tok.eos_token_id, gen).to(device)
        loss = peft_model(input_ids=rows, labels=rows).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    merged = (peft_model.merge_and_unload() if cfg.drift_rank > 0 else peft_model).eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)
    meta = {**drift_settings(cfg), "version": DRIFT_VERSION, "first_loss": losses[0] if losses else None,
            "last_loss": sum(losses[-10:]) / max(1, len(losses[-10:])), "build_cpu_s": time.process_time() - cpu0,
            "build_wall_s": devices.clock(device) - wall0}
    (out_dir / META_FILE).write_text(json.dumps(meta, indent=1, sort_keys=True))
    return meta
