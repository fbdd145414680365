"""tiny-local's tokenizer: word level over `corpus.vocabulary()`, built with `tokenizers` and wrapped
in transformers' `PreTrainedTokenizerFast`, so it saves and loads like any hub tokenizer.

Text is split on whitespace; every word is one token; a word outside the vocabulary becomes
`<unk>`. Encoding prepends `<bos>` (as Llama tokenizers do) and never appends `<eos>`.
`<extra_0>` ... `<extra_63>` are in the vocabulary but never in pre-training: use them for
triggers, markers and separators (`tokenizer.convert_tokens_to_ids("<extra_0>")`).
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from components.basemodel.corpus import RESERVED_TOKENS, vocabulary


def build_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {w: i for i, w in enumerate(vocabulary())}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with single spaces
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        additional_special_tokens=list(RESERVED_TOKENS),
        padding_side="right",
        model_max_length=512,
        clean_up_tokenization_spaces=False,
    )
