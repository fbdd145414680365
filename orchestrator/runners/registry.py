"""The workload registry: names -> workload modules, imported only when asked for.

A workload is named three ways, everywhere a name is accepted:

- a built-in name, a key of `WORKLOADS` (one dict, name -> module path);
- an installed plugin's name: an entry point in the group `ladder.workloads` whose value is a
  module path (`sparse_moe = "mylab.sparse_moe"` in the plugin's pyproject.toml);
- a module path importable from the working directory or the environment (`mylab.sparse_moe`).

Built-in names win over plugins, and both over module paths. Loading a module checks the
workload contract (`contract_problems`) before anything uses it, so a module that is not a
workload is refused by name, with what it lacks, before any Ray work.

Listing workloads reads each module's docstring from its source (its first line is the paper's
title), so `ladder list` never imports gymnasium, transformers or a workload's model code.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import importlib.metadata
import importlib.util
import inspect
import os
import sys
import typing
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable

from orchestrator.runners.config import ConfigError, closest, field_docs

ENTRY_POINT_GROUP = "ladder.workloads"

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


class ContractError(ConfigError):
    """A module named as a workload does not follow the workload contract (or does not import)."""


HOW_TO_NAME = (
    "A workload is named by a built-in name (`ladder list`), a module path importable from the working directory "
    "or the environment (e.g. mylab.sparse_moe for ./mylab/sparse_moe/__init__.py), or a plugin's entry point in "
    f"the group {ENTRY_POINT_GROUP!r}; `ladder new NAME` writes a workload to start from."
)


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

    @property
    def max_workers(self) -> int | None:
        """How many Ray Train workers one trial may use: the module's `MAX_WORKERS` (None: any)."""
        return getattr(self.module, "MAX_WORKERS", None)

    def threads(self, cfg: Any) -> int:
        """torch's CPU threads for a trial of `cfg`: its `threads` field when the Config has one (0:
        the runner's choice)."""
        return int(getattr(cfg, "threads", 0) or 0)

    def validate(self, cfg: Any, *, world_size: int = 1, gpus: bool = False) -> None:
        """Check the worker count against `MAX_WORKERS`, the config's ZeRO fields
        (`orchestrator.runners.zero`) and `autocast` field (`devices.check_autocast`), for workers
        with `gpus` or without, and run the workload's
        optional `validate(cfg, world_size)` hook; a ValueError from any becomes a ConfigError."""
        from orchestrator.run import devices
        from orchestrator.runners import zero

        hook = getattr(self.module, "validate", None)
        limit = self.max_workers
        if limit is not None and world_size > limit:
            raise ConfigError(f"{self.name} trains a trial on at most {limit} worker{'s' if limit > 1 else ''} "
                              f"(its MAX_WORKERS), got {world_size}: use workers={limit}")
        try:
            zero.check(cfg, gpus=gpus)  # the optional ZeRO fields, for every workload that has them
            devices.check_autocast(cfg, gpu=gpus)  # and the optional autocast field
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
        """The paper's claims (CLAIMS): effects a reproduction judges across seeds."""
        return list(getattr(self.module, "CLAIMS", []))

    @property
    def checks(self) -> list[Any]:
        """Invariants and mechanism sanity (CHECKS), which must hold at every seed."""
        return list(getattr(self.module, "CHECKS", []))

    def claims_at(self, size: str) -> list[Any]:
        """The claims judged at reproduction size `size`: `<SIZE>_CLAIMS` (e.g. BENCH_CLAIMS) where
        the workload exports it, since a threshold set by seed noise at one size does not carry to
        another; else CLAIMS."""
        return list(getattr(self.module, f"{size.upper()}_CLAIMS", None) or self.claims)

    def checks_at(self, size: str) -> list[Any]:
        """The checks run at reproduction size `size`: `<SIZE>_CHECKS` where exported, else CHECKS."""
        return list(getattr(self.module, f"{size.upper()}_CHECKS", None) or self.checks)

    @property
    def paper(self) -> str:
        return paper_title(self.name)


@dataclass(frozen=True)
class Source:
    """Where a workload name leads: its module path and how it was found."""

    name: str
    module: str
    kind: str
    """'built-in', 'plugin' or 'module'."""
    dist: str = ""
    """The distribution (package) that declares a plugin, with its version."""


def plugins() -> dict[str, Source]:
    """Installed plugins: entry points in the group `ladder.workloads`, by name (read from the
    installed packages' metadata; nothing is imported)."""
    found: dict[str, Source] = {}
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(ep, "dist", None)
        label = f"{dist.metadata['Name']} {dist.version}" if dist is not None else ""
        found.setdefault(ep.name, Source(ep.name, ep.value.strip(), "plugin", label))
    return found


def known() -> dict[str, Source]:
    """Every workload that has a name of its own: the built-in ones, then the plugins."""
    out = {name: Source(name, module, "built-in") for name, module in WORKLOADS.items()}
    for name, src in plugins().items():
        out.setdefault(name, src)
    return out


def _importable_here(module: str) -> bool:
    """Whether `module` can be imported, with the working directory on the path (where a
    console script, unlike `python -m`, does not put it)."""
    if not all(part.isidentifier() for part in module.split(".")):
        return False
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that is missing, or not a package
        return False


def resolve(name: str) -> Source:
    """Where the workload called `name` lives; UnknownWorkload (with the closest known name and
    the three ways to name a workload) when nothing answers to it."""
    if name in WORKLOADS:
        return Source(name, WORKLOADS[name], "built-in")
    plugin = plugins().get(name)
    if plugin is not None:
        if ":" in plugin.module:
            raise ContractError(f"plugin workload {name!r} ({plugin.dist}) points its {ENTRY_POINT_GROUP} entry point at "
                                f"{plugin.module!r}: point it at the workload's module (no ':attribute')")
        return plugin
    if _importable_here(name):
        return Source(name, name, "module")
    names = known()
    package, siblings = _sibling_modules(name)
    if siblings:  # a module path: the closest module of the package it names
        hint = closest(name, siblings) or closest(name, siblings, cutoff=0.0)
    else:
        hint = closest(name, names) or closest(name, names, cutoff=0.0)
    did_you_mean = f" Closest match: {hint!r}." if hint else ""
    where = ""
    if package and siblings:
        shown = sorted(siblings)
        where = f" Modules of package {package!r}: {', '.join(shown[:20])}{', ...' if len(shown) > 20 else ''}."
    elif "." in name and package is None:
        where = f" Package {name.split('.')[0]!r} does not import from here ({os.getcwd()})."
    raise UnknownWorkload(
        f"unknown workload {name!r}.{did_you_mean}{where} Known workloads: {', '.join(sorted(names))}. No built-in "
        f"workload, plugin or importable module has that name: {HOW_TO_NAME[0].lower()}{HOW_TO_NAME[1:]}"
    )


def _sibling_modules(name: str) -> tuple[str | None, list[str]]:
    """For a dotted `name` (mylab.sparse_moee): the deepest package on its path that imports
    (mylab), and the module paths of that package's modules (mylab.sparse_moe, ...), listed
    with pkgutil; (None, []) when no package on the path imports, or `name` has no dot."""
    import pkgutil

    parts = name.split(".")
    if len(parts) < 2 or not all(p.isidentifier() for p in parts):
        return None, []
    _importable_here(parts[0])  # puts the working directory on the path, as for the name itself
    for end in range(len(parts) - 1, 0, -1):
        package = ".".join(parts[:end])
        try:
            module = importlib.import_module(package)
        except Exception:  # missing, or raising on import: try the package above
            continue
        path = getattr(module, "__path__", None)
        if path is None:  # a module, not a package: nothing below it
            return package, []
        return package, [f"{package}.{info.name}" for info in pkgutil.iter_modules(path)]
    return None, []


def check_name(name: str) -> str:
    resolve(name)
    return name


CONTRACT_CHECKS = ("Config is a frozen dataclass", "fields typed and documented", "smoke() exists",
                   "train(cfg, run) signature")


def contract_checks(module: ModuleType) -> list[tuple[str, str | None]]:
    """The parts of the workload contract that can be judged without running it: one
    (check, problem) per name of `CONTRACT_CHECKS`, the problem None where the check holds."""
    out: list[tuple[str, str | None]] = []
    config = getattr(module, "Config", None)
    if config is None:
        out.append((CONTRACT_CHECKS[0], "no `Config` (a frozen @dataclass of the run's settings)"))
    elif not (isinstance(config, type) and dataclasses.is_dataclass(config)):
        out.append((CONTRACT_CHECKS[0], "`Config` is not a dataclass (decorate it with @dataclass(frozen=True))"))
    elif not config.__dataclass_params__.frozen:
        out.append((CONTRACT_CHECKS[0], "`Config` is not frozen (use @dataclass(frozen=True))"))
    else:
        out.append((CONTRACT_CHECKS[0], None))
    fields_problem = None
    if out[0][1] is None:
        try:
            typing.get_type_hints(config)
        except Exception as exc:
            fields_problem = f"`Config`'s field types do not resolve ({type(exc).__name__}: {exc})"
        docs = field_docs(config)
        missing = [f.name for f in dataclasses.fields(config) if not docs.get(f.name)]
        if missing and not fields_problem:
            fields_problem = (f"`Config` fields without a docstring under them: {', '.join(missing)} "
                              "(a one-line string right below each field)")
    else:
        fields_problem = "no `Config` dataclass to read fields from"
    out.append((CONTRACT_CHECKS[1], fields_problem))
    out.append((CONTRACT_CHECKS[2], None if callable(getattr(module, "smoke", None))
                else "no `smoke()` (returns a CPU-sized Config that trains in seconds)"))
    train = getattr(module, "train", None)
    train_problem = None
    if not callable(train):
        train_problem = "no `train(cfg, run)` (the training loop; returns its final metrics)"
    else:
        try:
            inspect.signature(train).bind(None, None)
        except TypeError:
            train_problem = f"`train` has the signature {inspect.signature(train)}; it must take (cfg, run)"
        except ValueError:  # a builtin without a signature: it will tell when called
            pass
        calls = ray_report_calls(train) if train_problem is None else []
        if calls:
            call, line, path = calls[0]
            train_problem = (f"`train` reports through Ray's `{call}(...)` ({os.path.basename(path)}, line {line}): "
                             "report through the run instead, run.report(metrics, step=step), which ladder sends to "
                             "MLflow, the console and Ray's schedulers alike (Ray's report reaches none of them from "
                             "`ladder run --local`, and a sweep's MLflow run kept only its last point)")
    out.append((CONTRACT_CHECKS[3], train_problem))
    return out


RAY_REPORTS = ("tune.report", "train.report", "session.report")
"""Ray's own report functions, as a Ray Tune or Ray Train loop calls them."""


@functools.lru_cache(maxsize=64)
def _parsed(path: str, stamp: tuple[int, int]) -> ast.Module | None:
    """The syntax tree of the file at `path` (`stamp`: its mtime and size, so an edited file is read again)."""
    try:
        return ast.parse(open(path, encoding="utf-8").read())
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None


def source_tree(fn: Callable[..., Any]) -> tuple[str, ast.Module] | None:
    """(file, syntax tree) of the module that defines `fn`, read once per version of the file;
    None when its source cannot be read."""
    try:
        path = inspect.getsourcefile(fn)
        st = os.stat(path) if path else None
    except (TypeError, OSError):
        return None
    tree = _parsed(path, (st.st_mtime_ns, st.st_size)) if st else None
    return (path, tree) if tree is not None else None


def ray_report_calls(train: Callable[..., Any]) -> list[tuple[str, int, str]]:
    """Calls of Ray's report functions in the module that defines `train`, read from its source
    (nothing is run): (the call as written, line, file). A module that never imports ray has none."""
    source = source_tree(train)
    if source is None:
        return []
    path, tree = source
    imported: set[str] = set()  # `from ray.tune import report` and the like: the bare name is Ray's
    uses_ray = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name == "ray" or a.name.startswith("ray.") for a in node.names):
            uses_ray = True
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "ray":
            uses_ray = True
            imported.update(a.asname or a.name for a in node.names if a.name == "report")
    if not uses_ray:
        return []

    def dotted(node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, ast.Attribute):
            head = dotted(node.value)
            return f"{head}.{node.attr}" if head else None
        return None

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = dotted(node.func)
            if name and (name.endswith(RAY_REPORTS) or name in imported):
                found.append((name, node.lineno, path))
    return sorted(found, key=lambda f: f[1])


def run_calls(train: Callable[..., Any], method: str) -> list[int] | None:
    """The lines where `train` calls `run.<method>(...)` on its run parameter, read from its source
    (nothing is run). None, so that nothing is judged on it, when the source cannot be read or the
    run leaves `train`'s hands (passed to another function, stored, returned): the calls may then
    be anywhere."""
    source = source_tree(train)
    name = getattr(train, "__name__", None)
    fn = next((n for n in (source[1].body if source else []) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
               and n.name == name), None)
    if fn is None or len(fn.args.args) < 2:
        return None
    param = fn.args.args[1].arg
    receivers = {id(n.value) for n in ast.walk(fn) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)}
    uses = [n for n in ast.walk(fn) if isinstance(n, ast.Name) and n.id == param]
    if any(id(n) not in receivers for n in uses):
        return None  # the run goes elsewhere (a helper, a closure's argument, an attribute)
    return [n.lineno for n in ast.walk(fn)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == method
            and isinstance(n.func.value, ast.Name) and n.func.value.id == param]


def contract_problems(module: ModuleType) -> list[str]:
    """What keeps `module` from being a workload, one phrase each (empty when it is one)."""
    return [problem for _, problem in contract_checks(module) if problem and not problem.startswith("no `Config` dataclass")]


def import_workload(name: str) -> ModuleType:
    """The module the workload name leads to, imported (ContractError when the import fails)."""
    source = resolve(name)
    try:
        return importlib.import_module(source.module)
    except Exception as exc:
        raise ContractError(f"workload {name!r}: importing {source.module} failed: {type(exc).__name__}: {exc}") from exc


def load(name: str) -> Workload:
    """The workload called `name`, imported and checked against the contract."""
    module = import_workload(name)
    problems = contract_problems(module)
    if problems:
        where = getattr(module, "__file__", None) or module.__name__
        raise ContractError(
            f"{name!r} ({where}) is not a workload: " + "; ".join(problems)
            + ". The contract: a frozen, documented `Config`, `smoke()` and `train(cfg, run)` (docs/own-workload.md; "
            "`ladder new NAME` writes one that follows it)"
        )
    return Workload(name, module)


def source_path(name: str) -> str | None:
    """Where the workload called `name` lives, found without importing it: its package's folder
    (its module's file for a plain module); None when that cannot be told."""
    try:
        spec = importlib.util.find_spec(resolve(name).module)
    except (ImportError, ValueError, KeyError):
        return None
    if spec is None or not spec.origin or not os.path.isfile(spec.origin):
        return None
    return os.path.dirname(spec.origin) if spec.submodule_search_locations is not None else spec.origin


def paper_title(name: str) -> str:
    """First line of the workload package's docstring, read without importing it."""
    try:
        spec = importlib.util.find_spec(resolve(name).module)
    except (ImportError, ValueError):
        return ""
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return ""
    with open(spec.origin, encoding="utf-8") as fh:
        doc = ast.get_docstring(ast.parse(fh.read())) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""
