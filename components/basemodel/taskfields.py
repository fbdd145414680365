"""The task-file fields of the LLM fine-tuning workloads' `Config`s, documented once, and their checks.

Every such workload names its base model and its task data the same way: `base`, `base_seed`,
`dtype`, `task_path`, `task_split`, `eval_path`, `eval_split` (`TaskFields`), and, where its records
are read as prompt and answer, `prompt_field` (`PromptField`) and `answer_field` (`AnswerField`).
A workload's `Config` inherits them and declares none itself; `with_task_fields` gives it the
mixins it reads and the defaults it differs in:

    @dataclass(frozen=True)
    class Config(with_task_fields(PromptField, AnswerField, dtype="float32")):
        steps: int = 100
        \"\"\"Optimizer steps.\"\"\"

`task_problems(cfg)` is every check of those fields, as messages naming the fix: the config
alone for `validate`; this machine (the base model present, each file read by the workload's
own `check`) with `machine=True` for `preflight`.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from components.basemodel.loader import DTYPES, TINY, base_problems, check_base, check_dtype


@dataclass(frozen=True)
class TaskFields:
    """The base model and the task files (see the module docstring)."""

    base: str = TINY
    """Base model: 'tiny-local[:k=v,...]', a local save_pretrained folder or a Hugging Face hub id (read from the
    local cache: nothing is downloaded at run time)."""
    base_seed: int = 0
    """Seed of the tiny-local build and of its world (ignored for other bases); never a trial seed: keep it fixed
    across a sweep."""
    dtype: str = "auto"
    """Weights' dtype when loading the base: 'auto' (the checkpoint's own; tiny-local's is float32), 'float32',
    'bfloat16' (the full-size runs, on a GPU) or 'float16'."""
    task_path: str = ""
    """Task data: a JSONL file (one JSON object per line) or a datasets save_to_disk folder whose records hold the
    fields the *_field settings name (comma-separated files where the workload trains one task per file);
    '' = the workload's built-in task on tiny-local's world (the CI default)."""
    task_split: str = "train"
    """Split of a saved DatasetDict read from task_path (a JSONL file or a saved single Dataset has none)."""
    eval_path: str = ""
    """Held-out data in task_path's format, as many files as task_path names; '' = a seeded share of task_path's
    records is held out."""
    eval_split: str = "test"
    """Split of a saved DatasetDict read from eval_path (GLUE tasks: 'validation', their test labels are hidden)."""


@dataclass(frozen=True)
class PromptField:
    """The prompt field of a workload that reads its records as prompt and answer."""

    prompt_field: str = "prompt"
    """Record field holding the prompt (GSM8K: 'question'; MetaMathQA: 'query'; Alpaca: 'instruction')."""


@dataclass(frozen=True)
class AnswerField:
    """The answer field of a workload that reads its records as prompt and answer."""

    answer_field: str = "answer"
    """Record field holding the answer the model learns and is scored on (MetaMathQA: 'response')."""


MIXINS = (PromptField, AnswerField)
"""The field groups `with_task_fields` adds to `TaskFields`, in the order their fields come."""


def with_task_fields(*mixins: type, **defaults: Any) -> type:
    """The frozen dataclass a workload's `Config` inherits: `TaskFields`, then the `mixins` it reads
    (`PromptField`, `AnswerField`), with `defaults` replacing theirs (e.g. dtype="float32"). The
    fields keep their place and their docstrings; only the defaults differ."""
    unknown_mixins = [m for m in mixins if m not in MIXINS]
    if unknown_mixins:
        raise TypeError(f"with_task_fields takes {[m.__name__ for m in MIXINS]}, not {unknown_mixins}")
    groups = (TaskFields, *sorted(set(mixins), key=MIXINS.index))
    hints = {k: v for g in groups for k, v in typing.get_type_hints(g).items()}
    unknown = sorted(set(defaults) - set(hints))
    if unknown:
        raise TypeError(f"with_task_fields: {unknown} are not fields of {[g.__name__ for g in groups]}; "
                        f"choose among {list(hints)}")
    if len(groups) == 1 and not defaults:
        return TaskFields
    label = ", ".join([g.__name__ for g in groups[1:]] + [f"{k}={v!r}" for k, v in defaults.items()])
    return dataclasses.make_dataclass(
        "TaskFields", [(k, hints[k], dataclasses.field(default=v)) for k, v in defaults.items()],
        bases=tuple(reversed(groups)), frozen=True,  # base classes' fields come first: TaskFields', then the mixins'
        namespace={"__module__": __name__, "__qualname__": f"with_task_fields({label})",
                   "__doc__": f"TaskFields with {label} (see `with_task_fields`)."})


TASK_FIELDS = tuple(f.name for g in (TaskFields, *MIXINS) for f in dataclasses.fields(g))
"""Every field `with_task_fields` can give a Config: no workload's Config declares one itself."""


def one_file(value: str) -> list[str]:
    """task_path / eval_path as one file ('' -> none)."""
    return [value] if value else []


def task_problems(cfg: Any, *, machine: bool = False, dtypes: tuple[str, ...] = DTYPES, targets: Any = None,
                  target_field: str = "lora_targets", check: Callable[[str, str, str], Any] | None = None,
                  files: Callable[[str], list[str]] = one_file) -> list[str]:
    """What is wrong with `cfg`'s task-file fields, as messages naming the fix (empty: nothing).

    Without `machine` (a workload's `validate`): the config alone: `base` is a well-formed name
    (`check_base`), `dtype` one of `dtypes`, eval_path comes with a task_path, and the split of each
    file given is named.
    With `machine=True` (its `preflight`), this machine: the base model is here and has the
    projection kinds `targets` names (`base_problems`; `target_field` names the field they come
    from), and every file of task_path and eval_path (`files` splits a field into them) passes
    `check(path, split, what)`, the workload's own reading of it through `taskfile` (a ValueError
    it raises becomes the message: a missing file is named with the format expected), or, without
    a `check`, exists."""
    problems: list[str] = []
    paths = (("task_path", cfg.task_path, "task_split", cfg.task_split),
             ("eval_path", cfg.eval_path, "eval_split", cfg.eval_split))
    if not machine:
        for run in (lambda: check_base(cfg.base), lambda: check_dtype(cfg.dtype, allowed=dtypes)):
            try:
                run()
            except ValueError as exc:
                problems.append(str(exc))
        if cfg.eval_path and not cfg.task_path:
            problems.append(f"eval_path={cfg.eval_path!r} is set without task_path: it holds out records of a task "
                            f"file, and the built-in task holds out its own; set task_path too, or eval_path=''")
        for what, value, split_name, split in paths:
            if value and not split.strip():
                problems.append(f"{split_name}={split!r} names no split of {what}: name the split of its saved "
                                f"DatasetDict to read (e.g. 'train'; a JSONL file has none and ignores it)")
        return problems
    problems += base_problems(cfg.base, targets, field=target_field)
    for what, value, split_name, split in paths:
        for path in files(value):
            if check is not None:
                try:
                    check(path, split, what)  # read through `taskfile`: a missing file is named with its format
                except ValueError as exc:
                    problems.append(str(exc))
            elif not Path(path).expanduser().exists():
                problems.append(f"{what}={path!r} does not exist on this machine (task files are not downloaded at "
                                f"run time): give a JSONL file or a datasets save_to_disk folder that is here, or "
                                f"{what}=''")
    return problems
