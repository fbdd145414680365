"""Plots: PNGs that exist, are not empty and change with the data; the family collapse numbers
measured from a family sweep written into a real (temporary) MLflow store."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from orchestrator.sweeps import plots
from orchestrator.sweeps.audit import AuditResult, AuditRow
from orchestrator.sweeps.collapse import EmpiricalReference, ParametricFit
from orchestrator.sweep import SweepError

TRUTH = ParametricFit(b_const=0.1, b_exp=-0.5, q_const=1.5, q_exp=-0.1)
T = np.round(np.arange(1, 41) / 40, 6)
PNG = b"\x89PNG\r\n\x1a\n"


def pixels(path: str) -> np.ndarray:
    from matplotlib.image import imread

    data = Path(path).read_bytes()
    assert data.startswith(PNG) and len(data) > 5000
    return imread(path)


def differ(a: str, b: str) -> float:
    """Share of pixels that differ between two same-sized charts."""
    pa, pb = pixels(a), pixels(b)
    assert pa.shape == pb.shape
    return float(np.mean(np.any(np.abs(pa - pb) > 1e-3, axis=-1)))


def test_collapsed_curves_png_depends_on_the_curves(tmp_path):
    ref = TRUTH.for_controls(0.2, 20.0)
    curves = {f"s{k}": (T, (3 + 0.1 * k) * ref(T)) for k in range(3)}
    a = plots.plot_collapse(curves, tmp_path / "a.png", references=ref, after=0.2)
    bent = dict(curves, s2=(T, 3.2 * ref(T) * (1 + 0.05 * (1 - T))))
    b = plots.plot_collapse(bent, tmp_path / "b.png", references=ref, after=0.2)
    assert a == str(tmp_path / "a.png")
    assert differ(a, b) > 0.001
    # the self-normalized scaled copies all lie on the reference: adding one changes little
    c = plots.plot_collapse({**curves, "s3": (T, 2.5 * ref(T))}, tmp_path / "c.png", references=ref, after=0.2)
    assert differ(a, c) < differ(a, b)


def test_residual_png_shows_the_band_and_a_deviation(tmp_path):
    ref = TRUTH.for_controls(0.2, 20.0)
    rng = np.random.default_rng(0)
    clean = {f"s{k}": (T, 3 * ref(T) * (1 + 0.001 * rng.standard_normal(T.size))) for k in range(2)}
    fault = dict(clean, s1=(T, clean["s1"][1] * (1 + 0.05 * (T > 0.6))))
    res_clean = plots.residuals(clean, ref)
    res_fault = plots.residuals(fault, ref)
    assert set(res_clean) == {"s0", "s1"}
    assert np.max(np.abs(res_clean["s1"].residual)) < 0.01 < np.max(res_fault["s1"].residual[T > 0.6])
    a = plots.plot_residuals(res_clean, tmp_path / "a.png", threshold=0.01)
    b = plots.plot_residuals(res_fault, tmp_path / "b.png", threshold=0.01)
    n = plots.plot_residuals(res_clean, tmp_path / "n.png", threshold=None)
    assert differ(a, b) > 0.001 and differ(a, n) > 0.01  # the band covers a visible area
    assert plots.plot_residuals({}, tmp_path / "none.png") is None


def test_threshold_is_calibrated_from_seeds_or_falls_back_to_the_floor():
    ref = TRUTH.for_controls(0.2, 20.0)
    rng = np.random.default_rng(1)
    seeds = EmpiricalReference([(T, 3 * ref(T) * (1 + 0.01 * rng.standard_normal(T.size))) for _ in range(3)])
    th = plots.threshold_for([seeds, seeds])
    assert callable(th) and np.all(th(np.array([0.7, 0.9])) >= 0.01)
    assert np.max(th(np.linspace(0.5, 1, 20))) > 0.01  # 1% noise x k = 3 exceeds the floor
    assert plots.threshold_for([ref]) == 0.01


def audit_result(regret_of_collapse: float) -> AuditResult:
    rows = [
        AuditRow("collapse", 0.3, "", 0.26, regret_of_collapse, "a", 3.0),
        AuditRow("collapse", 0.6, "", 0.40, 0.0, "a", 3.0),
        AuditRow("asha", 0.3, "", 0.26, 0.03, "b", 3.09),
        AuditRow("asha", 0.6, "", 0.40, 0.01, "c", 3.03),
        AuditRow("random", None, "", 0.06, 0.05, None, None),
    ]
    return AuditResult("x", "x-1", None, "eval/loss", "r", 16, "a", 3.0, rows, {"a": 3.0, "b": 3.09})


def test_compute_vs_regret_png_depends_on_the_rows(tmp_path):
    a = plots.plot_audit(audit_result(0.0), tmp_path / "a.png", target=(0.35, 0.005))
    b = plots.plot_audit(audit_result(0.02), tmp_path / "b.png", target=(0.35, 0.005))
    assert differ(a, b) > 0.001


# -- with an MLflow store -------------------------------------------------------------------------


def write_family(uri: str, root: Path, name: str, shape: dict[tuple[int, int], float]) -> str:
    """A family sweep: per (width, seed) a curve final * (l_ref(t) + a * (1 - t)), where `shape`
    gives a; self-normalized, the curve is l_ref + a (1 - t) exactly."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param

    c = MlflowClient(tracking_uri=uri)
    exp_id = c.create_experiment(name, artifact_location=(root / "mlartifacts").as_uri())
    parent = c.create_run(exp_id, tags={"ladder.kind": "sweep"}).info.run_id
    ref = TRUTH.for_controls(0.2, 80.0)
    for (width, seed), a in shape.items():
        tags = {"ladder.trial_id": f"w{width}_s{seed}", "ladder.sweep_id": f"{name}-1", "mlflow.parentRunId": parent}
        run = c.create_run(exp_id, tags=tags).info.run_id
        y = (4.0 - width / 100) * (ref(T) + a * (1 - T))
        metrics = [m for i, (p, v) in enumerate(zip(T, y)) for m in
                   (Metric("progress", float(p), 0, i), Metric("eval/loss", float(v), 0, i))]
        c.log_batch(run, metrics=metrics, params=[Param("width", str(width)), Param("seed", str(seed))])
        c.set_terminated(run, "FINISHED")
    c.set_terminated(parent, "FINISHED")
    return parent


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("plots-store")
    uri = f"sqlite:///{root / 'mlruns.db'}"
    seeds = {0: 0.01, 1: -0.01}
    collapsed = {(w, s): 0.002 * k + d for k, w in enumerate((48, 64, 80)) for s, d in seeds.items()}
    apart = {(w, s): 0.03 * k + d for k, w in enumerate((48, 64, 80)) for s, d in seeds.items()}
    parents = {
        "collapsed": write_family(uri, root, "collapsed", collapsed),
        "apart": write_family(uri, root, "apart", apart),
        "one_seed": write_family(uri, root, "one_seed", {(48, 0): 0.0, (64, 0): 0.0}),
    }
    return SimpleNamespace(uri=uri, root=root, parents=parents)


def test_family_collapse_numbers_are_the_width_and_seed_ranges(store, tmp_path):
    rep = plots.family_collapse_report("collapsed", uri=store.uri, path=tmp_path / "f.png")
    # normalized curves are l_ref + a (1 - t): at t = 0.2 the ranges are 0.8 x the ranges of a
    assert rep.width_spread == pytest.approx(0.8 * 0.004, abs=1e-9)
    assert rep.seed_spread == pytest.approx(0.8 * 0.02, abs=1e-9)
    assert rep.collapses and rep.groups == {"48": ["w48_s0", "w48_s1"], "64": ["w64_s0", "w64_s1"],
                                            "80": ["w80_s0", "w80_s1"]}
    apart = plots.family_collapse_report("apart", uri=store.uri, path=tmp_path / "g.png", after=0.5)
    assert apart.width_spread == pytest.approx(0.5 * 0.06, abs=1e-9) and not apart.collapses
    assert differ(rep.plot, apart.plot) > 0.001
    text = plots.format_family(apart)
    assert "does NOT collapse" in text and "0.0300" in text and "0.0100" in text


def test_family_report_is_logged_on_the_parent_run(store):
    from mlflow import MlflowClient

    rep = plots.family_collapse_report("collapsed", uri=store.uri)
    assert rep.artifacts == ["family/collapse.json", "family/family_collapse.png"]
    c = MlflowClient(tracking_uri=store.uri)
    local = c.download_artifacts(store.parents["collapsed"], "family/collapse.json", str(store.root / "dl"))
    logged = json.loads(Path(local).read_text())
    assert logged["collapses"] is True and logged["width_spread"] == pytest.approx(rep.width_spread)


def test_family_report_needs_seeds_per_width(store):
    with pytest.raises(SweepError, match=r"width=48: 1 seed\(s\).*at least two width values with at least two"):
        plots.family_collapse_report("one_seed", uri=store.uri, plot=False, log=False)
    with pytest.raises(SweepError, match="no 'depth' or 'seed' param"):
        plots.family_collapse_report("collapsed", group_by="depth", uri=store.uri, plot=False, log=False)


def test_log_figure_attaches_the_png(store, tmp_path):
    from mlflow import MlflowClient

    path = plots.plot_audit(audit_result(0.0), tmp_path / "chart.png")
    run_id = store.parents["apart"]
    assert plots.log_figure(path, run_id, artifact_path="charts", uri=store.uri) == "charts/chart.png"
    files = {a.path: a.file_size for a in MlflowClient(tracking_uri=store.uri).list_artifacts(run_id, "charts")}
    assert files == {"charts/chart.png": Path(path).stat().st_size}


def test_sweep_curves_png_marks_the_trials_that_ended_early(tmp_path):
    curves = {"a": (T, 3 - T), "b": (T[:12], 3.2 - T[:12]), "c": (T[:8], 3.5 - T[:8])}
    labels = {"a": "lr=0.01", "b": "lr=0.1", "c": "lr=1"}
    finished = plots.plot_sweep_curves(curves, tmp_path / "f.png", metric="eval/loss", labels=labels,
                                       states={"a": "finished", "b": "finished", "c": "finished"})
    marked = plots.plot_sweep_curves(curves, tmp_path / "m.png", metric="eval/loss", labels=labels, best="a",
                                     states={"a": "finished", "b": "stopped", "c": "diverged"})
    assert 0 < differ(finished, marked) < 0.2
