"""LADDER_TEST_SEED_SHIFT moves every smoke config's and every reproduction's seed (conftest.py),
so that tests/numerics.sh can run the numerically sensitive tests at seeds nobody tuned them on."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import REPO

PROBE = '''
import dataclasses
from orchestrator.runners import registry
from orchestrator.reproduction.reproduce import plan
from workloads.celerity_lm import smoke as from_package
from workloads.celerity_lm.workload import smoke as from_module
from conftest import SEED_SHIFT, shifted


def test_seeds_are_shifted():
    assert SEED_SHIFT == 7 and shifted(2) == 9
    assert from_package().seed == from_module().seed == 7
    for name in registry.WORKLOADS:
        cfg = registry.load(name).smoke()
        assert cfg.seed == 7, name
    p = plan("tubal_fgd", smoke=True)
    assert p.seeds == [7] and p.sweep.overrides["seed"] == 7
'''


def test_a_shift_moves_every_smoke_seed_and_every_reproduction(tmp_path):
    probe = tmp_path / "test_probe.py"  # outside tests/: no other pytest run collects it
    probe.write_text(PROBE)
    env = {**os.environ, "LADDER_TEST_SEED_SHIFT": "7",
           "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), str(REPO), os.environ.get("PYTHONPATH", "")])}
    env.pop("PYTEST_XDIST_WORKER", None)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "-p", "conftest", str(probe), "--rootdir", str(tmp_path), "--basetemp", str(tmp_path / "t")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout[-3000:] + done.stderr[-2000:]
