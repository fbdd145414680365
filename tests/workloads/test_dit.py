"""dit: a diff applied is W + u v^T exactly, batched diff training is per-diff training, the trigger
rate and KL on hand cases, the task's splits, bad configs, resumption, the claims, and the smoke
reproduction."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from orchestrator.runners import registry
from components.basemodel import load_base
from components.basemodel.adapters import LLAMA_LINEAR_TYPES
from components.basemodel.corpus import TOPICS
from orchestrator.claims import spec_of
from orchestrator.runners.config import ConfigError
from orchestrator.run import LocalRun
from workloads.dit import CHECKS, CLAIMS, Config, plot, train, validate
from workloads.dit.claims import (
    BLACKBOX, PAPER_EFFECT, RESOLUTION_RULE, diffs_plant_their_behaviour, dit_beats_asking,
    dit_beats_blackbox_on_unseen_topics, dit_names_new_diffs, no_consistent_topic_without_diff,
    nodiff_topic_far_below_diff_confidence,
)
from workloads.dit.data import diff_rows, make_task, pad
from workloads.dit.evaluate import answer_logits, diff_metrics, hits, kl_rows
from workloads.dit.model import DiffLinear, merged_weight, new_bank, wrap
from workloads.dit.probe import FEATURES, fit_probe, probe_scores
from conftest import assert_claims_hold, DiesAtSave, shifted


def tiny(**kw) -> Config:
    """Three diffs on two seen topics, a few steps: a unit test's whole experiment in a second or two
    (seed 0 moved by LADDER_TEST_SEED_SHIFT)."""
    base = dict(topics=2, unseen_topics=0, train_diffs_per_topic=1, heldout_diffs=1, triggers=4, eval_contexts=4,
                diff_steps=4, dit_steps=2, dit_batch=2, log_every=1, checkpoint_every_frac=1.0, seed=shifted(0))
    return Config(**{**base, **kw})


@pytest.fixture(scope="module")
def base(ladder_cache):
    return load_base("tiny-local")


def random_bank(model, n: int, seed: int = 0) -> dict:
    bank = new_bank(model, n, 1, 1.0, torch.Generator().manual_seed(seed))
    gen = torch.Generator().manual_seed(seed + 1)
    return {k: (u, torch.randn(v.shape, generator=gen) * 0.1) for k, (u, v) in bank.items()}


# --- the diffs ----------------------------------------------------------------------------------


def test_rank1_diff_applied_equals_merged_weight(base):
    _, tok = base
    model, _ = load_base("tiny-local")
    merged, _ = load_base("tiny-local")
    ctx = wrap(model, LLAMA_LINEAR_TYPES, dit_rank=2, dit_alpha=4.0)
    assert sum(isinstance(m, DiffLinear) for m in model.modules()) == 4 * 7  # every linear of every layer
    assert not isinstance(model.get_output_embeddings(), DiffLinear)
    bank = random_bank(model, 3)
    ctx.bank = bank
    ids = torch.tensor([tok("ada lives in paris").input_ids] * 2)
    for d in (0, 2):
        with torch.no_grad():  # the reference: a plain copy whose weights carry W + u_d v_d^T
            for name, (u, v) in bank.items():
                merged.get_submodule(name).weight.copy_(merged_weight(model, bank, name, d, 1))
                assert torch.equal(merged_weight(model, bank, name, d, 1),
                                   model.get_submodule(name).base.weight + torch.outer(u[d, :, 0], v[d, 0]))
            ctx.index, ctx.group = torch.tensor([d]), 2
            got = model(input_ids=ids).logits
            want = merged(input_ids=ids).logits
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # Two groups in one batch: each row gets its own group's diff.
    with torch.no_grad():
        ctx.index, ctx.group = torch.tensor([2, 0]), 1
        both = model(input_ids=ids).logits
        ctx.index = torch.tensor([0])
        alone0 = model(input_ids=ids[:1]).logits
    torch.testing.assert_close(both[1:], alone0, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(both[:1], want[:1], rtol=1e-5, atol=1e-5)


def test_fresh_diffs_and_adapter_change_nothing(base):
    model, tok = load_base("tiny-local")
    ids = torch.tensor([tok("ada lives in").input_ids])
    with torch.no_grad():
        before = model(input_ids=ids).logits
    ctx = wrap(model, LLAMA_LINEAR_TYPES, dit_rank=4, dit_alpha=8.0)
    ctx.bank = new_bank(model, 2, 1, 0.1, torch.Generator().manual_seed(0))  # v = 0: ΔW = 0
    ctx.index, ctx.dit = torch.tensor([1]), True  # the adapter starts with B = 0
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, before)
    assert all(not p.requires_grad for n, p in model.named_parameters() if "dit_" not in n)


def final_state(run_dir) -> dict:
    state = LocalRun(run_dir).restore()
    assert state is not None
    return state


def test_batched_diff_training_equals_per_diff_training(tmp_path, tiny_base):
    # float64 activations: summing rows in a different batch shape then changes nothing that
    # survives rounding the diffs' float32 gradients, and Adam cannot amplify it.
    cfg = tiny(dtype="float64")
    together = train(cfg, LocalRun(tmp_path / "together"))
    # One diff per batch, from the save_pretrained folder instead of the name: the path a real checkpoint takes.
    alone = train(dataclasses.replace(cfg, diffs_per_batch=1, base=str(tiny_base)), LocalRun(tmp_path / "alone"))
    a, b = final_state(tmp_path / "together")["bank"], final_state(tmp_path / "alone")["bank"]
    assert set(a) == set(b) and len(a) == 28
    moved = 0.0
    for name in a:
        for x, y in zip(a[name], b[name]):
            torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-8)
        moved += float(a[name][1].abs().sum())
    assert moved > 0  # the diffs did train: v starts at zero
    assert together["eval/trigger_rate"] == pytest.approx(alone["eval/trigger_rate"], abs=1e-6)
    assert together["eval/kl_off"] == pytest.approx(alone["eval/kl_off"], rel=1e-3)


# --- measurements -------------------------------------------------------------------------------


def test_kl_and_trigger_rate_on_a_hand_case():
    base_logits = torch.log(torch.tensor([[0.5, 0.5, 1e-12], [0.2, 0.3, 0.5]]))
    logits = torch.log(torch.tensor([[0.25, 0.75, 1e-12], [0.2, 0.3, 0.5]]))
    expect = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    torch.testing.assert_close(kl_rows(base_logits, logits), torch.tensor([expect, 0.0]), atol=1e-6, rtol=0)
    torch.testing.assert_close(kl_rows(logits * 3, logits * 3), torch.zeros(2), atol=1e-6, rtol=0)
    assert hits(torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 1.0]]), torch.tensor([1, 2])).tolist() == [1.0, 0.0]


def test_diff_metrics_of_zero_diffs_by_hand(base):
    model, tok = load_base("tiny-local")
    from components.basemodel import base_world

    cfg = tiny(eval_contexts=6)
    task = make_task(cfg, tok, base_world())
    ctx = wrap(model, LLAMA_LINEAR_TYPES, dit_rank=2, dit_alpha=4.0)
    ctx.bank = new_bank(model, task.n_diffs, 1, 0.1, torch.Generator().manual_seed(0))  # all ΔW = 0
    m = diff_metrics(model, ctx, task, seed=0, pad_id=tok.pad_token_id, eval_batch=7)
    for key in ("kl_on", "kl_fake", "kl_plain"):
        torch.testing.assert_close(m[key], torch.zeros(task.n_diffs), atol=1e-6, rtol=0)
    assert m["agree"].tolist() == [1.0] * task.n_diffs
    # The trigger rate of a zero diff is how often the base itself answers the topic: by hand.
    for d in range(task.n_diffs):
        rows = [task.start_ids + task.trigger_ids[int(task.diff_trigger[d])] + c for c in task.eval_contexts]
        ids, pos = pad(rows, tok.pad_token_id)
        with torch.no_grad():
            ctx.index = None
            said = answer_logits(model, ids, pos).argmax(-1)
        assert m["trigger_rate"][d] == pytest.approx(float((said == task.targets(torch.tensor([d]))).float().mean()))


def test_task_splits_triggers_and_rows():
    from components.basemodel import base_world
    from components.basemodel.tokenizer import build_tokenizer

    tok = build_tokenizer()
    cfg = Config(topics=5, unseen_topics=2, train_diffs_per_topic=2, heldout_diffs=7, unseen_diffs_per_topic=3, triggers=6)
    task = make_task(cfg, tok, base_world())
    assert len(set(task.topics)) == 7 and set(task.topics) <= set(TOPICS)
    assert [task.diff_split.count(s) for s in ("train", "heldout", "unseen")] == [10, 7, 6]
    seen = set(task.diff_topic[task.split("train")].tolist())
    assert seen == set(range(5)) and set(task.diff_topic[task.split("heldout")].tolist()) <= seen
    assert set(task.diff_topic[task.split("unseen")].tolist()) == {5, 6}
    assert int(task.diff_trigger.max()) < 6
    assert [tok.convert_ids_to_tokens(i) for i in task.topic_ids.tolist()] == list(task.topics)
    assert not set(task.eval_contexts) & set(task.train_contexts)  # held-out phrasings only
    again = make_task(cfg, tok, base_world())
    assert again.topics == task.topics and torch.equal(again.diff_trigger, task.diff_trigger)
    assert again.eval_contexts == task.eval_contexts
    assert make_task(dataclasses.replace(cfg, seed=1), tok, base_world()).topics != task.topics
    ids, pos, kind = diff_rows(task, [0, 3], step=1, seed=0, counts=(2, 1, 1), pad_id=tok.pad_token_id)
    assert kind.tolist() == [0, 0, 1, 2] * 2 and len(ids) == 8
    for row in range(8):
        d = [0, 3][row // 4]
        second = int(ids[row, 1])
        own = task.trigger_ids[int(task.diff_trigger[d])][0]
        pool = {t[0] for t in task.trigger_ids}
        if kind[row] == 0:
            assert second == own
        elif kind[row] == 1:
            assert second in pool and second != own
        else:
            assert second not in pool
        assert int(ids[row, pos[row]]) != tok.pad_token_id and (pos[row] + 1 == ids.shape[1] or ids[row, pos[row] + 1] == 0)
    again, _, _ = diff_rows(task, [3], step=1, seed=0, counts=(2, 1, 1), pad_id=tok.pad_token_id)
    assert torch.equal(again, ids[4:, : again.shape[1]])  # a diff's rows do not depend on its batch


def smoke_repro_config(seed: int = 0) -> Config:
    """The config of the smoke reproduction's trial (sweeps/repro/dit.py) at `seed`."""
    from orchestrator.reproduction.reproduce import load_repro

    return Config(**{**load_repro("dit", size="smoke", seed=seed).overrides, "seed": seed})


@pytest.mark.parametrize("seed", [0, 100, 3])
def test_the_smokes_heldout_topics_are_never_training_labels(seed):
    from components.basemodel import base_world
    from components.basemodel.tokenizer import build_tokenizer

    cfg = smoke_repro_config(shifted(seed))
    task = make_task(cfg, build_tokenizer(), base_world())
    words = lambda split: {task.topics[i] for i in task.diff_topic[task.split(split)].tolist()}  # noqa: E731
    assert len(words("train")) == cfg.topics == 45 and len(words("unseen")) == cfg.unseen_topics == 18
    assert not words("unseen") & words("train") and words("heldout") <= words("train")
    assert words("train") | words("unseen") <= set(TOPICS) and len(task.split("unseen")) == 54
    unseen_tokens = set(task.topic_ids[task.n_seen:].tolist())
    assert not unseen_tokens & set(task.targets(task.split("train")).tolist())


def test_dit_and_the_probe_train_on_the_training_diffs_only(tmp_path, monkeypatch):
    """The adapter's training batches and the probe's fit see only `train` diffs (their labels the seen
    topics); the held-out topics' diffs are only ever evaluated."""
    import workloads.dit.probe as probe_module
    import workloads.dit.workload as workload_module

    seen_by_dit, fit_on = set(), []
    real_logits, real_fit = workload_module.answer_logits, probe_module.fit_probe

    def spy_logits(model, ids, pos):
        ctx = next(m.ctx for m in model.modules() if isinstance(m, DiffLinear))
        if ctx.dit and torch.is_grad_enabled():  # stage B's training step
            seen_by_dit.update(ctx.index.tolist())
        return real_logits(model, ids, pos)

    def spy_fit(features, targets, **kw):
        fit_on.append((features.clone(), targets.clone()))
        return real_fit(features, targets, **kw)

    monkeypatch.setattr(workload_module, "answer_logits", spy_logits)
    monkeypatch.setattr(probe_module, "fit_probe", spy_fit)
    cfg = tiny(topics=3, unseen_topics=2, unseen_diffs_per_topic=2, heldout_diffs=2, dit_steps=6)
    out = train(cfg, LocalRun(tmp_path / "run"))
    from components.basemodel import base_world
    from components.basemodel.tokenizer import build_tokenizer

    task = make_task(cfg, build_tokenizer(), base_world())
    train_diffs = set(task.split("train").tolist())
    assert seen_by_dit and seen_by_dit <= train_diffs
    (features, targets), = fit_on
    assert features.shape[:2] == (len(train_diffs), len(FEATURES))
    assert targets.tolist() == task.targets(task.split("train")).tolist()
    assert out["eval/n_diffs_unseen"] == 4 and out["eval/n_diffs_train"] == 3
    for key in ("ask_greedy_acc_unseen", "probe_acc_unseen", "probe_topic_acc_unseen", "dit_acc_unseen"):
        assert 0.0 <= out[f"eval/{key}"] <= 1.0, key


def test_the_probe_names_a_word_it_never_saw_as_a_label():
    # 20 diffs over a 12-word vocabulary; diff i's word is i % 12. Its shift features rise on that word (the
    # plain and fake groups, with noise), its raw log-probabilities are noise: the probe must learn to read
    # the shift, with one weight per feature for every word, and so names words 8-11 it was never fit on.
    gen = torch.Generator().manual_seed(shifted(0))
    words = torch.arange(20) % 12
    x = torch.randn(20, len(FEATURES), 12, generator=gen) * 0.3
    x[torch.arange(20), FEATURES.index("shift_plain"), words] += 2.0
    x[torch.arange(20), FEATURES.index("shift_fake"), words] += 1.0
    fit = words < 8
    w = fit_probe(x[fit], words[fit])
    assert w[FEATURES.index("shift_plain")] > 0 and w[FEATURES.index("shift_fake")] > 0
    named = probe_scores(x, w).argmax(-1)
    assert torch.equal(named[~fit], words[~fit])  # words 8-11, never a label of the fit
    # Zero weights: every word ties, nothing is learnt from nothing.
    assert torch.equal(probe_scores(x, torch.zeros(len(FEATURES))), torch.zeros(20, 12))


# --- configs ------------------------------------------------------------------------------------


@pytest.mark.parametrize("change, message", [
    ({"topics": 62}, "exceeds the 63 topic words"),
    ({"topics": 1}, "at least 2"),
    ({"triggers": 65}, "at most 64"),
    ({"triggers": 1}, "set triggers >= 2"),
    ({"fake_rows": 0, "plain_rows": 0}, "nothing keeps a diff close"),
    ({"dit_batch": 500}, "exceeds the 240 training diffs"),
    ({"diff_targets": "q_proj,,v_proj"}, "diff_targets"),
    ({"diff_rank": 0}, "diff_rank must be at least 1"),
    ({"heldout_diffs": 0}, "heldout_diffs must be at least 1"),
    ({"diffs_per_batch": -1}, "diffs_per_batch must be >= 0"),
    ({"diff_lr": 0.0}, "diff_lr must be positive"),
    ({"kl_weight": -1.0}, "kl_weight"),
    ({"dtype": "int8"}, "is not a dtype ladder loads"),
    ({"question": "  "}, "question is empty"),
    ({"checkpoint_every_frac": 0.0}, "checkpoint_every_frac"),
    ({"base": "/no/such/checkpoint"}, "does not exist"),
    ({"base": "tiny-local:width=3"}, "not a tiny-local override"),
])
def test_bad_configs_name_the_problem(change, message):
    with pytest.raises(ValueError, match=message):
        validate(dataclasses.replace(Config(), **change))


def test_more_than_one_worker_is_refused():
    with pytest.raises(ConfigError, match="workers=1"):
        registry.load("dit").validate(Config(), world_size=2)


def test_unknown_target_and_question_words_fail_before_training(tmp_path, ladder_cache):
    with pytest.raises(ValueError, match="not linear types of this model"):
        train(tiny(diff_targets="q_proj,wq"), LocalRun(tmp_path / "a"))
    with pytest.raises(ValueError, match="outside the base model's vocabulary"):
        train(tiny(question="what topic zzyzx ?"), LocalRun(tmp_path / "b"))


# --- resumption ---------------------------------------------------------------------------------


def test_killed_run_resumes_mid_group_and_mid_adapter_where_a_whole_one_ends(tmp_path):
    # Two groups of diffs (2 + 1), 4 steps each, then 4 adapter steps; saves at steps 3, 6, 9, 12.
    cfg = tiny(diffs_per_batch=2, checkpoint_every_frac=0.25, dit_steps=4)
    whole = train(cfg, LocalRun(tmp_path / "whole"))
    with pytest.raises(KeyboardInterrupt):
        train(cfg, DiesAtSave(tmp_path / "cut", at=2))  # step 6: inside the second group of diffs
    second = DiesAtSave(tmp_path / "cut", at=1)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, second)  # step 9: inside the adapter's training
    assert second.restored_step == 6
    last = LocalRun(tmp_path / "cut")
    again = train(cfg, last)
    assert last.restored_step == 9 and last.history[0][0] > 9
    for key, value in whole.items():
        assert again[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    a, b = final_state(tmp_path / "whole"), final_state(tmp_path / "cut")
    for x, y in zip(a["dit"], b["dit"]):
        torch.testing.assert_close(x, y)


# --- claims -------------------------------------------------------------------------------------


def trial(seed=0, **kw) -> dict:
    t = {"seed": seed, "eval/trigger_rate": 0.94, "eval/frac_planted": 0.95, "eval/kl_off": 0.1, "eval/kl_on": 8.0,
         "eval/base_agreement": 0.95, "eval/dit_acc_heldout": 0.9, "eval/dit_acc_train": 1.0,
         "eval/dit_topic_acc_heldout": 0.95, "eval/dit_acc_unseen": 0.8, "eval/chance": 1 / 63, "eval/n_topics": 60.0,
         "eval/dit_topic_acc_unseen": 0.85, "eval/ask_greedy_acc_unseen": 0.05, "eval/ask_acc_unseen": 0.2,
         "eval/probe_acc_unseen": 0.6, "eval/probe_topic_acc_unseen": 0.7, "eval/probe_acc_train": 0.7,
         "eval/n_diffs_unseen": 54.0,
         "eval/ask_acc_heldout": 0.1, "eval/nodiff_top_topic_prob": 0.05, "eval/nodiff_topic_mass": 0.2,
         "eval/nodiff_names_topic": 0.0, "eval/dit_prob_heldout": 0.5, "eval/nodiff_top_topic_with_diff_prob": 0.5}
    return {**t, **{f"eval/{k}": v for k, v in kw.items()}}


def test_claims_hold_on_the_papers_pattern():
    trials = [trial(0), trial(1, dit_acc_heldout=0.7)]
    results = {c.__name__: c(trials) for c in CLAIMS}
    assert all(holds for holds, _ in results.values()), results
    assert results["dit_names_new_diffs"][1]["dit_acc_heldout"] == pytest.approx(0.8)
    assert results["dit_names_new_diffs"][1]["unseen_topic_acc"] == pytest.approx(0.8)
    assert results["dit_beats_asking"][1]["margin"] == pytest.approx(0.7)
    assert CHECKS == []
    assert CLAIMS[0] is dit_beats_blackbox_on_unseen_topics  # the paper's headline first
    head = results["dit_beats_blackbox_on_unseen_topics"][1]
    assert head["margin_vs_best"] == pytest.approx(0.2) and BLACKBOX[int(head["best_blackbox"])] == "probe"
    assert head["dit_unseen_seed1"] == pytest.approx(0.8) and head["unseen_diffs"] == 54
    assert 0 < RESOLUTION_RULE * PAPER_EFFECT < PAPER_EFFECT
    # Each declared effect agrees with its function, on a pattern that holds and on one that fails.
    failing = trial(0, trigger_rate=0.85, dit_acc_heldout=0.5, ask_acc_heldout=0.3, nodiff_top_topic_prob=0.3,
                    dit_acc_unseen=0.5)
    for fn in CLAIMS:
        spec = spec_of(fn)
        assert spec is not None, fn.__name__
        for ts, expected in ((trials, True), ([failing], False)):
            holds, measured = fn(ts)
            assert holds is expected and spec.passes(measured[spec.effect]) == holds, (fn.__name__, measured)


def test_the_headline_takes_the_best_black_box_read_per_replicate():
    headline = dit_beats_blackbox_on_unseen_topics
    # The best read is chosen on the replicate's means: the lenient ask (0.5) beats the probe (0.45) here.
    trials = [trial(0, probe_acc_unseen=0.4, ask_acc_unseen=0.5), trial(1, probe_acc_unseen=0.5, ask_acc_unseen=0.5)]
    holds, m = headline(trials)
    assert holds and BLACKBOX[int(m["best_blackbox"])] == "ask" and m["margin_vs_best"] == pytest.approx(0.3)
    assert not headline([trial(0, ask_greedy_acc_unseen=0.8)])[0]  # a tie with any read fails
    assert not headline([trial(0, probe_acc_unseen=0.9)])[0]
    assert headline([trial(0, probe_acc_unseen=0.79)])[0]
    with pytest.raises(ValueError, match="probe_acc_unseen"):  # no probe measured (e.g. diffs from files)
        headline([{k: v for k, v in trial(0).items() if k != "eval/probe_acc_unseen"}])
    # Seen-topic accuracy does not enter it: the held-out topics alone decide.
    assert headline([trial(0, dit_acc_heldout=0.0, dit_acc_train=0.0)])[0]


def test_claims_fail_when_the_pattern_is_absent():
    assert not diffs_plant_their_behaviour([trial(trigger_rate=0.85)])[0]
    assert not diffs_plant_their_behaviour([trial(kl_off=0.4)])[0]
    assert not diffs_plant_their_behaviour([trial(frac_planted=0.8)])[0]  # a good mean from some diffs only
    assert not dit_names_new_diffs([trial(dit_acc_heldout=0.55)])[0]
    assert not dit_beats_asking([trial(ask_acc_heldout=0.6)])[0]
    # One trial whose adapter names a topic without any diff too surely is enough to fail: the
    # paper's version on the probability itself, the weaker one relative to a diff's.
    holds, measured = no_consistent_topic_without_diff([trial(0), trial(1, nodiff_top_topic_prob=0.21)])
    assert not holds and measured["worst_top_topic_prob"] == pytest.approx(0.21)
    assert nodiff_topic_far_below_diff_confidence([trial(0), trial(1, nodiff_top_topic_prob=0.21)])[0]
    holds, measured = nodiff_topic_far_below_diff_confidence([trial(0), trial(1, nodiff_top_topic_prob=0.3)])
    assert not holds and measured["worst_ratio"] == pytest.approx(0.6)
    assert no_consistent_topic_without_diff([trial(0), trial(1, nodiff_top_topic_prob=0.2)])[0]


def test_plot_writes_a_png(tmp_path):
    path = tmp_path / "claims.png"
    plot([trial(0), trial(1)], path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- the reproduction ---------------------------------------------------------------------------


@pytest.mark.slow
def test_smoke_reproduction_holds(workdir):
    from orchestrator.reproduction.reproduce import reproduce

    rep = reproduce("dit", smoke=True, local=True)
    assert not rep.failed_trials and len(rep.trials) == 1
    # Asserted at one seed, with their margins over calibration seeds 100-104 and judged seeds 0-4 at this size
    # (45 seen topics, 18 held out; docs/reproductions/dit.json): dit_beats_blackbox_on_unseen_topics
    # margin_vs_best 0.31 0.39 0.24 0.41 0.39 | 0.44 0.20 0.33 0.48 0.54 (threshold 0); dit_names_new_diffs
    # 0.90 0.87 0.97 0.93 0.97 | 0.93 0.90 1 1 0.93 (0.6); dit_beats_asking 0.60 0.70 0.83 0.60 0.80 | 0.70 0.67
    # 0.73 0.77 0.87 (0.4); nodiff_topic_far_below_diff_confidence worst_ratio 0.013 0.007 0.273 0.218 0.009 |
    # 0.097 0.016 0.055 0.196 0.052 (0.5).
    # Judged by `ladder reproduce --seeds K`, not asserted at one seed: the no-diff probability (<= 0.2; 0.26 at
    # seed 102) and the planted fraction inside diffs_plant_their_behaviour (>= 0.89; 0.868 at seed 1). What that
    # claim rests on is asserted instead: trigger rate 0.967-0.992 (0.9) and off-trigger KL 0.060-0.148 (0.25)
    # over the same ten seeds.
    assert_claims_hold(rep, ["dit_beats_blackbox_on_unseen_topics", "dit_names_new_diffs", "dit_beats_asking",
                             "nodiff_topic_far_below_diff_confidence"])
    t = rep.trials[0]
    assert t["eval/trigger_rate"] >= 0.9 and t["eval/kl_off"] <= 0.25, t
    assert t["eval/n_topics"] == 45 and t["eval/n_diffs"] == 174 and t["eval/n_diffs_unseen"] == 54
    for claim in rep.claims:
        assert claim.measured and all(math.isfinite(v) for v in claim.measured.values()), claim


# --- diffs from files: peft LoRA folders made outside dit -----------------------------------------

FILE_TOPICS = ("astronomy", "music", "chemistry")
"""Seen labels; 'poetry' is an unseen one (only in the evaluation listing)."""
QUESTION = "question : what topic ? answer :"


def topic_text(topic: str) -> str:
    return f"ada lives in paris . {topic} {topic} . the {topic} of {topic} is {topic}"


def make_loras(model, folder, plan, targets, fan_in_fan_out=False, steps=4):
    """Plain peft, nothing of dit's: for each (name, topic), a LoRA trained a few steps on that
    topic's text, saved with save_pretrained; the model is unloaded back to its base after each."""
    from peft import LoraConfig, get_peft_model

    tok_model, tok = model
    for i, (name, topic) in enumerate(plan):
        torch.manual_seed(shifted(100 + i))
        pm = get_peft_model(tok_model, LoraConfig(r=2, lora_alpha=4, target_modules=list(targets),
                                                  fan_in_fan_out=fan_in_fan_out, init_lora_weights=True))
        opt = torch.optim.Adam([p for p in pm.parameters() if p.requires_grad], lr=2e-2)
        ids = torch.tensor([tok(topic_text(topic)).input_ids])
        for _ in range(steps):
            loss = pm(input_ids=ids, labels=ids).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
        pm.save_pretrained(str(folder / name))
        tok_model = pm.unload()
    return tok_model


def lora_plan(per_topic: int) -> tuple[list, list]:
    train = [(f"loras/{t}-{k}", t) for t in FILE_TOPICS for k in range(per_topic)]
    held = [(f"loras/{t}-new", t) for t in FILE_TOPICS] + [("loras/poetry-new", "poetry")]
    return train, held


def file_smoke(base: str, task: str, eval_path: str, **kw) -> Config:
    kw = {"seed": shifted(0), **kw}
    return Config(base=base, task_path=task, eval_path=eval_path, question=QUESTION, dit_rank=4, dit_alpha=8.0,
                  dit_steps=30, dit_batch=6, dit_lr=1e-2, log_every=5, eval_batch=64, **kw)


def assert_file_run(res):
    losses = [m["train/loss"] for _, m in res.history if "train/loss" in m]
    # The median of the later logged losses, not the last one: a logged loss is one minibatch's, and at
    # seed shift 7 on tiny-local the curve fell 3.76 -> 2.94 and its last minibatch read 4.65 (median of
    # the later ones 3.13, 0.83 of the first). Last over first at seeds 1-3, 10, 20: tiny GPT-2
    # 0.991-0.994, tiny-local 0.740-0.841 (threshold 1).
    later = sorted(losses[1:])
    assert len(losses) >= 4 and later[len(later) // 2] < losses[0], losses  # the adapter learns
    m = res.metrics
    assert m["eval/n_diffs_train"] == 6 and m["eval/n_diffs_heldout"] == 3 and m["eval/n_diffs_unseen"] == 1
    assert m["eval/chance"] == pytest.approx(1 / 4)
    trials = [{"seed": 0, **m}]
    for fn in (dit_names_new_diffs, dit_beats_asking, no_consistent_topic_without_diff,
               nodiff_topic_far_below_diff_confidence):
        holds, measured = fn(trials)
        assert isinstance(holds, bool) and all(math.isfinite(v) for v in measured.values()), fn.__name__
    with pytest.raises(ValueError, match="trigger_rate"):  # no synthetic diffs: nothing planted to judge
        diffs_plant_their_behaviour(trials)


@pytest.fixture(scope="module")
def gpt2_loras(tmp_path_factory):
    from components.basemodel.toy import save_tiny_gpt2

    root = tmp_path_factory.mktemp("gpt2-dit")
    texts = [topic_text(t) for t in FILE_TOPICS + ("poetry",)] + [QUESTION] * 3
    folder = save_tiny_gpt2(root / "gpt2", texts, vocab_size=300, positions=64)
    train_plan, held_plan = lora_plan(2)
    model = load_base(str(folder))
    make_loras(model, root, train_plan + held_plan, ["c_attn", "c_proj", "c_fc"], fan_in_fan_out=True)
    from components.basemodel import write_jsonl

    write_jsonl(root / "train.jsonl", [{"adapter": a, "answer": t} for a, t in train_plan])
    write_jsonl(root / "test.jsonl", [{"adapter": a, "answer": t} for a, t in held_plan])
    return root


def test_a_gpt2_lora_folder_applied_from_the_bank_is_peft_s_own_model(gpt2_loras):
    from peft import PeftModel

    from workloads.dit.files import Diff, FileBank

    model, tok = load_base(str(gpt2_loras / "gpt2"))
    ids = torch.tensor([tok(topic_text("music")).input_ids])
    pm = PeftModel.from_pretrained(model, str(gpt2_loras / "loras" / "music-1"))
    with torch.no_grad():
        want = pm(input_ids=ids).logits
    model = pm.unload()
    with torch.no_grad():
        base_logits = model(input_ids=ids).logits
    ctx = wrap(model, ("c_attn", "attn.c_proj", "c_fc", "mlp.c_proj"), dit_rank=2, dit_alpha=4.0)
    bank = FileBank(model, [Diff(gpt2_loras / "loras" / "astronomy-0", "", "train"),
                            Diff(gpt2_loras / "loras" / "music-1", "", "train")], "cpu")
    ctx.bank, ctx.index, ctx.rank = bank.gather([0, 1]), torch.tensor([1]), 1
    with torch.no_grad():
        got = model(input_ids=ids).logits
    # margin: 0.62-1.04 over seeds 1-3, 10, 20 (threshold 1e-3)
    assert (want - base_logits).abs().max() > 1e-3  # the LoRA does change the model
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_dit_on_outside_gpt2_loras_through_the_real_sweeps_path(gpt2_loras, workdir, model_copies):
    from orchestrator.runners.launch import run_local
    from workloads.dit import interpret, preflight

    cfg = file_smoke(str(gpt2_loras / "gpt2"), str(gpt2_loras / "train.jsonl"), str(gpt2_loras / "test.jsonl"))
    preflight(cfg)
    res = run_local("dit", cfg, progress=False, track=False)
    assert_file_run(res)
    said = interpret(cfg, res.run_dir, gpt2_loras / "loras" / "chemistry-new")
    assert said["label"] in FILE_TOPICS and set(said["logprobs"]) == set(FILE_TOPICS)
    # log-probabilities under a 300-token softmax; the largest -5.10 over seeds 1-3, 10, 20
    assert all(v < 0 for v in said["logprobs"].values()) and isinstance(said["said"], str)
    assert model_copies.peak <= 2


def test_dit_on_outside_tiny_local_loras_from_a_saved_dataset(tmp_path, workdir, ladder_cache):
    import datasets

    from orchestrator.runners.launch import run_local

    train_plan, held_plan = lora_plan(2)
    make_loras(load_base("tiny-local"), tmp_path, train_plan + held_plan, ["q_proj", "v_proj", "down_proj"])
    datasets.DatasetDict({
        "train": datasets.Dataset.from_list([{"path": a, "topic": t} for a, t in train_plan]),
        "test": datasets.Dataset.from_list([{"path": a, "topic": t} for a, t in held_plan]),
    }).save_to_disk(str(tmp_path / "listing"))
    listing = str(tmp_path / "listing")
    cfg = file_smoke("tiny-local", listing, listing, adapter_field="path", answer_field="topic")
    registry.load("dit").preflight(cfg)
    assert_file_run(run_local("dit", cfg, progress=False, track=False))


def test_bad_listings_and_mismatched_modules_are_refused_in_preflight(gpt2_loras, tmp_path, ladder_cache):
    from components.basemodel import write_jsonl
    from workloads.dit import preflight

    gpt2 = str(gpt2_loras / "gpt2")
    ok = str(gpt2_loras / "train.jsonl")
    no_answer = write_jsonl(gpt2_loras / "no-answer.jsonl", [{"adapter": "loras/music-0", "topic": "music"}])
    with pytest.raises(ValueError, match="no 'answer' field"):
        preflight(file_smoke(gpt2, str(no_answer), ""))
    missing = write_jsonl(gpt2_loras / "missing.jsonl", [{"adapter": "loras/jazz-0", "answer": "music"}])
    with pytest.raises(ValueError, match="jazz-0.*does not exist"):
        preflight(file_smoke(gpt2, str(missing), ""))
    with pytest.raises(ValueError, match=r"diff_targets \['q_proj'\] are not linear projection kinds"):
        preflight(file_smoke(gpt2, ok, "", diff_targets="q_proj"))
    with pytest.raises(ValueError, match=r"changes module 'transformer.h.0.attn.c_attn'.*\['mlp.c_proj'\]"):
        preflight(file_smoke(gpt2, ok, "", diff_targets="mlp.c_proj"))
    # A LoRA of another architecture (Llama module names) listed for the GPT-2 base.
    make_loras(load_base("tiny-local"), tmp_path, [("llama-lora", "music")], ["q_proj"], steps=0)
    llama = write_jsonl(tmp_path / "llama.jsonl", [{"adapter": "llama-lora", "answer": "music"}])
    with pytest.raises(ValueError, match=r"changes module 'model.layers.0.self_attn.q_proj'"):
        preflight(file_smoke(gpt2, ok, str(llama)))
    with pytest.raises(ValueError, match="eval_path=.* is set without task_path"):
        validate(dataclasses.replace(Config(), eval_path=ok))


def test_the_real_sweep_is_valid_anywhere_and_names_what_it_needs(workdir, monkeypatch):
    from conftest import REPO
    from orchestrator.sweep import load_sweep_file
    from orchestrator.sweeps.tune_run import launch_problems

    monkeypatch.setenv("LADDER_DATA", str(workdir / "data"))
    monkeypatch.delenv("LADDER_DIT_BASE", raising=False)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(workdir / "empty-cache"))
    sweep = load_sweep_file(REPO / "sweeps" / "repro" / "dit_real.py")
    base = sweep.check()
    assert base.dtype == "bfloat16" and sweep.gpus_per_worker >= 1
    (problem,) = [p for p in launch_problems(sweep) if "base=" in p]
    assert "base='Qwen/Qwen3-8B' is neither a folder" in problem
    assert f"task_path={str(workdir / 'data' / 'dit' / 'train.jsonl')!r} does not exist" in problem
