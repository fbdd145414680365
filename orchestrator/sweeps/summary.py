"""What a finished sweep's MLflow parent run shows first.

- Every trial's child run has the objective as a metric under its own name (a workload that
  computes it only at the end gets it from its final metrics), so the runs table can show it as
  a column beside the trials' params.
- The parent run has the best objective of the trials that trained to the end, under the same
  metric name (its row in the runs table shows the sweep's best in the children's column), and
  the tags `ladder.best_trial` and `ladder.best_params`.
- The experiment carries a view of its runs table for the MLflow UI (`experiment_page`): sorted
  by the objective, with the objective, the swept params and where stopped trials stopped as columns.
- Artifacts of the parent run: `trials.csv` (one row per trial: state, training fraction reached,
  objective, the collapse scheduler's predicted final, why it was stopped, then its params) and
  `trial_curves.png` (every trial's objective over training fraction; the stopped ones end in a
  marker), and optuna-dashboard's three study plots (`history_plots`): `optimization_history.png`,
  `param_importances.png`, `parallel_coordinate.png`.
"""

from __future__ import annotations

import csv
import io
import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from orchestrator.tracking import sink as tracking
from orchestrator.runners.console import format_params

CSV_NAME = "trials.csv"
PLOT_NAME = "trial_curves.png"
VIEW_KEY = "ladder"
"""The sweep's view in the MLflow UI: the experiment tag `mlflow.sharedViewState.ladder`, which
the UI opens with `viewStateShareKey=ladder` in the page's address (see `experiment_page`)."""


TRIALS_ONLY = "tags.`ladder.trial_id` LIKE '%'"
"""The runs search that keeps the sweep's parent runs out of its trials' table (a parent has no
trial id; MLflow's search drops a run that lacks the tag it filters on)."""
UI_ADDRESS = "http://127.0.0.1:5000"
"""Where `ladder ui` serves a local store by default."""


def shared_view(metric: str, mode: str, params: Sequence[str]) -> dict[str, Any]:
    """The runs table of the trials alone (`TRIALS_ONLY`), sorted by the objective, best first
    (sorted by a metric, the UI lists the trials' runs flat instead of folded under their parent),
    with the objective, the swept params, the fraction a stopped trial reached and why it stopped
    as columns."""
    return {"searchFilter": TRIALS_ONLY, "orderByKey": f"metrics.`{metric}`", "orderByAsc": mode == "min",
            "selectedColumns": [f"metrics.`{metric}`", *(f"params.`{p}`" for p in params), "tags.`ladder.stopped_at`",
                                "tags.`ladder.stop_reason`"]}


def experiment_page(uri: str, experiment: str) -> str:
    """The sweep's page in the MLflow UI: its trials' runs, in the model-training view, with the
    sweep's columns. Absolute: on the tracking server for an http(s) store, else where `ladder ui`
    serves it by default."""
    from urllib.parse import quote

    exp = tracking.client(uri).get_experiment_by_name(experiment)
    server = uri.rstrip("/") if str(uri).startswith(("http://", "https://")) else UI_ADDRESS
    return (f"{server}/#/experiments/{exp.experiment_id}/runs?workflowType=machine_learning"
            f"&viewStateShareKey={VIEW_KEY}&searchFilter={quote(TRIALS_ONLY, safe='')}")


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def trials_csv(trials: Sequence[Mapping[str, Any]], metric: str) -> str:
    """One row per trial, in trial order; the params last, one column each."""
    keys: list[str] = []
    for t in trials:
        keys += [k for k in t.get("params", {}) if k not in keys]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["trial", "state", "progress", metric, "predicted_final", "why", *keys])
    for t in sorted(trials, key=lambda t: t["trial_id"]):
        num = lambda x: f"{x:.6g}" if _finite(x) else ""  # noqa: E731
        writer.writerow([t["trial_id"], t.get("state", ""), num(t.get("progress")), num(t.get("objective")),
                         num(t.get("predicted")), t.get("why", ""), *[t.get("params", {}).get(k, "") for k in keys]])
    return out.getvalue()


def best_trial(trials: Sequence[Mapping[str, Any]], mode: str) -> Mapping[str, Any] | None:
    """The best trial among those that trained to the end."""
    done = [t for t in trials if t.get("state") == "finished" and _finite(t.get("objective"))]
    if not done:
        return None
    return (min if mode == "min" else max)(done, key=lambda t: t["objective"])


def log_sweep_summary(*, parent_run_id: str, uri: str, experiment: str, sweep_id: str,
                      trials: Sequence[Mapping[str, Any]], metric: str, mode: str,
                      space: Mapping[str, Any] | None = None) -> None:
    """Objective metrics on the trials' runs, best objective on the parent, trials.csv, the curves
    plot and the optimisation history, parameter importance and parallel-coordinate plots
    (`history_plots`; `space`, the sweep's, says which params are log-scaled)."""
    from mlflow.entities import Metric

    from orchestrator.sweeps import history_plots, plots

    c = tracking.client(uri)
    exp = c.get_experiment_by_name(experiment)
    runs = {r.data.tags.get("ladder.trial_id"): r
            for r in c.search_runs([exp.experiment_id], filter_string=f"tags.`ladder.sweep_id` = '{sweep_id}'",
                                   max_results=50000)}
    curves: dict[str, tuple[list[float], list[float]]] = {}
    ended: dict[str, float | None] = {}
    for t in trials:
        run = runs.get(t["trial_id"])
        if run is None:
            continue
        history = c.get_metric_history(run.info.run_id, metric)
        if not history:
            final = tracking.get_final(run, uri, mlflow_client=c) or {}
            value = final.get(metric, t.get("objective"))
            if _finite(value):
                steps = [m.step for key in run.data.metrics for m in c.get_metric_history(run.info.run_id, key)]
                c.log_batch(run.info.run_id, metrics=[Metric(metric, float(value), int(time.time() * 1000),
                                                             max(steps, default=0))])
                history = c.get_metric_history(run.info.run_id, metric)
        progress_history = c.get_metric_history(run.info.run_id, "progress")
        # When the trial last reported, not when its run was ended: the driver ends the runs of
        # stopped trials only after the whole sweep.
        ended[t["trial_id"]] = max((m.timestamp for m in progress_history), default=run.info.end_time)
        progress = sorted((m.step, m.value) for m in progress_history)
        steps = np.array([m.step for m in history], dtype=float)
        if progress:
            at = np.interp(steps, [s for s, _ in progress], [v for _, v in progress])
        else:
            at = np.full(len(history), 1.0)
        curves[t["trial_id"]] = (at.tolist(), [m.value for m in history])
    best = best_trial(trials, mode)
    if best is not None:
        c.log_metric(parent_run_id, metric, float(best["objective"]))
        tracking.set_tags(parent_run_id, {"ladder.best_trial": best["trial_id"],
                                          "ladder.best_params": json.dumps(best.get("params", {}), default=str)[:5000]},
                          uri=uri)
    tracking.log_text(parent_run_id, trials_csv(trials, metric), CSV_NAME, uri=uri)
    keys = list(dict.fromkeys(k for t in trials for k in t.get("params", {})))
    c.set_experiment_tag(exp.experiment_id, f"mlflow.sharedViewState.{VIEW_KEY}", json.dumps(shared_view(metric, mode, keys)))
    # Before the curves plot, which raises on failure: these never do (each failure is a warning).
    history_plots.log_history_plots(parent_run_id, trials, metric=metric, mode=mode, uri=uri, ended=ended,
                                    space=space, experiment=experiment)
    if curves:
        with tempfile.TemporaryDirectory(prefix="ladder-summary-") as tmp:
            path = plots.plot_sweep_curves(
                curves, Path(tmp) / PLOT_NAME, states={t["trial_id"]: t.get("state", "") for t in trials}, metric=metric,
                labels={t["trial_id"]: format_params(t.get("params", {})) for t in trials},
                best=best["trial_id"] if best else None,
                title=f"{experiment}: {len(curves)} trials, {metric} ({mode}); dashed: ended early")
            plots.log_figure(path, parent_run_id, uri=uri)
