"""The one trial path (`orchestrator.runners.trial`) in-process: `run_trial` with a fake `Run` and
a tiny workload named by its module path, tracked in a real MLflow on SQLite. No Ray, no network;
each test takes milliseconds once the module's store exists."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest
import torch

from orchestrator.runners import registry
from orchestrator.runners.config import ConfigError, from_dict
from orchestrator.runners.trial import (STATUS_FAILED, STATUS_FINISHED, STATUS_KILLED, TrialSpec, flush_quietly,
                                        open_run, run_trial, sinks_for)
from orchestrator.tracking import sink as tracking

NAME = "tests.orchestrator.fake_workload"
"""The tiny workload (tests/orchestrator/fake_workload.py), named as a user names their own: by module path."""


class FakeRun:
    """The `Run` a workload sees, in memory: reports go to the sinks `run_trial` built, as in
    `LocalRun`; `flushes` counts the trial's own `flush` of its Run."""

    def __init__(self, sinks: list[Any], *, world_size: int = 1) -> None:
        self.sinks = sinks
        self.device = torch.device("cpu")
        self.rank = 0
        self.world_size = world_size
        self.history: list[tuple[int, dict[str, float]]] = []
        self.state: dict[str, Any] | None = None
        self.flushes = 0

    def report(self, metrics, *, step: int) -> None:
        self.history.append((step, dict(metrics)))
        for sink in self.sinks:
            sink.log_metrics(dict(metrics), step)

    def save(self, state: dict[str, Any]) -> None:
        self.state = dict(state)

    def restore(self) -> dict[str, Any] | None:
        return self.state

    def prepare(self, model, optimizer):
        return model, optimizer

    def log_artifact(self, path) -> None:
        pass

    def flush(self) -> None:
        self.flushes += 1


class Maker:
    """A `make_run` that keeps what `run_trial` handed it (the sinks, the config) and the Run it made."""

    def __init__(self, **run_kwargs: Any) -> None:
        self.run_kwargs = run_kwargs
        self.sinks: list[Any] | None = None
        self.cfg: Any = None
        self.run: FakeRun | None = None

    def __call__(self, sinks: list[Any], cfg: Any) -> FakeRun:
        self.sinks, self.cfg = sinks, cfg
        self.run = FakeRun(sinks, **self.run_kwargs)
        return self.run


@pytest.fixture(scope="module")
def store(tmp_path_factory, ladder_cache) -> str:
    """One SQLite store for the module (its creation is the slow part); each test opens its own run.
    The experiment is created here with its artifacts under the store's folder, not the cwd."""
    root = tmp_path_factory.mktemp("trial-store")
    uri = f"sqlite:///{root / 'm.db'}"
    tracking.client(uri).create_experiment("trials", artifact_location=(root / "artifacts").as_uri())
    return uri


@pytest.fixture
def workload():
    return registry.load(NAME)


def _open(store: str, cfg: Any, name: str = "t") -> str:
    return open_run(NAME, cfg, experiment="trials", run_name=name, uri=store)


def _mlflow_run(store: str, run_id: str):
    return tracking.client(store).get_run(run_id)


def _losses(store: str, run_id: str) -> dict[int, float]:
    return {m.step: m.value for m in tracking.client(store).get_metric_history(run_id, "train/loss")}


def test_the_tiny_workload_is_loaded_by_its_module_path(workload):
    assert workload.name == NAME and workload.Config().steps == 3
    assert registry.resolve(NAME).kind == "module"


def test_a_trial_that_returns_is_finished_with_its_metrics_recorded(store, workload):
    cfg = workload.Config(steps=4)
    run_id = _open(store, cfg)
    maker = Maker()
    final, run = run_trial(TrialSpec.of(NAME, cfg, run_id=run_id, tracking_uri=store), maker)
    assert run is maker.run and maker.cfg == cfg
    assert final["train/loss"] == pytest.approx(0.25) and final["started_at"] == 1.0
    assert all(isinstance(v, float) for v in final.values())
    mlflow_run = _mlflow_run(store, run_id)
    assert mlflow_run.info.status == STATUS_FINISHED
    assert tracking.get_final(mlflow_run, store) == final  # record_final
    assert _losses(store, run_id) == {s: pytest.approx(1 / s) for s in (1, 2, 3, 4)}
    assert run.flushes == 1  # the Run's own flush, once the loop returned
    assert "ladder.interrupted" not in mlflow_run.data.tags


def test_the_spec_tags_land_on_the_run(store, workload):
    cfg = workload.Config()
    run_id = _open(store, cfg)
    run_trial(TrialSpec.of(NAME, cfg, run_id=run_id, tracking_uri=store, tags={"ladder.world_size": "1"}), Maker())
    tags = _mlflow_run(store, run_id).data.tags
    # The device comes from the Run the trial trained on (the GPU's name too, on a GPU).
    assert tags["ladder.world_size"] == "1" and tags["ladder.device"] == "cpu" and "ladder.device_name" not in tags


def test_a_trial_that_raises_is_failed_and_the_error_propagates(store, workload):
    cfg = workload.Config(steps=2, fail="error")
    run_id = _open(store, cfg)
    maker = Maker()
    with pytest.raises(RuntimeError, match="failed on purpose"):
        run_trial(TrialSpec.of(NAME, cfg, run_id=run_id, tracking_uri=store), maker)
    mlflow_run = _mlflow_run(store, run_id)
    assert mlflow_run.info.status == STATUS_FAILED
    assert tracking.get_final(mlflow_run, store) is None
    # The sinks were flushed on the way out: the points reported before the error are recorded
    # (the MLflow sink buffers them for 5 s, far longer than this trial).
    assert _losses(store, run_id) == {1: 1.0, 2: 0.5}
    assert maker.run.flushes == 0  # the Run's own flush belongs to a trial that returned


def test_a_trial_interrupted_by_ctrl_c_is_killed_and_tagged(store, workload):
    cfg = workload.Config(steps=1, fail="interrupt")
    run_id = _open(store, cfg)
    with pytest.raises(KeyboardInterrupt):
        run_trial(TrialSpec.of(NAME, cfg, run_id=run_id, tracking_uri=store), Maker())
    mlflow_run = _mlflow_run(store, run_id)
    assert mlflow_run.info.status == STATUS_KILLED
    assert mlflow_run.data.tags.get("ladder.interrupted") == "true"
    assert _losses(store, run_id) == {1: 1.0}


def test_record_final_false_records_no_final_metrics(store, workload):
    cfg = workload.Config()
    run_id = _open(store, cfg)
    final, _ = run_trial(TrialSpec.of(NAME, cfg, run_id=run_id, tracking_uri=store, record_final=False), Maker())
    assert final["train/loss"] == pytest.approx(1 / 3)  # still returned to the caller
    mlflow_run = _mlflow_run(store, run_id)
    assert tracking.get_final(mlflow_run, store) is None and mlflow_run.info.status == STATUS_FINISHED


@pytest.mark.parametrize("fail", ["", "error"])
def test_end_run_false_leaves_the_run_to_the_caller(store, workload, fail):
    cfg = workload.Config(fail=fail)
    run_id = _open(store, cfg)
    spec = TrialSpec.of(NAME, cfg, run_id=run_id, tracking_uri=store, end_run=False)
    if fail:
        with pytest.raises(RuntimeError):
            run_trial(spec, Maker())
    else:
        run_trial(spec, Maker())
    mlflow_run = _mlflow_run(store, run_id)
    assert mlflow_run.info.status == "RUNNING"
    assert _losses(store, run_id)  # flushed all the same


def test_without_sinks_nothing_is_reported_to_the_run(store, workload):
    """`with_sinks=False` (a Ray Train worker of rank > 0): the Run gets no sinks, the run's
    metrics come from rank 0 alone."""
    cfg = workload.Config()
    run_id = _open(store, cfg)
    maker = Maker()
    run_trial(TrialSpec.of(NAME, cfg, run_id=run_id, tracking_uri=store, record_final=False, end_run=False),
              maker, with_sinks=False)
    assert maker.sinks == [] and len(maker.run.history) == 3
    assert _losses(store, run_id) == {}


def test_an_untracked_trial_runs_without_mlflow(workload):
    maker = Maker()
    spec = TrialSpec.of(NAME, workload.Config(steps=2))
    assert sinks_for(spec, workload.Config()) == []
    final, _ = run_trial(spec, maker)
    assert final["train/loss"] == 0.5 and maker.sinks == []


def test_a_progress_label_shows_the_console_progress_line(workload, capsys):
    run_trial(TrialSpec.of(NAME, workload.Config(steps=2), progress="fakey"), Maker())
    err = capsys.readouterr().err
    assert "[fakey] step 2/2" in err and "100.0%" in err and "loss 0.5000" in err
    run_trial(TrialSpec.of(NAME, workload.Config(steps=2)), Maker())
    assert "[fakey]" not in capsys.readouterr().err


def test_loaded_is_used_instead_of_the_spec(workload):
    """A caller that holds the workload and Config (a local run) hands them over as they are."""
    cfg = workload.Config(steps=5)
    maker = Maker()
    final, _ = run_trial(TrialSpec.of(NAME, workload.Config(steps=1)), maker, loaded=(workload, cfg))
    assert maker.cfg is cfg and final["train/loss"] == pytest.approx(0.2)


class _Threads:
    """torch's threads set to `n` for the test, and set back after it."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __enter__(self):
        self.before = torch.get_num_threads()
        torch.set_num_threads(self.n)

    def __exit__(self, *exc):
        torch.set_num_threads(self.before)


def test_the_spec_threads_hold_while_training_and_are_restored_after(workload):
    with _Threads(1):
        final, _ = run_trial(TrialSpec.of(NAME, workload.Config(), threads=2), Maker())
        assert final["threads_seen"] == 2.0
        assert torch.get_num_threads() == 1


def test_the_workloads_own_threads_win_over_the_spec(workload):
    with _Threads(1):
        final, _ = run_trial(TrialSpec.of(NAME, workload.Config(threads=3), threads=2), Maker())
        assert final["threads_seen"] == 3.0
        assert torch.get_num_threads() == 1


def test_zero_threads_leave_torchs_setting(workload):
    with _Threads(2):
        final, _ = run_trial(TrialSpec.of(NAME, workload.Config()), Maker())
        assert final["threads_seen"] == 2.0


def test_threads_are_restored_when_train_raises(workload):
    with _Threads(1):
        with pytest.raises(RuntimeError):
            run_trial(TrialSpec.of(NAME, workload.Config(fail="error"), threads=2), Maker())
        assert torch.get_num_threads() == 1


def test_validate_sees_the_runs_world_size(store, workload):
    cfg = workload.Config(max_world_size=1)
    run_id = _open(store, cfg)
    maker = Maker(world_size=2)
    with pytest.raises(ConfigError, match=r"at most 1 workers \(max_world_size\), got 2"):
        run_trial(TrialSpec.of(NAME, cfg, run_id=run_id, tracking_uri=store), maker)
    assert maker.run.history == []  # refused before train
    assert _mlflow_run(store, run_id).info.status == STATUS_FAILED
    final, _ = run_trial(TrialSpec.of(NAME, workload.Config(max_world_size=2)), Maker(world_size=2))
    assert final["train/loss"] == pytest.approx(1 / 3)


def test_a_config_the_workload_would_not_build_is_refused_by_the_spec(workload):
    spec = TrialSpec(workload=NAME, config={"steps": 2, "stpes": 3})
    with pytest.raises(ConfigError, match="stpes"):
        spec.load()


def test_a_trial_spec_pickles_and_rebuilds_its_config(workload):
    cfg = workload.Config(steps=7, widths=(1, 2, 3), lr=0.003)
    spec = TrialSpec.of(NAME, cfg, run_id="abc", tracking_uri="sqlite:///x.db", threads=2, tags={"a": "b"},
                        wandb={"project": "p", "name": "n"})
    again = pickle.loads(pickle.dumps(spec))
    assert again == spec
    loaded, rebuilt = again.load()
    assert loaded.name == NAME and rebuilt == cfg and isinstance(rebuilt, workload.Config)
    assert from_dict(workload.Config, spec.config) == cfg
    assert again.identity == spec.identity
    assert TrialSpec.of(NAME, workload.Config(steps=8)).identity != spec.identity


def test_the_spec_is_frozen(workload):
    spec = TrialSpec.of(NAME, workload.Config())
    with pytest.raises(AttributeError):
        spec.threads = 4  # type: ignore[misc]


def test_a_failing_flush_is_reported_not_raised(capsys):
    class Broken:
        def __init__(self):
            self.flushed = 0

        def flush(self):
            self.flushed += 1
            raise OSError("disk full")

    first, second = Broken(), Broken()
    flush_quietly([first, second])
    assert first.flushed == second.flushed == 1  # one failure does not skip the others
    assert "could not flush the trial's metrics (OSError: disk full)" in capsys.readouterr().err


def test_open_run_records_params_tags_and_the_config(store, workload, tmp_path):
    cfg = workload.Config(steps=6)
    run_id = open_run(NAME, cfg, experiment="trials", run_name="opened", uri=store, tags={"ladder.mode": "x"})
    run = _mlflow_run(store, run_id)
    assert run.data.params["steps"] == "6" and run.data.params["widths"] == "4,8"
    assert run.data.tags["workload"] == NAME and run.data.tags["ladder.mode"] == "x"
    assert run.data.tags["paper"] == "A tiny workload for the trial path's unit tests (not a paper's method)."
    assert run.info.run_name == "opened" and run.info.status == "RUNNING"
    path = tracking.client(store).download_artifacts(run_id, "config.json", str(tmp_path))
    assert '"steps": 6' in Path(path).read_text()


def test_a_run_that_cannot_be_built_ends_the_trial_failed(store, workload):
    cfg = workload.Config()
    run_id = _open(store, cfg)

    def broken(sinks, cfg):
        raise OSError("no room for the run folder")

    with pytest.raises(OSError):
        run_trial(TrialSpec.of(NAME, cfg, run_id=run_id, tracking_uri=store), broken)
    assert _mlflow_run(store, run_id).info.status == STATUS_FAILED
