"""Real compressed bases through bitsandbytes (`Config.bnb_schemes`), beside the fake compressors.

The adapter a trial trained is evaluated once more on the base loaded by transformers with a
`BitsAndBytesConfig`: `nf4` (QLoRA's 4-bit NormalFloat, blocks of 64, bfloat16 compute) or `int8`
(LLM.int8()). bitsandbytes is not a ladder dependency and runs only on a CUDA GPU: `problem()` says
what is missing, and `preflight` refuses the option with it before anything is launched.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

BNB_SCHEMES = ("nf4", "int8")


def problem(names: tuple[str, ...]) -> str:
    """Why `names` cannot be loaded through bitsandbytes here ('' when they can)."""
    missing = []
    if importlib.util.find_spec("bitsandbytes") is None:
        missing.append("bitsandbytes is not installed (`pip install bitsandbytes`)")
    if not torch.cuda.is_available():
        missing.append("this machine has no CUDA GPU")
    if not missing:
        return ""
    return (f"bnb_schemes={tuple(names)} loads the base through bitsandbytes, which needs a CUDA GPU and "
            f"`pip install bitsandbytes`: {'; '.join(missing)} (or set bnb_schemes=() to use only the fake compressors)")


def quantization_config(name: str, compute_dtype: torch.dtype) -> Any:
    """transformers' BitsAndBytesConfig for `name` in BNB_SCHEMES."""
    from transformers import BitsAndBytesConfig

    if name == "nf4":
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=compute_dtype)
    if name == "int8":
        return BitsAndBytesConfig(load_in_8bit=True)
    raise ValueError(f"bnb scheme must be one of {BNB_SCHEMES}, got {name!r}")


def load(path: str, name: str, *, seed: int, dtype: str) -> tuple[Any, Any]:
    """(model, tokenizer) of the base at `path` quantized by bitsandbytes on the current GPU."""
    from components.basemodel import load_base

    reason = problem((name,))
    if reason:
        raise RuntimeError(reason)
    compute = torch.bfloat16 if dtype in ("auto", "bfloat16") else getattr(torch, dtype)
    return load_base(path, seed=seed, dtype=compute, quantization_config=quantization_config(name, compute),
                     device_map={"": torch.cuda.current_device()})
