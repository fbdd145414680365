from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import pytest

from orchestrator.runners.config import (
    ConfigError,
    apply_overrides,
    field_docs,
    flatten,
    from_dict,
    parse_sets,
    to_dict,
)


@dataclass(frozen=True)
class Toy:
    width: int = 8
    """Width of the thing."""
    lr: float = 1e-3
    """Learning rate."""
    tau: float | None = None
    """Optional timescale."""
    mode: Literal["a", "b"] = "a"
    """A choice."""
    widths: tuple[int, ...] = (1, 2)
    """Several ints."""
    flag: bool = False
    """A switch."""
    name: str = "x"


def test_overrides_coerce_each_type():
    cfg = apply_overrides(
        Toy(), parse_sets(["width=64", "lr=2e-2", "tau=0.5", "mode=b", "widths=3,4,5", "flag=true", "name=y"])
    )
    assert cfg == Toy(width=64, lr=0.02, tau=0.5, mode="b", widths=(3, 4, 5), flag=True, name="y")
    assert apply_overrides(cfg, {"tau": "none"}).tau is None
    assert apply_overrides(Toy(), {"width": "1e3"}).width == 1000


def test_unknown_field_names_the_closest_valid_one():
    with pytest.raises(ConfigError, match=r"unknown field 'widht'.*did you mean 'width'"):
        apply_overrides(Toy(), {"widht": "64"})


@pytest.mark.parametrize(
    "field,value,expected",
    [("width", "abc", "width expects an int"), ("lr", "fast", "lr expects a float"),
     ("flag", "maybe", "flag expects a bool"), ("mode", "c", "mode expects one of 'a' | 'b'"),
     ("width", "2.5", "width expects an int")],
)
def test_wrong_types_say_what_was_expected(field, value, expected):
    with pytest.raises(ConfigError, match=expected):
        apply_overrides(Toy(), {field: value})


def test_set_needs_an_equals_sign():
    with pytest.raises(ConfigError, match="field=value"):
        parse_sets(["width64"])


def test_field_docs_reads_docstrings_under_fields():
    docs = field_docs(Toy)
    assert docs["width"] == "Width of the thing."
    assert docs["tau"] == "Optional timescale."
    assert "name" not in docs  # undocumented fields are visible as missing


@dataclass(frozen=True)
class Sub(Toy):
    depth: int = 2
    """Depth of the thing."""
    width: int = 16
    """Width of the sub-thing."""
    lr: float = 1e-2


def test_field_docs_reads_inherited_fields_too_a_subclass_docstring_winning():
    docs = field_docs(Sub)
    assert docs["depth"] == "Depth of the thing."  # its own field
    assert docs["tau"] == "Optional timescale."  # inherited, not declared in Sub
    assert docs["width"] == "Width of the sub-thing."  # re-declared with a docstring: the subclass's
    assert docs["lr"] == "Learning rate."  # re-declared without one: the base's stays
    assert "name" not in docs
    assert field_docs(Toy)["width"] == "Width of the thing."


def test_flatten_and_round_trip():
    cfg = Toy(widths=(7, 9), tau=0.25)
    flat = flatten(cfg)
    assert flat["widths"] == "7,9" and flat["tau"] == "0.25" and flat["flag"] == "False"
    assert from_dict(Toy, to_dict(cfg)) == cfg
    assert from_dict(Toy, {k: v for k, v in flat.items()}) == cfg


def test_secret_looking_fields_are_redacted_before_they_leave_the_run():
    import json

    from orchestrator.runners.config import REDACTED, flatten, is_secret, to_json

    @dataclass(frozen=True)
    class WithSecrets:
        hf_token: str = "hf_abc123"
        api_key: str = "sk-123"
        db_password: str = "hunter2"
        bias_keys: int = 1024
        tokenizer: str = "bytes"
        wandb_key: str = ""

    flat = flatten(WithSecrets())
    assert flat["hf_token"] == flat["api_key"] == flat["db_password"] == REDACTED
    assert flat["bias_keys"] == "1024" and flat["tokenizer"] == "bytes"
    assert flat["wandb_key"] == ""  # nothing set, nothing to hide
    assert "hf_abc123" not in to_json(WithSecrets()) and json.loads(to_json(WithSecrets()))["api_key"] == REDACTED
    assert not is_secret("max_tokens") and not is_secret("eval_tokens") and is_secret("access_token")
