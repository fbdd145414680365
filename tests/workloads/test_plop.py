"""plop: the NFN score on hand-built cases and at random init, the hooks, the tasks' encoding, the
rank match (equal trainable parameters, checked against peft), bad configs, resumption, the
claims, the smoke reproduction, and task files (JSONL, save_to_disk) on a tiny GPT-2 folder and on
tiny-local through the code the full-size sweep runs, with the preflight refusals. tiny-local is built once per test run (the shared cache) and loaded once here."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from orchestrator.run import LocalRun
from orchestrator.claims import spec_of
from orchestrator.runners import registry
from orchestrator.runners.config import ConfigError
from workloads.plop import CHECKS, CLAIMS, Config, plot, smoke, train, validate
from workloads.plop.claims import (
    choice_stable_across_samples, equal_trainable_params, plop_at_least_best_usual_placement, scores_one_at_random_init,
    scores_same_in_every_trial_of_a_seed, scores_separate_when_pretrained,
)
from workloads.plop.claims import PARAM_TOLERANCE
from workloads.plop.data import TASKS, answer_loss, encode, split
from workloads.plop.nfn import (
    NFNRecorder, by_type, decoder_projections, kendall_tau, mean_gain, nfn, score_modules, select,
)
from workloads.plop.placement import block_types, match_ranks, placement_types, reachable, type_costs
from workloads.plop.workload import nfn_batches
from conftest import DiesAtSave, assert_claims_hold, shifted

TYPES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def base(tiny_base):
    """tiny-local (built once per test run, loaded once per module), its world and the smoke task's split."""
    from components.basemodel import base_world, load_base

    model, tok = load_base("tiny-local")
    world = base_world("tiny-local")
    train_set, held_set = split(world, "mul_mod", heldout_frac=0.25, seed=0)
    return model, tok, world, train_set, held_set


def gaussian(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# --- the score --------------------------------------------------------------------------------


def test_nfn_hand_built_case():
    # W = [[1, 0], [0, 0]]: rms 1/2, W_hat = [[2, 0], [0, 0]]. The data z = (3, 0) points along the
    # row W reads: ||W_hat z_hat|| / sqrt(2) = 2 / sqrt(2). The reference (1, 1)/sqrt(2) gets
    # ||(2/sqrt(2), 0)|| / sqrt(2) = 1. NFN = sqrt(2).
    w = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    actual, random = nfn(w, torch.tensor([[3.0, 0.0]]), torch.tensor([[1.0, 1.0]]))
    assert actual == pytest.approx(math.sqrt(2)) and random == pytest.approx(1.0)
    # Data orthogonal to W's row: nothing passes; mixed data averages per token.
    assert nfn(w, torch.tensor([[0.0, 5.0]]), torch.tensor([[1.0, 1.0]]))[0] == pytest.approx(0.0)
    assert nfn(w, torch.tensor([[3.0, 0.0], [0.0, 2.0]]), torch.tensor([[1.0, 1.0]]))[0] == pytest.approx(math.sqrt(2) / 2)


def test_nfn_ignores_the_scale_of_weights_and_inputs():
    w, z, ref = gaussian(6, 5, seed=1), gaussian(10, 5, seed=2), gaussian(10, 5, seed=3)
    a, r = nfn(w, z, ref)
    a2, r2 = nfn(7.0 * w, z * torch.linspace(0.1, 9.0, 10)[:, None], ref * 3.0)
    assert a2 == pytest.approx(a, rel=1e-5) and r2 == pytest.approx(r, rel=1e-5)
    # A Gaussian unit direction gets mean gain ~1 from any fixed-rms W (E ||W_hat u||^2 = d_out).
    assert float(mean_gain(w / w.square().mean().sqrt(), gaussian(20000, 5, seed=4))) == pytest.approx(1.0, abs=0.05)


def test_nfn_is_about_one_for_random_weights_and_large_for_aligned_ones():
    """Why about 1 at random init: a module's input never depends on its own weight, and an i.i.d.
    Gaussian W is rotation invariant, so ||W v|| has the same law for every direction v that is
    independent of W: the data's directions, however anisotropic, and random ones are amplified
    alike. Here the data is nearly one direction; a random W still scores ~1, and a W that learnt
    that direction (a rank-one component along it, as training puts there) scores well above 1."""
    d_in, d_out = 64, 4096  # one direction's gain has relative spread 1/sqrt(2 d_out) = 0.011
    direction = gaussian(d_in, seed=5)
    z = direction + 0.05 * gaussian(256, d_in, seed=6)  # [256, d_in] almost all along `direction`
    ref = gaussian(256, d_in, seed=7)
    w = gaussian(d_out, d_in, seed=8)
    a, r = nfn(w, z, ref)
    assert a / r == pytest.approx(1.0, abs=0.05)
    u = gaussian(d_out, seed=9)
    aligned = w + 3.0 * math.sqrt(d_out) * torch.outer(u / u.norm(), direction / direction.norm())
    a, r = nfn(aligned, z, ref)
    assert a / r > 1.5


def test_random_init_model_scores_about_one_and_the_pretrained_one_does_not(base):
    from transformers import AutoModelForCausalLM

    model, tok, _, train_set, _ = base
    cfg = smoke()
    torch.manual_seed(shifted(0))
    control = AutoModelForCausalLM.from_config(model.config)
    rand = by_type(score_modules(control, nfn_batches(train_set[:32], tok, cfg), seed=shifted(0)))
    pre = by_type(score_modules(model, nfn_batches(train_set[:32], tok, cfg), seed=shifted(0)))
    assert tuple(rand) == TYPES and tuple(pre) == TYPES
    # margins over seeds 1-5 (control init and reference draws; the pre-trained base is seed 0's): the control's
    # largest |score - 1| worst 0.044 (threshold 0.1); the base's top score worst 1.968 (threshold 1.3) and its
    # spread worst 0.682 (threshold 0.3)
    assert max(abs(v - 1) for v in rand.values()) < 0.1, rand
    assert max(pre.values()) > 1.3 and max(pre.values()) - min(pre.values()) > 0.3, pre


def test_hooks_capture_each_decoder_linear_input_without_padding(base):
    model, tok, _, train_set, _ = base
    linears = {n: p.module for n, p in decoder_projections(model).items()}
    assert len(linears) == 4 * 7 and {n.rsplit(".", 1)[-1] for n in linears} == set(TYPES)
    assert not any("lm_head" in n or "embed" in n for n in linears)

    enc = tok([e.text for e in train_set[:4]] + ["3 * 4 mod", "the"], padding=True, return_tensors="pt")
    ids, mask = enc["input_ids"], enc["attention_mask"]
    assert (mask == 0).any()  # the batch has padding to leave out
    # Independent capture: each module's input as a forward pre-hook sees it.
    seen: dict[str, torch.Tensor] = {}
    handles = [m.register_forward_pre_hook(lambda mod, args, n=n: seen.__setitem__(n, args[0].detach()))
               for n, m in linears.items()]
    rec = NFNRecorder(model, seed=3)
    rec.mask = mask
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    for h in handles:
        h.remove()
    rec.remove()
    assert set(rec.ratios) == set(linears)
    assert all(not m._forward_hooks for m in linears.values())  # removed

    gen = torch.Generator().manual_seed(3)  # the recorder draws references in module call order
    for name in seen:  # pre-hooks fire in call order too
        z = seen[name][mask.bool()]
        assert z.shape[0] == int(mask.sum())
        a, r = nfn(linears[name].weight, z, torch.randn(z.shape, generator=gen))
        assert rec.ratios[name] == [pytest.approx(a / r, rel=1e-6)], name
    # The layer-0 q_proj reads the normed embeddings.
    emb = model.model.layers[0].input_layernorm(model.model.embed_tokens(ids))
    torch.testing.assert_close(seen["model.layers.0.self_attn.q_proj"], emb)


def test_padding_does_not_change_the_scores(base):
    model, tok, _, train_set, _ = base
    texts = [e.text for e in train_set[:8]]
    enc = tok(texts, padding=True, return_tensors="pt")
    wide_ids = torch.cat([enc["input_ids"], torch.full((8, 5), tok.pad_token_id)], dim=1)
    wide_mask = torch.cat([enc["attention_mask"], torch.zeros(8, 5, dtype=torch.long)], dim=1)
    narrow = score_modules(model, [(enc["input_ids"], enc["attention_mask"])], seed=1)
    wide = score_modules(model, [(wide_ids, wide_mask)], seed=1)
    assert narrow.keys() == wide.keys()
    for k in narrow:
        assert wide[k] == pytest.approx(narrow[k], rel=1e-5), k


def test_by_type_select_and_kendall_tau():
    scores = {"model.layers.0.a.q_proj": 1.0, "model.layers.1.a.q_proj": 3.0, "model.layers.0.m.up_proj": 1.5}
    assert by_type(scores) == {"q_proj": 2.0, "up_proj": 1.5}
    t = {"q": 2.0, "k": 2.5, "v": 0.9, "o": 0.9, "down": 1.1}
    assert select(t, 3) == ["o", "v", "down"]  # lowest; the 0.9 tie breaks by name
    assert select(t, 2, rule="highest") == ["k", "q"]
    assert kendall_tau(t, t) == 1.0  # tau-b: the tie is in both, not a disagreement
    assert kendall_tau({"a": 1, "b": 2, "c": 3}, {"a": 3, "b": 2, "c": 1}) == -1.0
    assert kendall_tau({"a": 1, "b": 2, "c": 3}, {"a": 2, "b": 1, "c": 3}) == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="cannot choose"):
        select(t, 6)
    with pytest.raises(ValueError, match="same >= 2 keys"):
        kendall_tau({"a": 1, "b": 2}, {"a": 1, "c": 2})


# --- the task -----------------------------------------------------------------------------------


def test_tasks_split_by_group_and_encode_answer_targets(base):
    _, tok, world, _, _ = base
    for task in TASKS:
        tr, he = split(world, task, heldout_frac=0.25, seed=1)
        assert tr and he and not {e.prompt for e in tr} & {e.prompt for e in he}, task
    tr, he = split(world, "attr_query", heldout_frac=0.25, seed=1)
    entity = lambda e: e.prompt.split(" of ")[1].split(" ")[0]  # noqa: E731
    assert not {entity(e) for e in tr} & {entity(e) for e in he}  # held out by whole entities
    assert split(world, "mul_mod", heldout_frac=0.25, seed=1) == split(world, "mul_mod", heldout_frac=0.25, seed=1)
    assert split(world, "mul_mod", heldout_frac=0.25, seed=1) != split(world, "mul_mod", heldout_frac=0.25, seed=2)
    ids, mask, target = encode(tr[:3], tok)
    for i, e in enumerate(tr[:3]):
        n = int(mask[i].sum())
        assert tok.decode(ids[i, :n], skip_special_tokens=True) == f"{e.prompt} {e.answer}"
        assert target[i].nonzero().flatten().tolist() == [n - 1]  # one word-level answer token, last
    # answer_loss: the target token predicted from the position before it
    logits = torch.full((1, 3, 5), -10.0)
    logits[0, 1, 4] = 10.0  # position 1 predicts token 4 at position 2
    loss, exact = answer_loss(logits, torch.tensor([[0, 1, 4]]), torch.tensor([[False, False, True]]))
    assert float(loss) < 1e-6 and exact.tolist() == [True]
    loss, exact = answer_loss(logits, torch.tensor([[0, 1, 3]]), torch.tensor([[False, False, True]]))
    assert float(loss) > 10 and exact.tolist() == [False]


# --- the placement and equal parameter counts -------------------------------------------------


def test_reachable_and_match_by_hand():
    # costs 4 and 6 per rank, uniform ranks 2.5 and 1.67 for a target of 10 with no slack:
    # {8, 12} and {6, 12} meet at 12.
    m = match_ranks({"a": 4, "b": 6}, {"x": ["a"], "y": ["b"]}, 10, window=0)
    assert m.counts == {"x": 12, "y": 12} and m.ranks == {"x": {"a": 3}, "y": {"b": 2}} and m.exact
    # costs 4 and 7: {8, 12} and {7, 14} never meet: each takes its nearest, the gap is reported.
    m = match_ranks({"a": 4, "b": 7}, {"x": ["a"], "y": ["b"]}, 10, window=0)
    assert m.counts == {"x": 8, "y": 7} and not m.exact and m.max_rel_diff == pytest.approx(1 / 7)
    # Two types: the most uniform ranks reaching each count.
    assert reachable([2, 2], 8, window=1)[8] == (2, 2)


@pytest.mark.parametrize("plop_types", [("v_proj", "up_proj", "gate_proj"), ("v_proj", "o_proj", "down_proj"), ("k_proj",)])
def test_matched_placements_train_equal_parameter_counts_in_peft(plop_types):
    from transformers import AutoModelForCausalLM, LlamaConfig

    from components.basemodel import lora

    cfg = LlamaConfig(vocab_size=50, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    model = AutoModelForCausalLM.from_config(cfg)
    costs = type_costs(model)
    assert costs["k_proj"] == 2 * (64 + 32) and costs["down_proj"] == 2 * (176 + 64)
    assert block_types(model, "attention") == list(TYPES[:4]) and block_types(model, "mlp") == list(TYPES[4:])
    scores = {t: (0.5 if t in plop_types else 2.0) for t in TYPES}
    placements = {p: placement_types(p, model, scores, len(plop_types)) for p in ("plop", "attention", "mlp", "all")}
    assert set(placements["plop"]) == set(plop_types)
    assert placements["all"] == list(TYPES)  # every projection kind, whatever the scores
    target = 4 * sum(costs[t] for t in plop_types)
    if len(plop_types) == 1:
        # One PLoP type (cost 192 per rank) against all seven types at rank >= 1 (2336 at all ranks 1): no
        # common count in the window, each takes its nearest and the gap is reported (mlp's 2400 vs 2304,
        # 4.2%), which equal_trainable_params' 2% refuses. Without the all-modules arm the three match exactly.
        gap = match_ranks(costs, placements, target, window=3)
        assert gap.counts == {"plop": 2304, "attention": 2304, "mlp": 2400, "all": 2336}
        assert gap.max_rel_diff == pytest.approx(96 / 2304) and gap.max_rel_diff > PARAM_TOLERANCE
        del placements["all"]
    match = match_ranks(costs, placements, target, window=3)
    assert match.exact, match
    for p, ranks in match.ranks.items():
        assert sum(r * costs[t] for t, r in ranks.items()) == match.counts[p]
        fresh = AutoModelForCausalLM.from_config(cfg)
        peft_model = lora(fresh, list(ranks), r=max(ranks.values()), rank_pattern=dict(ranks))
        trainable = sum(x.numel() for x in peft_model.parameters() if x.requires_grad)
        assert trainable == match.counts[p], (p, ranks)
        # every type of the placement gets LoRA, and no other: all-modules touches all 7 kinds
        touched = {n.split(".lora_A")[0].rsplit(".", 1)[-1] for n, x in peft_model.named_parameters()
                   if x.requires_grad and ".lora_A" in n}
        assert touched == set(placements[p]), (p, touched)


# --- configs ------------------------------------------------------------------------------------


@pytest.mark.parametrize("change, message", [
    ({"task": "div_mod"}, "task must be one of"),
    ({"placement": "everywhere"}, "placement must be one of"),
    ({"placement": "plop_inverse"}, "is not in matched"),
    ({"matched": ("plop", "everywhere")}, "matched must list"),
    ({"nfn_samples": 60}, "use nfn_samples <= 45"),
    ({"n_types": 8}, "n_types=8 exceeds"),
    ({"n_types": 0}, "n_types must be positive"),
    ({"rank": 0}, "rank must be positive"),
    ({"rank_window": -1}, "rank_window"),
    ({"heldout_frac": 1.0}, "heldout_frac must lie"),
    ({"modulus": 101}, "modulus must lie"),
    ({"lr": 0.0}, "lr and alpha_over_rank must be positive"),
    ({"checkpoint_every_frac": 0.0}, "checkpoint_every_frac"),
    ({"base": "./no/such/folder"}, "does not exist"),
    ({"base": "tiny-local:widht=3"}, "not a tiny-local override"),
])
def test_bad_configs_name_the_problem(change, message):
    with pytest.raises(ValueError, match=message):
        validate(dataclasses.replace(Config(), **change))


def test_more_than_one_worker_is_refused():
    with pytest.raises(ConfigError, match="workers=1"):
        registry.load("plop").validate(Config(), world_size=2)


# --- the loop -----------------------------------------------------------------------------------


def short(**kw) -> Config:
    return dataclasses.replace(smoke(), **{**dict(steps=16, eval_every=8, log_every=4, checkpoint_every_frac=0.5), **kw})


def test_resumed_run_ends_where_an_uninterrupted_one_does(tmp_path, tiny_base):
    # The base given as a save_pretrained folder: the path a real checkpoint takes.
    cfg = short(base=str(tiny_base), placement="attention")
    whole = train(cfg, LocalRun(tmp_path / "whole"))

    with pytest.raises(KeyboardInterrupt):
        train(cfg, DiesAtSave(tmp_path / "cut"))
    resumed = LocalRun(tmp_path / "cut")
    again = train(cfg, resumed)
    assert resumed.restored_step == 8
    assert resumed.history[0][0] > 8
    for key in ("train/loss", "eval/loss", "eval/acc", "diag/trainable_params"):
        assert again[key] == pytest.approx(whole[key], rel=1e-6), key
    assert whole["diag/trainable_params"] == whole["diag/params/plop"] == whole["diag/params/mlp"]
    assert sum(whole[f"diag/chosen/{t}"] for t in TYPES) == 3
    assert whole["diag/rank/q_proj"] > 0 and whole["diag/rank/up_proj"] == 0  # attention-only


# --- claims -------------------------------------------------------------------------------------


def trial(placement, *, seed=0, task="mul_mod", acc=0.8, control=1.02, top=1.9, tau=1.0, same=1.0, params=100.0):
    a = {t: 1.0 + (top - 1.0) * i / 6 for i, t in enumerate(TYPES)}
    out = {"base": "tiny-local", "task": task, "seed": seed, "placement": placement,
           "eval/acc": acc, "eval/base_acc": 0.1, "diag/trainable_params": params,
           "diag/kendall_tau_ab": tau, "diag/same_choice_ab": same,
           **{f"diag/params/{p}": params for p in ("plop", "attention", "mlp", "all")}}
    out.update({f"diag/nfn_a/{t}": v for t, v in a.items()})
    out.update({f"diag/nfn_b/{t}": v for t, v in a.items()})
    out.update({f"diag/nfn_control/{t}": (control if i == 0 else 1.0) for i, t in enumerate(TYPES)})
    return out


def trials(**kw):
    accs = kw.pop("accs", {"plop": 0.8, "attention": 0.6, "mlp": 0.85, "all": 0.7})
    return [trial(p, acc=a, **kw) for p, a in accs.items()]


def test_claims_hold_on_the_papers_pattern():
    results = {c.__name__: c(trials()) for c in CLAIMS + CHECKS}
    assert all(holds for holds, _ in results.values()), results
    assert results["plop_at_least_best_usual_placement"][1]["worst_margin"] == pytest.approx(-0.05)
    assert CLAIMS[0] is plop_at_least_best_usual_placement  # the headline first
    assert results["scores_one_at_random_init"][1]["max_abs_dev"] == pytest.approx(0.02)
    assert {c.__name__ for c in CHECKS} == {"scores_one_at_random_init", "scores_same_in_every_trial_of_a_seed",
                                            "equal_trainable_params"}
    # Each declared effect agrees with its function, on a pattern that holds and on ones that fail.
    failing = [trials(top=1.2), trials(tau=0.6), trials(same=0.0),
               trials(accs={"plop": 0.4, "attention": 0.85, "mlp": 0.4, "all": 0.4})]
    for fn in CLAIMS:
        spec = spec_of(fn)
        assert spec is not None, fn.__name__
        for ts in [trials(), *failing]:
            holds, measured = fn(ts)
            assert spec.passes(measured[spec.effect]) == holds, (fn.__name__, measured)
        assert not all(fn(ts)[0] for ts in failing), fn.__name__


def test_claims_fail_when_the_pattern_is_absent():
    assert not scores_one_at_random_init(trials(control=1.2))[0]
    assert not scores_separate_when_pretrained(trials(top=1.2))[0]
    assert not scores_separate_when_pretrained(trials(control=1.35))[0]  # the control spreads too
    assert not choice_stable_across_samples(trials(tau=0.6))[0]
    assert not choice_stable_across_samples(trials(same=0.0))[0]
    assert not plop_at_least_best_usual_placement(trials(accs={"plop": 0.4, "attention": 0.85, "mlp": 0.4, "all": 0.4}))[0]
    # the all-modules arm alone beating PLoP by more than the margin fails it too
    assert not plop_at_least_best_usual_placement(trials(accs={"plop": 0.4, "attention": 0.3, "mlp": 0.4, "all": 0.9}))[0]
    # one task lost is enough: the worst task decides
    two = trials() + trials(task="attr_query", accs={"plop": 0.3, "attention": 0.9, "mlp": 0.3, "all": 0.3})
    holds, measured = plop_at_least_best_usual_placement(two)
    assert not holds and measured["worst_margin"] == pytest.approx(-0.6) and measured["attr_query/margin"] == pytest.approx(-0.6)
    assert measured["mean_margin"] == pytest.approx((-0.05 - 0.6) / 2)
    for extra, held in ((110.0, False), (101.0, True)):  # 10% apart fails, 1% (within PARAM_TOLERANCE) holds
        unequal = trials()
        unequal[2]["diag/trainable_params"] = extra
        for t in unequal:
            t["diag/params/mlp"] = extra
        holds, measured = equal_trainable_params(unequal)
        assert holds is held and measured["max_rel_diff"] == pytest.approx(extra / 100 - 1)
    drift = trials()
    drift[1]["diag/nfn_a/q_proj"] += 0.01  # a trial of the same seed scored differently
    assert choice_stable_across_samples(drift)[0] and not scores_same_in_every_trial_of_a_seed(drift)[0]


def test_claims_average_over_seeds_and_need_every_placement():
    ts = (trials(seed=0, accs={"plop": 0.6, "attention": 0.9, "mlp": 0.5, "all": 0.5})
          + trials(seed=1, accs={"plop": 1.0, "attention": 0.9, "mlp": 0.5, "all": 0.7}))
    _, measured = plop_at_least_best_usual_placement(ts)
    assert measured["mul_mod/plop"] == pytest.approx(0.8) and measured["worst_margin"] == pytest.approx(-0.1)
    for arm in ("mlp", "all"):
        with pytest.raises(ValueError, match="no trials with placement"):
            plop_at_least_best_usual_placement([t for t in ts if t["placement"] != arm])
    no_control = [{k: v for k, v in t.items() if "nfn_control" not in k} for t in ts]
    assert scores_one_at_random_init(no_control) == (None, {})


def test_plot_writes_a_png(tmp_path):
    path = tmp_path / "claims.png"
    plot(trials() + trials(task="attr_query"), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- the reproduction ---------------------------------------------------------------------------


def test_full_reproduction_runs_the_same_code_on_a_checkpoint_folder(monkeypatch, tiny_base):
    from orchestrator.reproduction.reproduce import load_repro
    from orchestrator.sweep import SweepError

    monkeypatch.setenv("PLOP_BASE", str(tiny_base))  # any save_pretrained folder
    sweep = load_repro("plop", smoke=False)
    assert sweep.base_config().base == str(tiny_base)
    assert sweep.trial_count() == 4 * 5 * 5  # tasks x placements (PLoP^-1 and all modules too) x seeds
    monkeypatch.setenv("PLOP_BASE", "/no/such/checkpoint")
    with pytest.raises(SweepError, match="does not exist"):
        load_repro("plop", smoke=False)


@pytest.mark.slow
def test_smoke_reproduction_holds(workdir, tiny_base, monkeypatch):
    from orchestrator.reproduction import reproduce as reproduction
    from orchestrator.sweep import grid

    built = reproduction.load_repro
    assert built("plop", smoke=True).trial_count() == 4 * 4  # every task x PLoP and the three usual placements

    def one_task(*args, **kwargs):
        sweep = built(*args, **kwargs)
        return dataclasses.replace(sweep, space={**sweep.space, "task": grid("mul_mod")})

    # One seed of the smoke on one of its tasks (its 16 trials take ~80 s; CI's budget for this file is ~20 s).
    monkeypatch.setattr(reproduction, "load_repro", one_task)
    rep = reproduction.reproduce("plop", smoke=True, local=True)
    assert not rep.failed_trials
    assert sorted(t["placement"] for t in rep.trials) == ["all", "attention", "mlp", "plop"]
    # margin over seeds 1-5 (measured): scores_one_at_random_init's max |score - 1| worst 0.043 (threshold 0.1);
    # scores_separate_when_pretrained's margin worst +0.512 (threshold 0); choice_stable_across_samples: the same
    # types chosen on both samples and Kendall tau 1.0 at every seed (threshold 0.8); the other two are exact.
    assert_claims_hold(rep, ["scores_one_at_random_init", "scores_separate_when_pretrained",
                             "choice_stable_across_samples", "scores_same_in_every_trial_of_a_seed",
                             "equal_trainable_params"])
    # The headline (plop_at_least_best_usual_placement) is judged and reported by `ladder reproduce`, not
    # asserted: one seed's 30 held-out pairs (0.033 each) decide a task, and the seed noise of a placement's
    # accuracy is 0.106 (docs/reproductions/plop.notes.md). What held at every seed measured: every placement
    # learnt the task and, on average, generalised past the base. Margins over seeds 0-4 and 100-104 (mul_mod):
    for t in rep.trials:
        # the base cannot already do the task: worst 0.133 (seeds 102, 103) (threshold 0.2)
        assert t["eval/base_acc"] < 0.2, t
        # every placement learnt it: worst 0.736 (seed 1; seeds 0-4, the smallest training accuracy of the four).
        # Threshold 0.25 (kept: half-way between the base's bound above and an earlier worst, 0.363)
        assert t["eval/train_acc"] > 0.25, t
    # the mean held-out accuracy of the four placements beats the base: worst +0.058 (seed 102: 0.192 against 0.133)
    # (threshold 0). Each placement alone no longer does at every seed: attention-only tied the base at seeds 4 and
    # 102 (0.100 and 0.133) once its rank was matched to the all-modules arm as well.
    accs = [t["eval/acc"] for t in rep.trials]
    assert sum(accs) / len(accs) > rep.trials[0]["eval/base_acc"], rep.trials
    claims = {c.name: c.measured for c in rep.outcomes}
    assert claims["equal_trainable_params"]["max_rel_diff"] == 0.0
    assert all(math.isfinite(v) for m in claims.values() for v in m.values())


# --- task files, a second architecture, the full-size sweep -----------------------------------


GPT2_KINDS = ["c_attn", "attn.c_proj", "c_fc", "mlp.c_proj"]


def mod_records(n: int = 13) -> list[dict]:
    """MetaMathQA-style records (query -> response): x * y mod n in words a BPE tokenizer learns."""
    return [{"query": f"what is {a} times {b} mod {n} ?", "response": str(a * b % n)} for a in range(n) for b in range(n)]


@pytest.fixture(scope="module")
def gpt2_task(tmp_path_factory):
    """A JSONL task file and a tiny GPT-2 folder (Conv1D projections) with a tokenizer trained on it."""
    from components.basemodel import write_jsonl
    from components.basemodel.toy import save_tiny_gpt2

    root = tmp_path_factory.mktemp("plop-gpt2")
    records = mod_records()
    write_jsonl(root / "task.jsonl", records)
    save_tiny_gpt2(root / "gpt2", [f"{r['query']} {r['response']}" for r in records], seed=7)
    return root


def gpt2_config(root, **kw) -> Config:
    return dataclasses.replace(smoke(), **{**dict(
        base=str(root / "gpt2"), task_path=str(root / "task.jsonl"), prompt_field="query", answer_field="response",
        dtype="auto", nfn_samples=16, n_types=2, lr=1e-2, steps=30, eval_every=15, log_every=5,
        checkpoint_every_frac=1.0), **kw})


def test_gpt2_folder_and_jsonl_task_run_the_full_size_code(gpt2_task, workdir, model_copies):
    from orchestrator.runners import launch
    from workloads.plop import preflight

    trials = []
    for placement in ("plop", "attention", "mlp", "all"):
        cfg = gpt2_config(gpt2_task, placement=placement, matched=("plop", "attention", "mlp", "all"))
        preflight(cfg)
        result = launch.run_local("plop", cfg, progress=False, track=False)
        assert model_copies.peak == 2  # the base and the random-init control, never a third
        m = result.metrics
        assert [k.split("/")[-1] for k in m if k.startswith("diag/nfn_a/")] == GPT2_KINDS  # c_proj twice, told apart
        # A random-init GPT-2 whose frozen tied head keeps logits small: the loss falls only a little
        # (held-out 5.65 -> 5.51 at seed 0), but below the first steps' and the base's. margin over seeds 1-5 and
        # the three placements: last/first train loss worst 0.990 (threshold: below 1); base minus held-out loss
        # worst 0.122 (threshold 0).
        first = next(h["train/loss"] for _, h in result.history if "train/loss" in h)
        if placement != "all":  # the margins were measured on these three (the all-modules arm: its placement only)
            assert m["train/loss"] < first and m["eval/loss"] < m["eval/base_loss"], (first, m)
        ranked = {k.split("/")[-1] for k, v in m.items() if k.startswith("diag/rank/") and v > 0}
        assert ranked == {"attention": {"c_attn", "attn.c_proj"}, "mlp": {"c_fc", "mlp.c_proj"},
                          "all": set(GPT2_KINDS)}.get(
            placement, {k.split("/")[-1] for k, v in m.items() if k.startswith("diag/chosen/") and v})
        trials.append({**dataclasses.asdict(cfg), **m})
    results = {c.__name__: c(trials) for c in CLAIMS + CHECKS}
    assert results["equal_trainable_params"][0] and results["scores_same_in_every_trial_of_a_seed"][0], results
    for holds, measured in results.values():
        assert holds in (True, False) and measured and all(math.isfinite(v) for v in measured.values())
    assert "task.jsonl/plop" in results["plop_at_least_best_usual_placement"][1]  # grouped by the task file


def test_a_saved_dataset_task_on_tiny_local_reproduces_the_built_in_task(tmp_path, tiny_base):
    import datasets

    cfg = short(steps=8, eval_every=8, log_every=4, checkpoint_every_frac=1.0, placement="mlp")
    world = base_world_of(cfg)
    train_set, held_set = split(world, cfg.task, heldout_frac=cfg.heldout_frac, seed=cfg.seed, modulus=cfg.modulus)
    datasets.DatasetDict({
        name: datasets.Dataset.from_list([{"question": e.prompt, "label": e.answer} for e in rows])
        for name, rows in (("train", train_set), ("test", held_set))}).save_to_disk(str(tmp_path / "mul_mod"))
    from_file = dataclasses.replace(cfg, task_path=str(tmp_path / "mul_mod"), eval_path=str(tmp_path / "mul_mod"),
                                    prompt_field="question", answer_field="label")
    registry.load("plop").preflight(from_file)
    built_in = train(cfg, LocalRun(tmp_path / "built-in"))
    filed = train(from_file, LocalRun(tmp_path / "file"))
    assert filed == built_in  # the same records: bit for bit the same scores, placement and training
    # margin: base held-out loss minus train loss worst 1.55 over seeds 1-5 (threshold 0)
    assert filed["train/loss"] < filed["eval/base_loss"] and filed["diag/trainable_params"] > 0


def base_world_of(cfg: Config):
    from components.basemodel import base_world

    return base_world(cfg.base, seed=cfg.base_seed)


def test_preflight_refuses_missing_fields_and_kinds_the_model_lacks(gpt2_task, tmp_path):
    from components.basemodel import write_jsonl

    plop = registry.load("plop")
    write_jsonl(tmp_path / "bad.jsonl", [{"query": "what is 1 times 2 ?", "response": "2"}, {"query": "what is 3 ?"}])
    with pytest.raises(ConfigError, match=r"bad.jsonl' line 2 has no 'response' field"):
        plop.preflight(gpt2_config(gpt2_task, task_path=str(tmp_path / "bad.jsonl")))
    with pytest.raises(ConfigError, match=r"no 'answer' field"):
        plop.preflight(gpt2_config(gpt2_task, answer_field="answer"))
    with pytest.raises(ConfigError, match=r"mlp_kinds=\['down_proj'\] names \['down_proj'\], not projection kinds of base "
                                          r".*its kinds are \['c_attn', 'attn.c_proj', 'c_fc', 'mlp.c_proj'\]"):
        plop.preflight(gpt2_config(gpt2_task, mlp_kinds=("down_proj",)))
    with pytest.raises(ConfigError, match=r"n_types=5 exceeds the 4 projection kinds"):
        plop.preflight(gpt2_config(gpt2_task, n_types=5))
    with pytest.raises(ConfigError, match=r"attention_kinds=\['c_attn'\] names \['c_attn'\].*'q_proj'"):
        plop.preflight(dataclasses.replace(Config(), attention_kinds=("c_attn",)))
    plop.preflight(gpt2_config(gpt2_task, mlp_kinds=("c_fc",), attention_kinds=("c_attn",)))  # kinds it has
    # OPT's fc1/fc2 sit in the layer itself, in no module named like an MLP: the arm must name them.
    from transformers import OPTConfig

    OPTConfig(vocab_size=50, hidden_size=16, ffn_dim=32, num_hidden_layers=1, num_attention_heads=2,
              word_embed_proj_dim=16).save_pretrained(tmp_path / "opt")
    with pytest.raises(ConfigError, match=r"base '.*opt': no linear projection .* placement 'mlp' needs one: .*mlp_kinds"):
        plop.preflight(dataclasses.replace(Config(), base=str(tmp_path / "opt")))
    plop.preflight(dataclasses.replace(Config(), base=str(tmp_path / "opt"), mlp_kinds=("fc1", "fc2")))
    with pytest.raises(ValueError, match="eval_path=.* set task_path too"):
        validate(dataclasses.replace(Config(), eval_path="x.jsonl"))
    with pytest.raises(ValueError, match="dtype='bf16' is not a dtype"):
        validate(dataclasses.replace(Config(), dtype="bf16"))


def test_the_real_sweep_is_valid_anywhere_and_names_what_it_needs(workdir, monkeypatch):
    from conftest import REPO
    from orchestrator.sweep import load_sweep_file
    from orchestrator.sweeps.tune_run import launch_problems

    monkeypatch.setenv("LADDER_DATA", str(workdir / "data"))
    monkeypatch.delenv("LADDER_LLMS", raising=False)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(workdir / "empty-cache"))
    sweep = load_sweep_file(REPO / "sweeps" / "repro" / "plop_real.py")
    sweep.check()
    assert sweep.trial_count() == 3 * 5 * 3  # (task, paper model) pairs x arms (all modules too) x seeds
    assert sweep.base_config().dtype == "bfloat16" and sweep.gpus_per_worker == 1
    (problem,) = [p for p in launch_problems(sweep) if "base=" in p]
    assert "base='Qwen/Qwen3-1.7B' is neither a folder" in problem and "hf download Qwen/Qwen3-1.7B" in problem
    assert f"task_path='{workdir / 'data' / 'metamathqa'}' does not exist" in problem
    assert "fields query (string), response (string)" in problem
