"""palc: the preference pairs, the calibrator and its loss, KV-cached decoding against transformers'
own, the base-model hash, bad configs, the claims on made-up trials, and the smoke reproduction."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from conftest import assert_claims_hold, shifted
from orchestrator.runners import registry
from components.basemodel import base_world, load_base
from orchestrator.claims import spec_of
from orchestrator.runners.config import ConfigError
from workloads.palc import CHECKS, CLAIMS, plot, smoke, validate
from workloads.palc.baselines import (
    RewardHead, args_decode, best_of_n, fit_reward, pooled_features, reward_accuracy, score_samples,
    until_stop,
)
from workloads.palc.claims import (
    TEST_TIME_BASELINES, palc_beats_best_test_time_baseline, palc_faster_than_test_time_baselines, base_untouched, gamma_zero_is_base, latency_within_budget, preference_accuracy_rises, share_rises_with_gamma,
)
from workloads.palc.data import (
    BLUNT, GENTLE, encode, generation_prompts, gentle_share, make_pairs, pair_batch, split_entities,
)
from workloads.palc.model import (
    Calibrator, arm_latency, base_forward, generate, group_by_length, latency, margins, mean_logprob, param_digest,
    preference_loss,
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


# --- the test-time baselines ------------------------------------------------------------------


@pytest.fixture(scope="module")
def reward(base, world):
    model, tok = base
    train_ents, held_ents = split_entities(world, 12, 0)
    pairs = make_pairs(world, train_ents, 300, "rm-test", 0.5)
    feats = pooled_features(model, tok, pairs, 0, torch.device("cpu"))
    return fit_reward(feats, 200, 0.05, 0.01, 0), feats, held_ents


def test_reward_head_ranks_the_pairs_it_was_fit_on_above_chance(reward):
    head, feats, _ = reward
    assert sum(p.numel() for p in head.parameters()) == 64 + 1
    acc, margin = reward_accuracy(head, feats)
    assert acc > 0.9 and margin > 0  # chance is 0.5; an unfitted (zero) head ties every pair
    assert reward_accuracy(RewardHead(64), feats)[0] == 0.0


def test_pooled_features_read_the_response_positions_only(base, world):
    model, tok = base
    pairs = make_pairs(world, list(world.entities[:2]), 3, "pool", 0.5)  # rows of different lengths, padded
    mean = pooled_features(model, tok, pairs, 0, torch.device("cpu"), pool="mean")
    last = pooled_features(model, tok, pairs, 0, torch.device("cpu"))
    for i, pair in enumerate(pairs):
        for j, resp in enumerate((pair.chosen, pair.rejected)):
            ids, start = encode(tok, pair.prompt, resp)
            with torch.no_grad():
                h = model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0].float()
            assert torch.allclose(mean[j, i], h[start:].mean(0), atol=1e-4)
            assert torch.allclose(last[j, i], h[-1], atol=1e-4)


def test_until_stop_keeps_the_first_stop_and_nothing_after():
    t = torch.tensor([[5, 7, 9, 7, 1], [1, 2, 3, 4, 5]])
    assert until_stop(t, 7).tolist() == [[True, True, False, False, False], [True] * 5]
    assert until_stop(t, None).all()


def test_best_of_n_keeps_the_argmax_reward_sample(base, reward):
    model, tok = base
    head, _, held_ents = reward
    ids = group_by_length(tok, generation_prompts(held_ents))[0]
    stop = tok(".", add_special_tokens=False).input_ids[0]
    chosen, samples, rewards = best_of_n(model, head, ids, 6, 5, torch.Generator().manual_seed(1), stop)
    assert samples.shape == (ids.shape[0], 6, 5) and rewards.shape == (ids.shape[0], 6)
    for i in range(ids.shape[0]):
        assert torch.equal(chosen[i], samples[i, int(rewards[i].argmax())])
    # the same samples as the base's own sampling with that stream, and a different head picks differently
    rows = ids.repeat_interleave(6, 0)
    again = generate(model, None, rows, 5, generator=torch.Generator().manual_seed(1)).view(ids.shape[0], 6, 5)
    assert torch.equal(again, samples)
    # the kept sample's reward is the head on that sample alone
    i = 0
    alone = score_samples(model, head, ids[i:i + 1], chosen[i:i + 1], stop)
    assert torch.allclose(alone, rewards[i].max().unsqueeze(0), atol=1e-4)


def test_args_with_zero_weight_is_greedy_decoding_of_the_base(base, reward):
    model, tok = base
    head, _, held_ents = reward
    for ids in group_by_length(tok, generation_prompts(held_ents))[:2]:
        for pool in ("last", "mean"):
            assert torch.equal(args_decode(model, head, ids, 6, k=5, w=0.0, pool=pool), generate(model, None, ids, 6))


def test_args_follows_the_reward_when_it_dominates(base, reward):
    model, tok = base
    _, _, held_ents = reward
    ids = group_by_length(tok, generation_prompts(held_ents))[0]
    greedy = generate(model, None, ids, 1)
    # a reward that is the negated base logit of the greedy token at step one: w large makes ARGS avoid it
    head = RewardHead(64)
    with torch.no_grad():
        head.lin.weight[0] = -model.get_output_embeddings().weight[greedy[0, 0]].float()
    first = args_decode(model, head, ids, 1, k=5, w=100.0)
    assert (first != greedy).float().mean() > 0.5


def test_dpo_head_trains_on_the_pairs_and_leaves_the_base_alone(base, world):
    from workloads.palc.workload import train_dpo_head

    model, tok = base
    train_ents, _ = split_entities(world, 12, 0)
    pairs = make_pairs(world, train_ents, 200, "dpo-head", 0.5)
    digest = param_digest(model)
    cfg = dataclasses.replace(smoke(), steps=40, warmup_steps=4)
    head = train_dpo_head(cfg, model, tok, pairs, torch.device("cpu"))
    assert not head.training and param_digest(model) == digest
    batch = pair_batch(tok, pairs[:64])
    # chance is 0.5: the trained head prefers the chosen responses it was trained on
    assert (margins(model, head, batch, [1.0])[1.0] > 0).float().mean() > 0.7


def test_arm_latency_measures_every_arm_against_the_base():
    lat = arm_latency({"base": lambda: sum(range(1000)), "slow": lambda: sum(range(20000))}, 2, 3,
                      torch.device("cpu"), "cpu")
    assert lat["base_s"] > 0 and lat["slow_s"] > 0 and math.isfinite(lat["slow_ratio"]) and "base_ratio" not in lat


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
    ({"method": "ppo"}, "method='ppo'"),
    ({"dtype": "int8"}, "dtype='int8'"),
    ({"eval_path": "held.jsonl"}, "eval_path=.held.jsonl. is set without task_path"),
    ({"dpo_targets": " , "}, "dpo_targets name at least one kind"),
    ({"bon_n": 0}, "bon_n, args_k"),
    ({"rm_pool": "max"}, "rm_pool='max'"),
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
         "eval/expected_params": 10288.0, "eval/share_bon": 0.3, "eval/share_args": 0.4,
         "perf/palc_latency_ratio_rot": 1.05, "perf/bon_latency_ratio_rot": 8.0, "perf/args_latency_ratio_rot": 3.0}
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
    failing = trial(**{"eval/pref_acc": 0.85, "perf/latency_ratio": 1.31, "eval/share_args": 0.6,
                       "perf/args_latency_ratio_rot": 1.0, **flat})
    for fn in CLAIMS:
        spec = spec_of(fn)
        assert spec is not None, fn.__name__
        for t, expected in ((trial(), True), (failing, False)):
            holds, measured = fn([t])
            assert holds is expected and spec.passes(measured[spec.effect]) == holds, (fn.__name__, measured)


@pytest.mark.parametrize("claim, change", [
    (palc_beats_best_test_time_baseline, {"eval/share_bon": 0.9}),
    (palc_beats_best_test_time_baseline, {"eval/share_args": 0.9}),
    (palc_faster_than_test_time_baselines, {"perf/bon_latency_ratio_rot": 1.0}),
    (palc_faster_than_test_time_baselines, {"perf/args_latency_ratio_rot": 1.0}),
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


def test_headline_takes_the_best_baseline_per_replicate_and_a_tie_does_not_hold():
    holds, m = palc_beats_best_test_time_baseline([trial(**{"eval/share_bon": 0.45, "eval/share_args": 0.2})])
    assert holds and m["best_baseline"] == TEST_TIME_BASELINES.index("bon")
    assert m["share_margin_vs_best"] == pytest.approx(0.05) and m["share_margin_vs_args"] == pytest.approx(0.3)
    assert palc_beats_best_test_time_baseline([trial(**{"eval/share_args": 0.5})])[0] is False
    # mean over the replicate's trials: 0.5 - mean(0.4, 0.7) < 0
    assert palc_beats_best_test_time_baseline([trial(), trial(seed=1, **{"eval/share_args": 0.7})])[0] is False
    no_baselines = {k: v for k, v in trial().items() if k != "eval/share_bon"}
    with pytest.raises(ValueError, match="baselines"):
        palc_beats_best_test_time_baseline([no_baselines])


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
    from orchestrator.reproduction.reproduce import reproduce

    rep = reproduce("palc", smoke=True, local=True)
    assert not rep.failed_trials and len(rep.trials) == 1
    # preference_accuracy_rises: margin (threshold 0) worst 0.01 over seeds 1-5 (0.09 0.095 0.01 0.085
    # 0.0525: the base's 0.36 at seed 3 against the band's 0.35); the two checks hold by construction
    # (gamma 0's logits equal the base's, difference 0; the base's hash unchanged) at seeds 1-5
    assert_claims_hold(rep, ["preference_accuracy_rises", "gamma_zero_is_base", "base_untouched"])
    # Judged and reported by `ladder reproduce`, not asserted here: the latency budget (a timing)
    # and share_rises_with_gamma, which asks the share never to fall over the whole grid. Greedy
    # decoding at gamma 2, past the calibrated range, decides that one on this single seed by the
    # processor: 0.46 at gamma 1 and 0.25 at gamma 2 with ATen's AVX2 kernels, 0.50 and 1.00 with
    # its portable ones. What held at every seed and kernel path measured (seeds 0, 100, 101): the
    # share rises from gamma -1 to 0 to 1, greedy and sampled.
    t = rep.trials[0]
    # margin: PALC's accuracy worst 0.99 over seeds 1-5 (threshold 0.9); the base's lies in
    # 0.36-0.495 over seeds 1-5 (band 0.35-0.65: 0.01 from its lower end at seed 3)
    assert t["eval/pref_acc"] >= 0.9 and 0.35 <= t["eval/pref_acc_base"] <= 0.65
    for kind in ("greedy", "sampled"):
        share = [t[f"eval/share_{kind}/gamma_{g}"] for g in ("-1", "0", "1")]
        # margin: the smallest step up, greedy and sampled, worst 0.086 over seeds 1-5 (greedy -1 -> 0
        # at seed 4; threshold 0.02)
        assert min(share[1] - share[0], share[2] - share[1]) > 0.02, (kind, share)
    assert math.isfinite(t["perf/latency_ratio"]) and t["perf/palc_s_per_token"] > 0
    assert t["eval/trainable_params"] == 16 * (64 + 579)
    # The test-time baselines ran on the same prompts. The reward head ranks its training pairs above
    # chance (0.5): 0.967-0.977 over seeds 100-104 and 200. The headline's gap, PALC's share minus the
    # best baseline's: 0.16-0.32 over seeds 100-104 and 200 (threshold 0).
    assert t["eval/rm_train_acc"] > 0.5 and t["eval/rm_heldout_acc"] > 0.5
    assert all(0.0 <= t[f"eval/share_{b}"] <= 1.0 for b in ("bon", "args", "bon_samples"))
    assert t["eval/share_greedy/gamma_1"] > max(t["eval/share_bon"], t["eval/share_args"])
    assert all(math.isfinite(t[f"perf/{a}_latency_ratio_rot"]) for a in ("palc", "bon", "args"))


# --- preference files, a second architecture, the DPO baseline ---------------------------------


def test_hh_dialogues_split_at_the_last_assistant_turn_and_message_lists_give_their_last_content():
    from workloads.palc.data import pairs_from_records

    hh = {"chosen": "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: and?\n\nAssistant: kind words",
          "rejected": "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: and?\n\nAssistant: rude words"}
    other = {"chosen": "\n\nHuman: a\n\nAssistant: b", "rejected": "\n\nHuman: c\n\nAssistant: b"}
    pairs, skipped = pairs_from_records([hh, other], prompt_field="", chosen_field="chosen", rejected_field="rejected",
                                        what="t")
    assert skipped == 1 and len(pairs) == 1
    assert pairs[0].prompt == "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: and?\n\nAssistant:"
    assert (pairs[0].chosen, pairs[0].rejected) == (" kind words", " rude words")
    with pytest.raises(ValueError, match="'rejected' has no"):
        pairs_from_records([{"chosen": hh["chosen"], "rejected": "no turns"}], prompt_field="", chosen_field="chosen",
                           rejected_field="rejected", what="t")
    uf = {"prompt": "q?", "chosen": [{"role": "user", "content": "q?"}, {"role": "assistant", "content": "good"}],
          "rejected": [{"role": "user", "content": "q?"}, {"role": "assistant", "content": "bad"}]}
    (p,), _ = pairs_from_records([uf], prompt_field="prompt", chosen_field="chosen", rejected_field="rejected", what="t")
    assert (p.prompt, p.chosen, p.rejected) == ("q?", "good", "bad")


def test_long_pairs_are_cut_to_max_len_keeping_the_prompts_end_the_same_for_both(base):
    from workloads.palc.data import Pair, encode_pair

    _, tok = base
    pair = Pair(" ".join(["ada is kind ."] * 6), "kind and warm and calm .", "rude .")
    (c, cs), (r, rs) = encode_pair(tok, pair, max_len=12)
    full_c, full_start = encode(tok, pair.prompt, pair.chosen)
    assert len(c) == 12 and cs == rs and c[:cs] == r[:rs] == full_c[:full_start][-cs:]
    assert c[cs:] == full_c[full_start:][: 12 - cs] and r[rs:] == encode(tok, pair.prompt, pair.rejected)[0][full_start:]
    assert encode_pair(tok, pair)[0] == (full_c, full_start)  # no limit: untouched


def test_dpo_loss_by_hand():
    from workloads.palc.model import dpo_loss

    pol, ref = torch.tensor([-1.0, -3.0]), torch.tensor([-2.0, -2.0])  # chosen gains 1, rejected loses 1
    torch.testing.assert_close(dpo_loss(pol, ref, 0.5), -torch.nn.functional.logsigmoid(torch.tensor(1.0)))
    torch.testing.assert_close(dpo_loss(ref, ref, 0.1), torch.tensor(math.log(2.0)))


def _world_records(world, n: int, tag: str) -> list[dict]:
    return [dataclasses.asdict(p) for p in make_pairs(world, list(world.entities), n, tag, context_prob=0.3)]


@pytest.fixture(scope="module")
def gpt2_files(world, tmp_path_factory):
    """A tiny GPT-2 folder and a JSONL preference file (prompt, chosen, rejected) from the world's pairs."""
    from components.basemodel import write_jsonl
    from components.basemodel.toy import save_tiny_gpt2

    root = tmp_path_factory.mktemp("palc-gpt2")
    records = _world_records(world, 600, "gpt2")
    texts = [f"{r['prompt']} {r['chosen']}" for r in records] + [f"{r['prompt']} {r['rejected']}" for r in records]
    folder = save_tiny_gpt2(root / "gpt2", texts, vocab_size=300, positions=64, seed=shifted(0))  # the base's init: moved with the test's seed
    return folder, write_jsonl(root / "pairs.jsonl", records)


def _file_cfg(folder, task, **kw):
    return dataclasses.replace(smoke(), base=str(folder), task_path=str(task), heldout_pairs=100, max_len=48, batch=16,
                               micro_batch=8, log_every=5, checkpoint_every=1000, latency_reps=3, **kw)


def _losses(result) -> list[float]:
    return [m["train/loss"] for _, m in result.history if "train/loss" in m]


def test_palc_and_dpo_on_a_tiny_gpt2_and_a_jsonl_file_through_the_real_sweeps_path(gpt2_files, workdir, model_copies):
    from orchestrator.runners import launch

    folder, task = gpt2_files
    w = registry.load("palc")
    out = {}
    for method, extra in (("palc", {"steps": 30, "lr": 3e-3}), ("dpo", {"steps": 20, "lr": 3e-3, "dpo_beta": 0.5})):
        cfg = _file_cfg(folder, task, method=method, **extra)
        w.validate(cfg)
        w.preflight(cfg)
        res = launch.run_local("palc", cfg, progress=False, track=False)
        losses, m = _losses(res), res.metrics
        # margin: the loss falls by at least 0.260 (palc) and 0.370 (dpo) over seeds 1-5 (threshold 0.1)
        assert losses[-1] < losses[0] - 0.1, (method, losses)
        assert m["eval/train_pairs"] == 500 and m["eval/heldout_pairs"] == 100
        # margin: held-out accuracy gains at least 0.37 over the base (1.0 against 0.27-0.63; the base is
        # the random-init GPT-2, its init moved with the seed) over seeds 1-5, palc and dpo (threshold 0.1);
        # reward margin at least 6.50 (palc) and 2.26 (dpo) over seeds 1-5 (threshold 0.5)
        assert m["eval/pref_acc"] - m["eval/pref_acc_base"] > 0.1 and m["eval/reward_margin"] > 0.5, (method, m)
        out[method] = m
    trial_ = {"seed": 0, **out["palc"]}
    assert [c([trial_])[0] for c in CHECKS] == [True, True]  # gamma 0 is the base, the base untouched, B(H + V) trained
    for claim_ in (preference_accuracy_rises, latency_within_budget):  # judged, not asserted: a random-init base
        assert claim_([trial_])[1]
    with pytest.raises(ValueError, match="no eval/share"):  # the gentle-word share is the synthetic world's measure
        share_rises_with_gamma([trial_])
    assert base_untouched([{"seed": 0, **out["dpo"]}])[0]  # the LoRA count as built, the base's weights unchanged
    assert out["dpo"]["eval/trainable_params"] == 8 * (2 * (32 + 96) + 2 * (32 + 32) + 2 * (32 + 128) + 2 * (128 + 32))
    assert model_copies.peak <= 2


def test_tiny_local_on_a_saved_hh_style_dataset_splits_the_prompt_off(world, workdir, model_copies):
    import datasets

    from orchestrator.runners import launch

    def hh(records):
        return [{"chosen": f"\n\nHuman: {r['prompt']}\n\nAssistant: {r['chosen']}",
                 "rejected": f"\n\nHuman: {r['prompt']}\n\nAssistant: {r['rejected']}"} for r in records]

    folder = workdir / "hh"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(hh(_world_records(world, 400, "hh-train"))),
                          "test": datasets.Dataset.from_list(hh(_world_records(world, 80, "hh-test")))}).save_to_disk(folder)
    cfg = dataclasses.replace(smoke(), task_path=str(folder), eval_path=str(folder), prompt_field="", steps=40,
                              log_every=5, checkpoint_every=1000, latency_reps=3)
    registry.load("palc").preflight(cfg)
    res = launch.run_local("palc", cfg, progress=False, track=False)
    losses, m = _losses(res), res.metrics
    assert losses[-1] < losses[0] - 0.1, losses  # margin: the loss falls by at least 0.507 over seeds 1-5 (threshold 0.1)
    assert m["eval/train_pairs"] == 400 and m["eval/heldout_pairs"] == 80 and m["eval/skipped_records"] == 0
    # margin: held-out accuracy gains at least 0.5375 over the base (0.875-0.9625 against 0.3375) over
    # seeds 1-5 (threshold 0.1); gamma 0 is the base: a check that holds by construction (logits equal)
    assert m["eval/pref_acc"] - m["eval/pref_acc_base"] > 0.1 and gamma_zero_is_base([{"seed": 0, **m}])[0]
    assert preference_accuracy_rises([{"seed": 0, **m}])[1]
    assert model_copies.peak <= 2


def test_a_missing_field_or_a_target_the_model_lacks_is_refused_before_any_work(gpt2_files, workdir):
    from components.basemodel import write_jsonl

    folder, task = gpt2_files
    w = registry.load("palc")
    bad = write_jsonl(workdir / "bad.jsonl", [{"prompt": "a", "chosen": "b", "rejected": "c"}, {"prompt": "a", "chosen": "b"}])
    with pytest.raises(ConfigError, match=r"line 2 has no 'rejected' field"):
        w.preflight(_file_cfg(folder, bad))
    with pytest.raises(ConfigError, match=r"line 1 has no 'question' field"):
        w.preflight(_file_cfg(folder, task, prompt_field="question"))
    with pytest.raises(ConfigError, match=r"dpo_targets \['q_proj'\] are not linear projection kinds .*'c_attn'"):
        w.preflight(_file_cfg(folder, task, method="dpo", dpo_targets="q_proj,c_attn"))
    w.preflight(_file_cfg(folder, task, method="dpo", dpo_targets="c_attn,mlp.c_proj"))


def test_the_real_sweep_is_valid_anywhere_and_names_what_it_needs(workdir, monkeypatch):
    from conftest import REPO
    from orchestrator.sweep import load_sweep_file
    from orchestrator.sweeps.tune_run import launch_problems

    monkeypatch.setenv("LADDER_DATA", str(workdir / "data"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(workdir / "empty-cache"))
    sweep = load_sweep_file(REPO / "sweeps" / "repro" / "palc_real.py")
    sweep.check()
    assert {p["method"] for p in sweep.points} == {"palc", "dpo"} and sweep.overrides["dtype"] == "bfloat16"
    (problem,) = [p for p in launch_problems(sweep) if "task_path" in p]
    assert "base='argsearch/llama-7b-sft-float32' is neither a folder" in problem
    assert f"task_path='{workdir / 'data' / 'hh-rlhf'}' does not exist" in problem  # the first config refused
    assert {p["task_path"] for p in sweep.points} == {str(workdir / "data" / n) for n in ("hh-rlhf", "ultrafeedback_binarized")}
