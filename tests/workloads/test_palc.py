"""palc: the preference pairs, the calibrator and its loss, KV-cached decoding against transformers'
own, the base-model hash, bad configs, the claims on made-up trials, and the smoke reproduction."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from conftest import assert_claims_hold
from orchestrator import registry
from orchestrator.basemodel import base_world, load_base
from orchestrator.claims import spec_of
from orchestrator.config import ConfigError
from workloads.palc import CHECKS, CLAIMS, plot, smoke, validate
from workloads.palc.claims import (
    base_untouched, gamma_zero_is_base, latency_within_budget, preference_accuracy_rises, share_rises_with_gamma,
)
from workloads.palc.data import (
    BLUNT, GENTLE, encode, generation_prompts, gentle_share, make_pairs, pair_batch, split_entities,
)
from workloads.palc.model import (
    Calibrator, base_forward, generate, group_by_length, latency, margins, mean_logprob, param_digest, preference_loss,
)
from workloads.palc.workload import gamma_key


@pytest.fixture(scope="module")
def base(ladder_cache):
    torch.manual_seed(0)
    model, tok = load_base("tiny-local")
    for p in model.parameters():
        p.requires_grad_(False)
    return model, tok


@pytest.fixture(scope="module")
def world():
    return base_world("tiny-local")


# --- data --------------------------------------------------------------------------------------


def test_pairs_match_in_length_and_structure_and_differ_only_in_trait_slots(base, world):
    _, tok = base
    pairs = make_pairs(world, list(world.entities), 300, "t", context_prob=0.5)
    assert any(p.prompt.count(".") for p in pairs) and any(not p.prompt.count(".") for p in pairs)
    for p in pairs:
        c, r = p.chosen.split(), p.rejected.split()
        assert len(c) == len(r) and len(encode(tok, p.prompt, p.chosen)[0]) == len(encode(tok, p.prompt, p.rejected)[0])
        differ = [(a, b) for a, b in zip(c, r) if a != b]
        assert differ and all(a in GENTLE and b in BLUNT for a, b in differ)
        assert all(a == b for a, b in zip(c, r) if a not in GENTLE)


def test_entity_split_is_disjoint_and_seeded(world):
    train, held = split_entities(world, 12, seed=3)
    assert len(held) == 12 and not set(train) & set(held) and len(train) + 12 == len(world.entities)
    assert split_entities(world, 12, seed=3) == (train, held)
    assert split_entities(world, 12, seed=4)[1] != held
    prompts = generation_prompts(held)
    assert all(any(e in p.split() for e in held) for p in prompts)
    assert make_pairs(world, held, 5, "x", 0.0) == make_pairs(world, held, 5, "x", 0.0)


def test_pair_batch_marks_exactly_the_positions_that_predict_response_tokens(base, world):
    _, tok = base
    pairs = make_pairs(world, list(world.entities), 4, "m", context_prob=0.0)
    b = pair_batch(tok, pairs)
    assert b["ids"].shape[0] == 8
    for row, (p, resp) in enumerate([(p, p.chosen) for p in pairs] + [(p, p.rejected) for p in pairs]):
        ids, start = encode(tok, p.prompt, resp)
        predicted = b["ids"][row, 1:][b["resp"][row, :-1]].tolist()
        assert predicted == ids[start:] and tok.decode(predicted) == resp
        assert int(b["attn"][row].sum()) == len(ids)


def test_gentle_share_counts_words_up_to_the_first_full_stop():
    assert gentle_share(["kind and rude . gentle gentle"]) == pytest.approx(1 / 4)
    assert gentle_share(["warm calm", "cold"]) == pytest.approx(2 / 3)
    assert gentle_share([""]) == 0.0


# --- the calibrator and the loss ---------------------------------------------------------------


@pytest.mark.parametrize("relu", [True, False])
def test_calibrator_has_b_times_h_plus_v_parameters_and_the_relu_flag_acts(relu):
    cal = Calibrator(64, 579, 16, relu=relu, dropout=0.0)
    assert sum(p.numel() for p in cal.parameters()) == 16 * (64 + 579)
    h = torch.randn(3, 64)
    z = h @ cal.down.weight.T
    expected = (torch.relu(z) if relu else z) @ cal.up.weight.T
    torch.testing.assert_close(cal(h), expected)


def test_mean_logprob_by_hand_and_loss_at_equal_margins():
    # Vocabulary of 2; row [0, 1, 1], response = the last two tokens, uniform logits: log(1/2) each.
    ids = torch.tensor([[0, 1, 1]])
    resp = torch.tensor([[True, True, False]])
    logits = torch.zeros(1, 3, 2)
    torch.testing.assert_close(mean_logprob(logits, ids, resp), torch.tensor([math.log(0.5)]))
    logits[0, 1, 1] = math.log(3.0)  # second response token now has probability 3/4
    torch.testing.assert_close(mean_logprob(logits, ids, resp), torch.tensor([(math.log(0.5) + math.log(0.75)) / 2]))
    lp = torch.tensor([-1.0, -1.0])
    torch.testing.assert_close(preference_loss(lp), torch.tensor(math.log(2.0)))
    assert preference_loss(torch.tensor([-0.5, -3.0])) < preference_loss(torch.tensor([-3.0, -0.5]))


def test_gradient_reaches_the_calibrator_only_and_gamma_zero_is_the_base(base, world):
    model, tok = base
    cal = Calibrator(64, model.config.vocab_size, 8, dropout=0.0)
    b = pair_batch(tok, make_pairs(world, list(world.entities), 6, "g", 0.5))
    logits, h = base_forward(model, b["ids"], b["attn"])
    assert not logits.requires_grad and not h.requires_grad
    preference_loss(mean_logprob(logits + cal(h), b["ids"], b["resp"])).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in cal.parameters())
    assert all(p.grad is None for p in model.parameters())
    plain = model(input_ids=b["ids"], attention_mask=b["attn"]).logits
    assert torch.equal(logits + 0.0 * cal(h).detach(), plain)
    m = margins(model, cal, b, [0.0, 1.0])
    lp = mean_logprob(plain, b["ids"], b["resp"])
    torch.testing.assert_close(m[0.0], lp[:6] - lp[6:])


def test_param_digest_sees_a_single_changed_weight(base):
    model, _ = base
    before = param_digest(model)
    assert param_digest(model) == before
    w = model.get_output_embeddings().weight
    old = w[3, 5].item()
    with torch.no_grad():
        w[3, 5] = old + 1e-6
    try:
        assert param_digest(model) != before
    finally:
        with torch.no_grad():
            w[3, 5] = old
    assert param_digest(model) == before


# --- decoding and latency ----------------------------------------------------------------------


def test_cached_greedy_decoding_matches_transformers_generate(base, world):
    model, tok = base
    groups = group_by_length(tok, generation_prompts(list(world.entities[:4])))
    assert all(len({len(r) for r in g.tolist()}) == 1 for g in groups)
    ids = groups[0]
    ours = generate(model, None, ids, 6)
    ref = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False,
                         eos_token_id=None, pad_token_id=tok.pad_token_id)[:, ids.shape[1]:]
    assert torch.equal(ours, ref)
    cal = Calibrator(64, model.config.vocab_size, 8, dropout=0.0).eval()
    assert torch.equal(generate(model, cal, ids, 6, gamma=0.0), ours)
    with torch.no_grad():
        cal.up.weight.zero_()
        cal.up.weight[tok.convert_tokens_to_ids("kind")] = 50.0  # ReLU(z) >= 0 and some z > 0: "kind" wins
    steered = generate(model, cal, ids, 3, gamma=1.0)
    assert (steered == tok.convert_tokens_to_ids("kind")).float().mean() > 0.5
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert torch.equal(generate(model, cal, ids, 4, 0.5, generator=g1), generate(model, cal, ids, 4, 0.5, generator=g2))


def test_latency_is_measured_for_both_arms(base, world):
    model, tok = base
    cal = Calibrator(64, model.config.vocab_size, 8).eval()
    ids = group_by_length(tok, generation_prompts(list(world.entities[:4])))[0]
    lat = latency(model, cal, ids, new_tokens=2, reps=3, gamma=1.0, clock="cpu")
    # the mechanics only: the ratio's size is a timing (a shared machine's load moved it past 5x
    # once in 3 repetitions of 2 tokens); the reproduction judges it with 21 paired repetitions
    assert lat["base_s"] > 0 and lat["palc_s"] > 0 and math.isfinite(lat["ratio"]) and lat["ratio"] > 0


# --- config checks -----------------------------------------------------------------------------


@pytest.mark.parametrize("change, message", [
    ({"bottleneck": 0}, "bottleneck must be positive"),
    ({"gammas": (0.5, 1.0)}, "must contain 0"),
    ({"gammas": (0.0, 2.0, 1.0)}, "strictly increasing"),
    ({"gamma_eval": 3.0}, "gamma_eval=3.0"),
    ({"heldout_entities": 48}, "use at most 40"),
    ({"dropout": 1.0}, "dropout"),
    ({"latency_clock": "gpu"}, "latency_clock"),
    ({"base": "./no/such/folder"}, "does not exist"),
    ({"base": "tiny-local:nope=1"}, "not a tiny-local override"),
])
def test_bad_configs_name_the_problem(change, message):
    with pytest.raises(ValueError, match=message):
        validate(dataclasses.replace(smoke(), **change))


def test_more_than_one_worker_is_refused():
    with pytest.raises(ConfigError, match="workers=1"):
        registry.load("palc").validate(smoke(), world_size=2)


# --- claims ------------------------------------------------------------------------------------


def trial(**kw) -> dict:
    t = {"seed": 0, "eval/pref_acc_base": 0.52, "eval/pref_acc": 0.97, "eval/gamma0_max_abs_logit_diff": 0.0,
         "perf/latency_ratio": 1.05, "perf/base_s_per_token": 0.002, "eval/base_unchanged": 1.0,
         "eval/base_trainable_params": 0.0, "eval/base_grads": 0.0, "eval/trainable_params": 10288.0,
         "eval/expected_params": 10288.0}
    for g, acc, s in zip((-1.0, 0.0, 0.5, 1.0, 2.0), (0.01, 0.52, 0.9, 0.97, 0.99), (0.0, 0.15, 0.3, 0.5, 1.0)):
        t[f"eval/pref_acc/{gamma_key(g)}"] = acc
        t[f"eval/share_greedy/{gamma_key(g)}"] = s
        t[f"eval/share_sampled/{gamma_key(g)}"] = s
    t.update(kw)
    return t


def test_claims_hold_on_the_papers_pattern():
    assert [c([trial()])[0] for c in CLAIMS + CHECKS] == [True] * len(CLAIMS + CHECKS)
    assert {c.__name__ for c in CHECKS} == {"gamma_zero_is_base", "base_untouched"}
    # Each declared effect agrees with its function, on a pattern that holds and on one that fails.
    flat = {f"eval/share_{k}/{gamma_key(g)}": 0.3 for k in ("greedy", "sampled") for g in (-1.0, 0.0, 0.5, 1.0, 2.0)}
    failing = trial(**{"eval/pref_acc": 0.85, "perf/latency_ratio": 1.31, **flat})
    for fn in CLAIMS:
        spec = spec_of(fn)
        assert spec is not None, fn.__name__
        for t, expected in ((trial(), True), (failing, False)):
            holds, measured = fn([t])
            assert holds is expected and spec.passes(measured[spec.effect]) == holds, (fn.__name__, measured)


@pytest.mark.parametrize("claim, change", [
    (preference_accuracy_rises, {"eval/pref_acc": 0.85}),
    (preference_accuracy_rises, {"eval/pref_acc_base": 0.8}),
    (share_rises_with_gamma, {"eval/share_greedy/gamma_1": 0.2}),
    (share_rises_with_gamma, {"eval/share_sampled/gamma_2": 0.45}),
    (gamma_zero_is_base, {"eval/gamma0_max_abs_logit_diff": 1e-3}),
    (latency_within_budget, {"perf/latency_ratio": 1.31}),
    (base_untouched, {"eval/base_unchanged": 0.0}),
    (base_untouched, {"eval/trainable_params": 10289.0}),
    (base_untouched, {"eval/base_grads": 1.0}),
])
def test_each_claim_fails_when_its_property_is_broken_in_one_seed(claim, change):
    holds, measured = claim([trial(), trial(seed=1, **change)])
    assert holds is False and measured
    spec = spec_of(claim)
    assert spec is None or not spec.passes(measured[spec.effect])


def test_flat_shares_do_not_count_as_rising():
    flat = {f"eval/share_{k}/{gamma_key(g)}": 0.3 for k in ("greedy", "sampled") for g in (-1.0, 0.0, 0.5, 1.0, 2.0)}
    assert share_rises_with_gamma([trial(**flat)])[0] is False


def test_plot_writes_a_png(tmp_path):
    path = tmp_path / "palc.png"
    plot([trial(), trial(seed=1)], path)
    assert path.stat().st_size > 1000


# --- the smoke reproduction --------------------------------------------------------------------


@pytest.mark.slow
def test_smoke_reproduction_holds(workdir):
    from orchestrator.reproduce import reproduce

    rep = reproduce("palc", smoke=True, local=True)
    assert not rep.failed_trials and len(rep.trials) == 1
    assert_claims_hold(rep, ["preference_accuracy_rises", "gamma_zero_is_base", "base_untouched"])
    # Judged and reported by `ladder reproduce`, not asserted here: the latency budget (a timing)
    # and share_rises_with_gamma, which asks the share never to fall over the whole grid. Greedy
    # decoding at gamma 2, past the calibrated range, decides that one on this single seed by the
    # processor: 0.46 at gamma 1 and 0.25 at gamma 2 with ATen's AVX2 kernels, 0.50 and 1.00 with
    # its portable ones. What held at every seed and kernel path measured (seeds 0, 100, 101): the
    # share rises from gamma -1 to 0 to 1, greedy and sampled.
    t = rep.trials[0]
    assert t["eval/pref_acc"] >= 0.9 and 0.35 <= t["eval/pref_acc_base"] <= 0.65
    for kind in ("greedy", "sampled"):
        share = [t[f"eval/share_{kind}/gamma_{g}"] for g in ("-1", "0", "1")]
        assert share[0] < share[1] < share[2], (kind, share)
    assert math.isfinite(t["perf/latency_ratio"]) and t["perf/palc_s_per_token"] > 0
    assert t["eval/trainable_params"] == 16 * (64 + 579)
