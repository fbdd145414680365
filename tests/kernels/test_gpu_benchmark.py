"""The first GPU run works unattended: `benchmarks/gpu.py --cpu-smoke` runs every section at toy sizes
under the Triton interpreter, the same code the GPU runs, and writes its JSON and markdown."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_cpu_smoke_runs_every_section_and_measures_every_mx_format(tmp_path):
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import gpu
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu.py"), "--cpu-smoke", str(tmp_path)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    res = json.loads((tmp_path / "gpu.json").read_text())
    assert {name: sec["status"] for name, sec in res["sections"].items()} == {name: "ok" for name in gpu.SECTIONS}
    mx = res["sections"]["mx"]
    assert [r["format"] for r in mx["quantize"]] == list(gpu.MX_FORMATS)
    assert all(r["bit_exact_vs_reference"] for r in mx["quantize"]), mx["quantize"]
    assert {r["format"] for r in mx["matmul"] if "ours_ms" in r} == set(gpu.MX_FORMATS)
    assert {(r["elem_format"], r["scale_format"]) for r in mx["ocp_formats"] if r.get("codes_and_scales_equal")} == {
        (e, s) for e in gpu.OCP_ELEMENTS for s in ("e8m0", "ue4m3")}
    judged = {t["target"] for t in res["targets"]}
    assert set(gpu.TARGETS) <= judged | {"mx_matmul_vs_torchao_decode"}, set(gpu.TARGETS) - judged
    # ladder itself: the local run names its device first; every workload trained two reports on the
    # placement check's stand-in device; the GPU sweep is not run on a CPU, and says so.
    from orchestrator.runners import registry

    prod = res["sections"]["product"]
    (run, sweep, *bf16) = prod["commands"]
    assert run["status"] == "pass" and run["detail"] == "celerity_lm: training in this process on cpu", run
    assert sweep["status"] == "not run" and "needs a GPU" in sweep["detail"]
    assert [(r["what"].split()[0], r["status"]) for r in bf16] == [("pica", "not run"), ("palc", "not run")]
    assert [r["workload"] for r in prod["workloads"]] == sorted(registry.WORKLOADS)
    assert all(r["status"] == "pass" and r["reports"] >= 1 and r["device"].startswith("stand-in")
               for r in prod["workloads"]), prod["workloads"]
    assert sum(r["ops_checked"] for r in prod["workloads"]) > 1000  # the check saw the ops
    low = res["sections"]["lowprec_training"]
    assert [r["arm"] for r in low["arms"]] == list(gpu.LOWPREC_ARMS) and all(r["finished"] for r in low["arms"])
    for r in low["arms"]:  # the same steps each, a loss curve, and the stability numbers the GPU run compares
        assert r["steps_done"] == r["steps"] == low["steps"] and r["curve_train_loss"], r
        assert r["train_weight_norm_growth"] > 0 and r["train_attn_logit_max"] > 0 and isinstance(r["diverged"], bool)
    page = (tmp_path / "gpu.md").read_text()
    for heading in ("## targets", "## ladder on the device", "## MX quantize", "## mx_matmul", "## OCP MX element formats on the device",
                    "## low-precision training: baseline against the fix"):
        assert heading in page
    assert res["sections"]["tests"]["failed"] == [] and res["sections"]["tests"]["returncode"] == 0
