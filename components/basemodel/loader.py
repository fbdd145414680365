"""`load_base`: the one way an LLM fine-tuning workload gets its base model and tokenizer.

`name_or_path` is either `tiny-local` (optionally `tiny-local:key=value,...` overriding fields of
`TinyRecipe`, e.g. `tiny-local:layers=2,hidden=128`), built here and cached, or anything
`from_pretrained` accepts: a local folder or a Hugging Face model id (`meta-llama/Llama-3.1-8B`).
Both go through `AutoModelForCausalLM.from_pretrained`: tiny-local is saved as an ordinary
Hugging Face folder and loaded back, so tests run the code cluster runs run.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import typing
from pathlib import Path
from typing import Any

import torch

from components.basemodel.corpus import World, make_world
from components.basemodel.tiny import META_FILE, TinyRecipe, artefact_dir, ensure_built

TINY = "tiny-local"


DTYPES = ("auto", "float32", "bfloat16", "float16")
"""A workload's `dtype` field: the weights' dtype when loading ('auto': the checkpoint's own;
bfloat16 on a GPU for the papers' models)."""


class BaseModelError(ValueError):
    """A base model that cannot be loaded; the message names the fix."""


def check_dtype(value: str, field: str = "dtype", allowed: tuple[str, ...] = DTYPES) -> None:
    """Raises BaseModelError (a ValueError) unless `value` is one of `allowed`."""
    if value not in allowed:
        raise BaseModelError(f"{field}={value!r} is not a dtype ladder loads; choose among {', '.join(allowed)}")


def parse_tiny(name: str) -> TinyRecipe | None:
    """The recipe of a `tiny-local[:k=v,...]` name, or None for any other name."""
    if name != TINY and not name.startswith(TINY + ":"):
        return None
    spec = name[len(TINY) + 1:]
    if not spec:
        return TinyRecipe()
    fields = {f.name: f for f in dataclasses.fields(TinyRecipe)}
    hints = typing.get_type_hints(TinyRecipe)
    overrides: dict[str, Any] = {}
    for item in spec.split(","):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in fields:
            raise BaseModelError(
                f"{name!r}: {item!r} is not a tiny-local override; write tiny-local:key=value,... "
                f"with keys among {', '.join(fields)}"
            )
        try:
            overrides[key] = hints[key](value.strip())
        except ValueError as exc:
            raise BaseModelError(f"{name!r}: {key} must be {hints[key].__name__}, got {value!r}") from exc
    return TinyRecipe(**overrides)


def _looks_like_path(name: str) -> bool:
    # A hub id is `org/name`; anything rooted, relative-marked or home-relative is a folder.
    return name.startswith(("/", "./", "../", "~")) or os.sep + os.sep in name or name.count("/") > 1


def check_base(name_or_path: str) -> None:
    """Cheap checks for a workload's `validate`: raises BaseModelError (a ValueError) naming the
    fix for a malformed tiny-local spec or a missing local folder, before anything is built."""
    if not isinstance(name_or_path, str) or not name_or_path:
        raise BaseModelError(f"base model must be a non-empty string ({TINY!r}, a local folder or a hub id), "
                             f"got {name_or_path!r}")
    recipe = parse_tiny(name_or_path)
    if recipe is not None:
        if recipe.hidden % recipe.heads or recipe.heads % recipe.kv_heads:
            raise BaseModelError(f"{name_or_path!r}: hidden must be a multiple of heads and heads of kv_heads")
        return
    if _looks_like_path(name_or_path) or Path(name_or_path).expanduser().exists():
        path = Path(name_or_path).expanduser()
        if not path.is_dir():
            raise BaseModelError(
                f"base model folder {str(path)!r} does not exist. Point it at a folder written by "
                f"save_pretrained (config.json and weights), use a Hugging Face model id such as "
                f"'meta-llama/Llama-3.1-8B', or use {TINY!r} for the small model built locally"
            )
        if not (path / "config.json").exists():
            raise BaseModelError(f"base model folder {str(path)!r} has no config.json: it is not a "
                                 f"save_pretrained folder; pass the folder that holds config.json")


def resolve(name_or_path: str, *, seed: int = 0, build: bool = True) -> str:
    """What `from_pretrained` is given: tiny-local's cached folder (built when missing unless
    `build=False`), or `name_or_path` itself."""
    check_base(name_or_path)
    recipe = parse_tiny(name_or_path)
    if recipe is None:
        return str(Path(name_or_path).expanduser()) if _looks_like_path(name_or_path) else name_or_path
    return str(ensure_built(recipe, seed) if build else artefact_dir(recipe, seed))


def load_base(
    name_or_path: str = TINY,
    *,
    seed: int = 0,
    dtype: torch.dtype | str | None = None,
    device: str | torch.device | None = None,
    **from_pretrained_kwargs: Any,
) -> tuple[Any, Any]:
    """(model, tokenizer) for `name_or_path`; the model in eval mode, on `device` when given.

    `seed` picks the tiny-local build (its world and weights); it is ignored for other models.
    Keep it fixed across a sweep's trials (a workload's own seed should not change it) so that
    one cached build serves them all. `dtype` goes to `from_pretrained` (tiny-local: float32 by
    default); extra keyword arguments too (`attn_implementation=`, `device_map=`, ...).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = resolve(name_or_path, seed=seed)
    kwargs = dict(from_pretrained_kwargs)
    if dtype is not None:
        kwargs["dtype"] = getattr(torch, dtype) if isinstance(dtype, str) and dtype != "auto" else dtype
    shared = ("local_files_only", "revision", "token", "trust_remote_code", "cache_dir")
    tok_kwargs = {k: kwargs[k] for k in shared if k in kwargs}
    try:
        tokenizer = AutoTokenizer.from_pretrained(target, **tok_kwargs)
        model = AutoModelForCausalLM.from_pretrained(target, **kwargs)
    except OSError as exc:
        raise BaseModelError(
            f"could not load base model {name_or_path!r}: {exc}. A hub id needs network access or a "
            f"copy in the Hugging Face cache (`hf download {name_or_path}` where the network is "
            f"reachable, then HF_HUB_OFFLINE=1); a local folder must hold save_pretrained files; "
            f"{TINY!r} needs neither"
        ) from exc
    if tokenizer.pad_token is None:  # Llama-3 ships none; padding to eos is the usual choice
        tokenizer.pad_token = tokenizer.eos_token
    if device is not None:
        model = model.to(device)
    return model.eval(), tokenizer


def base_world(name_or_path: str = TINY, *, seed: int = 0) -> World:
    """The corpus world a tiny-local build was pre-trained on (same seed, same recipe), to build
    tasks from; for any other model, `make_world(seed)` (its text works with any tokenizer)."""
    recipe = parse_tiny(name_or_path)
    return recipe.world(seed) if recipe is not None else make_world(seed)


def base_info(name_or_path: str = TINY, *, seed: int = 0) -> dict[str, Any]:
    """tiny-local's metadata (folder, recipe, params, held-out metrics, build time), building it
    when missing; for another model, its folder or id and config."""
    target = resolve(name_or_path, seed=seed)
    meta_path = Path(target) / META_FILE
    if meta_path.exists():
        return {"path": target, **json.loads(meta_path.read_text())}
    from transformers import AutoConfig

    return {"path": target, "config": AutoConfig.from_pretrained(target).to_dict()}


def base_kinds(name_or_path: str = TINY) -> list[str]:
    """The projection kinds (`adapters.kinds`) of a base model, from its config alone: the model
    is built on the meta device, no weights are read or allocated. For a workload's `preflight`,
    to refuse targets or placements the model does not have before any work is launched.
    Remembered per config file version: a sweep's many trial configs name the same base."""
    from components.basemodel.adapters import LLAMA_LINEAR_TYPES
    from components.pretrained import model_config

    if parse_tiny(name_or_path) is not None:
        return list(LLAMA_LINEAR_TYPES)
    target = resolve(name_or_path)
    config = model_config(target)
    stamp = Path(config).stat().st_mtime_ns if config else 0
    return list(_config_kinds(name_or_path, target, config, stamp))


@functools.lru_cache(maxsize=32)
def _config_kinds(name_or_path: str, target: str, config: str, stamp: int) -> tuple[str, ...]:
    from transformers import AutoConfig, AutoModelForCausalLM

    from components.basemodel.adapters import kinds

    try:
        loaded = AutoConfig.from_pretrained(target)
    except OSError as exc:
        raise BaseModelError(f"could not read the config of base model {name_or_path!r}: {exc}. A hub id must be in "
                             f"the local Hugging Face cache (`hf download {name_or_path}`); a folder must hold "
                             f"config.json") from exc
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(loaded)
    return tuple(kinds(model))


def base_problems(base: str, targets: Any = None, *, field: str = "lora_targets") -> list[str]:
    """What a workload's `preflight` says of its base model, as messages (empty: none): the model
    is tiny-local, a save_pretrained folder or a hub id in the local Hugging Face cache, and every
    kind in `targets` (None, "all" or "all-linear": no check) is one of its projection kinds, read
    from its config alone (`base_kinds`). `field` names the config field the targets come from."""
    from components.pretrained import model_config

    if parse_tiny(base) is None and not model_config(base):
        return [f"base={base!r} is neither a folder with config.json nor in the local Hugging Face cache (nothing "
                f"is downloaded at run time): `hf download {base}` where the network is reachable, or pass a "
                f"save_pretrained folder"]
    if targets is None or (isinstance(targets, str) and targets in ("all", "all-linear")):
        return []
    wanted = [targets] if isinstance(targets, str) else list(targets)
    try:
        have = base_kinds(base)
    except ValueError as exc:
        return [str(exc)]
    missing = [t for t in wanted if t not in have]
    if missing:
        return [f"{field} {missing} are not linear projection kinds of base={base!r}; choose among {have}"]
    return []
