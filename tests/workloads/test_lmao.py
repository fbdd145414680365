"""lmao: the MeZO step (seed replay, the update it makes, its estimate of the gradient), the pass
counter, the three methods' loops on tiny-local, resumption, bad configs, the claims on synthetic
trials, and the smoke reproduction (its arms shortened)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from orchestrator.runners import registry
from orchestrator.claims import spec_of
from orchestrator.runners.config import ConfigError
from orchestrator.run import LocalRun
from workloads.lmao import CHECKS, CLAIMS, Config, plot, smoke, train, validate
from workloads.lmao import data, memory, zo
from workloads.lmao.claims import (ACC_TOLERANCE, lmao_beats_lora_and_mezo, lmao_comparable_to_full_ft,
                                   lmao_memory_below_full_ft, no_base_grad_after_zo, three_forwards_one_backward)
from conftest import DiesAtSave, narrowed_reproduction


def params(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(5, 3, generator=g), torch.randn(7, generator=g), torch.randn(2, 2, 2, generator=g)]


# --- MeZO ---------------------------------------------------------------------------------------


def test_perturbations_replayed_from_the_seed_restore_theta():
    theta = params()
    before = [p.clone() for p in theta]
    zo_loss = lambda: sum(p.square().sum() for p in theta)  # noqa: E731
    plus, minus, g = zo.zo_step(theta, zo_loss, seed=123, eps=1e-2, lr=0.0)
    assert plus != minus and g != 0  # the two forwards saw different weights
    for p, q in zip(theta, before):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6)  # back to theta up to rounding, no z stored


def test_update_is_minus_lr_g_z_with_z_regenerated_from_the_seed():
    theta = params()
    before = [p.clone() for p in theta]
    zo.update(theta, seed=7, lr=0.1, projected_grad=2.0)
    gen = torch.Generator().manual_seed(7)
    for p, q in zip(theta, before):
        z = torch.randn(q.shape, generator=gen)  # the same stream, parameter by parameter
        torch.testing.assert_close(p, q - 0.1 * 2.0 * z)
    other = params()
    zo.update(other, seed=8, lr=0.1, projected_grad=2.0)
    assert not torch.allclose(other[0], theta[0])


def test_weight_decay_skips_the_masked_parameters():
    theta = [torch.ones(3), torch.ones(3)]
    zo.update(theta, seed=0, lr=0.5, projected_grad=0.0, weight_decay=0.2, decay=[True, False])
    torch.testing.assert_close(theta[0], torch.full((3,), 0.9))
    torch.testing.assert_close(theta[1], torch.ones(3))
    matrix = torch.ones(3, 2)
    assert zo.decay_mask([("model.layers.0.mlp.up_proj.weight", matrix), ("model.norm.weight", theta[1]),
                          ("x.bias", theta[1]), ("transformer.h.0.ln_1.weight", theta[1]),
                          ("model.norm_like.weight", matrix)]) == [True, False, False, False, False]


def test_projected_gradient_estimates_the_gradient_on_average():
    # L(theta) = 0.5 ||A theta - b||^2: E[g z] = grad L for z ~ N(0, I).
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(6, 4, generator=g, dtype=torch.float64), torch.randn(6, generator=g, dtype=torch.float64)
    theta = torch.randn(4, generator=g, dtype=torch.float64)
    exact = a.T @ (a @ theta - b)
    estimate = torch.zeros(4, dtype=torch.float64)
    n = 4000
    for s in range(n):
        probe = [theta.clone()]
        _, _, proj = zo.zo_step(probe, lambda: 0.5 * (a @ probe[0] - b).square().sum(), seed=s, eps=1e-4, lr=0.0)
        estimate += proj * torch.randn(4, generator=torch.Generator().manual_seed(s), dtype=torch.float64) / n
    cos = float(estimate @ exact / (estimate.norm() * exact.norm()))
    assert cos > 0.95 and float(estimate.norm() / exact.norm()) == pytest.approx(1.0, abs=0.15)


def test_zo_seed_depends_on_seed_and_step_only():
    assert zo.zo_seed(0, 5) == zo.zo_seed(0, 5)
    assert len({zo.zo_seed(s, t) for s in range(3) for t in range(100)}) == 300


# --- the counter --------------------------------------------------------------------------------


def test_pass_counter_counts_forwards_and_backwards_through_the_output():
    lin = torch.nn.Linear(3, 2)
    counter = zo.PassCounter(lin)
    x = torch.randn(4, 3)
    lin(x).sum().backward()
    with torch.no_grad():
        lin(x)
    assert counter.snapshot() == (2, 1)
    counter.active = False
    lin(x).sum().backward()
    assert counter.snapshot() == (2, 1)
    counter.active = True
    lin.requires_grad_(False)
    lin(x)  # nothing requires grad: no backward can follow, none is counted
    assert counter.snapshot() == (3, 1)
    assert zo.params_holding_grad(list(lin.parameters())) == 2  # the grads of the first backward stayed
    counter.remove()
    lin(x)
    assert counter.snapshot() == (3, 1)


# --- memory -------------------------------------------------------------------------------------


def test_memory_parts_are_the_bytes_of_the_tensors_held():
    lin = torch.nn.Linear(4, 3)  # 12 + 3 float32 parameters: 60 bytes
    opt = torch.optim.Adam(lin.parameters(), lr=1e-3)
    assert memory.tensor_bytes(lin.parameters()) == 60 and memory.grad_bytes(lin.parameters()) == 0
    assert memory.optimizer_state_bytes(opt) == 0 and memory.optimizer_state_bytes(None) == 0
    saved = memory.SavedActivations(lin.parameters())
    x = torch.randn(5, 4, requires_grad=True)
    with saved.recording():
        y = torch.tanh(lin(x))  # saves x (80 bytes) and tanh's output (60 bytes); the weight is a parameter
    assert saved.bytes == 5 * 4 * 4 + 5 * 3 * 4
    y.sum().backward()
    assert memory.grad_bytes(lin.parameters()) == 60
    opt.step()
    assert memory.optimizer_state_bytes(opt) == 2 * 60 + 2 * 4  # two moments and a float32 step per parameter
    assert memory.zo_noise_bytes(lin.parameters()) == 48 and memory.zo_noise_bytes([]) == 0
    lin.requires_grad_(False)
    with saved.recording():
        lin(x)  # a frozen weight: the input's gradient needs only the weight (a parameter), x is not kept
    assert saved.bytes == 0
    mem = memory.merge_max({}, {"params": 60, "grads": 60})
    memory.merge_max(mem, {"params": 60, "grads": 0, "optimizer": 128})
    assert mem == {"params": 60.0, "grads": 60.0, "optimizer": 128.0, "total": 188.0}


# --- data ---------------------------------------------------------------------------------------


def test_bijection_is_a_permutation_and_labels_the_image_token(tiny_base):
    from components.basemodel import load_base

    pairs = data.bijection("topics", 63, seed=4)
    assert sorted(a for a, _ in pairs) == sorted(b for _, b in pairs) and len({a for a, _ in pairs}) == 63
    assert pairs != data.bijection("topics", 63, seed=5) and pairs == data.bijection("topics", 63, seed=4)
    _, tok = load_base("tiny-local")
    batch = data.encode(pairs[:4], tok)
    for i, (a, b) in enumerate(pairs[:4]):
        assert tok.convert_ids_to_tokens(batch.ids[i][batch.mask[i] == 1].tolist()) == ["<bos>", a, "->", b]
        assert batch.labels[i].tolist().count(-100) == batch.ids.shape[1] - 1


# --- the loops ----------------------------------------------------------------------------------


@pytest.mark.parametrize("method, fwd, bwd", [("lmao", 3, 1), ("lora", 1, 1), ("mezo", 2, 0), ("full", 1, 1)])
def test_each_method_counts_its_passes_and_leaves_no_base_grad(tmp_path, tiny_base, method, fwd, bwd):
    from components.basemodel import load_base

    cfg = dataclasses.replace(smoke(), method=method, steps=6, eval_every=3, log_every=3)
    run = LocalRun(tmp_path)
    out = train(cfg, run)
    assert (out["diag/forwards_per_step_min"], out["diag/forwards_per_step_max"]) == (fwd, fwd)
    assert (out["diag/backwards_per_step_min"], out["diag/backwards_per_step_max"]) == (bwd, bwd)
    assert out["diag/base_params_with_grad"] == 0.0
    base = load_base("tiny-local")[0]
    n_base = sum(p.numel() for p in base.parameters())
    assert (out["diag/trainable_first_order"] > 0) == (method != "mezo")
    assert (out["diag/trainable_first_order"] == n_base) == (method == "full")
    assert (out["diag/zo_params"] == n_base) == (method in ("lmao", "mezo"))
    assert all(math.isfinite(m["train/loss"]) for _, m in run.history if "train/loss" in m)
    assert out["diag/eval_items"] == cfg.n_pairs and 0 <= out["eval/acc"] <= 1
    # The memory a step holds, from its tensors: the base's float32 parameters always; full fine-tuning adds a
    # gradient and two Adam moments per base weight; LMAO and LoRA only the adapter's; MeZO one z.
    base_bytes = 4 * n_base
    adapter = 4 * out["diag/trainable_first_order"]
    assert out["mem/params_bytes"] == base_bytes + (adapter if method in ("lmao", "lora") else 0)
    assert out["mem/grads_bytes"] == (adapter if method != "mezo" else 0)
    if method == "full":  # two moments per weight and one float32 step per tensor
        assert out["mem/optimizer_bytes"] == 2 * base_bytes + 4 * sum(1 for _ in base.parameters())
    elif method == "mezo":
        assert out["mem/optimizer_bytes"] == 0
    else:
        assert 2 * adapter < out["mem/optimizer_bytes"] <= 2 * adapter + 4 * 64
    assert (out["mem/activations_bytes"] > 0) == (method != "mezo")
    assert (out["mem/zo_noise_bytes"] == max(4 * p.numel() for p in base.parameters())) == (method in ("lmao", "mezo"))
    parts = ("params", "grads", "optimizer", "activations", "zo_noise")
    assert out["mem/peak_train_bytes"] == sum(out[f"mem/{p}_bytes"] for p in parts)


def test_full_fine_tuning_moves_every_base_weight_with_adamw(tmp_path, tiny_base):
    from components.basemodel import load_base

    base = dict(load_base("tiny-local")[0].named_parameters())
    cfg = dataclasses.replace(smoke(), method="full", full_lr=1e-3, full_weight_decay=0.1, steps=3, eval_every=3,
                              log_every=3, checkpoint_every_frac=1.0)
    run = LocalRun(tmp_path)
    train(cfg, run)
    state = run.restore()
    assert set(state["params"]) == set(base) and not any("lora_" in k for k in state["params"])
    for name, value in state["params"].items():
        assert not torch.equal(value, base[name]), name
    opt = state["optimizer"]
    assert len(opt["state"]) == len(base) and opt["param_groups"][0]["weight_decay"] == 0.1


def test_zeroth_order_moves_every_base_weight_and_lora_none(tmp_path, tiny_base):
    from components.basemodel import load_base

    base = dict(load_base("tiny-local")[0].named_parameters())
    for method in ("lmao", "lora"):
        cfg = dataclasses.replace(smoke(), method=method, steps=4, eval_every=4, log_every=4, checkpoint_every_frac=1.0)
        run = LocalRun(tmp_path / method)
        train(cfg, run)
        saved = run.restore()["params"]
        base_keys = [k for k in saved if "lora_" not in k]
        if method == "lora":  # only the adapter is checkpointed: the base never changes
            assert not base_keys and saved
        else:
            for k in base_keys:
                name = k.removeprefix("base_model.model.").replace(".base_layer", "")
                assert not torch.equal(saved[k], base[name]), k


def test_resumed_run_ends_where_an_uninterrupted_one_does(tmp_path, tiny_base):
    cfg = dataclasses.replace(smoke(), steps=8, eval_every=4, log_every=2, checkpoint_every_frac=0.5)
    whole = train(cfg, LocalRun(tmp_path / "whole"))

    with pytest.raises(KeyboardInterrupt):
        train(cfg, DiesAtSave(tmp_path / "cut"))
    resumed = LocalRun(tmp_path / "cut")
    again = train(cfg, resumed)
    assert resumed.restored_step == 4
    assert again["eval/loss"] == pytest.approx(whole["eval/loss"], rel=1e-5)
    assert again["diag/forwards_per_step_max"] == 3


@pytest.mark.parametrize("change, message", [
    ({"method": "adam"}, "method must be"),
    ({"full_lr": 0.0}, "full_lr must be positive"),
    ({"full_weight_decay": -0.1}, "full_weight_decay"),
    ({"pool": "cities"}, "pool must be one of"),
    ({"n_pairs": 64}, r"n_pairs must lie in \[2, 63\]"),
    ({"lora_targets": ()}, "lora_targets"),
    ({"zo_eps": 0.0}, "must be positive"),
    ({"zo_weight_decay": -1.0}, "zo_weight_decay"),
    ({"steps": 0}, "steps must be positive"),
    ({"checkpoint_every_frac": 0.0}, "checkpoint_every_frac"),
    ({"base": "./missing/model"}, "does not exist"),
])
def test_bad_configs_name_the_problem(change, message):
    with pytest.raises(ValueError, match=message):
        validate(dataclasses.replace(Config(), **change))


def test_unknown_lora_target_is_refused_with_the_choices(tmp_path, tiny_base):
    with pytest.raises(ValueError, match="choose among"):
        train(dataclasses.replace(smoke(), lora_targets=("qkv",)), LocalRun(tmp_path))


def test_more_than_one_worker_is_refused():
    with pytest.raises(ConfigError, match="workers=1"):
        registry.load("lmao").validate(Config(), world_size=2)


# --- claims -------------------------------------------------------------------------------------


def trials_for(losses: dict[str, list[float]], acc: dict[str, list[float]] | None = None, **diag):
    counts = {"lmao": (3, 1), "lora": (1, 1), "mezo": (2, 0), "full": (1, 1)}
    peak = {"lmao": 1.1e6, "lora": 1.1e6, "mezo": 1.0e6, "full": 4.2e6}  # the pattern memory.py counts
    out = []
    for method, values in losses.items():
        f, b = counts[method]
        for seed, loss in enumerate(values):
            out.append({"method": method, "seed": seed, "eval/loss": loss,
                        "eval/acc": (acc or {}).get(method, [0.5] * len(values))[seed], "diag/eval_items": 63.0,
                        "diag/forwards_per_step_min": f, "diag/forwards_per_step_max": f,
                        "diag/backwards_per_step_min": b, "diag/backwards_per_step_max": b,
                        "diag/base_params_with_grad": 0.0, "diag/zo_params": 259008.0,
                        "mem/peak_train_bytes": peak[method], "mem/params_bytes": 1.0e6, **diag.get(method, {})})
    return out


PATTERN = {"lmao": [2.0, 2.2], "full": [0.5, 0.6], "lora": [2.3, 2.1], "mezo": [5.0, 5.0]}


def test_claims_hold_on_the_papers_pattern():
    trials = trials_for(PATTERN, acc={"lmao": [0.92, 0.93], "full": [0.92, 0.92]})
    results = {c.__name__: c(trials) for c in CLAIMS + CHECKS}
    assert all(h for h, _ in results.values()), results
    assert [c.__name__ for c in CLAIMS] == ["lmao_comparable_to_full_ft", "lmao_beats_lora_and_mezo"]  # headline first
    head = results["lmao_comparable_to_full_ft"][1]
    assert head["acc_gap_vs_full"] == pytest.approx(0.005) and head["seeds_lmao_at_least_full"] == 2
    assert head["peak_ratio_lmao_to_full"] == pytest.approx(1.1 / 4.2) and head["items"] == 63
    assert results["lmao_beats_lora_and_mezo"][1]["seeds_lmao_best"] == 1
    assert results["three_forwards_one_backward"][1]["mezo_forwards"] == 2
    assert results["lmao_memory_below_full_ft"][1]["full_peak_bytes"] == 4.2e6


def test_headline_judges_accuracy_against_full_fine_tuning_within_the_tolerance():
    spec = spec_of(lmao_comparable_to_full_ft)
    assert spec is not None and spec.effect == "acc_gap_vs_full" and spec.direction == ">="
    assert spec.threshold == -ACC_TOLERANCE and "91.9" in spec.paper
    tol = ACC_TOLERANCE
    for lmao_acc, expected in (([0.9, 0.9], True), ([0.9 - tol + 1e-9, 0.9 - tol + 1e-9], True), ([0.9 - tol - 0.02, 0.9 - tol - 0.02], False),
                               ([0.95, 0.5], False), ([0.2, 0.3], False), ([1.0, 1.0], True)):
        holds, measured = lmao_comparable_to_full_ft(trials_for(PATTERN, acc={"lmao": lmao_acc, "full": [0.9, 0.9]}))
        assert holds is expected and spec.passes(measured[spec.effect]) == holds, (lmao_acc, measured)
    # Loss does not enter the headline: LMAO's loss far above full fine-tuning's, its accuracy equal, holds.
    assert lmao_comparable_to_full_ft(trials_for({"lmao": [9.0], "full": [0.1]}, acc={"lmao": [0.8], "full": [0.8]}))[0]
    with pytest.raises(ValueError, match="no trials of"):
        lmao_comparable_to_full_ft(trials_for({"lmao": [1.0], "lora": [1.0], "mezo": [1.0]}))


def test_memory_check_fails_when_lmao_holds_as_much_as_full_fine_tuning():
    assert lmao_memory_below_full_ft(trials_for(PATTERN))[0]
    same = {"lmao": {"mem/peak_train_bytes": 4.2e6}}
    holds, measured = lmao_memory_below_full_ft(trials_for(PATTERN, **same))
    assert not holds and measured["peak_ratio_lmao_to_full"] == 1.0
    with pytest.raises(ValueError, match="needs lmao and full"):
        lmao_memory_below_full_ft(trials_for({"lmao": [1.0], "lora": [1.0]}))


def test_loss_claim_agrees_with_its_declared_effect():
    spec = spec_of(lmao_beats_lora_and_mezo)
    for losses, expected in (({"lmao": [2.0, 2.2], "lora": [2.3, 2.1], "mezo": [5.0, 5.0]}, True),
                             ({"lmao": [2.5], "lora": [2.3], "mezo": [5.0]}, False),
                             ({"lmao": [2.0], "lora": [2.3], "mezo": [1.0]}, False)):
        holds, measured = lmao_beats_lora_and_mezo(trials_for(losses))
        assert holds is expected and spec.passes(measured[spec.effect]) == holds, measured


def test_claims_fail_when_the_pattern_is_absent():
    assert not lmao_beats_lora_and_mezo(trials_for({"lmao": [2.5], "lora": [2.3], "mezo": [5.0]}))[0]
    assert not lmao_beats_lora_and_mezo(trials_for({"lmao": [2.0], "lora": [2.3], "mezo": [1.0]}))[0]
    extra = {"lmao": {"diag/forwards_per_step_max": 4}}
    assert not three_forwards_one_backward(trials_for({"lmao": [1.0]}, **extra))[0]
    twice = {"lmao": {"diag/backwards_per_step_max": 2}}
    assert not three_forwards_one_backward(trials_for({"lmao": [1.0]}, **twice))[0]
    grads = {"mezo": {"diag/base_params_with_grad": 3.0}}
    assert not no_base_grad_after_zo(trials_for({"lmao": [1.0], "mezo": [1.0]}, **grads))[0]
    with pytest.raises(ValueError, match="no trials of"):
        lmao_beats_lora_and_mezo(trials_for({"lmao": [1.0], "lora": [1.0]}))


def test_plot_writes_a_png(tmp_path):
    path = tmp_path / "claims.png"
    plot(trials_for({"lmao": [2.0], "full": [0.5], "lora": [2.3], "mezo": [5.0]}), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- the reproduction ---------------------------------------------------------------------------


SHORT_STEPS = 150
"""The test's reproduction runs the smoke's four arms for this many steps, not its 600: the checks it asserts hold
by construction at any length (pass counts, base gradients, counted memory), and the one bound on training, LMAO's
loss below MeZO's, still has a margin at 150 (below); the full smoke is what `ladder reproduce lmao --smoke` runs
and judges for the report."""


@pytest.mark.slow
def test_smoke_reproduction_holds(workdir, tiny_base, monkeypatch):
    from orchestrator.reproduction import reproduce as reproduction

    full = narrowed_reproduction(monkeypatch, "lmao", {"steps": SHORT_STEPS})
    assert full.overrides["steps"] == 600 and len(full.points) == 4  # what this test shortens
    rep = reproduction.reproduce("lmao", smoke=True, local=True)
    assert not rep.failed_trials and len(rep.trials) == 4 and all(t["steps"] == SHORT_STEPS for t in rep.trials)
    results = {c.name: c for c in rep.outcomes}
    assert {c.name for c in rep.checks} == {"three_forwards_one_backward", "no_base_grad_after_zo", "lmao_memory_below_full_ft"}
    assert rep.outcomes[0].name == "lmao_comparable_to_full_ft"
    assert results["lmao_memory_below_full_ft"].holds, results["lmao_memory_below_full_ft"].measured
    for claim in rep.outcomes:
        assert claim.judged and all(math.isfinite(v) for v in claim.measured.values()), claim
    assert results["three_forwards_one_backward"].holds, results["three_forwards_one_backward"].measured
    assert results["no_base_grad_after_zo"].holds, results["no_base_grad_after_zo"].measured
    loss = results["lmao_beats_lora_and_mezo"].measured
    # The first-order half carries most of the progress. margin at 150 steps: mezo_loss - lmao_loss 1.56, 0.89, 0.80,
    # 1.54 at LADDER_TEST_SEED_SHIFT 0, 7, 10, 20 (threshold 0.4: half the worst measured gap; at the smoke's 600
    # steps it was worst 1.69 over seeds 1-5, threshold 1.0)
    assert loss["lmao_loss"] < loss["mezo_loss"] - 0.4, loss
    # lmao_beats_lora_and_mezo itself is judged and reported by `ladder reproduce`, not asserted: at
    # tiny-local's size (the smoke's 600 steps) the zeroth-order half's gain over LoRA r = 1 is below the
    # run-to-run spread of the LoRA trajectory (over seeds 0-5 LMAO ended below LoRA in 4 of 6, mean 2.830 vs
    # 2.877, per-seed differences from -0.36 to +0.21).


# --- task files and a second architecture -------------------------------------------------------

POSITIVE = ("good", "fine", "nice", "lovely", "superb", "bright")
NEGATIVE = ("bad", "awful", "poor", "dull", "grim", "weak")


def review_records(n: int, seed: int = 0) -> list[dict]:
    """SST-2-shaped records (`sentence`, `label` 0/1): the label is the sentiment of the adjective."""
    import random

    rng = random.Random(seed)
    nouns = ("film", "plot", "cast", "score", "ending", "script")
    return [{"sentence": f"the {rng.choice(nouns)} was {rng.choice(POSITIVE if i % 2 else NEGATIVE)} . ", "label": i % 2,
             "idx": i} for i in range(n)]


@pytest.fixture(scope="module")
def gpt2_task(tmp_path_factory):
    """A tiny GPT-2 folder (Conv1D, `transformer.h`, a byte-level BPE) and an SST-2-shaped JSONL file."""
    from components.basemodel import write_jsonl
    from components.basemodel.toy import save_tiny_gpt2

    root = tmp_path_factory.mktemp("lmao-gpt2")
    records = review_records(96)
    task = write_jsonl(root / "sst2.jsonl", records)
    folder = save_tiny_gpt2(root / "gpt2", [r["sentence"] + " It was terrible great" for r in records], vocab_size=300)
    return str(folder), str(task)


def gpt2_cfg(gpt2_task, **change) -> Config:
    folder, task = gpt2_task
    fields = dict(base=folder, task_path=task, lora_targets=("c_attn",), lora_rank=2, lora_alpha=4.0, lora_lr=1e-2, batch=16,
                  steps=30, eval_every=10, log_every=5)
    return dataclasses.replace(smoke(), **{**fields, **change})


def test_gpt2_folder_and_jsonl_task_run_the_real_sweeps_code(workdir, gpt2_task, model_copies):
    from orchestrator.runners import launch
    from workloads.lmao import preflight

    trials = []
    for method, zo_lr in (("lmao", 3e-6), ("lora", 3e-6), ("mezo", 1e-3), ("full", 3e-6)):
        cfg = gpt2_cfg(gpt2_task, method=method, zo_lr=zo_lr, full_lr=1e-3)
        preflight(cfg)
        result = launch.run_local("lmao", cfg, progress=False, track=False)
        losses = [m["train/loss"] for _, m in result.history if "train/loss" in m]
        # margin: losses[0] - losses[-1] worst 0.342 over seeds 1-5 (lmao 0.363, 0.359, 0.358, 0.349,
        # 0.344; lora 0.363, 0.358, 0.358, 0.348, 0.342; mezo 0.647, 0.387, 0.384, 0.475, 0.382) (threshold 0.1)
        if method != "full":  # full fine-tuning runs here for the code path (Conv1D weights, AdamW), not judged
            assert losses[-1] < losses[0] - 0.1, (method, losses)
        assert 0.0 <= result.metrics["eval/acc"] <= 1.0 and math.isfinite(result.metrics["eval/loss"])
        trials.append({"method": method, "seed": cfg.seed, **result.metrics})
    assert model_copies.peak <= 2
    outcomes = {c.__name__: c(trials) for c in CLAIMS + CHECKS}
    assert all(math.isfinite(v) for _, measured in outcomes.values() for v in measured.values()), outcomes
    assert outcomes["three_forwards_one_backward"][0] and outcomes["no_base_grad_after_zo"][0], outcomes
    assert outcomes["lmao_memory_below_full_ft"][0], outcomes
    assert outcomes["lmao_beats_lora_and_mezo"][1]["seeds"] == 1


def test_label_word_scores_agree_with_the_answer_loss(gpt2_task):
    from components.basemodel import load_base

    folder, task = gpt2_task
    model, tok = load_base(folder)
    rows = data.read_task(task, "train", "{sentence} It was", "label", 2)[:12]
    assert all(p.startswith("the ") and p.endswith(" . It was") and "  " not in p for p, _ in rows)  # the field stripped
    words = ("terrible", "great")
    got = data.choice_metrics(model, data.encode_choices(rows, words, tok), chunk=5)
    assert got["loss"] == pytest.approx(data.evaluate(model, data.encode_labelled(rows, words, tok))["loss"], rel=1e-5)
    # The prediction is the word of highest mean log-probability: flipping every label flips the accuracy.
    flipped = data.choice_metrics(model, data.encode_choices([(p, 1 - y) for p, y in rows], words, tok), chunk=5)
    assert got["acc"] + flipped["acc"] == pytest.approx(1.0)


def test_tiny_local_with_a_saved_dataset_task(workdir, tiny_base):
    import datasets

    from orchestrator.runners import launch
    from components.basemodel import corpus
    from workloads.lmao import preflight

    # Words tiny-local knows: "<name> likes <topic>", labelled by a random half of the topics.
    topics = list(corpus.TOPICS[:20])
    liked = set(topics[::2])
    rows = [{"sentence": f"{n} likes {t}", "label": int(t in liked)} for n in corpus.NAMES[:6] for t in topics]
    folder = workdir / "likes"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows[:100]),
                          "test": datasets.Dataset.from_list(rows[100:])}).save_to_disk(str(folder))
    cfg = dataclasses.replace(smoke(), task_path=str(folder), eval_path=str(folder), eval_split="test", template="{sentence} :",
                              label_words=("0", "1"), n_train=64, batch=16, steps=20, eval_every=10, log_every=5,
                              lora_rank=2, lora_alpha=4.0, lora_lr=1e-2)
    preflight(cfg)
    result = launch.run_local("lmao", cfg, progress=False, track=False)
    losses = [m["train/loss"] for _, m in result.history if "train/loss" in m]
    # margin: losses[0] - losses[-1] worst 4.71 over seeds 1-5 (4.71, 6.38, 4.99, 6.09, 4.79) (threshold 0.1)
    assert losses[-1] < losses[0] - 0.1, losses
    evals = [m["eval/loss"] for _, m in result.history if "eval/loss" in m]
    # margin: evals[0] - evals[-1] worst 0.419 over seeds 1-5 (0.614, 1.198, 1.054, 0.635, 0.419) (threshold 0);
    # the pass count is fixed by construction
    assert evals[-1] < evals[0] and result.metrics["diag/forwards_per_step_max"] == 3, evals


def test_bad_task_files_and_foreign_kinds_are_refused_in_preflight(tmp_path, gpt2_task):
    from orchestrator.runners import registry
    from components.basemodel import write_jsonl

    lmao = registry.load("lmao")
    folder, task = gpt2_task
    no_label = write_jsonl(tmp_path / "no_label.jsonl", [{"sentence": "a b", "label": 1}, {"sentence": "c d"}])
    with pytest.raises(ConfigError, match=r"line 2 has no 'label' field"):
        lmao.preflight(gpt2_cfg(gpt2_task, task_path=str(no_label)))
    with pytest.raises(ConfigError, match=r"no 'text' field"):
        lmao.preflight(gpt2_cfg(gpt2_task, template="Review: {text} It was"))
    unlabelled = write_jsonl(tmp_path / "test.jsonl", [{"sentence": "a b", "label": -1}])
    with pytest.raises(ConfigError, match=r"eval_path=.*record 0.*field 'label' is -1"):
        lmao.preflight(gpt2_cfg(gpt2_task, eval_path=str(unlabelled)))
    # GPT-2 has no q_proj / v_proj: the paper's targets are refused, naming the model's kinds.
    with pytest.raises(ConfigError, match=r"lora_targets \['q_proj', 'v_proj'\] are not linear projection kinds.*'c_attn'"):
        lmao.preflight(gpt2_cfg(gpt2_task, lora_targets=("q_proj", "v_proj")))
    lmao.preflight(gpt2_cfg(gpt2_task, lora_targets=("q_proj",), method="mezo"))  # no LoRA, nothing to place
    with pytest.raises(ConfigError, match="is neither a folder"):
        lmao.preflight(dataclasses.replace(Config(), base="nobody/no-such-model-here"))
    for change, message in (({"template": "It was"}, "names no record field"), ({"label_words": ("great",)}, "label_words"),
                            ({"eval_frac": 1.0}, "eval_frac"), ({"dtype": "int8"}, "dtype='int8'")):
        with pytest.raises(ValueError, match=message):
            validate(gpt2_cfg(gpt2_task, **change))


def test_the_real_sweep_is_valid_anywhere_and_names_what_it_needs(workdir, monkeypatch):
    from conftest import REPO
    from orchestrator.sweep import load_sweep_file
    from orchestrator.sweeps.tune_run import launch_problems

    monkeypatch.setenv("LADDER_DATA", str(workdir / "data"))
    monkeypatch.delenv("LADDER_LLMS", raising=False)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(workdir / "empty-cache"))
    sweep = load_sweep_file(REPO / "sweeps" / "repro" / "lmao_real.py")
    base = sweep.check()
    assert (base.template, base.label_words, base.dtype) == ("{sentence} It was", ("terrible", "great"), "float16")
    steps = {p["method"]: p["steps"] for p in sweep.points}
    assert steps == {"lmao": 1000, "lora": 1000, "mezo": 20000} and sweep.gpus_per_worker == 1
    (problem,) = [p for p in launch_problems(sweep) if "task_path" in p]
    assert "base='facebook/opt-13b' is neither a folder" in problem
    assert f"task_path='{workdir / 'data' / 'sst2'}' does not exist" in problem
