"""The base language model of ladder's LLM fine-tuning workloads.

    from orchestrator.basemodel import base_world, load_base, lora
    model, tokenizer = load_base("tiny-local")          # or "meta-llama/Llama-3.1-8B", or a folder
    world = base_world("tiny-local")                    # the corpus it was pre-trained on
    peft_model = lora(model, ["q_proj", "v_proj"], r=4)

`tiny-local` is a small `LlamaForCausalLM` with a word-level tokenizer of its own, pre-trained
here (one CPU thread, about a minute) on templated attribute sentences, modular arithmetic and
key-value facts, then cached under `$LADDER_CACHE` (default `~/.cache/ladder`) and loaded through
`from_pretrained` like any hub model. Its held-out metrics: `base_info("tiny-local")["metrics"]`
or `ladder base info`.
"""

from orchestrator.basemodel.adapters import LLAMA_LINEAR_TYPES, linear_types, lora
from orchestrator.basemodel.corpus import RESERVED_TOKENS, Example, World, make_world, vocabulary
from orchestrator.basemodel.loader import TINY, BaseModelError, base_info, base_world, check_base, load_base, parse_tiny, resolve
from orchestrator.basemodel.tiny import CODE_VERSION, TinyRecipe, cache_root, score

__all__ = [
    "CODE_VERSION", "LLAMA_LINEAR_TYPES", "RESERVED_TOKENS", "TINY", "BaseModelError", "Example", "TinyRecipe",
    "World", "base_info", "base_world", "cache_root", "check_base", "linear_types", "load_base", "lora", "make_world",
    "parse_tiny", "resolve", "score", "vocabulary",
]
