"""mx_anomaly: the measurements, the LM narrowing, the claims' logic, and the reproduction on Ray."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from orchestrator import registry
from orchestrator.config import ConfigError
from workloads import celerity_lm
from workloads import mx_anomaly as m
from workloads.mx_anomaly import claims
from workloads.mx_anomaly.workload import measure_block, narrowed, rel_mse, synthetic, validate

from tests.conftest import run_cli


def test_bad_configs_name_the_fix(tmp_path):
    w = registry.load("mx_anomaly")
    with pytest.raises(ConfigError, match="global_scale applies to ue4m3/ue5m3"):
        w.validate(m.Config(scale_format="e8m0", global_scale=True))
    with pytest.raises(ConfigError, match="subset of"):
        w.validate(m.Config(block_sizes=(12,)))
    with pytest.raises(ConfigError, match="scale_format must be one of"):
        w.validate(m.Config(scale_format="ue3m4"))
    with pytest.raises(ConfigError, match="no run.json"):
        w.validate(m.Config(lm_checkpoint=str(tmp_path)))
    with pytest.raises(ConfigError, match="--workers 1"):
        w.validate(m.smoke(), world_size=2)


@pytest.mark.parametrize("distribution", ["gaussian", "laplace"])
def test_synthetic_tensors_have_the_asked_width(distribution):
    cfg = m.Config(distribution=distribution, synthetic_rows=256)
    x = synthetic(cfg, 0.005)
    assert x.shape == (256, 1024)
    assert float(x.std()) == pytest.approx(0.005, rel=0.02)
    kurtosis = float(((x / x.std()) ** 4).mean())
    assert kurtosis == pytest.approx(3.0 if distribution == "gaussian" else 6.0, rel=0.15)


def _tiny_lm(seed=0):
    cfg = dataclasses.replace(celerity_lm.smoke(), width=32, depth=1, seed=seed)
    torch.manual_seed(seed)
    model, _, _ = celerity_lm.build(cfg)
    return model.eval(), cfg


def test_narrowing_keeps_the_function_and_sets_the_width():
    model, cfg = _tiny_lm()
    with torch.no_grad():  # make the LayerNorm parameters non-trivial so the compensation is exercised
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    narrow = narrowed(model, 0.004)
    x = torch.randint(0, 256, (2, cfg.seq_len))
    assert torch.allclose(model(x), narrow(x), atol=1e-4, rtol=1e-4)
    for block in narrow.blocks:
        assert float(block.qkv.weight.std()) == pytest.approx(0.004, rel=1e-4)
        assert float(block.fc.weight.std()) == pytest.approx(0.004, rel=1e-4)
    assert float(model.blocks[0].qkv.weight.std()) > 0.01  # the original is left alone


def test_measured_anomaly_on_one_block_pair():
    """The mechanism at the measurement level: UE4M3 block 8 vs 32 on a narrow tensor."""
    model, _ = _tiny_lm()
    batches = [(torch.randint(0, 256, (2, 16)), torch.randint(0, 256, (2, 16)))]
    cfg = m.Config(sigmas=(0.005, 1.0), synthetic_rows=64, lm_narrow_std=0.0)
    out = {}
    for b in (8, 32):
        out.update(measure_block(cfg, b, {"lm": model}, batches, torch.device("cpu"), loss_fp=0.0))
    assert out["eval/rel_mse/s0.005/b8"] > 2 * out["eval/rel_mse/s0.005/b32"]
    assert out["eval/rel_mse/s1/b8"] < out["eval/rel_mse/s1/b32"]
    before = model.blocks[0].qkv.weight.clone()
    assert all(math.isfinite(v) for v in out.values())
    assert torch.equal(model.blocks[0].qkv.weight, before)  # weights restored after quantizing them
    cfg5 = dataclasses.replace(cfg, scale_format="ue5m3")
    o5 = {**measure_block(cfg5, 8, {"lm": model}, batches, torch.device("cpu"), 0.0),
          **measure_block(cfg5, 32, {"lm": model}, batches, torch.device("cpu"), 0.0)}
    assert o5["eval/rel_mse/s0.005/b8"] < o5["eval/rel_mse/s0.005/b32"]
    assert rel_mse(torch.ones(4), torch.ones(4)) == 0.0


def _trial(fmt, glob, narrow_curve, wide_curve=(0.0125, 0.012, 0.011, 0.010, 0.009, 0.0073)):
    blocks = (256, 128, 64, 32, 16, 8)
    t = {"scale_format": fmt, "global_scale": glob, "block_sizes": list(blocks), "sigmas": [0.005, 1.0]}
    for b, v, w in zip(blocks, narrow_curve, wide_curve):
        t[f"eval/rel_mse/s0.005/b{b}"] = v
        t[f"eval/rel_mse/s1/b{b}"] = w
    return t


MONOTONE = (0.0125, 0.012, 0.011, 0.010, 0.009, 0.0073)


def test_claims_judge_the_curves_they_are_given():
    rising = _trial("ue4m3", False, (0.0144, 0.0142, 0.0141, 0.0141, 0.0186, 0.0539))
    flat = _trial("ue4m3", False, MONOTONE)
    holds, measured = claims.ue4m3_anomaly([rising])
    assert holds and measured["threshold_block"] in (32.0, 64.0) and measured["narrow_rise"] == pytest.approx(0.0539 / 0.0141)
    assert not claims.ue4m3_anomaly([flat])[0]
    assert claims.ue5m3_no_rise([_trial("ue5m3", False, MONOTONE)])[0]
    assert not claims.ue5m3_no_rise([_trial("ue5m3", False, (0.0125, 0.012, 0.011, 0.010, 0.009, 0.0095))])[0]
    with pytest.raises(LookupError, match="no trial with scale_format='ue5m3'"):
        claims.ue5m3_no_rise([rising])


def test_quantizes_a_celerity_run_folder(workdir):
    """lm_checkpoint loads the model `ladder run celerity_lm` trained: same held-out loss as that run's."""
    from orchestrator import launch

    lm_cfg = dataclasses.replace(celerity_lm.smoke(), tpp=1.0, eval_tokens=4096)
    result = launch.run_local("celerity_lm", lm_cfg, track=False, progress=False)
    cfg = m.Config(lm_checkpoint=str(result.run_dir), block_sizes=(32, 8), sigmas=(0.005,), synthetic_rows=16,
                   eval_tokens=4096, quantize_activations=False)
    from orchestrator.run import LocalRun

    out = m.train(cfg, LocalRun(workdir / "mx"))
    assert out["eval/lm_loss_fp"] == pytest.approx(result.metrics["eval/loss"], abs=1e-5)
    assert out["eval/rel_mse/lm_narrow_weights/b8"] > 1.5 * out["eval/rel_mse/lm_narrow_weights/b32"]


def test_the_lm_cache_key_is_the_lm_config_and_celerity_lm_code(monkeypatch, tmp_path):
    from workloads.mx_anomaly.workload import lm_cache_dir, lm_config

    monkeypatch.setenv("LADDER_CACHE", str(tmp_path))
    cfg = m.smoke()
    here = lm_cache_dir(lm_config(cfg))
    assert here.parent == tmp_path / "mx_anomaly"
    # Another scale format quantizes the same LM; another seed or width trains another.
    assert lm_cache_dir(lm_config(dataclasses.replace(cfg, scale_format="e8m0", global_scale=False))) == here
    assert lm_cache_dir(lm_config(dataclasses.replace(cfg, seed=1))) != here
    assert lm_cache_dir(lm_config(dataclasses.replace(cfg, lm_width=32))) != here


@pytest.mark.slow
def test_reproduce_mx_anomaly_on_ray(workdir):
    """`ladder reproduce mx_anomaly --smoke` on the local Ray: every claim holds, the table and the
    plot are in MLflow."""
    proc = run_cli(["reproduce", "mx_anomaly", "--smoke"], cwd=workdir, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    names = ("ue4m3_anomaly", "ue5m3_no_rise", "global_scale_also_removes_it", "lm_loss_anomaly")
    verdicts = {line.split()[0]: line.split()[1] for line in proc.stdout.splitlines()
                if line.split() and line.split()[0] in names}
    assert verdicts == {n: "yes" for n in names}, proc.stdout
    assert "all claims hold (4/4 claims, 4 trials" in proc.stdout

    from orchestrator import tracking

    c = tracking.client(tracking.tracking_uri(workdir))
    exp = c.get_experiment_by_name("repro-mx_anomaly-smoke")
    parents = [r for r in c.search_runs([exp.experiment_id]) if r.data.tags.get("ladder.kind") == "sweep"]
    assert len(parents) == 1
    parent = parents[0]
    assert parent.data.tags["ladder.claims"] == "4/4 claims hold"
    assert parent.data.metrics["claim/ue4m3_anomaly"] == 1.0
    assert parent.data.metrics["claim/ue4m3_anomaly/narrow_rise"] > 2.0
    artifacts = {a.path for a in c.list_artifacts(parent.info.run_id)}
    assert {"claims.txt", "claims.json", "repro_trials.json", "mx_anomaly_claims.png"} <= artifacts
    recorded = json.loads(open(c.download_artifacts(parent.info.run_id, "claims.json", str(workdir))).read())
    assert {r["name"] for r in recorded} == {"ue4m3_anomaly", "ue5m3_no_rise", "global_scale_also_removes_it",
                                             "lm_loss_anomaly"}
    # The four trials quantize one LM: one trial trained it (a curve of held-out LM losses), the
    # others read it from the cache (one point), and all measured the same full-precision loss.
    trials = [r for r in c.search_runs([exp.experiment_id]) if "ladder.trial_id" in r.data.tags]
    curves = sorted(len(c.get_metric_history(r.info.run_id, "eval/lm_loss")) for r in trials)
    assert len(trials) == 4 and curves[:3] == [1, 1, 1] and curves[3] > 1, curves
    assert len({json.loads(r.data.tags["ladder.final"])["eval/lm_loss_fp"] for r in trials}) == 1
    assert validate(m.smoke()) is None
