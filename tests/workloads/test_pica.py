"""pica: the adapter's algebra on tiny-local (projector, merge, span, shared gradient, counts), the
loop's resumption, bad configs, the claims on synthetic trials, and the smoke reproduction (its arms shortened)."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch

from orchestrator.runners import registry
from orchestrator.claims import spec_of
from orchestrator.runners.config import ConfigError
from orchestrator.run import LocalRun
from workloads.pica import CHECKS, CLAIMS, Config, plot, smoke, train, validate
from workloads.pica import data
from workloads.pica.adapter import (
    PiCa, column_projector, count_at_depths, merge, random_projector, shared_gradient_error,
    span_residual, trainable_count,
)
from workloads.pica.claims import (
    BUDGET_RATIO, LORA_TOLERANCE, column_beats_random, pica_beats_best_baseline, merged_equals_w0_plus_mp, pica_not_worse_than_lora,
    shared_gradient_aggregates_layers, trainable_count_independent_of_depth, update_in_span_of_p,
)
from workloads.pica.workload import DEPTH_PREFIX, UNSHARED_PREFIX, check_model
from conftest import DiesAtSave, narrowed_reproduction

TARGETS = ("q_proj", "k_proj", "v_proj", "up_proj", "down_proj")
D_OUT = {"q_proj": 64, "k_proj": 32, "v_proj": 32, "up_proj": 176, "down_proj": 64}  # tiny-local's shapes


@pytest.fixture(scope="module")
def tiny(tiny_base):
    from components.basemodel import base_world, load_base

    model, tok = load_base("tiny-local")
    return model, tok, base_world("tiny-local")


@pytest.fixture
def model(tiny):
    return copy.deepcopy(tiny[0])


@pytest.fixture(scope="module")
def batch(tiny):
    _, tok, world = tiny
    return data.encode(data.task_examples(world, "qa", 11)[:24], tok)


def set_ms(pica: PiCa, seed: int = 0, scale: float = 0.05) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in pica.ms.values():
            m.copy_(scale * torch.randn(m.shape, generator=g))


# --- the adapter ------------------------------------------------------------------------------


def test_column_projector_spans_the_top_singular_directions():
    w = torch.randn(32, 64, generator=torch.Generator().manual_seed(0))
    p = column_projector(w, 4)
    torch.testing.assert_close(p @ p.T, torch.eye(4), atol=1e-6, rtol=0)
    s = torch.linalg.svdvals(w.double())
    # ||W P^T||_F^2 is the energy of the top-4 singular values, the most any 4-dim subspace holds.
    assert float((w.double() @ p.double().T).square().sum()) == pytest.approx(float(s[:4].square().sum()), rel=1e-5)
    q = random_projector(64, 4, torch.Generator().manual_seed(1), dtype=torch.float32)
    torch.testing.assert_close(q @ q.T, torch.eye(4), atol=1e-6, rtol=0)
    assert float((w @ q.T).square().sum()) < float((w @ p.T).square().sum())


def test_zero_m_leaves_the_model_unchanged_and_forward_equals_the_merged_model(model, batch):
    with torch.no_grad():
        before = model(input_ids=batch.ids, attention_mask=batch.mask).logits
    pica = PiCa(model, TARGETS, 3)
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=batch.ids, attention_mask=batch.mask).logits, before, rtol=0, atol=0)
    set_ms(pica)
    merged = merge(model)
    assert not any(type(m).__name__ == "PiCaLinear" for m in merged.modules())
    with torch.no_grad():
        a = model(input_ids=batch.ids, attention_mask=batch.mask).logits
        b = merged(input_ids=batch.ids, attention_mask=batch.mask).logits
    assert not torch.allclose(a, before, atol=1e-3)  # M moved the model...
    assert float((a - b).abs().max() / a.abs().max()) < 1e-5  # ...and the merge moved it the same way


def test_one_m_per_type_is_the_same_tensor_in_every_layer(model):
    pica = PiCa(model, TARGETS, 2)
    groups = pica.by_type()
    assert set(groups) == set(TARGETS) and all(len(v) == 4 for v in groups.values())
    for layers in groups.values():
        assert all(layer.m is layers[0].m for layer in layers)
        assert not torch.equal(layers[0].projector, layers[1].projector)  # P is per layer
    assert all(not p.requires_grad for n, p in model.named_parameters() if not n.endswith(".m"))
    assert trainable_count(model) == pica.trainable() == 2 * sum(D_OUT.values())


def test_unshared_variant_has_one_m_per_layer(model):
    pica = PiCa(model, TARGETS, 2, share=False)
    assert len(pica.ms) == 4 * len(TARGETS)
    assert trainable_count(model) == 4 * 2 * sum(D_OUT.values())


def test_span_residual_tells_a_projected_update_from_a_free_one():
    g = torch.Generator().manual_seed(2)
    p = random_projector(64, 4, g, dtype=torch.float64)
    m = torch.randn(32, 4, generator=g, dtype=torch.float64)
    assert span_residual(m @ p, p) < 1e-12
    free = torch.randn(32, 64, generator=g, dtype=torch.float64)
    assert span_residual(free, p) > 0.9  # a random update is mostly outside a 4-dim subspace of R^64
    assert span_residual(torch.zeros(32, 64), p) == 0.0


def test_shared_gradient_is_the_sum_over_layers_not_one_layer(model, batch):
    pica = PiCa(model, TARGETS, 2)
    set_ms(pica, seed=3)
    loss_fn = lambda m: data.answer_loss(m, batch)  # noqa: E731
    assert shared_gradient_error(model, pica, loss_fn) < 1e-4
    # The contrast the check rests on: any single layer's term is far from the shared gradient.
    loss_fn(model).backward()
    layer = pica.by_type()["q_proj"][0]
    full = layer.m.grad.clone()
    merged = merge(model)
    w = dict(merged.named_modules())[next(n for n, lay in pica.layers.items() if lay is layer)].weight
    w.requires_grad_(True)
    loss_fn(merged).backward()
    one = w.grad @ layer.projector.T
    assert float((full - one).norm() / full.norm()) > 0.1


def test_count_does_not_grow_with_depth(tiny):
    config = tiny[0].config
    shared = count_at_depths(config, (1, 2, 8), TARGETS, 4, share=True)
    unshared = count_at_depths(config, (1, 2, 8), TARGETS, 4, share=False)
    assert set(shared.values()) == {4 * sum(D_OUT.values())}
    assert unshared == {d: d * 4 * sum(D_OUT.values()) for d in (1, 2, 8)}


def test_rank_above_a_targets_smallest_side_is_refused(model):
    check_model(dataclasses.replace(smoke(), rank=32), model)  # k_proj is 32 x 64: r = 32 still fits
    with pytest.raises(ValueError, match="rank=33 exceeds"):
        check_model(dataclasses.replace(smoke(), rank=33), model)
    with pytest.raises(ValueError, match=r"targets \['qproj'\] are not linear projection kinds"):
        check_model(dataclasses.replace(smoke(), targets=("qproj",)), model)


# --- data ---------------------------------------------------------------------------------------


def test_qa_task_holds_out_whole_entities_and_labels_only_the_answer(tiny):
    _, tok, world = tiny
    examples = data.task_examples(world, "qa", 11)
    assert len(examples) == len(world.entities) * len(data.QA_RELATIONS)
    train_ex, held = data.split(examples, 0.2, 0, by_entity=True)
    who = lambda e: e.prompt.split(" ? ")[0].rsplit(" ", 1)[-1]  # noqa: E731
    assert {who(e) for e in train_ex}.isdisjoint({who(e) for e in held})
    assert len(held) == round(0.2 * len(world.entities)) * len(data.QA_RELATIONS)
    b = data.encode(held[:3], tok)
    for i, e in enumerate(held[:3]):
        labelled = b.labels[i][b.labels[i] != -100].tolist()
        assert tok.convert_ids_to_tokens(labelled) == [e.answer]


# --- the loop -----------------------------------------------------------------------------------


def test_smoke_run_measures_every_exact_property(tmp_path, tiny_base):
    run = LocalRun(tmp_path)
    out = train(smoke(), run)
    assert out["diag/trainable"] == out["diag/expected_trainable"] == 2 * sum(D_OUT.values())
    assert out["diag/base_changed"] == 0.0
    assert out["diag/merge_weight_err"] < 1e-5 and out["diag/merge_logit_err"] < 1e-5
    assert out["diag/span_residual"] < 1e-5 and out["diag/shared_grad_err"] < 1e-4
    # Top singular directions hold more of dL/dW0. margin: 2.955x chance at seeds 1-5, the same at every seed (the
    # base, its column space and the check batch do not depend on the trial seed) (threshold 1.5x)
    assert out["diag/grad_energy_in_span"] > 1.5 * out["diag/grad_energy_chance"]
    assert {out[f"{DEPTH_PREFIX}{d}"] for d in smoke().count_depths} == {out["diag/trainable"]}
    assert out[f"{UNSHARED_PREFIX}4"] == 4 * out[f"{UNSHARED_PREFIX}1"]
    losses = [m["train/loss"] for _, m in run.history if "train/loss" in m]
    assert losses[-1] < losses[0]  # margin: last/first worst 0.465 over seeds 1-5 (threshold: below 1)


def test_resumed_run_ends_where_an_uninterrupted_one_does(tmp_path, tiny_base):
    cfg = dataclasses.replace(smoke(), steps=12, eval_every=6, log_every=3, checkpoint_every_frac=0.5,
                              exact_checks=False, count_depths=(1,))
    whole = train(cfg, LocalRun(tmp_path / "whole"))

    with pytest.raises(KeyboardInterrupt):
        train(cfg, DiesAtSave(tmp_path / "cut"))
    resumed = LocalRun(tmp_path / "cut")
    again = train(cfg, resumed)
    assert resumed.restored_step == 6
    assert again["eval/loss"] == pytest.approx(whole["eval/loss"], rel=1e-6)


@pytest.mark.parametrize("change, message", [
    ({"task": "div"}, "task must be one of"),
    ({"subspace": "row"}, "subspace must be"),
    ({"targets": ()}, "targets must be distinct"),
    ({"rank": 0}, "rank must be positive"),
    ({"count_depths": (0, 2)}, "count_depths"),
    ({"heldout_frac": 1.0}, "heldout_frac"),
    ({"lr": 0.0}, "lr must be positive"),
    ({"warmup_frac": 1.0}, "warmup_frac"),
    ({"dtype": "int8"}, "dtype='int8' is not a dtype"),
    ({"method": "vera"}, "method must be one of"),
    ({"svft_bands": -2}, "svft_bands must be"),
    ({"svft_pattern": "diagonal"}, "svft_pattern must be"),
    ({"micro_batch": -1}, "micro_batch must be >= 0"),
    ({"eval_path": "held.jsonl"}, "eval_path=.held.jsonl. is set without task_path"),
    ({"task_path": "t.jsonl", "answer_field": "prompt"}, "two field names"),
    ({"base": "./no/such/folder"}, "does not exist"),
    ({"base": "tiny-local:layerz=2"}, "not a tiny-local override"),
])
def test_bad_configs_name_the_problem(change, message):
    with pytest.raises(ValueError, match=message):
        validate(dataclasses.replace(Config(), **change))


def test_more_than_one_worker_is_refused():
    with pytest.raises(ConfigError, match="workers=1"):
        registry.load("pica").validate(Config(), world_size=2)


# --- claims -------------------------------------------------------------------------------------


BASELINE_ACC = {"lora": 0.4, "dora": 0.45, "pissa": 0.3, "svft": 0.35}


def trials_for(column_losses, random_losses, lora_losses=None, pica_acc=0.5, **diag):
    base = {"diag/merge_weight_err": 1e-7, "diag/merge_logit_err": 1e-7, "diag/base_changed": 0.0,
            "diag/span_residual": 1e-7, "diag/shared_grad_err": 1e-6, "diag/trainable": 736.0,
            "diag/expected_trainable": 736.0, f"{DEPTH_PREFIX}1": 736.0, f"{DEPTH_PREFIX}4": 736.0,
            f"{UNSHARED_PREFIX}1": 736.0, f"{UNSHARED_PREFIX}4": 2944.0, **diag}
    out = []
    for sub, losses in (("column", column_losses), ("random", random_losses)):
        for seed, loss in enumerate(losses):
            out.append({**base, "method": "pica", "subspace": sub, "seed": seed, "share": True, "eval/loss": loss,
                        "eval/acc": pica_acc if sub == "column" else 0.2, "eval/train_loss": loss / 2,
                        "diag/grad_energy_in_span": 0.3 if sub == "column" else 0.1})
    lora_losses = column_losses if lora_losses is None else lora_losses
    for method, acc in BASELINE_ACC.items():  # the baselines at matched budgets: no exact checks, no depth counts
        for seed, loss in enumerate(lora_losses):
            out.append({"method": method, "subspace": "column", "seed": seed, "share": True, "eval/loss": loss,
                        "eval/acc": acc + 0.01 * seed, "eval/train_loss": loss / 2,
                        "diag/trainable": 960.0 if method == "dora" else 800.0, "diag/lora_rank": 1.0})
    return out


def test_claims_hold_on_the_papers_pattern():
    results = {c.__name__: c(trials_for([1.0, 1.2, 0.9], [1.3, 1.1, 1.2])) for c in CLAIMS + CHECKS}
    assert all(h for h, _ in results.values()), results
    assert [c.__name__ for c in CLAIMS] == ["pica_beats_best_baseline", "column_beats_random", "pica_not_worse_than_lora"]
    # Each declared effect agrees with its function, on a pattern that holds and on one that fails.
    for fn in CLAIMS:
        spec = spec_of(fn)
        assert spec is not None, fn.__name__
        for trials, expected in ((trials_for([1.0, 1.2, 0.9], [1.3, 1.1, 1.2]), True),
                                 (trials_for([1.2, 1.2, 1.2], [1.0, 1.3, 1.2], [0.9, 0.9, 0.9], pica_acc=0.3), False)):
            holds, measured = fn(trials)
            assert holds is expected and spec.passes(measured[spec.effect]) == holds, (fn.__name__, measured)
    assert results["column_beats_random"][1]["seeds_column_wins"] == 2
    assert results["column_beats_random"][1]["column_loss"] == pytest.approx(31 / 30)
    assert results["column_beats_random"][1]["column_grad_energy"] == pytest.approx(0.3)
    # The best baseline is DoRA (mean 0.46 over seeds 0-2), chosen per replicate by its mean accuracy.
    head = results["pica_beats_best_baseline"][1]
    assert head["best_baseline"] == 1 and head["best_baseline_acc"] == pytest.approx(0.46)
    assert head["acc_margin_vs_best"] == pytest.approx(0.04) and head["acc_margin_vs_pissa"] == pytest.approx(0.19)
    assert head["dora_budget_ratio"] == pytest.approx(960 / 736) and head["seeds"] == 3


def test_claims_fail_when_the_pattern_is_absent():
    assert not column_beats_random(trials_for([1.2, 1.2, 1.2], [1.0, 1.3, 1.2]))[0]
    assert not merged_equals_w0_plus_mp(trials_for([1], [1], **{"diag/merge_logit_err": 1e-3}))[0]
    assert not merged_equals_w0_plus_mp(trials_for([1], [1], **{"diag/base_changed": 1e-8}))[0]
    assert not update_in_span_of_p(trials_for([1], [1], **{"diag/span_residual": 0.3}))[0]
    assert not shared_gradient_aggregates_layers(trials_for([1], [1], **{"diag/shared_grad_err": 0.7}))[0]
    assert not trainable_count_independent_of_depth(trials_for([1], [1], **{f"{DEPTH_PREFIX}4": 2944.0}))[0]
    assert not pica_not_worse_than_lora(trials_for([1.3, 1.3, 1.3], [1.4] * 3, [1.0, 1.1, 1.0]))[0]  # 0.27 worse
    holds, measured = pica_not_worse_than_lora(trials_for([1.1, 1.2, 1.3], [1.4] * 3, [1.0, 1.1, 1.2]))
    assert holds and measured["loss_margin_vs_lora"] == pytest.approx(-0.1) and measured["seeds_pica_wins"] == 0
    assert measured["pica_trainable"] == 736 and measured["lora_trainable"] == 800 and measured["lora_rank"] == 1
    with pytest.raises(ValueError, match="needs pica .* and lora trials"):
        pica_not_worse_than_lora([t for t in trials_for([1.0], [1.0]) if t["method"] == "pica"])
    assert not pica_beats_best_baseline(trials_for([1.0] * 3, [1.0] * 3, pica_acc=0.46))[0]  # a tie with DoRA fails
    assert pica_beats_best_baseline(trials_for([1.0] * 3, [1.0] * 3, pica_acc=0.47))[0]
    with pytest.raises(ValueError, match=r"no trials of \['svft'\]"):
        pica_beats_best_baseline([t for t in trials_for([1.0], [1.0]) if t["method"] != "svft"])
    with pytest.raises(ValueError, match="needs column and random"):
        column_beats_random([t for t in trials_for([1.0], [1.0]) if t["subspace"] == "column"])


def test_plot_writes_a_png(tmp_path):
    path = tmp_path / "claims.png"
    plot(trials_for([1.0, 1.2, 0.9], [1.3, 1.1, 1.2]), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- the reproduction ---------------------------------------------------------------------------


SHORT_STEPS = 10
"""The test's reproduction runs the smoke's six arms for this many steps, not its 200: nothing it asserts depends on
how far the arms train (the exact properties hold for any trained M, the gradient energies are measured on W0
before the first step, the counts are fixed by the shapes), and the full smoke, whose claims need the 200 steps,
is what `ladder reproduce pica --smoke` runs and judges for the report."""


@pytest.mark.slow
def test_smoke_reproduction_holds(workdir, tiny_base, monkeypatch):
    from orchestrator.reproduction import reproduce as reproduction

    full = narrowed_reproduction(monkeypatch, "pica", {"steps": SHORT_STEPS})
    assert full.overrides["steps"] == 200 and len(full.points) == 6  # what this test shortens
    rep = reproduction.reproduce("pica", smoke=True, local=True)
    assert not rep.failed_trials and all(t["steps"] == SHORT_STEPS for t in rep.trials)
    # PiCa column, PiCa random, LoRA, DoRA, PiSSA, SVFT at one trial seed (the smoke's replicate), shortened
    assert sorted(t["method"] for t in rep.trials) == ["dora", "lora", "pica", "pica", "pissa", "svft"]
    results = {c.name: c for c in rep.outcomes}
    assert {c.name for c in rep.checks} >= {"merged_equals_w0_plus_mp", "trainable_count_independent_of_depth"}
    for claim in rep.outcomes:
        assert claim.judged and all(math.isfinite(v) for v in claim.measured.values()), claim
    exact = ["merged_equals_w0_plus_mp", "update_in_span_of_p", "shared_gradient_aggregates_layers",
             "trainable_count_independent_of_depth"]
    assert all(results[n].holds for n in exact), [(n, results[n].measured) for n in exact]
    # The headline and the two loss claims are judged and reported by `ladder reproduce`, not asserted: one seed
    # decides none of them (docs/reproductions.md). Asserted: what the ablation rests on, and the budgets.
    ablation = results["column_beats_random"].measured
    # The column space holds more of dL/dW0 than a random subspace of the same rank (the column's share is fixed by
    # the base; the random one's varies with the seed; both are measured on W0 before the first step, so the
    # shortened run measures what the full smoke does). margin: column / random 2.01, 3.02, 2.22, 2.33 at
    # LADDER_TEST_SEED_SHIFT 0, 7, 10, 20 (worst 2.56 over single seeds 100-104); threshold 1.5: halfway between
    # chance (1x, a random subspace's own share) and the worst measured (2.01), rounded down to a half.
    assert ablation["column_grad_energy"] > 1.5 * ablation["random_grad_energy"], ablation
    head = results["pica_beats_best_baseline"].measured
    assert head["pica_trainable"] == 2944 and head["held_out_items"] == 50
    assert {m: head[f"{m}_trainable"] for m in ("lora", "dora", "pissa", "svft")} == {
        "lora": 3200, "dora": 4672, "pissa": 3200, "svft": 3032}


# --- task files, a second architecture, the baselines at equal budget, the real sweep ------------

GPT2_KINDS = ("c_attn", "attn.c_proj", "c_fc", "mlp.c_proj")


def lookup_records(n: int) -> list[dict[str, str]]:
    words = ["red", "blue", "green", "gold", "gray"]
    return [{"prompt": f"the colour of item {i} is", "answer": words[(3 * i) % 5]} for i in range(n)]


@pytest.fixture(scope="module")
def gpt2_task(tmp_path_factory):
    """A tiny GPT-2 folder (Conv1D projections, BPE tokenizer) and a prompt/answer JSONL."""
    from components.basemodel import write_jsonl
    from components.basemodel.toy import save_tiny_gpt2

    root = tmp_path_factory.mktemp("pica-gpt2")
    records = lookup_records(60)
    folder = save_tiny_gpt2(root / "gpt2", [f"{r['prompt']} {r['answer']}" for r in records], vocab_size=300, positions=32)
    return folder, write_jsonl(root / "task.jsonl", records)


def gpt2_config(gpt2_task, **change) -> Config:
    folder, task = gpt2_task
    cfg = dataclasses.replace(smoke(), base=str(folder), task_path=str(task), targets=GPT2_KINDS, rank=4, steps=20,
                              batch=16, lr=3e-2, eval_every=10, log_every=5, count_depths=(1, 2), check_examples=16)
    return dataclasses.replace(cfg, **change)


def test_gpt2_folder_and_a_jsonl_task_run_every_arm_and_the_claims(gpt2_task, workdir, model_copies, monkeypatch):
    from orchestrator.runners import launch
    from workloads.pica import workload

    b_start: dict = {}  # init_lora_weights -> the largest |B| entry of the adapters as built, before training
    real_lora = workload.lora

    def recorded_lora(model, *args, init_lora_weights=True, **kwargs):
        built = real_lora(model, *args, init_lora_weights=init_lora_weights, **kwargs)
        b_start[init_lora_weights] = max(float(p.detach().abs().max()) for n, p in built.named_parameters()
                                         if "lora_B" in n)
        return built

    monkeypatch.setattr(workload, "lora", recorded_lora)
    registry.load("pica").preflight(gpt2_config(gpt2_task))
    trials = []
    for arm in ({"method": "pica"}, {"method": "pica", "subspace": "random"}, {"method": "lora"}, {"method": "pissa"}):
        cfg = gpt2_config(gpt2_task, **arm)
        res = launch.run_local("pica", cfg, progress=False, track=False)
        losses = [m["train/loss"] for _, m in res.history if "train/loss" in m]
        # margin: last/first worst 0.991 over seeds 1-5 and the four arms (PiCa column at seed 3) (threshold: below 1)
        assert len(losses) >= 3 and losses[-1] < losses[0], (arm, losses)
        trials.append({**dataclasses.asdict(cfg), **res.metrics})
    assert model_copies.peak <= 2, model_copies.peak
    pica_t, _, lora_t, pissa_t = trials
    # GPT-2 at d = 32: PiCa's r * sum of d_out per kind (96 + 32 + 128 + 32) = 4 * 288; LoRA's r * sum(in + out)
    # over the 2 x 4 projections = r * 2 * (128 + 64 + 160 + 160) = r * 1024, nearest at r = 1.
    assert pica_t["diag/trainable"] == pica_t["diag/pica_trainable"] == lora_t["diag/pica_trainable"] == 4 * 288
    assert lora_t["diag/lora_rank"] == pissa_t["diag/lora_rank"] == 1
    assert lora_t["diag/trainable"] == pissa_t["diag/trainable"] == lora_t["diag/expected_trainable"] == 1024
    for claim in [c for c in CLAIMS if c is not pica_beats_best_baseline] + CHECKS:  # no DoRA, SVFT arms here
        holds, measured = claim(trials)
        assert holds in (True, False) and measured and all(math.isfinite(v) for v in measured.values()), claim.__name__
        if claim in CHECKS:  # exact on the Conv1D model too: the merge, the span, the shared gradient, the count
            assert holds, (claim.__name__, measured)
    # PiSSA is not LoRA under another name: its B starts at the top singular directions of W0, LoRA's at zero (by
    # construction: no held-out losses compared, which differed by only 5e-4 to 0.014 at seeds 1-5).
    assert set(b_start) == {True, "pissa"} and b_start[True] == 0.0 and b_start["pissa"] > 0.0, b_start


def test_tiny_local_reads_a_saved_dataset_with_its_own_field_names(tiny_base, workdir):
    import datasets

    from orchestrator.runners import launch
    from components.basemodel import base_world

    world = base_world("tiny-local")
    train_ex, held_ex = data.split(data.task_examples(world, "qa", 11), 0.2, 0, by_entity=True)
    rows = lambda exs: [{"question": e.prompt, "label": e.answer} for e in exs]  # noqa: E731
    folder = workdir / "qa"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows(train_ex)),
                          "test": datasets.Dataset.from_list(rows(held_ex))}).save_to_disk(str(folder))
    built_in = dataclasses.replace(smoke(), steps=20, exact_checks=False, count_depths=(1,))
    cfg = dataclasses.replace(built_in, task_path=str(folder), eval_path=str(folder), prompt_field="question",
                              answer_field="label")
    registry.load("pica").preflight(cfg)
    res = launch.run_local("pica", cfg, progress=False, track=False)
    losses = [m["train/loss"] for _, m in res.history if "train/loss" in m]
    assert losses[-1] < losses[0], losses  # margin: last/first worst 0.754 over seeds 1-5 (threshold: below 1)
    # The same examples from the file as from the built-in task: the same run, number for number.
    same = train(built_in, LocalRun(workdir / "built-in"))
    assert res.metrics["eval/loss"] == same["eval/loss"] and res.metrics["eval/acc"] == same["eval/acc"]


def test_a_missing_field_or_a_module_kind_the_model_lacks_is_refused_in_preflight(gpt2_task, tmp_path, tiny_base):
    from components.basemodel import write_jsonl

    pre = registry.load("pica").preflight
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "the colour of item 1 is", "label": "red"}])
    with pytest.raises(ConfigError, match="no 'answer' field"):
        pre(gpt2_config(gpt2_task, task_path=str(bad)))
    with pytest.raises(ConfigError, match="eval_path.*no 'answer' field"):
        pre(gpt2_config(gpt2_task, eval_path=str(bad)))
    with pytest.raises(ConfigError, match=r"targets \['q_proj'\] are not linear projection kinds.*c_attn"):
        pre(gpt2_config(gpt2_task, targets=("q_proj", "c_fc")))
    with pytest.raises(ConfigError, match=r"targets \['c_attn'\] are not linear projection kinds.*q_proj"):
        pre(dataclasses.replace(smoke(), targets=("c_attn",)))
    with pytest.raises(ValueError, match="method must be one of"):
        validate(dataclasses.replace(smoke(), method="vera"))


def test_matched_lora_rank_is_the_nearest_count(tiny):
    from workloads.pica.workload import matched_lora_rank, pica_count

    model = tiny[0]
    per_rank = 4 * (128 + 96 + 96 + 240 + 240)  # tiny-local: sum(in + out) over q, k, v, up, down, 4 layers
    for rank, expected in ((2, 1), (8, 1), (16, 2), (32, 4)):
        cfg = dataclasses.replace(smoke(), rank=rank)
        count = pica_count(model, cfg)
        assert count == rank * sum(D_OUT.values())
        r = matched_lora_rank(model, cfg)
        assert r == expected and all(abs(r * per_rank - count) <= abs(k * per_rank - count) for k in range(1, 9))
    assert matched_lora_rank(model, dataclasses.replace(smoke(), lora_rank=3)) == 3


# --- SVFT, and the baselines' budgets -------------------------------------------------------------


def test_svft_merges_to_w0_plus_u_m_vt_counts_its_pattern_and_starts_at_the_base(model, batch):
    from workloads.pica.svft import SVFT, band_count, merge as svft_merge, svft_count

    with torch.no_grad():
        before = model(input_ids=batch.ids, attention_mask=batch.mask).logits
    w0 = {n: p.detach().double().clone() for n, p in model.named_parameters() if n.endswith("proj.weight")}
    assert svft_count(model, TARGETS, 0) == 4 * (3 * 64 + 2 * 32) and band_count(5, 1) == 13 and band_count(3, 9) == 9
    adapter = SVFT(model, TARGETS, 1)
    # tiny-local: k = min(out, in) is 64 for q, up, down and 32 for k, v: 3k - 2 per matrix, 4 layers
    assert adapter.trainable() == trainable_count(model) == 4 * (3 * 190 + 2 * 94) == 3032
    with torch.no_grad():  # M = 0: the base model's outputs, exactly
        torch.testing.assert_close(model(input_ids=batch.ids, attention_mask=batch.mask).logits, before, rtol=0, atol=0)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for layer in adapter.layers.values():
            layer.values.copy_(0.05 * torch.randn(layer.values.shape, generator=g))
    merged = dict(svft_merge(model).named_modules())
    for name, layer in adapter.layers.items():
        w = w0[name + ".weight"]
        sv = torch.linalg.svdvals(w)
        # U, V are W0's singular vectors: U diag(s) V^T = W0, and both have orthonormal columns
        torch.testing.assert_close(layer.u.double() * sv @ layer.v.double().T, w, atol=1e-5, rtol=0)
        torch.testing.assert_close(layer.v.double().T @ layer.v.double(), torch.eye(len(sv), dtype=torch.float64), atol=1e-5, rtol=0)
        m = torch.zeros(len(sv), len(sv), dtype=torch.float64)
        m[layer.rows, layer.cols] = layer.values.detach().double()
        assert int((m != 0).sum()) == band_count(len(sv), 1) and torch.equal(m, torch.triu(torch.tril(m, 1), -1))
        reference = w + layer.u.double() @ m @ layer.v.double().T  # W0 + U M V^T in float64
        torch.testing.assert_close(merged[name].weight.detach().double(), reference, atol=1e-6, rtol=0)
    with torch.no_grad():
        a = model(input_ids=batch.ids, attention_mask=batch.mask).logits
        b = svft_merge(model)(input_ids=batch.ids, attention_mask=batch.mask).logits
    assert not torch.allclose(a, before, atol=1e-3) and float((a - b).abs().max() / a.abs().max()) < 1e-5


def test_svft_random_pattern_has_the_banded_count_and_the_diagonal():
    from workloads.pica.svft import band_count, positions

    rows, cols = positions(16, 2, "random", torch.Generator().manual_seed(0))
    assert len(rows) == band_count(16, 2) == len({(int(r), int(c)) for r, c in zip(rows, cols)})
    assert torch.equal(rows[:16], torch.arange(16)) and torch.equal(cols[:16], torch.arange(16))
    banded = set(zip(*(t.tolist() for t in positions(16, 2, "banded"))))
    assert set(zip(rows.tolist(), cols.tolist())) != banded  # off the band somewhere


def test_every_baseline_is_at_pica_budget_or_up_to_the_stated_ratio(tiny):
    from components.basemodel import lora
    from workloads.pica.svft import SVFT, matched_bands
    from workloads.pica.workload import matched_lora_rank, pica_count

    cfg = dataclasses.replace(smoke(), rank=8)  # the smoke reproduction's r
    budget = pica_count(tiny[0], cfg)
    counts = {}
    for method, extra in (("lora", {}), ("dora", {"use_dora": True}), ("pissa", {"init_lora_weights": "pissa"})):
        r = matched_lora_rank(tiny[0], cfg)
        counts[method] = trainable_count(lora(copy.deepcopy(tiny[0]), list(TARGETS), r=r, alpha=r, **extra))
    svft_model = copy.deepcopy(tiny[0])
    counts["svft"] = SVFT(svft_model, TARGETS, matched_bands(svft_model, TARGETS, budget)).trainable()
    assert budget == 2944 and counts == {"lora": 3200, "dora": 4672, "pissa": 3200, "svft": 3032}, counts
    assert all(1.0 <= c / budget <= BUDGET_RATIO for c in counts.values()), {k: c / budget for k, c in counts.items()}


def test_the_real_sweep_is_valid_anywhere_and_names_what_it_needs(workdir, monkeypatch):
    from conftest import REPO
    from orchestrator.sweep import load_sweep_file
    from orchestrator.sweeps.tune_run import launch_problems

    monkeypatch.setenv("LADDER_DATA", str(workdir / "data"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)  # read at import: no network retries
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(workdir / "empty-cache"))
    sweep = load_sweep_file(REPO / "sweeps" / "repro" / "pica_real.py")
    sweep.check()
    assert {p["method"] for p in sweep.points} == {"pica", "lora", "pissa"} and sweep.overrides["dtype"] == "bfloat16"
    (problem,) = [p for p in launch_problems(sweep) if "task_path" in p]
    assert f"task_path='{workdir / 'data' / 'commonsense_15k.jsonl'}' does not exist" in problem
    assert "hf download google/gemma-2b" in problem
