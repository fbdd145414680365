from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from orchestrator.runners import registry


def test_registry_matches_workload_folders():
    folders = {p.parent.name for p in (REPO / "workloads").glob("*/__init__.py")}
    assert folders == set(registry.WORKLOADS)
    for name, module in registry.WORKLOADS.items():
        assert module == f"workloads.{name}"


def test_unknown_name_lists_known_ones_and_the_closest():
    with pytest.raises(registry.UnknownWorkload) as info:
        registry.check_name("celerity_ln")
    msg = str(info.value)
    assert "'celerity_ln'" in msg and "Closest match: 'celerity_lm'" in msg
    assert "module path importable from the working directory" in msg and "'ladder.workloads'" in msg
    for name in registry.WORKLOADS:
        assert name in msg


@pytest.mark.parametrize("name", sorted(registry.WORKLOADS))
def test_paper_title_is_the_first_docstring_line(name):
    title = registry.paper_title(name)
    assert title and "http" in title, f"{name}: docstring must start with the paper title and link"


def test_listing_imports_no_workload_code():
    code = (
        "import sys; from orchestrator.commands.cli import main; main(['list']);"
        "heavy = [m for m in ('torch', 'ray', 'transformers', 'mlflow') if m in sys.modules];"
        "assert not heavy, heavy"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert "celerity_lm" in out.stdout


def test_a_plugin_is_listed_with_its_package_and_runs_by_its_name(tmp_path):
    """An installed plugin: a distribution's metadata declaring an entry point in the group
    ladder.workloads (what `pip install` writes), found on the path of the `ladder` command."""
    from orchestrator.commands import scaffold

    site, elsewhere = tmp_path / "site", tmp_path / "elsewhere"
    elsewhere.mkdir()
    scaffold.new("plugged_moe", site / "mylab", cwd=site)
    info = site / "mylab-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mylab\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[ladder.workloads]\nsparse_moe = mylab.plugged_moe\n")
    env = {**os.environ, "PYTHONPATH": str(site)}
    ladder = str(Path(sys.executable).parent / "ladder")

    listed = subprocess.run([ladder, "list"], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    line = next(x for x in listed.stdout.splitlines() if x.startswith("sparse_moe "))
    assert "[plugin: mylab 0.1.0]" in line and "two-layer MLP" in line
    assert "celerity_lm" in listed.stdout  # beside the built-in ones

    run = subprocess.run([ladder, "run", "sparse_moe", "--smoke", "--local", "--no-track"], cwd=elsewhere, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "sparse_moe: finished" in run.stdout and "eval/loss" in run.stdout
    assert (elsewhere / "ladder-runs" / "sparse_moe").is_dir()


CAPPED = '''"""A workload that declares its worker cap and its CPU threads, as a workload does."""
from dataclasses import dataclass

import torch

MAX_WORKERS = 2
"""Two workers at most."""


@dataclass(frozen=True)
class Config:
    threads: int = 3
    """torch CPU threads while training."""


@dataclass(frozen=True)
class Bare:
    steps: int = 1
    """No threads field."""


def smoke() -> Config:
    return Config()


def train(cfg: Config, run) -> dict[str, float]:
    return {"threads": float(torch.get_num_threads())}
'''


def test_the_runner_enforces_max_workers_and_pins_the_configs_threads(tmp_path, monkeypatch):
    """What a workload declares once (MAX_WORKERS, Config.threads) is enforced by the registry and
    run_trial, not by the workload's own train."""
    import torch

    from orchestrator.runners.config import ConfigError
    from orchestrator.run import LocalRun
    from orchestrator.runners.trial import TrialSpec, run_trial

    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "rg_capped.py").write_text(CAPPED)
    w = registry.load("rg_capped")
    assert w.max_workers == 2
    w.validate(w.Config(), world_size=2)
    with pytest.raises(ConfigError, match=r"at most 2 workers \(its MAX_WORKERS\), got 3: use workers=2"):
        w.validate(w.Config(), world_size=3)
    assert registry.load("curves").max_workers == 1 and registry.load("celerity_lm").max_workers is None

    assert w.threads(w.Config()) == 3 and w.threads(w.module.Bare()) == 0
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        final, _ = run_trial(TrialSpec.of("rg_capped", w.Config()), lambda sinks, _: LocalRun(tmp_path / "run"))
        assert final == {"threads": 3.0}  # pinned while train ran ...
        assert torch.get_num_threads() == 1  # ... and restored after
    finally:
        torch.set_num_threads(before)


def test_a_misspelt_module_path_gets_the_closest_module_of_its_package(tmp_path, monkeypatch):
    from orchestrator.commands import scaffold

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "mylab_pkg").mkdir()
    (tmp_path / "mylab_pkg" / "__init__.py").write_text("")
    scaffold.new("sparse_moe", tmp_path / "mylab_pkg", cwd=tmp_path)
    (tmp_path / "mylab_pkg" / "dense_mlp.py").write_text("")
    assert registry.resolve("mylab_pkg.sparse_moe").module == "mylab_pkg.sparse_moe"
    with pytest.raises(registry.UnknownWorkload) as info:
        registry.resolve("mylab_pkg.sparse_moee")
    msg = str(info.value)
    assert "unknown workload 'mylab_pkg.sparse_moee'. Closest match: 'mylab_pkg.sparse_moe'." in msg, msg
    assert "Modules of package 'mylab_pkg': mylab_pkg.dense_mlp, mylab_pkg.sparse_moe." in msg
    # Deeper paths too: the deepest package that imports answers.
    with pytest.raises(registry.UnknownWorkload, match=r"Closest match: 'mylab_pkg\.sparse_moe\.workload'"):
        registry.resolve("mylab_pkg.sparse_moe.workloda")
    # A package that does not import is named; a plain name still gets the closest built-in one.
    with pytest.raises(registry.UnknownWorkload, match=r"Package 'mylab_pkgg' does not import from here"):
        registry.resolve("mylab_pkgg.sparse_moe")
    with pytest.raises(registry.UnknownWorkload, match="Closest match: 'celerity_lm'"):
        registry.resolve("celerty_lm")


RAY_REPORTING = '''
"""A loop written for Ray Tune: it reports through Ray, not through the run."""
from dataclasses import dataclass

from ray import tune


@dataclass(frozen=True)
class Config:
    lr: float = 0.1
    """Learning rate."""


def smoke() -> Config:
    return Config()


def train(cfg: Config, run) -> dict:
    for step in range(1, 4):
        tune.report({"eval/loss": 1.0 / step})
    return {"eval/loss": 1.0 / 3}
'''


def test_a_loop_that_reports_through_ray_is_refused_naming_run_report(tmp_path, monkeypatch, capsys):
    """Ray's `tune.report` inside `train` bypasses ladder's run (no MLflow curve, nothing under
    --local): refused when the workload loads, so `ladder sweep --check` and `ladder run` refuse it
    before anything starts. Calls named like Ray's in a module that never imports ray are not Ray's."""
    from orchestrator.commands.cli import main

    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rg_tune_loop.py").write_text(RAY_REPORTING)
    line = next(i for i, text in enumerate(RAY_REPORTING.splitlines(), 1) if "tune.report(" in text)
    with pytest.raises(registry.ContractError, match=re.escape(
            f"`train` reports through Ray's `tune.report(...)` (rg_tune_loop.py, line {line}): report through the "
            "run instead, run.report(metrics, step=step)")):
        registry.load("rg_tune_loop")
    (tmp_path / "s.py").write_text("from orchestrator.sweep import Sweep\nsweep = Sweep(name='s', workload='rg_tune_loop')\n")
    assert main(["sweep", "s.py", "--check"]) == 2
    assert "run.report(metrics, step=step)" in capsys.readouterr().err
    assert not (tmp_path / "mlruns.db").exists()
    for alias in ("from ray.train import report", "from ray.tune import report as rep"):
        body = RAY_REPORTING.replace("from ray import tune", alias).replace(
            "tune.report(", "rep(" if "as rep" in alias else "report(")
        path = tmp_path / "rg_bare.py"
        path.write_text(body)
        calls = registry.ray_report_calls(registry.import_workload("rg_bare").train)
        assert [c[:2] for c in calls] == [("rep" if "as rep" in alias else "report", line)], (alias, calls)
        sys.modules.pop("rg_bare", None)
    plain = RAY_REPORTING.replace("from ray import tune", "import types\ntune = types.SimpleNamespace(report=print)")
    (tmp_path / "rg_no_ray.py").write_text(plain)
    assert registry.ray_report_calls(registry.import_workload("rg_no_ray").train) == []
