"""martingale_uq: the blend and its schedule by hand, the exact draw against its closed forms and the
forward urn, the shortcut's excess variance, concentration, calibration with a perfect prior, the
bootstrap's coverage against an enumerated answer, the generators, bad configs, resumption, the
claims and the smoke reproduction."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy import stats

from conftest import judged_claim, shifted
from orchestrator.run import LocalRun
from orchestrator.claims import spec_of
from orchestrator.runners import registry
from orchestrator.runners.config import ConfigError
from workloads.martingale_uq import CHECKS, CLAIMS, Config, plot, smoke, train, validate
from workloads.martingale_uq import bytemodel, imagedata, pixelmodel, tabular, textlm, tinygpt2
from workloads.martingale_uq.claims import (
    bootstrap_undercovers_rare_alert, exact_above_bootstrap, exact_covers_nll, exact_covers_rare_alert,
    shortcut_wider_than_exact,
)
from workloads.martingale_uq.coverage import COL, COLUMNS, covered, evaluate_chunk, summarize
from workloads.martingale_uq.posterior import (
    blend_weight, bootstrap, dp_functional, exact_long_run, exact_variance, forecast_metrics, forward_urn,
    interval, minimax_alpha, shortcut_excess_variance, single_atom_shortcut,
)


@pytest.fixture(autouse=True)
def one_thread():
    """The runner pins a trial to one thread (Config.threads); tests calling train or its parts
    directly do the same (two threads on these small tensors run many times slower on a loaded
    machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def uq_cfg(**kw) -> SimpleNamespace:
    """The fields evaluate_chunk reads, with the workload's defaults."""
    base = {f.name: f.default for f in dataclasses.fields(Config)}
    return SimpleNamespace(**{**base, "horizon": 0, **kw})


# --- the blend and its Dirichlet schedule ----------------------------------------------------


def test_blend_weights_by_hand():
    assert blend_weight(2.0, 0) == 1.0  # before any data the forecast is the generator
    assert blend_weight(2.0, 2) == pytest.approx(0.5)
    assert blend_weight(2.0, 6) == pytest.approx(0.25)
    assert blend_weight(5.0, 20) == pytest.approx(0.2)
    with pytest.raises(ValueError, match="alpha must be positive"):
        blend_weight(0.0, 3)


def test_forecast_metric_by_hand():
    # alpha = 2, theta(Q) = 0.5, values 1, 0, 1: (i zbar_i + 2 * 0.5) / (i + 2).
    np.testing.assert_allclose(forecast_metrics([1.0, 0.0, 1.0], 0.5, 2.0), [0.5, 2 / 3, 0.5, 0.6])


def test_forecast_metric_is_a_martingale_under_forward_sampling():
    # The next value comes from P_i: a generator value w.p. lambda_i, else a copy of a seen one.
    prior = np.array([0.0, 0.3, 2.0, 5.0])
    z = np.array([1.0, -1.0, 4.0])
    alpha = 3.0
    lam = float(blend_weight(alpha, len(z)))
    now = forecast_metrics(z, float(prior.mean()), alpha)[-1]
    expected = sum(lam / len(prior) * forecast_metrics(np.append(z, v), float(prior.mean()), alpha)[-1] for v in prior)
    expected += sum((1 - lam) / len(z) * forecast_metrics(np.append(z, v), float(prior.mean()), alpha)[-1] for v in z)
    assert expected == pytest.approx(now, abs=1e-12)


def test_minimax_alpha_by_hand_and_its_bounds():
    # z = (0, 2): zbar 1, sigma^2 = 2; theta(Q) = 1.5, c = 1: Delta = 0.5 + sqrt(2)/sqrt(2) = 1.5.
    z = np.array([[0.0, 2.0]])
    assert minimax_alpha(z, 1.5, c=1.0, alpha_min=0.1, alpha_max=200)[0] == pytest.approx(2 / 2.25)
    assert minimax_alpha(z, 1.5, c=1.0)[0] == 5.0  # clipped to the floor
    assert minimax_alpha(np.ones((1, 7)), 0.0)[0] == 5.0  # no spread: the data alone are certain
    assert minimax_alpha(z, 1.0, c=0.0)[0] == 200.0  # zbar = theta(Q), no pad: the ceiling
    # sigma^2 / (c sigma / sqrt(n))^2 = n / c^2 bounds alpha for any data.
    rows = np.random.default_rng(0).standard_normal((500, 30)) * 3
    a = minimax_alpha(rows, 0.0, c=1.64, alpha_min=1e-3, alpha_max=1e6)
    assert a.max() <= 30 / 1.64**2 + 1e-9 and a.min() > 0


# --- the exact long-run draw, the shortcut, the urn ------------------------------------------


def test_dp_functional_of_an_indicator_is_beta():
    # For h = 1_A, theta(G_0) = G_0(A) ~ Beta(alpha Q(A), alpha (1 - Q(A))): exactly.
    rng = np.random.default_rng(shifted(1))
    prior = (np.arange(1000) < 300).astype(float)  # Q(A) = 0.3
    draws = dp_functional(rng, np.array([4.0]), prior, 3000)[0]
    # margin: KS p-value worst 0.295 over seeds 1-5 (threshold 0.01)
    assert stats.kstest(draws, stats.beta(4 * 0.3, 4 * 0.7).cdf).pvalue > 0.01


def test_exact_draw_matches_its_closed_form_moments_and_the_long_forward_urn():
    rng = np.random.default_rng(shifted(2))
    prior = rng.standard_normal(20_000) + 0.4
    z = rng.standard_normal((1, 20))
    alpha = np.array([6.0])
    exact = exact_long_run(rng, z, alpha, prior, 20_000)[0]
    mean = (z.sum() + 6.0 * prior.mean()) / 26.0
    var = exact_variance(z[0], 6.0, float(prior.mean()), float(prior.var()))
    # margin: the mean's error worst 1.43 sd over seeds 1-5 (threshold 4 sd); the variance's worst
    # relative error 0.018 over seeds 1-5 (threshold 0.05)
    assert exact.mean() == pytest.approx(mean, abs=4 * math.sqrt(var / 20_000))
    assert exact.var() == pytest.approx(var, rel=0.05)
    # Algorithm 1 run 2,000 steps ahead draws (nearly) the same law as the exact limit.
    urn = forward_urn(rng, z, alpha, prior, 2000, 2000)[0]
    assert stats.ks_2samp(exact[:2000], urn).pvalue > 0.01  # margin: p worst 0.391 over seeds 1-5 (threshold 0.01)


def test_shortcut_excess_variance_is_measured_as_derived():
    rng = np.random.default_rng(shifted(3))
    prior = rng.exponential(size=20_000)  # skewed, Var_Q = 1
    z = rng.exponential(size=(1, 20)) * 0.5
    alpha = np.array([8.0])
    short = single_atom_shortcut(rng, z, alpha, prior, 40_000)[0]
    exact = exact_long_run(rng, z, alpha, prior, 40_000)[0]
    excess = shortcut_excess_variance(20, 8.0, float(prior.var()))
    # margin over seeds 1-5: the excess's relative error worst 0.016 (threshold 0.1), the centres' gap
    # worst 0.0014 (threshold 0.01), the width ratio worst 2.04 (threshold 1.2)
    assert short.var() - exact.var() == pytest.approx(excess, rel=0.1)
    assert short.mean() == pytest.approx(exact.mean(), abs=0.01)  # same centre, wider spread
    lo_s, hi_s = interval(short, 0.9)
    lo_e, hi_e = interval(exact, 0.9)
    assert hi_s - lo_s > 1.2 * (hi_e - lo_e)


def test_posterior_concentrates_on_the_empirical_metric_as_n_grows():
    rng = np.random.default_rng(shifted(4))
    prior = rng.standard_normal(20_000) + 1.0  # theta(Q) = 1, the data's is 0
    offsets, sds = [], []
    for n in (20, 500, 20_000):
        z = rng.standard_normal((1, n))
        alpha = minimax_alpha(z, float(prior.mean()))
        draws = exact_long_run(rng, z, alpha, prior, 300)[0]
        offsets.append(abs(draws.mean() - z.mean()))
        sds.append(draws.std())
        assert draws.std() < 1.3 / math.sqrt(n)  # margin: std * sqrt(n) worst 1.09 over seeds 1-5 and every n (threshold 1.3)
    # Each 25-40x more data at least halves the offset and the spread. margin over seeds 1-5: offset
    # ratios worst 0.068 (20 -> 500) and 0.115 (500 -> 20,000), sd ratios worst 0.25 and 0.185
    # (threshold 0.5 each); the last offset worst 0.0013 (threshold 0.015), the last sd worst 0.0077
    # (threshold 0.01)
    assert offsets[1] < 0.5 * offsets[0] and offsets[2] < 0.5 * offsets[1] and offsets[2] < 0.015, offsets
    assert sds[1] < 0.5 * sds[0] and sds[2] < 0.5 * sds[1] and sds[2] < 0.01, sds


@pytest.mark.parametrize("n", [5, 20, 50])
def test_exact_intervals_are_calibrated_with_a_perfect_generator(n):
    # Q = F: the prior's draws come from the deployed distribution itself (mean score, skewed).
    world = tabular.World(2, 0.03, 2.0, 0.5, shift=0.0)
    prior = world.score(world.sample(np.random.default_rng(shifted(5)), 20_000))
    sampler = lambda rng, reps, count: world.score(world.sample(rng, (reps, count)))  # noqa: E731
    rows = evaluate_chunk(uq_cfg(draws=300), np.random.default_rng(shifted(n)), sampler, prior, n, 400)
    cov = covered(rows, "exact", world.true_metric("mean_score", 0.0)).mean()
    # Near the nominal 0.9: not under-covering, not much wider than needed. At n = 5 the exact draw
    # is conservative (alpha >= 5 gives the generator at least half the weight): its coverage over
    # seeds 1-25 is 0.9525-0.99, mean 0.974, past the 0.97 that n = 20 and 50 keep (it was set at seed
    # 0's 0.9625 and failed at seeds 2 and 5). Rule for n = 5's upper bound: that mean plus 3 binomial
    # sd of 400 repetitions (0.008), 0.998. margin over seeds 1-25: n = 5 worst 0.99 (bound 0.998);
    # n = 20 0.875-0.94, n = 50 0.8575-0.92 (band 0.85-0.97).
    upper = 0.998 if n == 5 else 0.97
    assert 0.85 <= cov <= upper, cov


def test_bootstrap_coverage_matches_the_enumerated_answer():
    # Bernoulli(p) data: given k successes the bootstrap mean is Binomial(n, k/n)/n, so its
    # percentile interval, and whether it holds p, is known for every k.
    n, p, reps = 20, 0.04, 1000
    expected = sum(
        stats.binom.pmf(k, n, p)
        for k in range(n + 1)
        if stats.binom.ppf(0.05, n, k / n) / n <= p <= stats.binom.ppf(0.95, n, k / n) / n
    )
    rng = np.random.default_rng(shifted(6))
    z = (rng.random((reps, n)) < p).astype(float)
    lo, hi = interval(bootstrap(rng, z, 1000), 0.9)
    rows = np.full((reps, len(COLUMNS)), np.nan)
    rows[:, COL["bootstrap_lo"]], rows[:, COL["bootstrap_hi"]] = lo, hi
    assert expected == pytest.approx(0.514, abs=0.002)  # P(k = 1) + P(k = 2): k = 0 gives [0, 0]
    # margin: worst |coverage - expected| 0.036 over seeds 1-25 (seed 13; abs 0.04, 2.5 binomial sd of 1000 repetitions)
    assert covered(rows, "bootstrap", p).mean() == pytest.approx(expected, abs=0.04)
    # No spread: the interval is the point itself, closed at both ends.
    point = np.zeros((1, len(COLUMNS)))
    point[0, COL["bootstrap_lo"]] = point[0, COL["bootstrap_hi"]] = 0.05
    assert covered(point, "bootstrap", 0.05)[0] and not covered(point, "bootstrap", 0.0500001)[0]


def test_chunk_alpha_sources_and_the_horizon_target():
    # Deterministic deployed values: the n seen ones are all 1 (no spread), the next `horizon`
    # ones 0, 2, 0, 2, ..., the 20 held-out ones for alpha 0.5, 1.5, ... (zbar = theta(Q) = 1).
    def sampler(rng, reps, count):
        row = np.concatenate([np.ones(5), np.tile([0.0, 2.0], 4), np.tile([0.5, 1.5], 10)])[:count]
        return np.tile(row, (reps, 1))

    prior = np.linspace(0.0, 2.0, 101)
    rows = evaluate_chunk(uq_cfg(horizon=8, draws=50), np.random.default_rng(0), sampler, prior, 5, 3)
    assert (rows[:, COL["alpha"]] == 5.0).all()  # sigma = 0 on the samples: the floor
    np.testing.assert_allclose(rows[:, COL["horizon_truth"]], (5 + 8) / 13)  # the seen and the next 8
    held = evaluate_chunk(uq_cfg(horizon=8, alpha_holdout=20, draws=50), np.random.default_rng(0), sampler, prior, 5, 3)
    expect = minimax_alpha(np.tile([0.5, 1.5], (1, 10)), 1.0)[0]
    assert expect == pytest.approx(20 / 1.64**2)  # Delta = c sigma / sqrt(20): alpha = n / c^2
    np.testing.assert_allclose(held[:, COL["alpha"]], expect)
    fixed = evaluate_chunk(uq_cfg(alpha_rule="fixed", alpha=12.5, draws=50), np.random.default_rng(0), sampler, prior, 5, 3)
    assert (fixed[:, COL["alpha"]] == 12.5).all() and np.isnan(fixed[:, COL["horizon_lo"]]).all()


def test_summary_of_known_records():
    rows = np.full((4, len(COLUMNS)), np.nan)
    rows[:, COL["alpha"]] = [5, 5, 7, 7]
    rows[:, COL["exact_lo"]], rows[:, COL["exact_hi"]] = [0, 0, 0.5, 0.2], [1, 0.4, 0.9, 0.6]
    rows[:, COL["exact_sd"]] = 0.1
    out = summarize(rows, 20, theta_true=0.45)
    assert out["eval/coverage/exact/n20"] == 0.5  # [0, 1] and [0.2, 0.6] hold 0.45
    assert out["eval/width/exact/n20"] == pytest.approx((1 + 0.4 + 0.4 + 0.4) / 4)
    assert out["eval/alpha/n20"] == 6 and out["eval/reps/n20"] == 4
    assert "eval/coverage/horizon/n20" not in out  # no urn run: nothing reported for it


# --- the generators ---------------------------------------------------------------------------


def test_true_metric_is_the_deployed_distributions():
    world = tabular.World(3, 0.03, 2.0, 0.5, shift=0.3)
    s = world.score(world.sample(np.random.default_rng(shifted(7)), 400_000))
    # margin over seeds 1-5: the alert rate's error worst 6.6e-4 (threshold 1e-3), the mean's worst
    # 2.3e-3 (threshold 5e-3), the shift's worst 2.6e-3 (threshold 5e-3)
    assert world.true_metric("alert_rate", 2.0) == pytest.approx((s > 2.0).mean(), abs=1e-3)
    assert world.true_metric("mean_score", 2.0) == pytest.approx(s.mean(), abs=5e-3)
    hist = world.score(world.sample(np.random.default_rng(shifted(8)), 400_000, historical=True))
    assert hist.mean() - s.mean() == pytest.approx(0.97 * 0.3, abs=5e-3)  # the bulk's shift


def test_em_fits_a_known_mixture_and_never_raises_the_nll():
    rng = np.random.default_rng(shifted(9))
    x = np.concatenate([rng.normal([-2, 0], 0.5, (3000, 2)), rng.normal([2, 1], 0.5, (1000, 2))])
    x = torch.from_numpy(x)
    params = tabular.gmm_init(x, 2, torch.Generator().manual_seed(shifted(0)))
    losses = []
    for _ in range(40):
        params, nll = tabular.em_step(params, x)
        losses.append(nll)
    assert all(b <= a + 1e-9 for a, b in zip(losses, losses[1:]))  # EM's monotonicity (largest rise seen: 1e-13)
    # margin over seeds 1-5: the means' error worst 0.027 (atol 0.05), the weights' worst 2e-5 (atol
    # 0.02), the sample mean's worst 0.019 (atol 0.05)
    order = torch.argsort(params["means"][:, 0])
    torch.testing.assert_close(params["means"][order], torch.tensor([[-2.0, 0.0], [2.0, 1.0]], dtype=x.dtype), atol=0.05, rtol=0)
    torch.testing.assert_close(torch.softmax(params["logits"], 0)[order], torch.tensor([0.75, 0.25], dtype=x.dtype), atol=0.02, rtol=0)
    sample = tabular.gmm_sample(params, 20_000, torch.Generator().manual_seed(shifted(1)))
    torch.testing.assert_close(sample.mean(0), x.mean(0), atol=0.05, rtol=0)


def test_byte_model_texts_and_nll():
    data = torch.tensor(list(b"x = 1\nif x:\n    y = 2\nprint(y)\n" * 20), dtype=torch.long)
    windows = bytemodel.real_texts(data, 4, 6, 1000, torch.Generator().manual_seed(0))
    assert len(windows) > 5 and bool((windows[:, 3] == bytemodel.NEWLINE).all())  # each text starts a line
    model = bytemodel.ByteModel(4, 3, 8)
    got = bytemodel.nll_per_byte(model, windows[:3], batch=2)
    w = windows[0]
    direct = -sum(torch.log_softmax(model(w[t : t + 4]), -1)[w[t + 4]] for t in range(6)) / 6
    assert got[0].item() == pytest.approx(direct.item(), rel=1e-5)
    gen = bytemodel.generate(model, 5, 7, 1.0, torch.Generator().manual_seed(0))
    assert gen.shape == (5, 11) and bool((gen[:, :4] == bytemodel.NEWLINE).all())


@pytest.mark.slow
def test_byte_model_trial_learns_and_measures_nll(tmp_path):
    cfg = Config(generator="bytes", metric="nll", ns=(5, 20), repetitions=20, draws=100, horizon=20,
                 prior_draws=300, real_texts=200, corpus_bytes=150_000, byte_steps=60, log_every=20, seed=shifted(0))
    run = LocalRun(tmp_path)
    out = train(cfg, run)
    losses = [m["train/loss"] for _, m in run.history if "train/loss" in m]
    # from ~log 256 = 5.5 nats down. margin over seeds 1-5: the first loss worst 3.16 (threshold 6.0),
    # the fall worst 0.318 nats (threshold 0.1); theta_true 2.57-2.68 and theta_prior 2.67-3.03 over
    # seeds 1-5 and 10 (band 0.5-5.5)
    assert losses[-1] < losses[0] - 0.1 and losses[0] < 6.0, losses
    assert 0.5 < out["eval/theta_true"] < 5.5 and 0.5 < out["eval/theta_prior"] < 5.5
    # The prior's metric is its own samples' NLL, the gap the difference as reported (a mechanism check;
    # the gap's size is not: 0.11-0.43 nats over seeds 1-5 but 0.004 at seed 10, where |gap| > 0.01 failed)
    assert out["eval/prior_gap"] == out["eval/theta_prior"] - out["eval/theta_true"]
    assert 0 <= out["eval/coverage/exact/n20"] <= 1 and out["eval/reps/n20"] == 20


def test_tiny_gpt2_trains_once_per_seed_from_its_start_token_and_loads_as_gpt2(tmp_path, monkeypatch):
    from transformers import GPT2LMHeadModel

    monkeypatch.setenv("LADDER_CACHE", str(tmp_path / "cache"))
    recipe = tinygpt2.Recipe(layers=1, hidden=16, heads=2, vocab=300, seq=12, batch=8, steps=40, lr=1e-2,
                             corpus_bytes=20_000)
    seen = []  # every training batch's inputs, through the model's own forward
    forward = GPT2LMHeadModel.forward
    monkeypatch.setattr(GPT2LMHeadModel, "forward", lambda self, *a, **kw: seen.append(kw["input_ids"]) or forward(self, *a, **kw))
    losses = []
    folder, loss, trained = tinygpt2.ensure_built(recipe, shifted(0), lambda step, value: losses.append(value))
    assert trained and len(losses) == recipe.steps and loss == losses[-1]
    # Each window is the start token and seq tokens: what the workload scores and generates from.
    assert len(seen) == recipe.steps and all(x.shape == (8, 13) for x in seen)
    assert all(bool((x[:, 0] == x[0, 0]).all()) for x in seen) and not bool((seen[0][:, 1:] == seen[0][0, 0]).all())
    # It learns: from about log(300) = 5.7 nats. margin: the fall 1.15-1.60 nats over seeds 1-5, 10, 11
    # (threshold 0.75)
    assert losses[-1] < losses[0] - 0.75, losses
    monkeypatch.setattr(GPT2LMHeadModel, "forward", forward)
    # Cached per (recipe, seed): asked again it loads, without training.
    assert tinygpt2.ensure_built(recipe, shifted(0), lambda *_: pytest.fail("the cached model was trained again")) == (folder, loss, False)
    assert tinygpt2.folder_of(recipe, shifted(1)) != folder
    assert tinygpt2.folder_of(dataclasses.replace(recipe, steps=41), shifted(0)) != folder
    lm, tokenizer, start = textlm.load(str(folder), torch.device("cpu"))
    assert isinstance(lm, GPT2LMHeadModel) and lm.config.n_positions == 13 and len(tokenizer) <= 300
    assert start == seen[0][0, 0].item()
    texts = textlm.generate(lm, start, 4, 12, 1.0, torch.Generator().manual_seed(0), 4, torch.device("cpu"))
    assert texts.shape == (4, 13) and bool((texts[:, 0] == start).all())
    assert bool(torch.isfinite(textlm.nll_per_token(lm, texts, 4, torch.device("cpu"))).all())


# --- configs ----------------------------------------------------------------------------------


@pytest.mark.parametrize("change, message", [
    ({"alpha_rule": "fixed", "alpha": 300.0}, "outside"),
    ({"alpha_rule": "fixed", "alpha": 1.0}, "outside"),
    ({"alpha_min": 10.0, "alpha_max": 5.0}, "alpha range"),
    ({"alpha_min": 0.0}, "alpha range"),
    ({"alpha_rule": "empirical"}, "alpha_rule must be"),
    ({"ns": (0, 20)}, "n < 1"),
    ({"ns": ()}, "ns is empty"),
    ({"ns": (20, 20)}, "repeats"),
    ({"metric": "nll"}, "not defined for generator='gmm'"),
    ({"generator": "flow"}, "generator must be"),
    ({"level": 1.0}, "level must lie"),
    ({"draws": 5}, "draws >= 20"),
    ({"repetitions": 0}, "repetitions must be"),
    ({"horizon": -1}, "horizon must be"),
    ({"alpha_holdout": 1}, "alpha_holdout"),
    ({"dp_tol": 0.0}, "dp_tol"),
    ({"history": 10}, "too few"),
    ({"generator": "bytes", "metric": "nll", "real_texts": 100}, "raise real_texts"),
    ({"generator": "tiny_gpt2", "metric": "mean_score"}, "not defined for generator='tiny_gpt2'"),
    ({"generator": "tiny_gpt2", "metric": "nll", "gpt2_hidden": 33}, "multiple of gpt2_heads"),
    ({"generator": "tiny_gpt2", "metric": "nll", "gpt2_vocab": 257}, "gpt2_vocab=257 >= 258"),
    ({"generator": "tiny_gpt2", "metric": "nll", "gpt2_steps": 0}, "gpt2_steps must be"),
])
def test_bad_configs_name_the_problem(change, message):
    with pytest.raises(ValueError, match=message):
        validate(dataclasses.replace(Config(), **change))


def test_more_than_one_worker_is_refused():
    with pytest.raises(ConfigError, match="workers=1"):
        registry.load("martingale_uq").validate(Config(), world_size=2)


# --- the loop and resumption ------------------------------------------------------------------


def test_resumed_run_holds_the_repetitions_done_and_ends_like_an_unbroken_one(tmp_path):
    cfg = smoke()
    whole = train(cfg, LocalRun(tmp_path / "whole"))
    saves = []

    class Dies(LocalRun):
        def save(self, state):
            super().save(state)
            saves.append({k: len(v) for k, v in state["records"].items()})
            if len(saves) == 3:  # the fit, n = 5 done, then two chunks of 10 repetitions at n = 20
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(cfg, Dies(tmp_path / "cut"))
    assert cfg.checkpoint_every == 2 and cfg.chunk == 10 and cfg.repetitions == 40
    assert saves == [{}, {"n5": 20}, {"n5": 40}]  # every second chunk and at the end of an n
    resumed = LocalRun(tmp_path / "cut")
    again = train(cfg, resumed)
    assert resumed.restored_step == cfg.em_iters + 40
    assert again == whole  # the same repetitions, drawn from the same per-chunk streams
    assert resumed.history[0][0] > cfg.em_iters + 40  # no EM step and no finished chunk was redone


# --- claims -----------------------------------------------------------------------------------


def trial(metric="alert_rate", shift=0.3, gap=0.02, exact=0.95, boot=0.5, short=0.9, reps=200.0, ratio=1.5, n=20,
          generator="gmm", temperature=1.0):
    t = {"generator": generator, "metric": metric, "shift": shift, "temperature": temperature, "level": 0.9,
         "eval/prior_gap": gap, "eval/theta_true": 0.037, "eval/theta_prior": 0.037 + gap, "eval/real_sd": 0.5}
    for m in (5, n):
        t.update({f"eval/reps/n{m}": reps, f"eval/coverage/exact/n{m}": exact, f"eval/coverage/shortcut/n{m}": short,
                  f"eval/coverage/bootstrap/n{m}": boot, f"eval/coverage/horizon/n{m}": 0.9,
                  f"eval/width/exact/n{m}": 0.1, f"eval/width/bootstrap/n{m}": 0.08, f"eval/alpha/n{m}": 5.0,
                  f"eval/sd/exact/n{m}": 0.03, f"eval/sd/shortcut/n{m}": 0.03 * ratio})
    return t


def text(temperature=1.0, gap=-0.1, exact=0.9, boot=0.85, metric="nll", **kw):
    """A tiny-GPT-2 NLL trial whose prior is its own samples at `temperature`."""
    return trial(metric=metric, generator="tiny_gpt2", temperature=temperature, gap=gap, exact=exact, boot=boot, **kw)


def every_prior(**change):
    """The smoke's five priors with coverages of the paper's pattern; `change` replaces one of them by name."""
    priors = {"T1": text(), "T1.1": text(1.1, gap=0.2, exact=0.88, boot=0.86), "up": trial(),
              "down": trial(shift=-0.3, gap=-0.01, exact=0.8), "mean": trial(metric="mean_score", boot=0.87)}
    return list({**priors, **change}.values())


def test_claims_hold_on_the_papers_pattern_and_report_both_priors():
    trials = every_prior()
    results = {c.__name__: c(trials) for c in CLAIMS + CHECKS}
    assert all(holds for holds, _ in results.values()), results
    assert CLAIMS[0] is exact_covers_nll  # the headline: the paper's metric
    assert CHECKS == [shortcut_wider_than_exact] and spec_of(shortcut_wider_than_exact) is None
    for c in CLAIMS:
        assert judged_claim(c, trials)
    nll = results["exact_covers_nll"][1]
    assert nll["exact_coverage"] == pytest.approx(0.89) and nll["bootstrap_coverage"] == pytest.approx(0.855)
    assert nll["repetitions"] == 400 and nll["T1.1_prior_gap_sd"] == pytest.approx(0.4)
    assert nll["exact_coverage_prior_below"] == 0.9 and nll["exact_coverage_prior_above"] == 0.88
    alert = results["exact_covers_rare_alert"][1]
    # both shifts judged together: (0.95 + 0.8) / 2, each side reported
    assert alert["exact_coverage"] == pytest.approx(0.875) and alert["repetitions"] == 400
    assert alert["exact_coverage_prior_above"] == 0.95 and alert["exact_coverage_prior_below"] == 0.8
    every = results["exact_above_bootstrap"][1]
    assert every["repetitions"] == 1000  # all five priors
    assert every["exact_minus_bootstrap"] == pytest.approx((0.9 + 0.88 + 0.95 + 0.8 + 0.95 - 0.85 - 0.86 - 0.5 - 0.5 - 0.87) / 5)
    assert every["nll_exact_minus_bootstrap"] == pytest.approx(0.89 - 0.855)
    assert results["bootstrap_undercovers_rare_alert"][1]["exact_minus_bootstrap"] == pytest.approx(0.375)
    assert results["shortcut_wider_than_exact"][1]["min_sd_ratio"] == pytest.approx(1.5)
    assert "tiny_gpt2_nll_T1.1_sd_ratio" in results["shortcut_wider_than_exact"][1]


def test_claims_judge_every_prior_pool_seeds_by_repetitions_and_fail_without_the_pattern():
    cov = exact_covers_rare_alert([trial(exact=0.9, reps=200), trial(exact=0.8, reps=600)])[1]
    assert cov["exact_coverage"] == pytest.approx(0.825) and cov["repetitions"] == 800
    # A prior that under-states the metric is judged with the other: one good prior does not carry the claim.
    assert not judged_claim(exact_covers_rare_alert, every_prior(down=trial(shift=-0.3, gap=-0.01, exact=0.74)))
    assert judged_claim(exact_covers_rare_alert, every_prior(down=trial(shift=-0.3, gap=-0.01, exact=0.75)))
    assert not judged_claim(exact_covers_nll, every_prior(T1=text(exact=0.95), **{"T1.1": text(1.1, gap=0.2, exact=0.74)}))
    assert not judged_claim(exact_covers_nll, [text(exact=0.84), text(1.1, exact=0.85)])
    assert not judged_claim(exact_above_bootstrap, [text(exact=0.85, boot=0.86), text(1.1, exact=0.85, boot=0.85)])
    assert judged_claim(exact_above_bootstrap, [text(exact=0.85, boot=0.85)])
    assert not judged_claim(bootstrap_undercovers_rare_alert, [trial(boot=0.64)])
    assert judged_claim(bootstrap_undercovers_rare_alert, [trial(boot=0.63)])
    assert not shortcut_wider_than_exact([trial(), trial(metric="mean_score", ratio=0.99)])[0]
    with pytest.raises(ValueError, match="needs >= 200"):
        exact_covers_rare_alert([trial(reps=100)])
    with pytest.raises(ValueError, match="needs >= 200"):
        exact_covers_nll([text(reps=150)])
    with pytest.raises(ValueError, match="no GPT-2 NLL-per-token trial"):
        exact_covers_nll([trial(), text(metric="alert_rate")])
    with pytest.raises(ValueError, match="no GMM alert-rate trial"):
        bootstrap_undercovers_rare_alert([trial(metric="mean_score"), text()])


def test_plot_writes_a_png(tmp_path):
    path = tmp_path / "claims.png"
    plot([trial(), trial(shift=-0.3, gap=-0.01), text(), text(1.1), {**trial(), "generator": "bytes", "metric": "nll"}], path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- the reproduction -------------------------------------------------------------------------


@pytest.mark.slow
def test_smoke_reproduction_holds(workdir):
    from orchestrator.reproduction.reproduce import reproduce

    rep = reproduce("martingale_uq", smoke=True, local=True)
    assert not rep.failed_trials and len(rep.trials) == 5
    # Margins measured at the calibration seeds 100-104 (`ladder report martingale_uq --smoke --seed 100
    # --seeds 5`). The pooled rare-alert coverage (0.738-0.762 there) is under its claim's 0.85 by
    # design of the under-stating prior: asserted is its mechanism, not the claim.
    by_name = {c.name: c.measured for c in rep.claims}
    nll = by_name["exact_covers_nll"]
    assert nll["repetitions"] >= 400  # both priors' 200 repetitions
    assert nll["exact_coverage"] >= 0.82  # worst 0.897 (the claim's threshold 0.85 is judged over seeds)
    assert nll["T1_prior_gap_sd"] < 0  # the paper's prior under-states the deployed NLL: worst -0.51 (threshold 0)
    assert by_name["exact_above_bootstrap"]["exact_minus_bootstrap"] > 0  # worst +0.094 (threshold 0)
    alert = by_name["exact_covers_rare_alert"]
    assert alert["exact_coverage_prior_above"] >= 0.9  # worst 0.955 (threshold 0.9)
    # k = 0 alerts uncovered under the under-stating prior: the gap worst 0.405 (threshold 0.25)
    assert alert["exact_coverage_prior_above"] - alert["exact_coverage_prior_below"] >= 0.25
    assert by_name["bootstrap_undercovers_rare_alert"]["bootstrap_coverage"] <= 0.63  # worst 0.530 (threshold 0.63)
    assert {c.name for c in rep.checks} == {c.__name__ for c in CHECKS}
    assert next(c for c in rep.checks if c.name == "shortcut_wider_than_exact").measured["min_sd_ratio"] > 1  # worst 1.20
    for t in rep.trials:  # the coverage-vs-n plot has its points
        ns = (5, 20, 50) if t["generator"] == "tiny_gpt2" else (5, 10, 20, 50)
        assert {f"eval/coverage/{v}/n{n}" for v in ("exact", "shortcut", "bootstrap", "horizon") for n in ns} <= set(t)


# --- the paper's text setting: a frozen LM by from_pretrained, a text file ---------------------------


WORDS = ("the river valley was settled by farmers in the early century and the town grew around a mill "
         "later a railway reached it and the station became the centre of trade for the region").split()


def _wiki(n_lines: int = 120, seed: int = 0) -> list[str]:
    """WikiText-2-raw-like lines: headings and paragraphs of words."""
    import numpy as np

    rng = np.random.default_rng(seed)
    lines = []
    for i in range(n_lines):
        if i % 20 == 0:
            lines.append(f" = Section {i // 20} = ")
        lines.append(" " + " ".join(rng.choice(WORDS, size=12)) + " . ")
    return lines


def _tiny_gpt2(folder, lines: list[str]) -> None:
    """GPT-2's architecture (hidden size 32, 2 layers) and a byte-level BPE tokenizer trained on the
    lines, both written by save_pretrained: the folder `from_pretrained` reads for 'gpt2'."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    tokenizer.save_pretrained(str(folder))
    torch.manual_seed(shifted(0))  # the LM's init: moved with the test's seed
    eot = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_layer=2, n_embd=32, n_head=2, n_positions=64,
                               bos_token_id=eot, eos_token_id=eot)).save_pretrained(str(folder))


def _causal_lm_smoke(**change) -> Config:
    fields = dict(generator="causal_lm", metric="nll", model="gpt2-tiny", text_len=12, real_texts=80, prior_draws=200,
                  lm_batch=100, horizon=20)
    return dataclasses.replace(smoke(), **{**fields, **change})


@pytest.mark.parametrize("layout", ["txt", "saved"])
def test_a_frozen_pretrained_lm_on_a_text_file_runs_through_the_workload(workdir, layout):
    """The smoke of the paper's text setting (`sweeps/repro/martingale_uq_real.py`): a GPT-2 folder
    and WikiText-2 raw as a .txt file or a datasets save_to_disk folder, through the same loaders."""
    import datasets
    from orchestrator.runners import launch, registry

    lines = _wiki()
    _tiny_gpt2(workdir / "gpt2-tiny", lines)
    if layout == "txt":
        (workdir / "wiki.test.raw").write_text("\n".join(lines) + "\n")
        path = "wiki.test.raw"
    else:
        datasets.DatasetDict({"test": datasets.Dataset.from_dict({"text": lines})}).save_to_disk(str(workdir / "wikitext"))
        path = "wikitext"
    cfg = _causal_lm_smoke(text_path=path)
    w = registry.load("martingale_uq")
    w.validate(cfg)
    w.preflight(cfg)
    result = launch.run_local("martingale_uq", cfg, progress=False, track=False)
    out = result.metrics
    # An untrained 300-token LM: about log(300) = 5.7 nats per token, on real and generated texts alike.
    # margin: both 5.688-5.707 over seeds 1-5 (band 4-7); prior_sd worst 0.031 and every width worst
    # 0.022 over seeds 1-5 (threshold 0)
    assert 4.0 < out["train/loss"] < 7.0 and 4.0 < out["eval/theta_prior"] < 7.0
    assert math.isfinite(out["eval/theta_true"]) and out["eval/prior_sd"] > 0
    for n in cfg.ns:
        assert 0 <= out[f"eval/coverage/exact/n{n}"] <= 1 and out[f"eval/width/exact/n{n}"] > 0
    again = launch.run_local("martingale_uq", cfg, progress=False, track=False).metrics  # seeded: the same draws
    assert again["eval/theta_prior"] == out["eval/theta_prior"] and again["eval/theta_true"] == out["eval/theta_true"]


@pytest.mark.parametrize("change, match", [
    ({"model": "no-such-folder"}, r"model='no-such-folder' is neither a folder with config.json nor .*hf download gpt2"),
    ({"model": "gpt2"}, r"nothing is downloaded at run time"),
    ({"text_path": "wiki.missing.raw"}, r"text_path='wiki.missing.raw' is neither a text file .*wikitext-2-raw-v1"),
    ({"text_len": 80}, r"text_len=80 tokens \(\+1 start token\) exceed model='gpt2-tiny''s 64 positions"),
    ({"text_path": "wikitext", "text_split": "validation"}, r"has splits \['test'\], not text_split='validation'"),
])
def test_a_missing_model_or_text_is_refused_before_the_run_naming_the_fix(workdir, monkeypatch, change, match):
    import datasets
    from orchestrator.runners import registry
    from orchestrator.runners.config import ConfigError

    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(workdir / "empty-cache"))
    lines = _wiki(20)
    _tiny_gpt2(workdir / "gpt2-tiny", lines)
    (workdir / "wiki.test.raw").write_text("\n".join(lines))
    datasets.DatasetDict({"test": datasets.Dataset.from_dict({"text": lines})}).save_to_disk(str(workdir / "wikitext"))
    cfg = _causal_lm_smoke(**{"text_path": "wiki.test.raw", **change})
    w = registry.load("martingale_uq")
    w.validate(cfg)
    with pytest.raises(ConfigError, match=match):
        w.preflight(cfg)


def test_causal_lm_needs_a_model_and_a_text():
    with pytest.raises(ValueError, match="generator='causal_lm' needs model"):
        validate(dataclasses.replace(smoke(), generator="causal_lm", metric="nll"))


def test_the_real_sweep_is_valid_anywhere_and_names_what_it_needs(workdir, monkeypatch):
    from conftest import REPO
    from orchestrator.sweep import load_sweep_file
    from orchestrator.sweeps.tune_run import launch_problems

    monkeypatch.setenv("LADDER_DATA", str(workdir / "data"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(workdir / "empty-cache"))
    sweep = load_sweep_file(REPO / "sweeps" / "repro" / "martingale_uq_real.py")
    sweep.check()
    (problem,) = [p for p in launch_problems(sweep) if "text_path" in p]
    assert "model='gpt2' is neither a folder" in problem
    assert f"text_path='{workdir / 'data' / 'wikitext-2-raw'}' is neither" in problem and "Salesforce/wikitext" in problem


# --- the paper's image setting: a PixelCNN trained on CIFAR-10-like images, SVHN-like deployed ---------------


def test_pixelcnn_is_autoregressive_normalized_and_samples_its_own_distribution(tmp_path):
    """Over every 2 x 2 image of 2 levels (4,096 of them) an untrained PixelCNN's probabilities sum
    to 1, which only the causal masks allow; its samples' mean bits per dim is its entropy; a saved
    one loads to the same scores."""
    import itertools

    torch.manual_seed(shifted(0))
    model = pixelmodel.PixelCNN(levels=2, hidden=6, layers=1).eval()
    every = torch.tensor(list(itertools.product((0, 1), repeat=12))).view(-1, 2, 2, 3).permute(0, 3, 1, 2)
    bpd = pixelmodel.score(model, every, 4096, torch.device("cpu")).double()
    p = torch.exp2(-12 * bpd)
    assert p.sum().item() == pytest.approx(1.0, abs=1e-5)
    with torch.no_grad():  # a row's logits need only the rows above it (what sampling row by row relies on)
        torch.testing.assert_close(model(every[:64])[..., :1, :], model(every[:64, :, :1]))
    entropy = float((p * bpd).sum())  # bits per dim of a draw from the model, in expectation
    samples = pixelmodel.generate(model, 3000, 2, 1.0, torch.Generator().manual_seed(shifted(0)), 1000, torch.device("cpu"))
    assert samples.shape == (3000, 3, 2, 2) and set(samples.unique().tolist()) <= {0, 1}
    drawn = pixelmodel.score(model, samples, 3000, torch.device("cpu")).double()
    assert abs(drawn.mean().item() - entropy) < 4 * drawn.std().item() / math.sqrt(3000)  # margin: worst 1.52 sd over seeds 1-5 (threshold 4)
    pixelmodel.save(model, tmp_path / "g.pt", image_size=2)
    loaded, size = pixelmodel.load(tmp_path / "g.pt")
    assert size == 2 and torch.equal(pixelmodel.score(loaded, every[:50], 50, torch.device("cpu")), bpd[:50].float())
    assert pixelmodel.quantize(torch.tensor([0, 15, 16, 255], dtype=torch.uint8), 16).tolist() == [0, 0, 1, 15]


def _images(n: int, seed: int, shift: int, size: int = 12, wide: bool = False) -> list:
    """Small colour images with structure (a brightness class, a blue channel tied to the red one)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        a = np.clip(rng.integers(0, 4) * 60 + shift + rng.normal(0, 20, (size, size + 4 * wide, 3)), 0, 255)
        a[:, :, 2] = a[:, :, 0] // 2
        out.append(Image.fromarray(a.astype(np.uint8)))
    return out


@pytest.fixture(scope="module")
def image_sets(tmp_path_factory):
    """CIFAR-10's and SVHN's hub formats (save_to_disk DatasetDicts, columns img / image and label) and
    an imagefolder, at 12 x 12."""
    import datasets

    root = tmp_path_factory.mktemp("images")

    def saved(name: str, column: str, splits: dict) -> str:
        features = datasets.Features({column: datasets.Image(), "label": datasets.ClassLabel(num_classes=4)})
        datasets.DatasetDict({split: datasets.Dataset.from_dict({column: imgs, "label": [i % 4 for i in range(len(imgs))]},
                                                                features=features)
                              for split, imgs in splits.items()}).save_to_disk(str(root / name))
        return str(root / name)

    sets = {"cifar10": saved("cifar10", "img", {"train": _images(300, 0, 0), "test": _images(120, 1, 0)}),
            "svhn": saved("svhn", "image", {"test": _images(120, 2, 40, wide=True)})}
    for split in ("train", "test"):
        for label in ("a", "b"):
            (root / "folder" / split / label).mkdir(parents=True)
            for i, img in enumerate(_images(2, 3, 0)):
                img.save(root / "folder" / split / label / f"{i}.png")
    sets["folder"] = str(root / "folder")
    return sets


def test_images_read_from_a_saved_dataset_and_an_imagefolder(image_sets):
    svhn = imagedata.open_split(image_sets["svhn"], "test", "image_data", "image_split")
    assert imagedata.image_column(svhn, "", "image_data", "image_column") == "image"
    got = imagedata.pixels(svhn, "image", 12, [0, 5])
    first = svhn[0]["image"]
    assert first.size == (16, 12) and got.shape == (2, 3, 12, 12) and got.dtype == torch.uint8
    want = np.asarray(first.crop((2, 0, 14, 12)))  # the centre square, at its own size: no resampling
    assert torch.equal(got[0], torch.from_numpy(want.transpose(2, 0, 1).copy()))
    assert imagedata.pixels(svhn, "image", 6, [0]).shape == (1, 3, 6, 6)
    cifar = imagedata.open_split(image_sets["cifar10"], "train", "image_data", "image_split")
    assert imagedata.image_column(cifar, "", "image_data", "image_column") == "img" and len(cifar) == 300
    folder = imagedata.open_split(image_sets["folder"], "test", "image_data", "image_split")
    assert len(folder) == 4 and imagedata.image_column(folder, "", "image_data", "image_column") == "image"


def _pixels_smoke(sets: dict, **change) -> Config:
    """The image sweep's settings (sweeps/repro/martingale_uq_images.py) at the size of a test."""
    fields = dict(generator="pixels", metric="nll", image_data=sets["svhn"], generator_data=sets["cifar10"],
                  image_size=8, image_levels=16, pixel_hidden=12, pixel_layers=1, pixel_steps=60, pixel_batch=32,
                  lr=1e-2, real_images=100, prior_draws=100, lm_batch=100, horizon=20, log_every=10, alpha_c=1.0)
    return dataclasses.replace(smoke(), **{**fields, **change})


def test_a_pixelcnn_trained_on_saved_images_runs_through_the_workload_and_its_claims(workdir, image_sets):
    """The smoke of the image setting: the PixelCNN learns CIFAR-10-like training images (bits per dim
    going down), is saved, scores SVHN-like deployed images and its own samples; every interval is
    measured, the check and the plot run on the trial; loaded back, it gives the same metric values."""
    from orchestrator.runners import launch, registry
    from orchestrator.runners.config import to_dict

    cfg = _pixels_smoke(image_sets, generator_save="generator.pt")
    w = registry.load("martingale_uq")
    w.validate(cfg)
    w.preflight(cfg)
    result = launch.run_local("martingale_uq", cfg, progress=False, track=False)
    out = result.metrics
    losses = [m["train/loss"] for _, m in result.history if "train/loss" in m and "eval/bpd_real" not in m]
    assert len(losses) == 6 and all(math.isfinite(x) for x in losses)
    # From about 4 bits (uniform over 16 levels). margin over seeds 1-5: the first loss worst 3.30
    # (threshold 4.5), the fall worst 1.47 bits (threshold 1.0)
    assert losses[-1] < losses[0] - 1.0 and losses[0] < 4.5
    assert out["train/loss"] == losses[-1] and (workdir / "generator.pt").is_file()
    # The shifted digits are less likely than its own samples. margin: theta_true - theta_prior worst
    # 6.18 bits per dim over seeds 1-5 (8.02 against 1.84 at seed 1; threshold 1.0)
    assert out["eval/theta_true"] - out["eval/theta_prior"] > 1.0 and out["eval/theta_prior"] > 0
    for n in cfg.ns:
        for variant in ("exact", "shortcut", "bootstrap", "horizon"):
            assert 0 <= out[f"eval/coverage/{variant}/n{n}"] <= 1 and out[f"eval/width/{variant}/n{n}"] > 0
    trial = {**to_dict(cfg), **out}
    holds, measured = shortcut_wider_than_exact([trial])
    # The check runs on the trial and reports its ratio; its verdict is not asserted: at this size the
    # two posteriors' sds are within sampling noise of each other (pixels_nll_sd_ratio 0.987-1.009
    # over seeds 1-5, the check failing at seeds 1-4), so `holds` is the seed's draw. The reproduction
    # judges the check at its own size (min sd ratio >= 1.25 over seeds 1-5).
    assert holds == (measured["min_sd_ratio"] > 1) and 0 < measured["pixels_nll_T1_sd_ratio"] < math.inf
    plot([trial], workdir / "claims.png")
    assert (workdir / "claims.png").stat().st_size > 0
    loaded = dataclasses.replace(cfg, generator_save="", generator_path="generator.pt")
    w.preflight(loaded)
    again = launch.run_local("martingale_uq", loaded, progress=False, track=False).metrics
    assert again["eval/theta_prior"] == out["eval/theta_prior"] and again["eval/theta_true"] == out["eval/theta_true"]
    assert again["train/loss"] == pytest.approx(out["eval/theta_true"])  # nothing fitted: its bits per dim of the deployed


@pytest.mark.parametrize("change, match", [
    ({"image_data": "no-such-folder"}, r"image_data='no-such-folder' is not a folder .*uoft-cs/cifar10.*save_to_disk"),
    ({"image_column": "pixels"}, r"has columns \['image', 'label'\], not image_column='pixels'"),
    ({"image_column": "label"}, r"column 'label' of image_data=.* cannot be read as images"),
    ({"image_split": "validation"}, r"has splits \['test'\], not image_split='validation'"),
    ({"generator_path": "missing.pt"}, r"generator_path='missing.pt' is not a file: expected a PixelCNN written by"),
    ({"generator_path": "small.pt"}, r"was trained with image_size=4, not image_size=8"),
    ({"generator_data": ""}, r"image_data=.* has splits \['test'\], not generator_split='train'"),
    ({"image_data": "CIFAR", "generator_data": "", "generator_split": "test"}, r"would be trained on the deployed images"),
    ({"real_images": 500, "horizon": 0}, r"holds 120 images, fewer than 500: lower real_images"),
])
def test_a_missing_image_dataset_column_or_generator_is_refused_before_the_run(workdir, image_sets, change, match):
    from orchestrator.runners import registry
    from orchestrator.runners.config import ConfigError

    pixelmodel.save(pixelmodel.PixelCNN(16, 3, 0), "small.pt", image_size=4)
    change = {k: image_sets["cifar10"] if v == "CIFAR" else v for k, v in change.items()}
    cfg = _pixels_smoke(image_sets, **change)
    w = registry.load("martingale_uq")
    w.validate(cfg)
    with pytest.raises(ConfigError, match=match):
        w.preflight(cfg)


def test_pixels_configs_name_the_problem():
    base = dataclasses.replace(smoke(), generator="pixels", metric="nll", real_images=200)
    for change, match in [({}, "needs image_data"), ({"pixel_hidden": 10}, "multiple of 3"),
                          ({"image_levels": 300}, "image_levels"), ({"real_images": 30}, "raise real_images"),
                          ({"generator_path": "g.pt", "generator_save": "h.pt"}, "set one of them")]:
        with pytest.raises(ValueError, match=match):
            validate(dataclasses.replace(base, image_data="x", **change) if change else base)


def test_the_image_sweep_is_valid_anywhere_and_names_what_it_needs(workdir, monkeypatch):
    from conftest import REPO
    from orchestrator.sweep import load_sweep_file
    from orchestrator.sweeps.tune_run import launch_problems

    monkeypatch.setenv("LADDER_DATA", str(workdir / "data"))
    sweep = load_sweep_file(REPO / "sweeps" / "repro" / "martingale_uq_images.py")
    sweep.check()
    assert sweep.trial_count() == 6
    (problem,) = [p for p in launch_problems(sweep) if "image_data" in p]
    assert f"image_data='{workdir / 'data' / 'cifar10'}' is not a folder" in problem
    assert "uoft-cs/cifar10" in problem and "ufldl-stanford/svhn" in problem and "save_to_disk" in problem
