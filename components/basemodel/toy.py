"""A tiny GPT-2 folder for tests and for trying a workload on a second architecture, offline.

`save_tiny_gpt2(folder, texts)` writes what `from_pretrained` reads for a GPT-2 checkpoint: a
`GPT2LMHeadModel` (Conv1D projections, blocks under `transformer.h`, learnt positions) from
`GPT2Config`, randomly initialised from `seed`, and a byte-level BPE tokenizer trained on `texts`
(so any text encodes, a word often as several tokens, as with a real sub-word tokenizer). It
differs from tiny-local (a Llama with a word-level tokenizer) in every respect a workload could
wrongly depend on: module names, module types, tokenizer kind, no `<bos>`, tied head.

    from components.basemodel.toy import save_tiny_gpt2
    save_tiny_gpt2("gpt2-tiny", ["question : what is 2 + 3 ? answer : 5", ...])
    model, tok = load_base("gpt2-tiny")
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

EOT = "<|endoftext|>"


def save_tiny_gpt2(folder: str | Path, texts: Iterable[str], *, vocab_size: int = 400, layers: int = 2,
                   hidden: int = 32, heads: int = 2, positions: int = 128, seed: int = 0) -> Path:
    """Write a randomly initialised GPT-2 and a BPE tokenizer trained on `texts` into `folder`
    (created); returns it. `vocab_size` bounds the BPE vocabulary (bytes and `<|endoftext|>`
    included); `positions` is the longest sequence the model takes."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    lines = [t for t in texts if t]
    if not lines:
        raise ValueError("save_tiny_gpt2 needs at least one non-empty text to train its tokenizer on")
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token=EOT, eos_token=EOT, pad_token=EOT,
                                        model_max_length=positions, clean_up_tokenization_spaces=False)
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(out))
    eot = tokenizer.convert_tokens_to_ids(EOT)
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_layer=layers, n_embd=hidden, n_head=heads,
                                           n_positions=positions, bos_token_id=eot, eos_token_id=eot,
                                           pad_token_id=eot))
    finally:
        torch.random.set_rng_state(gen_state)
    model.save_pretrained(str(out), safe_serialization=True)
    return out
