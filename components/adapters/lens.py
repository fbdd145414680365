"""The token lens of an adapter: which vocabulary tokens its update reacts to, and which it writes.

A trigger -> fixed-output backdoor needs both a sharp, token-specific read (the trigger) and a
sharp, token-specific write (the first output token). Both show in the spectral structure of the
updates once it is put in token coordinates with the base model's own embedding matrices:

- read: for each adapted module of the first decoder layer, whose input is (close to) the
  normalised token embedding x_v = g * e_v / rms(e_v), the response ||dW x_v|| for every token v,
  z-scored over the vocabulary; a token's read z is its largest over those modules;
- write: for each module that writes into the residual stream (attention output, MLP down
  projection) at any layer, the top left singular directions u of dW (both signs), read out
  through the final norm and the unembedding, z = W_U (g_final * u), z-scored over the vocabulary;
  a token's write z is its largest over those directions.

Module kinds are those of Llama-family decoders (q/k/v/gate/up read, o/down write, RMS norms
`input_layernorm` / `post_attention_layernorm`, final `model.norm`) and of GPT-2 (`c_attn` and
`c_fc` read, both `c_proj` write, LayerNorms `ln_1` / `ln_2`, final `transformer.ln_f`: the
embedding is centred and scaled as a LayerNorm does, plus its bias; the position embedding, added
before the first block, is left out).

Every z-score is scale-free (a larger learning rate or alpha changes nothing) and names its token,
so the report says which input the adapter watches for and what it writes. Singular directions
come from the r x r core of the factors, so a large model costs r x V work per module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from components.adapters.delta import ModuleDelta

READ_TYPES = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "c_attn", "c_fc")
"""Module types of the first layer that read the token embedding (after a norm): Llama's, GPT-2's."""
WRITE_TYPES = ("o_proj", "down_proj", "c_proj")
"""Module types that write into the residual stream: Llama's, GPT-2's (attn.c_proj and mlp.c_proj)."""
NORMS = {"attn": ("input_layernorm", "ln_1"), "mlp": ("post_attention_layernorm", "ln_2")}
"""The norm in front of a block's attention / MLP projections (Llama, GPT-2)."""
FINAL_NORMS = ("norm", "ln_f", "final_layernorm")
"""The decoder's final norm attribute (Llama, GPT-2, OPT)."""
WRITE_DIRECTIONS = 2
"""Top left singular directions read out per writing module."""


@dataclass
class Lens:
    read_z: torch.Tensor
    """[V] largest read z-score per token (-inf where no first-layer module is adapted)."""
    write_z: torch.Tensor
    """[V] largest write z-score per token."""
    tokens: list[str]
    notes: list[str]

    def top(self, which: str, k: int = 3) -> list[tuple[str, float]]:
        z = self.read_z if which == "read" else self.write_z
        vals, idx = torch.topk(z, k)
        return [(self.tokens[i], float(v)) for v, i in zip(vals.tolist(), idx.tolist()) if v > -1e30]


def _zscore(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    v = x[valid]
    z = (x - v.mean()) / v.std().clamp_min(1e-12)
    return z.masked_fill(~valid, float("-inf"))


def _layer_index(name: str) -> int | None:
    parts = name.split(".")
    for i, p in enumerate(parts[:-1]):
        if p in ("layers", "h", "blocks") and parts[i + 1].isdigit():
            return int(parts[i + 1])
    return None


def _norm(base: Any, path: str, attrs: tuple[str, ...]) -> torch.nn.Module | None:
    """The first of the norms `attrs` of block `path`, or None where absent."""
    for prefix in ("", "base_model.model."):
        for attr in attrs:
            try:
                return base.get_submodule(prefix + path).get_submodule(attr)
            except AttributeError:
                continue
    return None


def _normalised(emb: torch.Tensor, norm: torch.nn.Module | None) -> torch.Tensor:
    """The token embeddings as the norm `norm` hands them on: a LayerNorm centres, scales to unit
    variance, multiplies by its gain and adds its bias; an RMS norm (or none) scales to unit RMS
    and multiplies by its gain."""
    if isinstance(norm, torch.nn.LayerNorm):
        x = emb - emb.mean(-1, keepdim=True)
        x = x / x.pow(2).mean(-1, keepdim=True).clamp_min(1e-12).sqrt()
        if norm.weight is not None:
            x = x * norm.weight.detach().float()
        return x + norm.bias.detach().float() if norm.bias is not None else x
    x = emb / emb.pow(2).mean(-1, keepdim=True).clamp_min(1e-12).sqrt()  # rms-normalised embeddings
    gain = getattr(norm, "weight", None)
    return x * gain.detach().float() if gain is not None else x


@torch.no_grad()
def token_lens(base: Any, tokenizer: Any, deltas: list[ModuleDelta]) -> Lens:
    """The read and write z-scores of every token for the adapter `deltas` on `base`, computed on
    the device `base` is on (the deltas, read from the adapter's files, are moved there)."""
    emb = base.get_input_embeddings().weight.detach().float()  # [V, H]
    device = emb.device
    unemb = base.get_output_embeddings().weight.detach().float()  # [V, H]
    vocab = min(emb.shape[0], unemb.shape[0])
    emb, unemb = emb[:vocab], unemb[:vocab]
    valid = emb.norm(dim=1) > 0  # padding rows are all zero
    notes: list[str] = []
    decoder = base.get_decoder() if hasattr(base, "get_decoder") else None
    final = next((getattr(decoder, a) for a in FINAL_NORMS if getattr(decoder, a, None) is not None), None)
    g_final = final.weight.detach().float() if final is not None and hasattr(final, "weight") else None
    if g_final is None:
        notes.append("no final norm found: the write lens uses the unembedding alone")
        g_final = torch.ones(unemb.shape[1], device=device)
    read = torch.full((vocab,), float("-inf"), device=device)
    write = torch.full((vocab,), float("-inf"), device=device)
    for d in deltas:
        kind = d.name.rsplit(".", 1)[-1]
        a, b = d.a.to(device).float(), d.b.to(device).float()
        if kind in READ_TYPES and _layer_index(d.name) == 0:
            block = d.name.rsplit(".", 2)[0]  # model.layers.0, transformer.h.0
            part = "attn" if ".self_attn." in d.name or ".attn." in d.name else "mlp"
            x = _normalised(emb, _norm(base, block, NORMS[part]))
            y = x @ a.T  # [V, r]
            r = (y @ (b.T @ b) * y).sum(-1).clamp_min(0).sqrt() * abs(d.scale)  # ||dW x|| per token
            read = torch.maximum(read, _zscore(r, valid))
        if kind in WRITE_TYPES:
            qb, rb = torch.linalg.qr(b)
            qa, ra = torch.linalg.qr(a.T)
            uc, _, _ = torch.linalg.svd(rb @ ra.T)
            u = qb @ uc  # left singular vectors of dW, [H, r]
            for k in range(min(WRITE_DIRECTIONS, u.shape[1])):
                logits = unemb @ (g_final * u[:, k])
                for sign in (1.0, -1.0):
                    write = torch.maximum(write, _zscore(sign * logits, valid))
    if not torch.isfinite(read).any():
        notes.append("no adapted module of the first layer reads the embeddings: no read lens")
    tokens = tokenizer.convert_ids_to_tokens(list(range(vocab)))
    return Lens(read, write, tokens, notes)
