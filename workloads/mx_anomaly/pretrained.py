"""The paper's actual observation: a pretrained LLM (any Llama/Qwen checkpoint) loaded by
transformers' `AutoModelForCausalLM.from_pretrained`, its weights and the inputs of its linear
layers quantized, its held-out loss measured on a text.

Every `nn.Linear` but the output head (attention q/k/v/o, MLP gate/up/down) is quantized; the
embeddings and the head stay high precision, as for the Celerity-shaped LM. The weights are loaded in
float32 (a bf16 checkpoint converts exactly), so the error measured is the format's alone. The
text is a UTF-8 file or a datasets `save_to_disk` folder with a `text` column (WikiText-2 raw);
without one, the held-out files of celerity_lm's standard-library corpus, decoded.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from components import pretrained as on_disk

MODEL_SOURCES = ("a folder written by transformers' save_pretrained holding a causal LM and its tokenizer, or a hub id "
                 "fetched once beforehand into the Hugging Face cache, e.g. `hf download Qwen/Qwen2.5-0.5B` "
                 "(https://huggingface.co/Qwen/Qwen2.5-0.5B; any Llama or Qwen checkpoint)")
TEXT_SOURCES = ("a UTF-8 text file (WikiText-2 raw's wiki.test.raw) or a datasets save_to_disk folder with a 'text' "
                "column; WikiText-2 raw: https://huggingface.co/datasets/Salesforce/wikitext, config 'wikitext-2-raw-v1'")


class CausalLM(nn.Module):
    """A transformers causal LM as the measurements see the Celerity-shaped LM: token ids in, logits out."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=ids).logits

    def linears(self) -> list[nn.Linear]:
        head = self.lm.get_output_embeddings()
        return [m for m in self.lm.modules() if isinstance(m, nn.Linear) and m is not head]


def read_text(path: str, split: str) -> str:
    if not path:  # celerity_lm's held-out standard-library files
        from components.lm.corpus import load_corpus

        _, held = load_corpus("stdlib", heldout_frac=0.1, max_bytes=4_000_000)
        return held.tobytes().decode("utf-8", errors="replace")
    return on_disk.read_text(path, split)


def load(model: str, device: torch.device) -> tuple[CausalLM, Any]:
    """(the LLM in eval mode on `device`, float32, its tokenizer); nothing is downloaded."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model, local_files_only=True)
    lm = AutoModelForCausalLM.from_pretrained(model, local_files_only=True, dtype=torch.float32)
    return CausalLM(lm).to(device).eval(), tokenizer


def token_ids(tokenizer: Any, text: str, tokens: int) -> np.ndarray:
    """The first ~`tokens` tokens of the text (whole lines), tokenized in pieces."""
    ids: list[int] = []
    lines = text.splitlines(keepends=True)
    for i in range(0, len(lines), 200):
        ids.extend(tokenizer("".join(lines[i : i + 200]), add_special_tokens=False)["input_ids"])
        if len(ids) >= tokens:
            break
    return np.asarray(ids, dtype=np.int64)
