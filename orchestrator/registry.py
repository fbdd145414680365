"""The workload registry: one dict, name -> module path, imported only when asked for.

Listing workloads reads each module's docstring from its source (its first line is the paper's
title), so `ladder list` never imports gymnasium, transformers or a workload's model code.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable

from orchestrator.config import ConfigError, closest

WORKLOADS: dict[str, str] = {
    "car_lora": "workloads.car_lora",
    "celerity_lm": "workloads.celerity_lm",
    "consistent_lra": "workloads.consistent_lra",
    "curves": "workloads.curves",
    "diffgda": "workloads.diffgda",
    "dit": "workloads.dit",
    "frl": "workloads.frl",
    "jailbreak_lora": "workloads.jailbreak_lora",
    "lmao": "workloads.lmao",
    "lowprec_attention": "workloads.lowprec_attention",
    "martingale_uq": "workloads.martingale_uq",
    "mom": "workloads.mom",
    "mx_anomaly": "workloads.mx_anomaly",
    "palc": "workloads.palc",
    "pft": "workloads.pft",
    "pica": "workloads.pica",
    "plop": "workloads.plop",
    "swd_rl": "workloads.swd_rl",
    "tubal_fgd": "workloads.tubal_fgd",
    "wasi": "workloads.wasi",
}


class UnknownWorkload(KeyError):
    def __str__(self) -> str:  # KeyError quotes its message; we want it plain
        return str(self.args[0])


@dataclass(frozen=True)
class Workload:
    """A loaded workload module, with the contract's parts looked up once."""

    name: str
    module: ModuleType

    @property
    def Config(self) -> type:
        return self.module.Config

    @property
    def train(self) -> Callable[..., dict[str, float]]:
        return self.module.train

    def smoke(self) -> Any:
        return self.module.smoke()

    def validate(self, cfg: Any, *, world_size: int = 1) -> None:
        """Check the config's ZeRO fields (`orchestrator.zero`) and run the workload's optional
        `validate(cfg, world_size)` hook; a ValueError from either becomes a ConfigError."""
        from orchestrator import zero

        hook = getattr(self.module, "validate", None)
        try:
            zero.check(cfg)  # the optional ZeRO fields, for every workload that has them
            if hook is not None:
                hook(cfg, world_size)
        except ValueError as exc:
            raise ConfigError(f"{self.name}: {exc}") from exc

    def preflight(self, cfg: Any) -> None:
        """Run the workload's optional `preflight(cfg)` hook: checks of the machine that will run
        it (a data folder present, ...), as opposed to `validate`, which judges the config alone.
        Its ValueError becomes a ConfigError."""
        hook = getattr(self.module, "preflight", None)
        if hook is None:
            return
        try:
            hook(cfg)
        except ValueError as exc:
            raise ConfigError(f"{self.name}: {exc}") from exc

    @property
    def claims(self) -> list[Any]:
        return list(getattr(self.module, "CLAIMS", []))

    @property
    def paper(self) -> str:
        return paper_title(self.name)


def check_name(name: str) -> str:
    if name not in WORKLOADS:
        hint = closest(name, WORKLOADS) or closest(name, WORKLOADS, cutoff=0.0)
        did_you_mean = f" Closest match: {hint!r}." if hint else ""
        raise UnknownWorkload(
            f"unknown workload {name!r}.{did_you_mean} Known workloads: {', '.join(sorted(WORKLOADS))}"
        )
    return name


def load(name: str) -> Workload:
    check_name(name)
    return Workload(name, importlib.import_module(WORKLOADS[name]))


def paper_title(name: str) -> str:
    """First line of the workload package's docstring, read without importing it."""
    check_name(name)
    spec = importlib.util.find_spec(WORKLOADS[name])
    if spec is None or spec.origin is None:
        return ""
    with open(spec.origin, encoding="utf-8") as fh:
        doc = ast.get_docstring(ast.parse(fh.read())) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""
