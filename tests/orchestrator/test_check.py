"""`ladder check`: each way a workload can break the contract is named, and exits 1.

The broken workloads are the package `ladder new` writes with one fault each: no checkpoint, a
progress that stops short of 1, a restart that does not restore all of its state, and a Config
without docstrings. They run in this process (no Ray), on the smoke config: a second each.
"""

from __future__ import annotations


import pytest

from orchestrator.commands import check, scaffold
from orchestrator.runners import registry
from orchestrator.commands.cli import main

FAULTS = {
    # name: (text replaced in workload.py, its replacement, the check that must fail)
    "never_saves": ('            run.save({"step": step', '            None and run.save({"step": step',
                    "checkpoints before the end"),
    "short_progress": ('"progress": step / cfg.steps}', '"progress": step / (cfg.steps + 1)}', "progress reaches 1"),
    # Restores weights and step but not the optimizer's moments: the curve changes after a restart.
    "forgets_optimizer": ("        optimizer.load_state_dict(state[\"optimizer\"])\n", "",
                          "resumed run matches an uninterrupted one"),
    "undocumented": ('    """Hidden units of the two-layer MLP."""\n', "", "fields typed and documented"),
    # The batch never reaches run.device: on a GPU, the first matmul with the model's weights fails.
    "batch_on_cpu": ("per_worker:(run.rank + 1) * per_worker].to(run.device)", "per_worker:(run.rank + 1) * per_worker]",
                     "tensors stay on run.device"),
}


@pytest.fixture
def broken(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name, (old, new, _) in FAULTS.items():
        folder, _ = scaffold.new(f"ck_{name}", tmp_path)
        path = folder / "workload.py"
        text = path.read_text()
        assert old in text, f"the template changed: {old!r} is gone"
        path.write_text(text.replace(old, new))
    return tmp_path


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_check_names_the_broken_part(broken, fault, capsys):
    assert main(["check", f"ck_{fault}"]) == 1
    out = capsys.readouterr().out
    failing = FAULTS[fault][2]
    assert f"FAILS  {failing}" in out, out
    assert f"ck_{fault} does not follow the workload contract" in out and failing in out.splitlines()[-1]
    if fault == "forgets_optimizer":
        assert "after the restart" in out and "uninterrupted run" in out
    if fault == "batch_on_cpu":
        # The line that made the op, and the fix; the other checks were judged on the plain CPU.
        line = next(i for i, text in enumerate((broken / f"ck_{fault}" / "workload.py").read_text().splitlines(), 1)
                    if "loss = F.mse_loss(model(x)" in text)
        assert f"workload.py:{line})" in out and ".to(run.device)" in out, out
        assert "ok     resumed run matches an uninterrupted one" in out and out.count("FAILS") == 1


def test_a_non_workload_module_is_refused_naming_what_it_lacks(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "ck_plain.py").write_text(
        "from dataclasses import dataclass\n\n@dataclass\nclass Config:\n    lr: float = 0.1\n    '''lr'''\n\n"
        "def train(cfg):\n    return {}\n")
    with pytest.raises(registry.ContractError) as info:
        registry.load("ck_plain")
    msg = str(info.value)
    assert "'ck_plain'" in msg and "not a workload" in msg
    for part in ("`Config` is not frozen", "no `smoke()`", "it must take (cfg, run)"):
        assert part in msg, msg
    # The command line says it before anything runs, and `ladder check` lists it as a table.
    assert main(["run", "ck_plain", "--smoke", "--local"]) == 2
    assert "`Config` is not frozen" in capsys.readouterr().err
    assert main(["check", "ck_plain"]) == 1
    out = capsys.readouterr().out
    assert "FAILS  Config is a frozen dataclass" in out and "FAILS  train(cfg, run) signature" in out


def test_unknown_name_gives_the_closest_and_the_three_ways(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["show", "curvs"]) == 2
    err = capsys.readouterr().err
    assert "Closest match: 'curves'" in err
    assert "module path importable from the working directory" in err and "ladder.workloads" in err


def test_scheduler_check_replays_what_reaches_tune():
    history = [(10, {"train/loss": 1.0, "progress": 0.5}), (10, {"eval/acc": 0.5}),
               (20, {"train/loss": 0.5, "eval/acc": 0.7, "progress": 1.0})]
    assert check.scheduler_verdict(history, "eval/acc") == (True, "")
    holds, why = check.scheduler_verdict(history, "eval/loss")
    assert holds is False and "carries eval/loss" in why
    # Evaluated only at the end: fifo ranks it, the early-stopping schedulers cannot (a limit, not a failure).
    only_final = [(10, {"train/loss": 1.0, "progress": 0.5}), (20, {"train/loss": 0.4, "progress": 1.0}),
                  (20, {"eval/loss": 0.5, "progress": 1.0})]
    holds, why = check.scheduler_verdict(only_final, "eval/loss")
    assert holds is None and why.startswith("fifo only") and "step 20" in why
    report = check.Report("w", [check.Result("reports usable by every scheduler (eval/loss)", holds, why)])
    assert report.ok and "  limit  reports usable" in check.format_report(report)
    # Only in what train returns: recorded on the trial's run for fifo sweeps and claims, seen by no scheduler.
    holds, why = check.scheduler_verdict(only_final, "eval/f1", final={"eval/f1": 0.9})
    assert holds is None and "only in what train returns" in why


def test_a_module_path_runs_and_resumes_by_its_run_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    scaffold.new("ck_resumed", tmp_path / "lab")
    assert main(["run", "lab.ck_resumed", "--smoke", "--local", "--no-track", "--set", "steps=40"]) == 0
    [run_dir] = (tmp_path / "ladder-runs" / "lab.ck_resumed").iterdir()
    assert "lab.ck_resumed: finished" in capsys.readouterr().out
    # --resume finds the workload from the run's record: the module path, resolved again.
    assert main(["run", "--resume", str(run_dir), "--local", "--no-track"]) == 0
    assert "lab.ck_resumed: finished" in capsys.readouterr().out


def test_the_ray_check_kills_the_worker_group_and_sees_it_restore(tmp_path):
    """`ladder check --ray`: its worker loop runs through `ray_train.trainer` (as `entry`, with the
    TrialSpec every Ray Train run gets), every worker dies one report after the first checkpoint,
    and the restarted group must continue from that checkpoint to progress 1."""
    import ray

    workload = registry.load("curves")
    started = ray.is_initialized()
    try:
        # The synthetic curves (200 steps, a checkpoint every 50): the restore is the mechanism here,
        # not the training; test_faults restores a two-worker celerity_lm run (DDP) after a SIGKILL, and
        # test_deepspeed a ZeRO-3 one.
        cfg = workload.smoke()
        result = check.ray_restore(workload, cfg, tmp_path / "ray-check" / "run", workers=2)
    finally:
        if not started:  # the tests after this one in the process check that nothing started Ray
            ray.shutdown()
    assert result.holds is True, result.detail
    assert result.detail.startswith("from step ") and int(result.detail.split()[-1]) > 0
