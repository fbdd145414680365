"""LoRA through peft, and the names of a decoder's linear module types (q_proj ... down_proj)."""

from __future__ import annotations

from typing import Any, Sequence

import torch

LLAMA_LINEAR_TYPES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The linear module types of a Llama-architecture decoder layer (also Qwen, Gemma, Mistral)."""


def linear_types(model: torch.nn.Module) -> list[str]:
    """The distinct leaf names of `nn.Linear` modules inside the decoder layers, in first-seen
    order (lm_head and embeddings excluded): the `target_modules` vocabulary of this model."""
    seen: dict[str, None] = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and ".layers." in name:
            seen.setdefault(name.rsplit(".", 1)[-1], None)
    return list(seen)


def lora(model: torch.nn.Module, targets: Sequence[str] | str = "all-linear", *, r: int = 8, alpha: float = 16,
         dropout: float = 0.0, adapter_name: str = "default", **lora_kwargs: Any) -> Any:
    """`peft.get_peft_model` with a causal-LM `LoraConfig`: only the adapter is trainable.
    `targets` are module type names (see `linear_types`) or peft's "all-linear" (lm_head excluded)."""
    from peft import LoraConfig, get_peft_model

    if not isinstance(targets, str):
        known = set(linear_types(model))
        unknown = [t for t in targets if t not in known]
        if unknown:
            raise ValueError(f"LoRA targets {unknown} are not linear module types of this model; choose among {sorted(known)}")
        targets = list(targets)
    cfg = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets, task_type="CAUSAL_LM",
                     **lora_kwargs)
    return get_peft_model(model, cfg, adapter_name=adapter_name)
