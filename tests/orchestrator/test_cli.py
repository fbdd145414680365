"""Bad input is answered before any work starts: no Ray, no MLflow store, no run folder."""

from __future__ import annotations

import pytest

from conftest import run_cli
from orchestrator.commands.cli import main


@pytest.mark.parametrize(
    "args,expected",
    [
        (["run", "celerity"], "unknown workload 'celerity'. Closest match: 'celerity_lm'. Known workloads: car_lora, celerity_lm, "),
        (["run", "celerity_lm", "--set", "widht=64"], "unknown field 'widht'"),
        (["run", "celerity_lm", "--set", "width=abc"], "width expects an int, got 'abc'"),
        (["run", "celerity_lm", "--workers", "64"], "64 workers x 1 CPU need 64 CPUs, but this machine (local Ray) has"),
        (["run", "celerity_lm", "--set", "data=/no/such/folder"], "data folder '/no/such/folder' does not exist"),
        (["run", "celerity_lm", "--smoke", "--set", "batch_size=15", "--workers", "2"], "does not split over 2 workers"),
        (["run", "--resume", "nowhere"], "no run.json there"),
    ],
)
def test_bad_input_is_named_before_anything_starts(args, expected, workdir, capsys):
    import ray

    assert main(args) == 2
    err = capsys.readouterr().err
    assert expected in err
    assert "did you mean 'width'" in err or "widht" not in " ".join(args)
    assert not ray.is_initialized()
    assert not (workdir / "mlruns.db").exists() and not (workdir / "ladder-runs").exists()


def test_help_for_each_command(workdir):
    for command in ([], ["run"], ["ui"], ["list"], ["show"], ["new"], ["check"]):
        out = run_cli(command + ["--help"], workdir, timeout=60)
        assert out.returncode == 0 and "usage: ladder" in out.stdout


def test_show_lists_documented_fields(workdir, capsys):
    assert main(["show", "celerity_lm", "--smoke"]) == 0
    out = capsys.readouterr().out
    assert "width = 48  [int]  Model width" in out


def test_the_cli_and_the_adapter_audit_import_no_workload():
    """The CLI reaches workloads through the registry only, when a command names one; the adapter
    audit is ladder's own code, not a workload's."""
    import subprocess
    import sys

    code = ("import sys, components.adapters.lens; from orchestrator.commands.cli import main; "
            "rc = main(['audit-adapter', 'no-such-adapter']); "
            "print(rc, sorted(m for m in sys.modules if m == 'workloads' or m.startswith('workloads.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "no adapter at 'no-such-adapter'" in out.stderr, out.stderr  # the command ran
    assert out.stdout.strip().endswith(" []"), out.stdout


def test_a_dashboard_url_in_ray_address_is_refused_with_the_fix_before_ray(workdir, capsys, monkeypatch):
    from orchestrator.runners.launch import ClusterUnreachable, check_cluster

    url = "http://127.0.0.1:8265"
    with pytest.raises(ClusterUnreachable) as info:
        check_cluster(url, timeout_s=0.1)  # refused by its form: no connection is tried
    msg = str(info.value)
    assert f"RAY_ADDRESS={url} is the Ray dashboard's address" in msg
    assert f"ray job submit --address {url}" in msg
    assert "RAY_ADDRESS=127.0.0.1:6379" in msg and "RAY_ADDRESS=ray://127.0.0.1:10001" in msg
    with pytest.raises(ClusterUnreachable, match=r"RAY_ADDRESS=head\.example:6379"):
        check_cluster("HTTPS://head.example:8265/", timeout_s=0.1)
    # Through the command: one message, exit 2, nothing started or recorded.
    monkeypatch.setenv("RAY_ADDRESS", url)
    assert main(["run", "curves", "--smoke"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ladder: error: RAY_ADDRESS=http://127.0.0.1:8265 is the Ray dashboard's address")
    assert "Traceback" not in err
    import ray

    assert not ray.is_initialized()
    assert not (workdir / "mlruns.db").exists() and not (workdir / "ladder-runs").exists()


def test_report_and_reproduce_help_print_a_single_percent_sign(capsys):
    for command in ("report", "reproduce"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        out = " ".join(capsys.readouterr().out.split())  # as one line: argparse wraps it
        assert "95% interval" in out and "%%" not in out, out


TPE_SWEEP = ("from orchestrator.sweep import *\n"
             "sweep = Sweep(name='s', workload='curves', base='smoke', search='tpe', num_samples=12,{extra}\n"
             "              space={{'lr': loguniform(1e-3, 1e-1), 'seed': seeds(2)}})\n")


@pytest.mark.parametrize("cpus,extra,expected", [
    (2, "", "at most 2 trials at once on this machine (local Ray, 2 CPUs)"),  # the machine binds
    (16, "", "at most 4 trials at once on this machine (local Ray, 16 CPUs)"),  # the search's default binds
    (16, " max_concurrent=6,", "at most 6 trials at once on this machine (local Ray, 16 CPUs)"),
    (3, " cpus_per_worker=2,", "at most 1 trial at once on this machine (local Ray, 3 CPUs)"),
])
def test_check_says_what_this_machine_would_run_at_once(workdir, capsys, monkeypatch, cpus, extra, expected):
    monkeypatch.setenv("LADDER_NUM_CPUS", str(cpus))
    path = workdir / "s.py"
    path.write_text(TPE_SWEEP.format(extra=extra))
    assert main(["sweep", str(path), "--check"]) == 0
    out = capsys.readouterr().out
    assert f"each run over 2 seeds of seed; {expected}" in out, out


def test_check_of_a_drawn_sweep_says_its_concurrency_and_a_cluster_address_is_judged(workdir, capsys, monkeypatch):
    monkeypatch.setenv("LADDER_NUM_CPUS", "2")
    path = workdir / "s.py"
    path.write_text("from orchestrator.sweep import *\n"
                    "sweep = Sweep(name='s', workload='curves', base='smoke', space={'lr': grid(1e-3, 1e-2, 1e-1)})\n")
    assert main(["sweep", str(path), "--check"]) == 0
    assert "  at most 2 trials at once on this machine (local Ray, 2 CPUs)" in capsys.readouterr().out
    # With a dashboard URL in RAY_ADDRESS, --check says why it would not launch, connecting to nothing.
    monkeypatch.setenv("RAY_ADDRESS", "http://127.0.0.1:8265")
    assert main(["sweep", str(path), "--check"]) == 0
    out = capsys.readouterr().out
    assert "not runnable here" in out and "is the Ray dashboard's address" in out
    assert "at most" not in out  # the cluster decides, and this sweep sets no cap
