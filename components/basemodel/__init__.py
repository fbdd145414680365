"""The base language model of ladder's LLM fine-tuning workloads.

    from components.basemodel import base_world, load_base, lora
    model, tokenizer = load_base("tiny-local")          # or "meta-llama/Llama-3.1-8B", or a folder
    world = base_world("tiny-local")                    # the corpus it was pre-trained on
    peft_model = lora(model, ["q_proj", "v_proj"], r=4)  # kinds(model): the projection kinds it has

A workload reaches a model's linear projections through `projections(model)` (nn.Linear and
GPT-2's Conv1D, found by asking the model for its block class), its task data through
`read_records(path, fields)` or `file_examples(path, prompt_field, answer_field)` (JSONL or a
datasets save_to_disk folder), the base-model and task-file fields of its Config through
`with_task_fields` (checked by `task_problems`), and a second architecture for tests through
`toy.save_tiny_gpt2`.

`tiny-local` is a small `LlamaForCausalLM` with a word-level tokenizer of its own, pre-trained
here (one CPU thread, about a minute) on templated attribute sentences, modular arithmetic and
key-value facts, then cached under `$LADDER_CACHE` (default `~/.cache/ladder`) and loaded through
`from_pretrained` like any hub model. Its held-out metrics: `base_info("tiny-local")["metrics"]`
or `ladder base info`.
"""

from components.basemodel.adapters import (
    LLAMA_LINEAR_TYPES, Projection, as_linear, check_targets, kinds, linear_types, lora, projections, select, weight_oi,
)
from components.basemodel.corpus import RESERVED_TOKENS, Example, World, make_world, vocabulary
from components.basemodel.loader import (
    DTYPES, TINY, BaseModelError, base_info, base_kinds, base_problems, base_world, check_base, check_dtype, load_base, parse_tiny, resolve,
)
from components.basemodel.taskfields import (
    TASK_FIELDS, AnswerField, PromptField, TaskFields, task_problems, with_task_fields,
)
from components.basemodel.taskfile import TaskFileError, check_records, file_examples, read_records, write_jsonl
from components.basemodel.tiny import CODE_VERSION, TinyRecipe, cache_root, score

__all__ = [
    "CODE_VERSION", "DTYPES", "LLAMA_LINEAR_TYPES", "RESERVED_TOKENS", "TASK_FIELDS", "TINY", "AnswerField", "BaseModelError",
    "Example", "Projection", "PromptField", "TaskFields",
    "TaskFileError", "TinyRecipe", "World", "as_linear", "base_info", "base_kinds", "base_problems", "base_world", "cache_root", "check_base",
    "check_dtype", "check_records", "check_targets", "file_examples", "kinds", "linear_types", "load_base", "lora", "make_world",
    "parse_tiny", "projections", "read_records", "resolve", "score", "select", "task_problems", "vocabulary", "weight_oi",
    "with_task_fields", "write_jsonl",
]
