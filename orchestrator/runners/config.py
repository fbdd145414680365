"""Config dataclasses: field documentation, `--set field=value` parsing, checks and flattening.

Every workload's `Config` is a frozen dataclass whose fields carry a one-line docstring under
them. Everything here works from the dataclass itself, so a typo or a wrong type is caught
before any work is launched, with the closest valid name in the message.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import json
import textwrap
import types
import typing
from typing import Any, Iterable, Literal, Mapping


class ConfigError(ValueError):
    """A config override or value does not fit the workload's `Config`."""


def closest(name: str, options: Iterable[str], cutoff: float = 0.5) -> str | None:
    """The most similar option to `name`, or None when nothing is within `cutoff`."""
    match = difflib.get_close_matches(name, list(options), n=1, cutoff=cutoff)
    return match[0] if match else None


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of a dataclass, read from its source: its own fields' and
    those it inherits (every dataclass of its MRO, base classes first, a subclass's docstring
    replacing its base's). A class whose source cannot be read (one made by `make_dataclass`)
    adds none."""
    docs: dict[str, str] = {}
    for klass in reversed(getattr(cls, "__mro__", (cls,))):
        if klass is cls or (klass is not object and dataclasses.is_dataclass(klass)):
            docs.update(_own_field_docs(klass))
    return docs


def _own_field_docs(cls: type) -> dict[str, str]:
    """The docstrings under the fields declared in `cls`'s own class body."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    tree = ast.parse(source)
    docs: dict[str, str] = {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    for node, nxt in zip(body, body[1:] + [None]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if (
                isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def describe_type(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(describe_type(a) for a in typing.get_args(tp))
    if origin is tuple:
        args = typing.get_args(tp)
        inner = describe_type(args[0]) if args else "any"
        return f"tuple of {inner}"
    if tp is type(None):
        return "None"
    return getattr(tp, "__name__", str(tp))


def coerce(name: str, tp: Any, raw: Any) -> Any:
    """Convert `raw` (a string from the command line, or a Python value) to the field's type."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if raw is None or (isinstance(raw, str) and raw.lower() in ("none", "null")):
            if type(None) in args:
                return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return coerce(name, arg, raw)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(f"{name} expects {describe_type(tp)}, got {raw!r}")
    if origin is Literal:
        for option in args:
            if raw == option or (isinstance(raw, str) and str(option) == raw):
                return option
        hint = closest(str(raw), [str(a) for a in args])
        extra = f" (did you mean {hint!r}?)" if hint else ""
        raise ConfigError(f"{name} expects one of {describe_type(tp)}, got {raw!r}{extra}")
    if origin is tuple:
        items = raw
        if isinstance(raw, str):
            items = [p for p in raw.replace(" ", "").strip("()[]").split(",") if p]
        if not isinstance(items, (list, tuple)):
            raise ConfigError(f"{name} expects {describe_type(tp)} (comma-separated), got {raw!r}")
        inner = args[0] if args else str
        return tuple(coerce(name, inner, item) for item in items)
    if tp is bool:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.lower() in ("1", "true", "yes", "on"):
            return True
        if isinstance(raw, str) and raw.lower() in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{name} expects a bool (true/false), got {raw!r}")
    if tp is int:
        if isinstance(raw, bool):
            raise ConfigError(f"{name} expects an int, got {raw!r}")
        if isinstance(raw, int):
            return raw
        if isinstance(raw, float) and raw.is_integer():
            return int(raw)
        if isinstance(raw, str):
            try:
                return int(raw.replace("_", ""))
            except ValueError:
                try:
                    value = float(raw)
                except ValueError:
                    value = None
                if value is not None and value.is_integer():
                    return int(value)
        raise ConfigError(f"{name} expects an int, got {raw!r}")
    if tp is float:
        if isinstance(raw, bool):
            raise ConfigError(f"{name} expects a float, got {raw!r}")
        if isinstance(raw, (int, float)):
            return float(raw)
        if isinstance(raw, str):
            try:
                return float(raw)
            except ValueError:
                pass
        raise ConfigError(f"{name} expects a float, got {raw!r}")
    if tp is str:
        if isinstance(raw, str):
            return raw
        raise ConfigError(f"{name} expects a string, got {raw!r}")
    return raw


def check_fields(cls: type, names: Iterable[str], *, what: str = "field") -> None:
    """Raise for the first name that is not a field of `cls`, naming the closest valid one."""
    valid = [f.name for f in dataclasses.fields(cls)]
    for name in names:
        if name not in valid:
            hint = closest(name, valid)
            suggestion = f"; did you mean {hint!r}?" if hint else ""
            raise ConfigError(
                f"unknown {what} {name!r} for {cls.__module__}.{cls.__qualname__}{suggestion} "
                f"(valid: {', '.join(valid)})"
            )


def apply_overrides(cfg: Any, overrides: Mapping[str, Any]) -> Any:
    """A copy of `cfg` with fields replaced by (type-checked) values."""
    cls = type(cfg)
    check_fields(cls, overrides)
    hints = _hints(cls)
    values = {name: coerce(name, hints[name], raw) for name, raw in overrides.items()}
    return dataclasses.replace(cfg, **values)


def parse_sets(items: Iterable[str]) -> dict[str, str]:
    """`["width=64", "lr=1e-3"]` -> `{"width": "64", "lr": "1e-3"}`."""
    out: dict[str, str] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--set expects field=value, got {item!r}")
        key, value = item.split("=", 1)
        out[key.strip()] = value.strip()
    return out


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def from_dict(cls: type, data: Mapping[str, Any]) -> Any:
    check_fields(cls, data)
    hints = _hints(cls)
    return cls(**{k: coerce(k, hints[k], v) for k, v in data.items()})


SECRET_WORDS = ("token", "password", "passwd", "secret", "apikey", "credential", "credentials")
REDACTED = "<redacted>"


def is_secret(name: str) -> bool:
    """A field whose name says it holds a secret: token, password, secret, api_key, ..._key."""
    parts = name.lower().split("_")
    return any(p in SECRET_WORDS for p in parts) or parts[-1] == "key" or "api_key" in name.lower()


def redacted(data: dict[str, Any]) -> dict[str, Any]:
    """`data` with the values of secret-looking fields replaced, for anything that leaves the run."""
    return {k: (REDACTED if is_secret(k) and v not in ("", None) else v) for k, v in data.items()}


def flatten(cfg: Any) -> dict[str, str]:
    """Config as MLflow params: every field a string (tuples comma-joined), secrets redacted."""
    out = {}
    for key, value in redacted(to_dict(cfg)).items():
        if isinstance(value, (list, tuple)):
            value = ",".join(str(v) for v in value)
        out[key] = str(value)
    return out


def to_json(cfg: Any) -> str:
    """Config as the JSON logged next to a run, secrets redacted."""
    return json.dumps(redacted(to_dict(cfg)), indent=2, sort_keys=True, default=str)
