"""Shared test setup: every test that records runs does so in its own temporary folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# Triton kernels run on the CPU under the interpreter; it reads this when kernels are decorated.
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# MLflow servers the tests start (infra/mlflow/server.sh) run one web worker: a few requests at a time.
os.environ.setdefault("MLFLOW_SERVER_WORKERS", "1")
os.environ.pop("MLFLOW_TRACKING_URI", None)
os.environ.pop("RAY_ADDRESS", None)
# Two xdist workers share CI's two cores: one intra-op thread per process (and per process it
# starts: runs, Ray workers) instead of each oversubscribing both cores.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parents[1]
LADDER = [sys.executable, "-m", "orchestrator.commands.cli"]

import torch  # noqa: E402  (after the environment above: torch reads it at import)

from orchestrator.run import LocalRun  # noqa: E402


# ---------------------------------------------------------------- seed-shifted runs
# LADDER_TEST_SEED_SHIFT=K runs the suite's training at other seeds: every workload's `smoke()`
# returns its Config with `seed` raised by K, and every reproduction (`orchestrator.reproduction.reproduce.plan`,
# which `reproduce` goes through) starts K seeds later. Tests that build a Config of their own
# pass its seed through `shifted()`. A threshold that still holds K seeds away does not depend on
# the processor it was tuned on: another CPU perturbs a tiny run less than another seed does
# (tests/numerics.sh runs the `numerics` tests at two shifts). The tiny-local base keeps seed 0
# (one cached build; its pre-training is perturbed by the kernel settings instead).
SEED_SHIFT = int(os.environ.get("LADDER_TEST_SEED_SHIFT") or 0)


def shifted(seed: int = 0) -> int:
    """A test's own training seed, moved by LADDER_TEST_SEED_SHIFT."""
    return seed + SEED_SHIFT


def _shift_seeds(shift: int) -> None:
    """Wrap every built-in workload's `smoke` and the reproductions' `plan` so that their seeds
    move by `shift`. Done when conftest is imported, before any test module imports them."""
    import dataclasses
    import functools
    import importlib

    from orchestrator.runners import registry
    from orchestrator.reproduction import reproduce

    def moved(smoke):
        @functools.wraps(smoke)
        def smoke_at_shifted_seed(*args, **kwargs):
            cfg = smoke(*args, **kwargs)
            return dataclasses.replace(cfg, seed=cfg.seed + shift) if hasattr(cfg, "seed") else cfg
        return smoke_at_shifted_seed

    for path in registry.WORKLOADS.values():
        package = importlib.import_module(path)
        original = package.smoke
        wrapped = moved(original)
        for module in {package, sys.modules[original.__module__]}:
            if getattr(module, "smoke", None) is original:
                module.smoke = wrapped
    plan = reproduce.plan

    @functools.wraps(plan)
    def plan_at_shifted_seed(name, *, seed=0, **kwargs):
        return plan(name, seed=seed + shift, **kwargs)

    reproduce.plan = plan_at_shifted_seed


# Once per process: this file imported again under another name (`tests.conftest`) finds the
# reproductions' plan already wrapped, and does not shift twice.
if SEED_SHIFT:
    from orchestrator.reproduction import reproduce as _reproduce

    if not hasattr(_reproduce.plan, "__wrapped__"):
        _shift_seeds(SEED_SHIFT)


@pytest.fixture(autouse=True)
def _one_thread_for_direct_train_calls(request):
    """Tests under tests/workloads call `train` directly, without the runner that pins a trial's
    `threads` (1 in every smoke config): they get that one thread too, with or without xdist."""
    from orchestrator.run import pinned_threads

    if "tests/workloads/" not in Path(str(request.node.fspath)).as_posix():
        yield
        return
    with pinned_threads(1):
        yield


class DiesAtSave(LocalRun):
    """A LocalRun killed (KeyboardInterrupt) right after its `at`-th checkpoint is written: what a
    SIGKILL between a save and the next step leaves behind, in-process."""

    def __init__(self, *args, at: int = 1, **kwargs):
        super().__init__(*args, **kwargs)
        self.at, self.saves = at, 0

    def save(self, state):
        super().save(state)
        self.saves += 1
        if self.saves == self.at:
            raise KeyboardInterrupt


@pytest.fixture(scope="session", autouse=True)
def ladder_cache(tmp_path_factory) -> Path:
    """One model cache for the whole run (`$LADDER_CACHE` when set): tiny-local is built once, by
    whichever test needs it first, and reused by every later test and the Ray workers they start."""
    if not os.environ.get("LADDER_CACHE"):
        base = tmp_path_factory.getbasetemp()
        if os.environ.get("PYTEST_XDIST_WORKER"):
            base = base.parent  # one cache for every xdist worker: the build's file lock makes one of them build it
        os.environ["LADDER_CACHE"] = str(base / "ladder-cache")
    return Path(os.environ["LADDER_CACHE"])


@pytest.fixture(scope="session")
def tiny_base(ladder_cache) -> Path:
    """The folder of the cached tiny-local build (seed 0); load it with `load_base("tiny-local")`."""
    from components.basemodel import resolve

    return Path(resolve("tiny-local"))


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A fresh current folder: ./mlruns.db, ./mlartifacts and ./ladder-runs land here."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def assert_claims_hold(rep, names: list[str] | None = None) -> None:
    """Assert that the named claims and checks of a reproduction hold at every seed it ran (every
    claim and check when `names` is None) and that none of its trials failed; the message names
    each one that fails, with its numbers."""
    known = {c.name for c in rep.outcomes}
    unknown = sorted(set(names or ()) - known)
    assert not unknown, f"the reproduction has no claim or check {unknown}: it has {sorted(known)}"
    problems = rep.failures(names)
    assert not problems, problems


def judged_claim(fn, trials):
    """What a claim says at these trials (its `holds`), after asserting it is declared with
    `@claim` and that its declared effect against its threshold says the same wherever it is
    judged (holds None: not judged)."""
    from orchestrator.claims import spec_of

    spec = spec_of(fn)
    assert spec is not None, f"{fn.__name__} has no @claim"
    holds, measured = fn(trials)
    if holds is not None:
        assert spec.passes(measured[spec.effect]) == holds, (fn.__name__, measured)
    return holds


def narrowed_reproduction(monkeypatch, name: str, narrow):
    """The smoke reproduction sweep of `name` as it stands, after making every later `load_repro`
    (the one `reproduce` calls) return `narrow(sweep)`: a dict of Config overrides, or a function of
    the sweep. A workload test runs the real smoke at a size its mechanisms need, and asserts on the
    returned sweep what it shortened; `ladder reproduce NAME --smoke` still runs the whole smoke."""
    import dataclasses

    from orchestrator.reproduction import reproduce as reproduction

    built = reproduction.load_repro
    change = narrow if callable(narrow) else (
        lambda sweep: dataclasses.replace(sweep, overrides={**sweep.overrides, **narrow}))
    monkeypatch.setattr(reproduction, "load_repro", lambda *args, **kwargs: change(built(*args, **kwargs)))
    return built(name, smoke=True)


def run_cli(args: list[str], cwd: Path, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `ladder ARGS` as a real process in `cwd`."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(LADDER + args, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=full_env)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_mlflow_server(data_dir: Path, port: int, timeout: float = 300) -> subprocess.Popen:
    """`infra/mlflow/server.sh DATA_DIR PORT` as a real process group, returned once /health answers."""
    import time
    import urllib.request

    # One web worker: MLflow's default of four starts four copies of the server, which on two
    # cores more than doubles its start-up (measured here: 25 s against 59 s under load).
    env = {"MLFLOW_SERVER_WORKERS": "1", **os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    server = subprocess.Popen(["bash", str(REPO / "infra/mlflow/server.sh"), str(data_dir), str(port)],
                              cwd=data_dir.parent, env=env, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=open(data_dir.parent / f"mlflow-server-{port}.log", "a"))
    deadline = time.monotonic() + timeout
    while True:
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read() == b"OK":
                return server
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                stop_process_group(server)
                log = (data_dir.parent / f"mlflow-server-{port}.log").read_text()[-2000:]
                raise AssertionError(f"the MLflow server on port {port} did not come up:\n{log}")
            time.sleep(0.3)


def stop_process_group(proc: subprocess.Popen, sig: int | None = None) -> None:
    """Signal the process group this test started (and only it), then reap it."""
    import signal

    try:
        os.killpg(proc.pid, sig or signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


# Tests whose verdict depends on a training run's numbers: every workload test (smoke runs and
# reproductions judged against thresholds), tiny-local's pre-training, and the conformance runs.
# `make test-numerics` (tests/numerics.sh) runs them under other CPU kernel paths.
NUMERICS = ("tests/workloads/", "tests/orchestrator/test_basemodel.py", "tests/test_conformance.py")


# Seconds each module took in a full `make test` on 2 cores (two xdist workers, so each figure
# includes sharing the machine), heaviest first; modules under 10 s are left out. The suite runs
# the modules in this order (the Makefile turns off xdist's own reordering, which sorts by test
# count and so left the heaviest few-test modules for last, one worker finishing alone): longest
# first gives the two workers even finishing times. A stale figure only costs balance.
# `make test-durations` measures them again into tests/module_seconds.json (tests/module_seconds.py).
MODULE_SECONDS_FILE = REPO / "tests" / "module_seconds.json"


def read_module_seconds(path: Path) -> dict[str, float]:
    """{module path: seconds} from `path`; a missing or unreadable file gives {} (no order, never an
    error: tests/test_suite_order.py is where a broken file fails)."""
    import json

    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): float(v) for k, v in data.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


MODULE_SECONDS = read_module_seconds(MODULE_SECONDS_FILE)


def pytest_collection_modifyitems(config, items):
    def rel(item):
        path = Path(str(item.fspath)).resolve()
        return (path.relative_to(REPO) if path.is_relative_to(REPO) else path).as_posix()

    paths = {item: rel(item) for item in items}
    for item in items:
        if paths[item].startswith(NUMERICS):
            item.add_marker(pytest.mark.numerics)
    # Heaviest modules first; a stable sort keeps each module's tests together and in order.
    items.sort(key=lambda item: -MODULE_SECONDS.get(paths[item], 0))


_prebuild: subprocess.Popen | None = None


def pytest_sessionstart(session):
    """Under xdist, the controller starts tiny-local's pre-training (a minute or two of one core)
    in a process of its own as the session starts, into the cache the workers share (see
    `ladder_cache`), so that the first worker to need it waits less and the other none. Workers
    that need it before it is done wait on the build's lock, as they would for each other. Not for
    a `-k` selection, which may need no model at all."""
    global _prebuild
    config = session.config
    if os.environ.get("PYTEST_XDIST_WORKER") or not getattr(config.option, "numprocesses", None):
        return
    if config.option.keyword:
        return
    cache = Path(os.environ.get("LADDER_CACHE") or config._tmp_path_factory.getbasetemp() / "ladder-cache")
    cache.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "LADDER_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
    _prebuild = subprocess.Popen(LADDER + ["base", "build"], cwd=REPO, env=env, start_new_session=True,
                                 stdout=subprocess.DEVNULL, stderr=open(cache / "prebuild.log", "w"))


def pytest_sessionfinish(session, exitstatus):
    if _prebuild is not None and _prebuild.poll() is None:
        stop_process_group(_prebuild)



# A claim and a check over a scaffolded workload's lr sweep (`ladder new`'s, trained at two learning
# rates): what the tests of `ladder reproduce` append to its __init__.py, each adding its CLAIMS list.
LR_CLAIM_SOURCE = '''

from orchestrator.claims import claim


@claim("gap", at_least=0.0, paper="a larger learning rate ends lower within the same budget")
def larger_lr_ends_lower(trials):
    """The larger learning rate ends with the lower held-out loss."""
    by_lr = {t["lr"]: t["eval/loss"] for t in trials}
    gap = by_lr[min(by_lr)] - by_lr[max(by_lr)]
    return gap >= 0.0, {"gap": gap, "low_lr": by_lr[min(by_lr)], "high_lr": by_lr[max(by_lr)]}


def losses_finite(trials):
    """Every trial ends with a finite loss."""
    import math
    return all(math.isfinite(t["eval/loss"]) for t in trials), {"trials": len(trials)}
'''


def wait_for(predicate, proc: subprocess.Popen, timeout: float = 240.0, poll: float = 0.1,
             frozen: bool = False) -> None:
    """Poll `predicate` until it holds (a kill point). The process ending first fails the test with
    the end of its output; so does the timeout, after killing its process group.

    frozen: return with the process group stopped (SIGSTOP) and the predicate true while stopped,
    so that nothing the group writes between the look and the caller's SIGKILL can undo the kill
    point. A predicate that no longer holds once the group is stopped lets it go on (SIGCONT)."""
    import signal
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            if not frozen:
                return
            os.killpg(proc.pid, signal.SIGSTOP)
            if predicate():
                return
            os.killpg(proc.pid, signal.SIGCONT)
        if proc.poll() is not None:
            raise AssertionError("the process ended before the kill point:\n" + (proc.stdout.read()[-3000:] if proc.stdout else ""))
        time.sleep(poll)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    raise AssertionError("kill point never reached")



class ModelCopies:
    """The most `transformers` models alive at once while the fixture was active: every
    `PreTrainedModel` made (from_pretrained, from_config) or copied (copy.deepcopy) is counted
    until it is garbage."""

    def __init__(self) -> None:
        import weakref

        self.alive: "weakref.WeakSet" = weakref.WeakSet()
        self.peak = 0

    def add(self, model) -> None:
        self.alive.add(model)
        # A collection only lowers the count: when the count before one cannot raise the peak, the
        # count after one cannot either, and the full collection (a fifth of a second) is skipped.
        if self.count(collect=False) > self.peak:
            self.peak = max(self.peak, self.count())

    def count(self, collect: bool = True) -> int:
        """Models alive now that are not part of another (GPT2LMHeadModel holds a GPT2Model)."""
        import gc

        if collect:
            gc.collect()  # a model dropped earlier but held in a reference cycle is not a copy in use
        models = list(self.alive)
        inner = {id(m) for outer in models for m in outer.modules() if m is not outer}
        return sum(1 for m in models if id(m) not in inner)


@pytest.fixture
def model_copies(monkeypatch) -> ModelCopies:
    """Counts the base-model copies a test's code holds at once (`model_copies.peak`): a model
    built by a constructor (counted when it ends, in `post_init`: a GPT2LMHeadModel is whole by
    then, its GPT2Model inside it) or copied by deepcopy (which goes through `__setstate__`)."""
    from transformers import PreTrainedModel

    copies = ModelCopies()
    post_init, setstate = PreTrainedModel.post_init, torch.nn.Module.__setstate__

    def counted_post_init(self, *args, **kwargs):  # the end of every transformers model's constructor
        post_init(self, *args, **kwargs)
        copies.add(self)

    def counted_setstate(self, state):
        setstate(self, state)
        copies.add(self)

    monkeypatch.setattr(PreTrainedModel, "post_init", counted_post_init)
    monkeypatch.setattr(PreTrainedModel, "__setstate__", counted_setstate, raising=False)
    return copies
