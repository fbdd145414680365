"""The early-stopping audit on synthetic sweeps written into a real (temporary) MLflow store."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from orchestrator.sweeps.audit import audit, format_audit, load_sweep, main_audit, rungs_for
from orchestrator.sweeps.collapse import ParametricFit
from orchestrator.sweep import SweepError

# Eq. 5 constants as ground truth: b falls with tau, so curves of different tau cross
TRUTH = ParametricFit(b_const=0.1, b_exp=-0.5, q_const=1.5, q_exp=-0.1)
T = np.round(np.arange(1, 41) / 40, 6)  # an eval every 2.5% of training, as the benchmark reports
TAUS = np.geomspace(0.03, 0.8, 6)


def final_of(tau: float) -> float:
    # best final loss at tau = 0.1; the large-tau runs lead mid-run and end worse
    return 3.0 * (1 + 0.02 * math.log(tau / 0.1) ** 2)


def curve(tau: float, seed: int, *, final: float | None = None, noise: float = 0.002, tpp: float = 20.0) -> np.ndarray:
    rng = np.random.default_rng(1000 * seed + int(tau * 1e4))
    y = (final or final_of(tau)) * TRUTH.for_controls(tau, tpp)(T)
    return y * (1 + noise * rng.standard_normal(T.size))


def write_sweep(uri: str, root: Path, name: str, trials: dict[str, dict], *, sweep_id: str | None = None) -> str:
    """A sweep as `ladder sweep` records it: a parent run tagged ladder.kind=sweep and one child
    run per trial with progress, the metric, tau, tpp and tokens per report. Returns the parent."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param, RunTag

    c = MlflowClient(tracking_uri=uri)
    exp = c.get_experiment_by_name(name)
    exp_id = exp.experiment_id if exp else c.create_experiment(name, artifact_location=(root / "mlartifacts").as_uri())
    sweep_id = sweep_id or f"{name}-1"
    parent = c.create_run(exp_id, tags={"ladder.kind": "sweep", "mlflow.runName": sweep_id}).info.run_id
    for tid, t in trials.items():
        tags = {"ladder.trial_id": tid, "ladder.sweep_id": sweep_id, "mlflow.parentRunId": parent,
                "ladder.trial_params": json.dumps({"tau": t["tau"], **t.get("params", {})})}
        tags.update(t.get("tags", {}))
        run = c.create_run(exp_id, tags=tags).info.run_id
        p, y = t["progress"], t["loss"]
        tokens = 1e6 * t.get("size", 1.0)
        metrics = []
        for i, (pi, yi) in enumerate(zip(p, y)):
            step = i + 1
            metrics += [Metric("progress", float(pi), 0, step), Metric(t.get("metric", "eval/loss"), float(yi), 0, step),
                        Metric("tau", t["tau"], 0, step), Metric("tpp", t.get("tpp", 20.0), 0, step),
                        Metric("tokens", tokens * float(pi), 0, step)]
        params = [Param(k, str(v)) for k, v in {"tau": t["tau"], "warmup_frac": 0.1, **t.get("params", {})}.items()]
        final = RunTag("ladder.final", json.dumps({"params": 1000.0 * t.get("size", 1.0)}))
        c.log_batch(run, metrics=metrics, params=params, tags=[final])
        c.set_terminated(run, t.get("status", "FINISHED"))
    c.set_terminated(parent, "FINISHED")
    return parent


def tau_sweep(seeds: int = 2, taus=TAUS, **kw) -> dict[str, dict]:
    return {
        f"tau{tau:.3f}_s{s}": {"progress": T, "loss": curve(tau, s, **kw), "tau": float(tau), "params": {"seed": s}}
        for tau in taus
        for s in range(seeds)
    }


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("audit-store")
    uri = f"sqlite:///{root / 'mlruns.db'}"
    parents = {
        "tau_sweep": write_sweep(uri, root, "tau_sweep", tau_sweep(seeds=2)),
        "reference": write_sweep(uri, root, "reference", {
            f"ref{tau:.3f}_s{s}": {"progress": T, "loss": curve(tau, 50 + s, final=2.0), "tau": float(tau)}
            for tau in TAUS for s in range(2)
        }),
        "partial_reference": write_sweep(uri, root, "partial_reference", {
            f"ref{tau:.3f}": {"progress": T, "loss": curve(tau, 60, final=2.0), "tau": float(tau)} for tau in TAUS[:3]
        }),
        "stopped": write_sweep(uri, root, "stopped", {
            f"t{k}": {"progress": T[:12], "loss": curve(0.1, k)[:12], "tau": 0.1,
                      "tags": {"ladder.stopped_early": "true", "ladder.stopped_at": "0.3"}}
            for k in range(3)
        }),
    }
    return SimpleNamespace(uri=uri, root=root, parents=parents)


def test_collapse_beats_asha_at_equal_compute_with_a_tau_matched_reference(store):
    res = audit("tau_sweep", reference={"experiment": "reference"}, uri=store.uri, log=False)
    best = min(res.finals.values())
    assert res.n_trials == 12 and res.best_final == pytest.approx(best)
    assert "empirical reference from experiment 'reference'" in res.reference
    collapse, asha = res.row("collapse", 0.3), res.row("asha", 0.3)
    # 12 -> 6 -> 3 -> 2 at rungs 0.1, 0.2, 0.3; two run to the end
    assert collapse.compute_fraction == pytest.approx((12 + 6 + 3) * 0.1 / 12 + 2 * 0.7 / 12)
    assert asha.compute_fraction == pytest.approx(collapse.compute_fraction)
    assert collapse.regret < 0.005 < asha.regret
    assert res.row("predicted-best", 0.3).regret < res.row("current-best", 0.3).regret
    assert res.row("current-best", 0.3).regret > 0.01  # the curves do cross
    rnd = res.row("random", None)
    assert rnd.compute_fraction == pytest.approx(1 / 12)
    assert rnd.regret == pytest.approx(np.mean(list(res.finals.values())) / best - 1)
    for row in res.rows:
        assert row.chosen is None or row.regret == pytest.approx(res.finals[row.chosen] / best - 1)


def test_leave_one_out_uses_same_tau_peers_or_a_parametric_fit(store):
    res = audit("tau_sweep", uri=store.uri, budgets=(0.3,), log=False)
    assert res.reference == "leave-one-out: other trials at the same tau and tpp"
    assert res.row("collapse", 0.3).regret < 0.005 < res.row("asha", 0.3).regret
    # one seed per tau: no trial has a peer, so the parametric curve over the others is used
    write_sweep(store.uri, store.root, "one_seed", tau_sweep(seeds=1, taus=TAUS[::2]))
    one = audit("one_seed", uri=store.uri, budgets=(0.3,), log=False)
    assert one.reference == "leave-one-out: parametric fit over the other trials"
    assert one.row("predicted-best", 0.3).regret < 0.005 < one.row("current-best", 0.3).regret


def test_compute_is_weighted_by_trial_cost(store):
    sizes = {"small": 1.0, "big": 3.0}
    trials = {
        f"{n}{k}": {"progress": T, "loss": curve(0.1, k, final=3.0 - 0.1 * k - (0.5 if n == "big" else 0)),
                    "tau": 0.1, "size": size}
        for n, size in sizes.items() for k in range(2)
    }
    write_sweep(store.uri, store.root, "sized", trials)
    res = audit("sized", uri=store.uri, budgets=(0.3,), log=False)
    # cost = params * tokens: the big trials weigh 9 each, the small ones 1
    cb = res.row("current-best", 0.3)
    assert cb.chosen == "big1"
    assert cb.compute_fraction == pytest.approx((0.3 * 20 + 0.7 * 9) / 20)


def test_audit_logs_table_json_and_charts_on_the_parent_run(store, capsys):
    from mlflow import MlflowClient

    res = audit("tau_sweep", reference={"experiment": "reference"}, uri=store.uri, budgets=(0.15, 0.3))
    assert res.parent_run_id == store.parents["tau_sweep"]
    c = MlflowClient(tracking_uri=store.uri)
    names = {Path(a.path).name: a.file_size for a in c.list_artifacts(res.parent_run_id, "audit")}
    assert {"audit.txt", "audit.json", "compute_vs_regret.png", "collapsed_curves.png", "residuals.png"} <= set(names)
    assert all(size > 1000 for name, size in names.items() if name.endswith(".png"))
    local = c.download_artifacts(res.parent_run_id, "audit/audit.json", str(store.root / "dl"))
    logged = json.loads(Path(local).read_text())
    assert logged["best_trial"] == res.best_trial
    assert [r["policy"] for r in logged["rows"]] == [r.policy for r in res.rows]


def test_format_audit_lists_every_policy_at_every_budget(store):
    res = audit("tau_sweep", reference={"experiment": "reference"}, uri=store.uri, budgets=(0.15, 0.3), log=False)
    text = format_audit(res)
    lines = text.splitlines()
    for policy in ("collapse", "asha", "predicted-best", "current-best", "median"):
        rows = [l for l in lines if l.startswith(policy + " ")]
        assert len(rows) == 2, policy
    assert sum(l.startswith("random ") for l in lines) == 1
    row = res.row("collapse", 0.3)
    assert f"{100 * row.compute_fraction:.2f}%" in text and f"{100 * row.regret:.2f}%" in text
    assert "rungs 0.1/0.2/0.3, keep 50%" in text
    # picks are named with their point of the search space
    assert f"{row.chosen} ({res.labels[row.chosen]})" in text
    tau = next(x for x in TAUS if res.best_trial.startswith(f"tau{x:.3f}_"))
    assert res.labels[res.best_trial] == f"seed={res.best_trial[-1]}, tau={tau:.4g}"


def test_rungs_before_the_first_report_are_dropped():
    assert rungs_for(0.3) == (0.1, 0.2, 0.3)
    assert rungs_for(0.15, first_report=0.05) == (0.05, 0.1, 0.15)
    assert rungs_for(0.1, first_report=0.05) == (0.066667, 0.1)


def test_unknown_experiment_names_the_closest_and_the_fix(store):
    with pytest.raises(SweepError, match=r"'tau_swep' not found.*Did you mean 'tau_sweep'.*ladder sweep"):
        audit("tau_swep", uri=store.uri, log=False)


def test_a_sweep_of_stopped_trials_only_is_refused_with_the_fix(store):
    with pytest.raises(SweepError, match=r"fewer than two trials.*t0 was stopped early at 30%.*scheduler='fifo'"):
        audit("stopped", uri=store.uri, log=False)


def test_unfinished_trials_are_left_out_and_said_so(store):
    trials = tau_sweep(seeds=1, taus=TAUS[:4])
    trials["cut"] = {"progress": T[:20], "loss": curve(0.1, 9)[:20], "tau": 0.1}
    trials["running"] = {"progress": T, "loss": curve(0.1, 8), "tau": 0.1, "status": "RUNNING"}
    write_sweep(store.uri, store.root, "mixed", trials)
    sweep = load_sweep("mixed", uri=store.uri)
    assert sorted(t.trial_id for t in sweep.trials) == sorted(k for k in trials if k not in ("cut", "running"))
    assert sweep.left_out == {"cut": "ended at progress 50%", "running": "is running"}
    res = audit("mixed", uri=store.uri, budgets=(0.3,), log=False)
    assert "left out (not full curves): 2 trial(s)" in format_audit(res)


def test_a_reference_missing_a_trials_tau_is_refused(store):
    with pytest.raises(SweepError, match=r"no reference within 5% of tau=0\.\d+.*add this tau to the reference sweep"):
        audit("tau_sweep", reference={"experiment": "partial_reference"}, uri=store.uri, log=False)


def test_the_latest_invocation_with_full_curves_is_audited(store):
    write_sweep(store.uri, store.root, "twice", tau_sweep(seeds=1, taus=TAUS[:3]), sweep_id="twice-old")
    write_sweep(store.uri, store.root, "twice", tau_sweep(seeds=1, taus=TAUS[:5]), sweep_id="twice-new")
    assert audit("twice", uri=store.uri, budgets=(0.3,), log=False).n_trials == 5
    assert audit("twice", uri=store.uri, budgets=(0.3,), log=False, sweep_id="twice-old").n_trials == 3


def test_main_audit_prints_the_table(store, capsys, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store.uri)
    args = SimpleNamespace(experiment="tau_sweep", metric="eval/loss", reference_experiment="reference", plot=False)
    assert main_audit(args) == 0
    out = capsys.readouterr().out
    assert "audit of 'tau_sweep'" in out and "collapse" in out and "asha" in out
    assert "audit.txt, audit.json" in out
    args.reference_experiment = "nope"
    with pytest.raises(SweepError, match="'nope' not found"):
        main_audit(args)


def test_a_leave_one_out_reference_never_holds_the_trial_itself():
    from orchestrator.sweeps.audit import TrialCurve, leave_one_out
    from orchestrator.sweeps.collapse import normalize

    base = curve(0.1, 0, noise=0.0)
    shapes = {"a": base, "b": base * (1 + 0.05 * (1 - T)), "c": base * (1 + 0.2 * (1 - T))}
    trials = [TrialCurve(k, k, T, y, 0.1, 20.0, 1.0, {}) for k, y in shapes.items()]
    refs, label = leave_one_out(trials)
    assert label == "leave-one-out: other trials at the same tau and tpp"
    grid = T[1:]
    norm = {k: np.interp(grid, T, normalize(T, y)) for k, y in shapes.items()}
    for ref, (k, others) in zip(refs, (("a", "bc"), ("b", "ac"), ("c", "ab"))):
        mean = np.mean([norm[o] for o in others], axis=0)
        np.testing.assert_allclose(ref(grid), mean, atol=2e-3)
        assert np.max(np.abs(ref(grid) - norm[k])) > 0.02
