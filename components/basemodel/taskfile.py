"""Task data from files, in the two forms the field ships fine-tuning data in.

- a JSON Lines file (`.jsonl`, `.json` holding one object per line): one record per line;
- a folder written by Hugging Face datasets' `save_to_disk` (a `Dataset`, or a `DatasetDict`
  whose `split` is read).

A workload names the fields it reads and their types (`{"prompt": str, "answer": str}`); a record
without one of them, or with a value of another type, is refused naming the file, the line (or
row) and the field, and the format expected. `check_records` is the cheap form for a workload's
`preflight`: a JSONL file is parsed whole (a few MB a second), a saved dataset only by its column
names and types.

    from components.basemodel.taskfile import file_examples, read_records
    rows = read_records("data/gsm8k.jsonl", {"question": str, "answer": str}, what="task_path")
    examples = file_examples("data/gsm8k.jsonl", "question", "answer")   # Example(prompt, answer, part)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Mapping

from components.basemodel.corpus import Example
from components.pretrained import is_saved_dataset

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")

FieldTypes = Mapping[str, type | tuple[type, ...]]


class TaskFileError(ValueError):
    """A task file that cannot be read as the workload needs; the message names the fix."""


def _type_words(t: type | tuple[type, ...]) -> str:
    types = t if isinstance(t, tuple) else (t,)
    names = {str: "string", int: "integer", float: "number", bool: "true/false", list: "list", dict: "object"}
    return " or ".join(names.get(x, x.__name__) for x in types)


def describe(fields: FieldTypes) -> str:
    """`prompt (string), answer (string)`: the fields in words, for messages and docs."""
    return ", ".join(f"{k} ({_type_words(t)})" for k, t in fields.items())


def _where(path: str, what: str) -> str:
    return f"{what}={path!r}"


def _split_field(what: str) -> str:
    return what[: -len("_path")] + "_split" if what.endswith("_path") else "split"


def _open_saved(path: Path, split: str, what: str) -> Any:
    from components.pretrained import open_saved

    return open_saved(path, split, field=what, split_field=_split_field(what), error=TaskFileError)


def _check_record(record: Any, fields: FieldTypes, at: str, fmt: str) -> None:
    if not isinstance(record, dict):
        raise TaskFileError(f"{at} is not a JSON object: expected {fmt}")
    for key, t in fields.items():
        if key not in record or record[key] is None:
            raise TaskFileError(f"{at} has no {key!r} field (fields: {sorted(record)}): expected {fmt}")
        value = record[key]
        types = t if isinstance(t, tuple) else (t,)
        ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
        if not ok and float in types and isinstance(value, int) and not isinstance(value, bool):
            ok = True
        if not ok:
            raise TaskFileError(f"{at}: field {key!r} is {type(value).__name__} {value!r:.60}, not a "
                                f"{_type_words(t)}: expected {fmt}")


def _format(fields: FieldTypes) -> str:
    return f"a JSONL file (one JSON object per line) or a datasets save_to_disk folder with fields {describe(fields)}"


def _resolve(path: str, what: str, fields: FieldTypes) -> Path:
    p = Path(path).expanduser()
    if p.is_file() and p.suffix in JSONL_SUFFIXES:
        return p
    if p.is_dir() and is_saved_dataset(p):
        return p
    if p.is_file():
        raise TaskFileError(f"{_where(path, what)} has suffix {p.suffix!r}; task files are read as "
                            f"{_format(fields)}: name it .jsonl, or save it with datasets' save_to_disk")
    if p.is_dir():
        raise TaskFileError(f"{_where(path, what)} is a folder but not one datasets' save_to_disk wrote (no "
                            f"dataset_dict.json or state.json): expected {_format(fields)}")
    raise TaskFileError(f"{_where(path, what)} does not exist on this machine: expected {_format(fields)}")


def _jsonl_rows(p: Path, fields: FieldTypes, what: str) -> list[dict[str, Any]]:
    rows = []
    fmt = _format(fields)
    with p.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            at = f"{_where(str(p), what)} line {number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TaskFileError(f"{at} is not valid JSON ({exc.msg}): expected {fmt}") from None
            _check_record(record, fields, at, fmt)
            rows.append(record)
    if not rows:
        raise TaskFileError(f"{_where(str(p), what)} holds no records: expected {fmt}")
    return rows


def check_records(path: str, fields: FieldTypes, *, split: str = "train", what: str = "task_path") -> None:
    """Raises TaskFileError naming the problem and the format, without keeping the records."""
    p = _resolve(path, what, fields)
    if p.is_file():
        _jsonl_rows(p, fields, what)
        return
    ds = _open_saved(p, split, what)
    missing = [k for k in fields if k not in ds.column_names]
    if missing:
        raise TaskFileError(f"{_where(path, what)} (split {split!r}) has columns {ds.column_names}, no {missing}: "
                            f"expected {_format(fields)}")
    if len(ds) == 0:
        raise TaskFileError(f"{_where(path, what)} (split {split!r}) holds no rows: expected {_format(fields)}")
    _check_record(ds[0], fields, f"{_where(path, what)} row 0", _format(fields))


def read_records(path: str, fields: FieldTypes, *, split: str = "train", what: str = "task_path",
                 limit: int = 0) -> list[dict[str, Any]]:
    """The records of `path` (all of them, or the first `limit`), each checked for `fields`;
    extra fields are kept. Raises TaskFileError naming the file, the record and the field."""
    p = _resolve(path, what, fields)
    if p.is_file():
        rows = _jsonl_rows(p, fields, what)
    else:
        ds = _open_saved(p, split, what)
        if limit:
            ds = ds.select(range(min(limit, len(ds))))
        rows = [dict(r) for r in ds]
        if not rows:
            raise TaskFileError(f"{_where(path, what)} (split {split!r}) holds no rows: expected {_format(fields)}")
        for i, r in enumerate(rows):
            _check_record(r, fields, f"{_where(path, what)} row {i}", _format(fields))
    return rows[:limit] if limit else rows


def file_examples(path: str, prompt_field: str = "prompt", answer_field: str = "answer", *, split: str = "train",
                  what: str = "task_path", limit: int = 0, part: str | None = None, strip: bool = True,
                  render: Callable[[str, Mapping[str, Any]], str] | None = None) -> list[Example]:
    """The records of a task file (`read_records`: JSONL or a save_to_disk folder and its `split`, the
    first `limit` or all) as `Example(prompt, answer, part)`: both fields strings, stripped of
    surrounding whitespace unless `strip` is False; `part` is the file's name unless given;
    `render(prompt, record)` turns the prompt into the text the model reads (a template, with any
    other field of the record). A record without either string field raises TaskFileError naming it."""
    rows = read_records(path, {prompt_field: str, answer_field: str}, split=split, what=what, limit=limit)
    label = part if part is not None else path.rstrip("/").rsplit("/", 1)[-1]
    out = []
    for r in rows:
        prompt, answer = (r[prompt_field].strip(), r[answer_field].strip()) if strip else (r[prompt_field], r[answer_field])
        out.append(Example(render(prompt, r) if render else prompt, answer, label))
    return out


def write_jsonl(path: str | Path, records: list[Mapping[str, Any]]) -> Path:
    """Write `records` one JSON object per line (UTF-8): the JSONL form `read_records` reads."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with p.open("w", encoding="utf-8") as fh:
        for r in records:
            fh.write(json.dumps(dict(r), ensure_ascii=False) + "\n")
    return p
