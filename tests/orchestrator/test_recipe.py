"""Tests of the Celerity scaling recipe (orchestrator.recipe): pure arithmetic, no Ray."""

from __future__ import annotations

import dataclasses

import pytest

from orchestrator.recipe import (
    CELERITY_BATCH_SIZES,
    CELERITY_SHAPES,
    CELERITY_TAU_POINTS,
    ModelConfig,
    Proxy,
    ScalingLaws,
    adamw_timescale,
    celerity_params,
    family,
    fit_power_law,
    gpt_params,
    mup_lr,
    optimal_tau,
    scale,
    target_tau,
    weight_decay_for_tau,
)

PROXY = Proxy(width=48, depth=3, lr=2e-2, batch_size=32, seq_len=128, tpp=20.0, tau=0.2, warmup_frac=0.05)


def test_the_610m_check_gives_tau_0_105():
    # 610M (d = 2048, proxy d = 256): base LR 1.62e-2, lambda 0.1, D = 48.5B, B = 504 x 2048 tokens
    eta = mup_lr(1.62e-2, 2048, 256)
    assert eta == pytest.approx(1.62e-2 / 8)
    assert adamw_timescale(504 * 2048, eta, 0.1, 48.5e9) == pytest.approx(0.105, rel=0.01)
    # the unadjusted base LR would be 8x off: the muP adjustment is what makes it 0.105
    assert adamw_timescale(504 * 2048, 1.62e-2, 0.1, 48.5e9) == pytest.approx(0.105 / 8, rel=0.01)


def test_weight_decay_solved_from_tau_gives_tau_back():
    lam = weight_decay_for_tau(0.105, 504 * 2048, 1.62e-2 / 8, 48.5e9)
    assert lam == pytest.approx(0.1, rel=0.01)
    assert adamw_timescale(504 * 2048, 1.62e-2 / 8, lam, 48.5e9) == pytest.approx(0.105, rel=1e-12)


def test_default_tau_law_is_the_fit_to_celerity_bands():
    c, m = fit_power_law(*zip(*CELERITY_TAU_POINTS))
    laws = ScalingLaws()
    assert laws.tau_coef == pytest.approx(c, abs=0.01) and laws.tau_exp == pytest.approx(m, abs=0.01)
    for tpp, tau in CELERITY_TAU_POINTS:
        assert optimal_tau(tpp) == pytest.approx(tau, rel=0.03)
    pl = ScalingLaws.power_lines()
    assert pl.tau_exp == -0.52 and optimal_tau(20.0, pl) == pytest.approx(0.175)


def test_celerity_parameter_counts_and_batch_sizes():
    nominal = (0.5e9, 0.9e9, 1.8e9, 3.9e9)  # the 300M model counts 0.27B: its name is rounded up
    for (w, d), n in zip(CELERITY_SHAPES[1:], nominal):
        assert celerity_params(w, d) == pytest.approx(n, rel=0.03)
    proxy = Proxy(width=640, depth=13, lr=0.15, batch_size=176, seq_len=8192, tpp=20.0, tau=0.175)
    members = family(proxy, CELERITY_SHAPES, tpp=20.0, param_count=celerity_params)
    for cfg, table in zip(members, CELERITY_BATCH_SIZES):
        assert cfg.batch_size == pytest.approx(table, rel=0.05)  # B ∝ D^0.5 reproduces Table 2


def test_family_holds_tpp_tau_and_warmup_fixed_and_solves_weight_decay():
    shapes = [(48, 3), (64, 3), (96, 3), (128, 4)]
    members = family(PROXY, shapes, tpp=80.0, param_count=gpt_params)
    tau = PROXY.tau * (80.0 / 20.0) ** -0.5
    for cfg, (w, d) in zip(members, shapes):
        assert (cfg.width, cfg.depth) == (w, d)
        assert cfg.params == 12 * w * w * d
        assert cfg.tokens == cfg.steps * cfg.batch_tokens and cfg.batch_tokens == cfg.batch_size * 128
        assert cfg.tpp == pytest.approx(80.0, rel=0.05)
        assert cfg.tau == pytest.approx(tau)
        assert cfg.hidden_lr == pytest.approx(2e-2 * 48 / w) and cfg.lr == 2e-2
        assert adamw_timescale(cfg.batch_tokens, cfg.hidden_lr, cfg.weight_decay, cfg.tokens) == pytest.approx(tau)
        assert cfg.warmup_frac == 0.05
    batches = [m.batch_size for m in members]
    assert batches == sorted(batches) and batches[0] < batches[-1]
    # batch grows as the square root of the dataset, from the proxy's (4x its TPP here)
    assert members[0].batch_size == round(32 * 4**0.5)


def test_target_tau_without_a_tuned_tau_uses_the_law():
    untuned = dataclasses.replace(PROXY, tau=None)
    assert target_tau(234.0, untuned) == pytest.approx(0.78 * 234**-0.5)
    assert target_tau(20.0, PROXY) == 0.2


def test_a_workload_passes_its_own_parameter_count_and_gets_plain_dicts():
    def count(width: int, depth: int) -> int:
        return 1000 * width + depth

    cfg = scale(PROXY, 64, 3, tpp=20.0, param_count=count, batch_multiple=8)
    assert cfg.params == count(64, 3)
    assert cfg.batch_size % 8 == 0
    d = cfg.to_dict({"width", "depth", "lr", "weight_decay", "batch_size", "tpp", "tau", "nonexistent"})
    assert set(d) == {"width", "depth", "lr", "weight_decay", "batch_size", "tpp", "tau"}
    assert set(cfg.to_dict()) == {f.name for f in dataclasses.fields(ModelConfig)}


def test_warmup_cap_shrinks_the_warmup_fraction_of_long_runs():
    proxy = dataclasses.replace(PROXY, warmup_frac=0.1)
    cfg = scale(proxy, 2048, 40, tpp=20.0, warmup_tokens_cap=375e6)
    assert cfg.warmup_frac == pytest.approx(375e6 / cfg.tokens) and cfg.warmup_frac < 0.1
    assert scale(proxy, 2048, 40, tpp=20.0).warmup_frac == 0.1
