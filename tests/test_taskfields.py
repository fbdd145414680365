"""The task-file fields of the LLM fine-tuning workloads have one home (components.basemodel.taskfields):
no workload's Config declares one itself, every one is documented (field_docs reads inherited
docstrings), the shared checks name the fix, and `file_examples` reads a task file for every caller."""

from __future__ import annotations

import dataclasses
import importlib

import pytest

from components.basemodel import (
    TASK_FIELDS, AnswerField, PromptField, TaskFields, check_records, file_examples, task_problems, with_task_fields,
    write_jsonl,
)
from orchestrator.runners.config import field_docs

WORKLOADS = ("car_lora", "dit", "jailbreak_lora", "lmao", "palc", "pica", "plop")
SHARED = ("base", "base_seed", "dtype", "task_path", "task_split", "eval_path", "eval_split")


def _config(name: str) -> type:
    return importlib.import_module(f"workloads.{name}.workload").Config


def _declared(config: type) -> list[str]:
    """The task-file fields `config`'s own class body declares."""
    return sorted(set(config.__dict__.get("__annotations__", {})) & set(TASK_FIELDS))


@pytest.mark.parametrize("name", WORKLOADS)
def test_no_workload_config_declares_a_task_file_field_and_each_is_documented(name):
    config = _config(name)
    declared = _declared(config)
    assert not declared, (f"workloads/{name}/workload.py's Config declares {declared} itself: inherit them through "
                          f"components.basemodel.with_task_fields (a different default: with_task_fields(..., field=value))")
    fields = {f.name for f in dataclasses.fields(config)}
    assert set(SHARED) <= fields
    docs = field_docs(config)
    undocumented = [f for f in TASK_FIELDS if f in fields and not docs.get(f)]
    assert not undocumented, f"{name}: field_docs(Config) lacks {undocumented}"
    shared_docs = field_docs(TaskFields) | field_docs(PromptField) | field_docs(AnswerField)
    assert {f: docs[f] for f in TASK_FIELDS if f in fields} == {f: shared_docs[f] for f in TASK_FIELDS if f in fields}


def test_a_redeclared_field_is_caught():
    @dataclasses.dataclass(frozen=True)
    class Config(with_task_fields(PromptField)):
        prompt_field: str = "question"
        """Mine."""

    assert _declared(Config) == ["prompt_field"]  # what the test above refuses
    assert field_docs(Config)["prompt_field"] == "Mine."  # and a redeclared docstring would win


def test_with_task_fields_keeps_order_and_docs_and_changes_only_defaults():
    base = with_task_fields(PromptField, AnswerField, dtype="float32", prompt_field="")
    names = [f.name for f in dataclasses.fields(base)]
    assert names == [*SHARED, "prompt_field", "answer_field"]
    cfg = base()
    assert (cfg.dtype, cfg.prompt_field, cfg.answer_field, cfg.base) == ("float32", "", "answer", "tiny-local")
    assert field_docs(base)["dtype"] == field_docs(TaskFields)["dtype"]
    assert with_task_fields() is TaskFields
    assert [f.name for f in dataclasses.fields(with_task_fields(AnswerField))] == [*SHARED, "answer_field"]
    with pytest.raises(TypeError, match="prompt_field"):
        with_task_fields(dtype="float32", prompt_field="q")  # no PromptField asked for
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.dtype = "auto"


def test_task_problems_name_the_problem_and_the_fix(tmp_path):
    Cfg = with_task_fields(PromptField)
    assert task_problems(Cfg()) == []
    (problem,) = task_problems(Cfg(eval_path="held.jsonl"))
    assert "eval_path='held.jsonl' is set without task_path" in problem and "set task_path too" in problem
    (problem,) = task_problems(Cfg(task_path="t.jsonl", task_split=""))
    assert "task_split='' names no split of task_path" in problem
    assert "dtype='int8' is not a dtype" in task_problems(Cfg(dtype="int8"))[0]
    assert task_problems(Cfg(dtype="float64"), dtypes=("float32", "float64")) == []

    task = write_jsonl(tmp_path / "t.jsonl", [{"prompt": "a", "answer": "b"}])
    seen = []
    cfg = Cfg(task_path=str(task), eval_path=str(tmp_path / "missing.jsonl"), eval_split="validation")
    assert task_problems(cfg, machine=True, check=lambda path, split, what: seen.append((path, split, what))) == []
    assert seen == [(str(task), "train", "task_path"), (str(tmp_path / "missing.jsonl"), "validation", "eval_path")]
    (problem,) = task_problems(cfg, machine=True)  # no check of its own: the file must exist
    assert f"eval_path={str(tmp_path / 'missing.jsonl')!r} does not exist on this machine" in problem
    (problem,) = task_problems(cfg, machine=True, check=lambda path, split, what: check_records(
        path, {"prompt": str, "answer": str}, split=split, what=what))  # read through taskfile: named with its format
    assert "eval_path=" in problem and "does not exist on this machine: expected" in problem
    assert "fields prompt (string), answer (string)" in problem

    def refuse(path, split, what):
        raise ValueError(f"{what}={path!r} is wrong")

    assert task_problems(Cfg(task_path=str(task)), machine=True, check=refuse) == [f"task_path={str(task)!r} is wrong"]
    many = Cfg(task_path=f"{task},{tmp_path / 'b.jsonl'}")
    problems = task_problems(many, machine=True, files=lambda v: v.split(","))
    assert len(problems) == 1 and "b.jsonl' does not exist" in problems[0]
    (problem,) = task_problems(Cfg(base=str(tmp_path / "nobase")), machine=True)
    assert "is neither a folder with config.json" in problem


def test_file_examples_strips_labels_and_renders_as_asked(tmp_path):
    path = write_jsonl(tmp_path / "gsm.jsonl", [{"q": " 1 + 1 ? ", "a": " 2 ", "input": "x"}])
    (e,) = file_examples(str(path), "q", "a")
    assert (e.prompt, e.answer, e.part) == ("1 + 1 ?", "2", "gsm.jsonl")
    (e,) = file_examples(str(path), "q", "a", part="file", strip=False)
    assert (e.prompt, e.answer, e.part) == (" 1 + 1 ? ", " 2 ", "file")
    (e,) = file_examples(str(path), "q", "a", render=lambda p, r: f"{p} [{r['input']}]")
    assert e.prompt == "1 + 1 ? [x]"
    with pytest.raises(ValueError, match="eval_path=.* no 'answer' field"):
        file_examples(str(path), what="eval_path", prompt_field="q")
