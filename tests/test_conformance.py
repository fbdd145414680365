"""Every built-in workload passes `ladder check`: the contract, checked by the same code for ours
as for anyone's (orchestrator/commands/check.py).

One test per workload runs its smoke() through the local Run uninterrupted, copying its folder one
report after its first checkpoint (what a run killed there leaves), then restarts from that copy;
the restart must report what the uninterrupted run did, and the reports that reach Tune must carry the workload's objective (its
reproduction sweep's, else eval/loss). `ladder check --ray` adds a Ray Train restart, which
tests/orchestrator/test_faults.py tests on celerity_lm with two workers and a real SIGKILL.
"""

from __future__ import annotations

import pytest

from orchestrator.commands import check
from orchestrator.runners import registry

NAMES = sorted(registry.WORKLOADS)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_workload_passes_ladder_check(name, tmp_path):
    report = check.check(name, tmp_path)
    assert report.ok, check.format_report(report)
    judged = {r.check for r in report.results if r.holds}
    assert "resumed run matches an uninterrupted one" in judged, check.format_report(report)
