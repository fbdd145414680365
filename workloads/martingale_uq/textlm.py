"""The paper's text scenario: a frozen pretrained causal LM (GPT-2) loaded by transformers'
`from_pretrained`, scoring texts of a text file (WikiText-2 raw) and its own generations.

A text is `text_len` tokens; its metric value is the LM's negative log-likelihood per token given
the tokens before it, after the tokenizer's start token (BOS, else EOS, as GPT-2 starts a
document). Deployed ("real") texts are disjoint windows of the file's token stream, chosen at
random; the generator's texts are the LM's own samples from the start token at `temperature`
(ancestral sampling, no top-k), the GPT-2-scores-its-own-generations setting of the paper.

The text file is a plain UTF-8 file (`.txt`, e.g. `wiki.test.raw`) or a folder written by
Hugging Face datasets' `save_to_disk` with a `text` column (WikiText-2 as the hub publishes it),
whose lines are joined with newlines.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

MODEL_SOURCES = ("a folder written by transformers' save_pretrained holding a causal LM and its tokenizer, or a hub "
                 "id fetched once beforehand into the Hugging Face cache, e.g. `hf download gpt2` "
                 "(https://huggingface.co/openai-community/gpt2)")
TEXT_SOURCES = ("a UTF-8 text file (WikiText-2 raw's wiki.test.raw) or a datasets save_to_disk folder with a 'text' "
                "column; WikiText-2 raw: https://huggingface.co/datasets/Salesforce/wikitext, config 'wikitext-2-raw-v1' "
                "(`datasets.load_dataset('Salesforce/wikitext', 'wikitext-2-raw-v1').save_to_disk(DIR)` once, where "
                "the internet is reachable)")


def load(model: str, device: torch.device) -> tuple[torch.nn.Module, Any, int]:
    """(frozen LM in eval mode on `device`, its tokenizer, the start token id); nothing is downloaded."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model, local_files_only=True)
    lm = AutoModelForCausalLM.from_pretrained(model, local_files_only=True, dtype=torch.float32).to(device).eval()
    lm.requires_grad_(False)
    start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    if start is None:
        raise ValueError(f"model={model!r}: its tokenizer has neither a BOS nor an EOS token to start a text from")
    return lm, tokenizer, int(start)


def tokenize(tokenizer: Any, text: str) -> torch.Tensor:
    """The text's token ids [T], in pieces so that no tokenizer limit on one call applies."""
    ids: list[int] = []
    lines = text.splitlines(keepends=True)
    for i in range(0, len(lines), 1000):
        ids.extend(tokenizer("".join(lines[i : i + 1000]), add_special_tokens=False)["input_ids"])
    return torch.tensor(ids, dtype=torch.long)


def real_windows(ids: torch.Tensor, start: int, length: int, count: int, gen: torch.Generator) -> torch.Tensor:
    """[min(count, T // length), 1 + length]: disjoint windows of the stream, at random, after the start token."""
    n = len(ids) // length
    pick = torch.randperm(n, generator=gen)[:count]
    windows = ids[: n * length].view(n, length)[pick]
    return torch.cat([torch.full((len(pick), 1), start, dtype=torch.long), windows], 1)


@torch.no_grad()
def generate(lm: torch.nn.Module, start: int, count: int, length: int, temperature: float, gen: torch.Generator,
             batch: int, device: torch.device) -> torch.Tensor:
    """[count, 1 + length]: the LM's samples after the start token, with its key-value cache."""
    out = []
    for i in range(0, count, batch):
        b = min(batch, count - i)
        tokens = torch.full((b, 1), start, dtype=torch.long, device=device)
        past = None
        for _ in range(length):
            step = lm(input_ids=tokens[:, -1:] if past is not None else tokens, past_key_values=past, use_cache=True)
            past = step.past_key_values
            probs = torch.softmax(step.logits[:, -1].float() / temperature, dim=-1)
            tokens = torch.cat([tokens, torch.multinomial(probs, 1, generator=gen)], 1)
        out.append(tokens.cpu())
    return torch.cat(out)


@torch.no_grad()
def nll_per_token(lm: torch.nn.Module, windows: torch.Tensor, batch: int, device: torch.device) -> torch.Tensor:
    """Mean NLL (nats) per token of each window after its first token, [N]."""
    out = []
    for i in range(0, len(windows), batch):
        w = windows[i : i + batch].to(device)
        logp = F.log_softmax(lm(input_ids=w).logits[:, :-1].float(), dim=-1)  # [b, L, V]
        out.append(-logp.gather(-1, w[:, 1:, None]).squeeze(-1).mean(-1).cpu())
    return torch.cat(out)
