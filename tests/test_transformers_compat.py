"""ladder ships a top-level `kernels` package; Hugging Face's `kernels` hub package has the same
import name and transformers probes for it. Ours must not be mistaken for it."""

from __future__ import annotations

import torch


def test_transformers_builds_and_runs_a_tiny_model_with_ladder_installed():
    import kernels
    import transformers
    from transformers.utils import import_utils

    assert kernels.__file__ and "site-packages/kernels" not in kernels.__file__  # ours, not the hub's
    assert not import_utils.is_kernels_available()
    config = transformers.LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 97, (2, 10))
    out = model(input_ids=ids, labels=ids)
    assert out.logits.shape == (2, 10, 97) and torch.isfinite(out.loss)
    generated = model.generate(ids, max_new_tokens=5, do_sample=False)
    assert generated.shape == (2, 15)
