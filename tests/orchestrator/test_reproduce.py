"""`ladder reproduce`: loading reproduction sweeps, judging claims, the table, and bad input."""

from __future__ import annotations

import pytest

from orchestrator import reproduce
from orchestrator.config import ConfigError
from orchestrator.registry import UnknownWorkload
from orchestrator.sweep import Sweep, SweepError

from tests.conftest import run_cli


def test_every_workload_with_claims_has_a_reproduction_sweep():
    from orchestrator import registry

    for name in registry.WORKLOADS:
        w = registry.load(name)
        if not w.claims:
            continue
        for smoke in (True, False):
            sweep = reproduce.load_repro(name, smoke=smoke, seed=3)
            assert sweep.workload == name and sweep.name == f"repro-{name}{'-smoke' if smoke else ''}"
            assert sweep.trial_count() >= 1
        for claim in w.claims:
            assert callable(claim) and (claim.__doc__ or "").strip(), f"{name}: claim {claim} needs a docstring"


def test_seed_reaches_the_trials():
    a = reproduce.load_repro("mx_anomaly", smoke=True, seed=0)
    b = reproduce.load_repro("mx_anomaly", smoke=True, seed=5)
    assert a.base_config().seed == 0 and b.base_config().seed == 5


def test_a_workload_without_claims_is_refused_with_the_reason():
    with pytest.raises(ConfigError, match="has no CLAIMS"):
        reproduce.load_repro("celerity_lm")
    with pytest.raises(UnknownWorkload, match="Closest match: 'mx_anomaly'"):
        reproduce.load_repro("mx_anomoly")


def test_a_repro_file_without_build_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(reproduce, "REPRO_DIR", tmp_path)
    (tmp_path / "mx_anomaly.py").write_text("sweep = None\n")
    with pytest.raises(SweepError, match=r"must define `build\(\*, smoke"):
        reproduce.load_repro("mx_anomaly")
    (tmp_path / "mx_anomaly.py").write_text(
        "from orchestrator.sweep import Sweep\n"
        "def build(*, smoke=False, seed=0):\n"
        "    return Sweep(name='x', workload='celerity_lm')\n")
    with pytest.raises(SweepError, match="runs workload 'celerity_lm', not 'mx_anomaly'"):
        reproduce.load_repro("mx_anomaly")
    (tmp_path / "mx_anomaly.py").write_text(
        "from orchestrator.sweep import Sweep\n"
        "def build(*, smoke=False, seed=0):\n"
        "    return Sweep(name='x', workload='mx_anomaly', overrides={'blok_size': 8})\n")
    with pytest.raises(SweepError, match="block_sizes"):
        reproduce.load_repro("mx_anomaly")


def higher_is_better(trials):
    """Trial b beats trial a."""
    by = {t["variant"]: t["eval/score"] for t in trials}
    return by["b"] > by["a"], {"a": by["a"], "b": by["b"]}


def needs_a_missing_trial(trials):
    """Variant c beats a."""
    by = {t["variant"]: t["eval/score"] for t in trials}
    return by["c"] > by["a"], {}


def test_evaluate_measures_and_reports_errors():
    trials = [{"variant": "a", "eval/score": 1.0}, {"variant": "b", "eval/score": 2.0}]
    results = reproduce.evaluate([higher_is_better, needs_a_missing_trial], trials)
    assert [(r.name, r.holds) for r in results] == [("higher_is_better", True), ("needs_a_missing_trial", False)]
    assert results[0].measured == {"a": 1.0, "b": 2.0}
    assert results[0].statement == "Trial b beats trial a."
    assert "KeyError" in results[1].error
    flipped = reproduce.evaluate([higher_is_better], [{"variant": "a", "eval/score": 3.0}, {"variant": "b", "eval/score": 2.0}])
    assert not flipped[0].holds

    rep = reproduce.Reproduction("demo", Sweep(name="x", workload="mx_anomaly"), trials, results, [], None, None, 1.0)
    table = reproduce.format_claims(rep)
    assert "higher_is_better" in table and "yes" in table and "NO" in table and "KeyError" in table
    assert "NOT reproduced (1/2 claims" in table
    assert not rep.holds


def test_cli_rejects_bad_input_before_running(workdir):
    proc = run_cli(["reproduce", "nope"], cwd=workdir, timeout=60)
    assert proc.returncode == 2 and "unknown workload 'nope'" in proc.stderr
    proc = run_cli(["reproduce", "celerity_lm", "--smoke"], cwd=workdir, timeout=60)
    assert proc.returncode == 2 and "has no CLAIMS" in proc.stderr
    proc = run_cli(["reproduce", "mx_anomaly", "--local", "--resume"], cwd=workdir, timeout=60)
    assert proc.returncode == 2 and "drop --local" in proc.stderr
    assert not (workdir / "mlruns.db").exists()  # nothing recorded for refused input


def needs_the_full_size(trials):
    """Trial b beats a at the full size; a smoke run cannot tell."""
    by = {t["variant"]: t["eval/score"] for t in trials}
    return None, {"a": by["a"], "b": by["b"]}


def test_a_claim_not_judged_at_this_size_is_shown_as_such_and_never_counts_as_holding():
    trials = [{"variant": "a", "eval/score": 1.0}, {"variant": "b", "eval/score": 2.0}]
    results = reproduce.evaluate([higher_is_better, needs_the_full_size], trials)
    assert [(r.name, r.holds, r.judged) for r in results] == [
        ("higher_is_better", True, True), ("needs_the_full_size", None, False)]
    assert results[1].measured == {"a": 1.0, "b": 2.0}  # the numbers are still reported
    rep = reproduce.Reproduction("demo", Sweep(name="x", workload="mx_anomaly"), trials, results, [], None, None, 1.0)
    table = reproduce.format_claims(rep)
    assert "not judged" in table and "all judged claims hold (1/1 claims hold, 1 not judged" in table
    assert rep.holds  # every judged claim holds

    failing = reproduce.evaluate([needs_a_missing_trial, needs_the_full_size], trials)
    rep = reproduce.Reproduction("demo", Sweep(name="x", workload="mx_anomaly"), trials, failing, [], None, None, 1.0)
    assert not rep.holds and "NOT reproduced (0/1 claims hold, 1 not judged" in reproduce.format_claims(rep)
    only_unjudged = reproduce.evaluate([needs_the_full_size], trials)
    rep = reproduce.Reproduction("demo", Sweep(name="x", workload="mx_anomaly"), trials, only_unjudged, [], None, None, 1.0)
    assert not rep.holds  # nothing judged: nothing reproduced


def test_a_workload_of_ones_own_reproduces_from_repro_py_in_its_package(tmp_path, monkeypatch):
    from orchestrator import scaffold

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    folder, module = scaffold.new("repro_moe", tmp_path / "lab")
    assert module == "lab.repro_moe"
    with (folder / "__init__.py").open("a") as fh:
        fh.write("\n\ndef lower_lr_is_worse(trials):\n    '''The smaller learning rate ends with the higher loss.'''\n"
                 "    by_lr = {t['lr']: t['eval/loss'] for t in trials}\n"
                 "    return by_lr[min(by_lr)] > by_lr[max(by_lr)], by_lr\n\n\nCLAIMS = [lower_lr_is_worse]\n")
    with pytest.raises(ConfigError, match=r"no reproduction sweep: write .*lab/repro_moe/repro\.py"):
        reproduce.load_repro(module, smoke=True)
    (folder / "repro.py").write_text(
        "from orchestrator.sweep import Sweep, grid\n"
        "def build(*, smoke=False, seed=0):\n"
        "    return Sweep(name='x', workload='lab.repro_moe', base='smoke' if smoke else 'default',\n"
        "                 overrides={'seed': seed}, space={'lr': grid(1e-3, 1e-2)})\n")
    sweep = reproduce.load_repro(module, smoke=True, seed=2)
    assert sweep.name == "repro-lab.repro_moe-smoke" and sweep.trial_count() == 2 and sweep.base_config().seed == 2
