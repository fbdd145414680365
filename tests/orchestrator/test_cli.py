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
