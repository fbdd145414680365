"""tubal_fgd: the t-product algebra against its definitions, the FGD maths against autograd, the
loop's early stopping and resumption, bad configs, the claims, and the smoke reproduction."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from orchestrator.runners import registry
from orchestrator.runners.config import ConfigError
from orchestrator.run import LocalRun
from workloads.tubal_fgd import CHECKS, CLAIMS, Config, plot, smoke, train, validate
from workloads.tubal_fgd.claims import (
    best_is_least_error, early_stopping_near_best, large_init_grows_with_rank, minimax_of, no_trial_diverged,
    small_init_flat_in_rank, small_init_near_minimax, small_init_overfits_late, small_init_starts_at_zero,
    spectral_grows_with_rank,
)
from workloads.tubal_fgd.problem import (
    adjoint, gradient, loss, make_problem, measure, minimax_level, relative_error, small_init, spectral_init,
    symmetrise,
)
from workloads.tubal_fgd.tensor import (
    t_gram, t_identity, t_product, t_transpose, top_factor, tubal_rank,
)
from workloads.tubal_fgd.workload import CURVE_PREFIX, Tracker, curve_steps, initial_factor, measurements
from conftest import judged_claim, DiesAtSave, shifted

f64 = torch.float64


def rand(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=f64)


def bcirc_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A * B from the definition: C_l = sum_j A_j B_{(l - j) mod k}, with no FFT."""
    k = a.shape[2]
    c = torch.zeros(a.shape[0], b.shape[1], k, dtype=a.dtype)
    for l in range(k):
        for j in range(k):
            c[:, :, l] += a[:, :, j] @ b[:, :, (l - j) % k]
    return c


def tiny(**kw) -> Config:
    """A problem small enough for a unit test to run to convergence in well under a second. Its seed
    moves with LADDER_TEST_SEED_SHIFT (conftest.shifted)."""
    base = dict(seed=shifted(0), n=6, k=3, rank=1, factor_rank=3, oversample=12.0, val_frac=0.25, noise_std=0.0,
                init_scale=1e-6, lr=0.3, steps=600, log_every=50, curve_points=10)
    return Config(**{**base, **kw})


# --- t-product algebra -----------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_t_product_matches_block_circulant_definition(k):
    a, b = rand(4, 3, k, seed=1), rand(3, 5, k, seed=2)
    torch.testing.assert_close(t_product(a, b), bcirc_product(a, b))


def test_t_product_hand_example():
    # k = 2: C_0 = A_0 B_0 + A_1 B_1, C_1 = A_0 B_1 + A_1 B_0, with 1 x 1 slices.
    a = torch.tensor([[[1.0, 2.0]]], dtype=f64)
    b = torch.tensor([[[3.0, 5.0]]], dtype=f64)
    torch.testing.assert_close(t_product(a, b), torch.tensor([[[13.0, 11.0]]], dtype=f64))


def test_t_transpose_reverses_slices_after_the_first():
    a = rand(2, 3, 4, seed=3)
    at = t_transpose(a)
    assert at.shape == (3, 2, 4)
    for l, src in enumerate([0, 3, 2, 1]):
        torch.testing.assert_close(at[:, :, l], a[:, :, src].T)


@pytest.mark.parametrize("k", [3, 4])
def test_transpose_of_product_and_identity(k):
    a, b = rand(4, 3, k, seed=4), rand(3, 2, k, seed=5)
    torch.testing.assert_close(t_transpose(t_product(a, b)), t_product(t_transpose(b), t_transpose(a)))
    torch.testing.assert_close(t_product(t_identity(4, k), a), a)
    torch.testing.assert_close(t_transpose(t_transpose(a)), a)


def test_product_size_mismatch_is_an_error():
    with pytest.raises(ValueError, match="inner sizes"):
        t_product(rand(4, 3, 3), rand(4, 3, 3))


@pytest.mark.parametrize("k", [3, 4])
def test_gram_is_u_times_u_transpose_and_has_its_tubal_rank(k):
    u = rand(7, 2, k, seed=6)
    x = t_gram(u)
    torch.testing.assert_close(x, t_product(u, t_transpose(u)))
    torch.testing.assert_close(x, t_transpose(x))
    assert tubal_rank(x) == 2
    assert tubal_rank(torch.zeros(3, 3, k, dtype=f64)) == 0


def test_tubal_rank_is_the_largest_fourier_slice_rank():
    # Slices (1, 1, 1) of a rank-one matrix: the DC Fourier slice is 3x it, the others vanish.
    m = torch.outer(torch.tensor([1.0, 2.0, 0.0], dtype=f64), torch.tensor([1.0, 0.0, 1.0], dtype=f64))
    a = torch.stack([m, m, m], dim=2)
    assert tubal_rank(a) == 1
    a[:, :, 1] = torch.eye(3, dtype=f64)  # now the non-DC Fourier slices carry the identity
    assert tubal_rank(a) == 3


@pytest.mark.parametrize("k", [3, 4])
@pytest.mark.parametrize("by", ["eig", "svd"])
def test_top_factor_recovers_a_psd_low_rank_tensor_exactly(k, by):
    # Even k has a real Nyquist slice besides the DC one: both must come back without phase loss.
    y = t_gram(rand(6, 2, k, seed=7))
    for rank in (2, 4):
        torch.testing.assert_close(t_gram(top_factor(y, rank, by=by)), y)


def test_top_factor_clips_or_keeps_negative_eigenvalues_by_mode():
    # diag(3, -2, 1) in the first slice only: every Fourier slice is that same diagonal matrix.
    y = torch.zeros(3, 3, 3, dtype=f64)
    y[:, :, 0] = torch.diag(torch.tensor([3.0, -2.0, 1.0], dtype=f64))
    expect_eig = torch.zeros_like(y)
    expect_eig[:, :, 0] = torch.diag(torch.tensor([3.0, 0.0, 1.0], dtype=f64))
    expect_svd = torch.zeros_like(y)
    expect_svd[:, :, 0] = torch.diag(torch.tensor([3.0, 2.0, 0.0], dtype=f64))
    torch.testing.assert_close(t_gram(top_factor(y, 2, by="eig")), expect_eig)
    torch.testing.assert_close(t_gram(top_factor(y, 2, by="svd")), expect_svd)
    with pytest.raises(ValueError, match="rank must lie"):
        top_factor(y, 4)


# --- measurements and the gradient -----------------------------------------------------------


def test_symmetrised_sensing_is_symmetric_and_measures_symmetric_tensors_alike():
    a = rand(5, 4, 4, 3, seed=8)
    s = symmetrise(a)
    torch.testing.assert_close(t_transpose(s), s)
    x = t_gram(rand(4, 2, 3, seed=9))
    torch.testing.assert_close(measure(s.reshape(5, -1), x), measure(a.reshape(5, -1), x))


def test_adjoint_is_the_transpose_of_measure():
    a = rand(7, 4 * 4 * 3, seed=10)
    x, z = rand(4, 4, 3, seed=11), rand(7, seed=12)
    lhs = torch.dot(measure(a, x), z)
    rhs = (x * adjoint(a, z, (4, 4, 3))).sum()
    torch.testing.assert_close(lhs, rhs)


def test_problem_target_measurements_and_seeding():
    p = make_problem(n=5, k=3, rank=2, measurements=40, val_measurements=10, noise_std=0.0, seed=3)
    assert p.a_train.shape == (40, 75) and p.a_val.shape == (10, 75)
    assert float(torch.linalg.vector_norm(p.target)) == pytest.approx(1.0)
    assert tubal_rank(p.target) == 2
    torch.testing.assert_close(measure(p.a_train, p.target), p.y_train)  # noise-free
    again = make_problem(n=5, k=3, rank=2, measurements=40, val_measurements=10, noise_std=0.0, seed=3)
    other = make_problem(n=5, k=3, rank=2, measurements=40, val_measurements=10, noise_std=0.0, seed=4)
    torch.testing.assert_close(again.y_val, p.y_val)
    assert not torch.allclose(other.target, p.target)


def test_gradient_matches_autograd_of_the_loss():
    p = make_problem(n=5, k=4, rank=2, measurements=60, val_measurements=1, noise_std=0.1, seed=1)
    u = rand(5, 3, 4, seed=13).requires_grad_(True)
    loss(p, u).backward()
    torch.testing.assert_close(gradient(p, u.detach()), u.grad)


def test_small_init_scale_and_spectral_init_of_noise_free_data():
    u0 = small_init(30, 10, 3, 1e-3, seed=0)
    assert float(u0.std()) == pytest.approx(1e-3 / math.sqrt(10), rel=0.1)
    p = make_problem(n=6, k=3, rank=1, measurements=4000, val_measurements=1, noise_std=0.0, seed=2)
    # (1/m) M*(y) -> X* as m grows: the spectral start is already close, and no worse for larger R.
    assert relative_error(p, t_gram(spectral_init(p, 1))) < 0.05
    assert relative_error(p, t_gram(spectral_init(p, 6, by="svd"))) > relative_error(p, t_gram(spectral_init(p, 1)))


def test_large_init_is_the_small_draw_scaled_up():
    # init='large' draws U_0 ~ N(0, large_init_scale^2 / R) from the same stream as small init:
    # the same tensor times large_init_scale / init_scale, so the two arms are paired.
    p = make_problem(n=5, k=3, rank=1, measurements=20, val_measurements=1, noise_std=0.0, seed=4)
    cfg = tiny(n=5, factor_rank=4, init_scale=1e-3, large_init_scale=0.5)
    small = initial_factor(cfg, p)
    large = initial_factor(dataclasses.replace(cfg, init="large"), p)
    torch.testing.assert_close(large, small * 500.0)
    assert float(large.std()) == pytest.approx(0.5 / math.sqrt(4), rel=0.5)  # 60 entries


@pytest.mark.parametrize("k", [1, 3, 4])
def test_packed_symmetric_sensing_matches_the_dense_operator(k):
    from workloads.tubal_fgd.problem import SymmetricSensing

    p = make_problem(n=5, k=k, rank=2, measurements=30, val_measurements=1, noise_std=0.1, seed=5)
    op = SymmetricSensing(p.a_train, p.shape)
    # one column per pair X[i, j, l] = X[j, i, -l]: (n^2 k + fixed entries) / 2, the fixed ones i = j
    # at l = 0 (and l = k/2 for even k): e.g. (75 + 5) / 2 = 40 columns at k = 3
    fixed = 5 * (2 if k % 2 == 0 else 1)
    assert op.a.shape == (30, (25 * k + fixed) // 2)
    x, z = t_gram(rand(5, 3, k, seed=15)), rand(30, seed=16)
    torch.testing.assert_close(op.measure(x), measure(p.a_train, x))
    torch.testing.assert_close(op.adjoint(z), adjoint(p.a_train, z, p.shape))


def test_minimax_level_hand_worked():
    # n r k sigma^2 / m: 16 * 2 * 3 * 0.1^2 / 576 = 0.96 / 576 = 1 / 600, the smoke's level
    assert minimax_level(16, 2, 3, 0.1, 576) == pytest.approx(1 / 600)
    assert minimax_level(30, 3, 3, 0.2, 1458) == pytest.approx(270 * 0.04 / 1458)
    assert minimax_of(trials_for([1, 1, 1, 1], [1, 1, 1, 1])) == pytest.approx(1 / 600)
    with pytest.raises(ValueError, match="mix problem sizes"):
        minimax_of([{**t, "noise_std": 0.2 if t["factor_rank"] == 2 else 0.1}
                    for t in trials_for([1, 1, 1, 1], [1, 1, 1, 1])])


# --- the loop ---------------------------------------------------------------------------------


def test_tracker_best_and_early_stopped_iterates():
    t = Tracker(patience=0)
    for step, (rse, val) in enumerate([(5, 9), (3, 6), (1, 7), (2, 5), (4, 8)]):
        t.update(step, rse, val)
    assert (t.best_rse, t.best_step) == (1, 2)
    assert (t.es_rse, t.es_step, t.val_min) == (2, 3, 5)
    patient = Tracker(patience=1)
    for step, (rse, val) in enumerate([(5, 9), (3, 6), (1, 7), (2, 5)]):
        patient.update(step, rse, val)
    assert (patient.es_rse, patient.es_step) == (3, 1)  # frozen at step 2, one step without improvement
    assert patient.best_rse == 1


def test_curve_steps_are_log_spaced_and_include_the_ends():
    s = curve_steps(1000, 10)
    assert s[0] == 0 and s[-1] == 1000 and s == sorted(set(s))
    assert 10 in s and 100 in s


def test_noise_free_small_init_recovers_the_target_at_every_rank(tmp_path):
    for i, R in enumerate((1, 3)):
        out = train(tiny(factor_rank=R), LocalRun(tmp_path / str(i)))
        # margin: worst best_rse 7.7e-12 and rse 7.7e-12 over seeds 1-5 (threshold 1e-6), both at R = 3, seed 3
        assert out["eval/best_rse"] < 1e-6, out
        assert out["eval/rse"] < 1e-6 and out["eval/diverged"] == 0.0
        assert out[f"{CURVE_PREFIX}0"] == pytest.approx(1.0, abs=1e-6)  # U_0 U_0^T ~ 0: error of X = 0


def test_noisy_run_early_stops_before_its_over_fitted_end(tmp_path):
    out = train(tiny(noise_std=0.2, factor_rank=6, steps=3000), LocalRun(tmp_path))
    assert out["eval/es_rse"] >= out["eval/best_rse"]  # best: the least error of every iterate, by construction
    # margin: rse / best_rse worst 2.38 over seeds 1-5 (threshold 1)
    assert out["eval/rse"] > 1.0 * out["eval/best_rse"]
    # margin: es_step 128-555 over seeds 1-5 (thresholds 0 and 3000)
    assert 0 < out["eval/es_step"] < 3000


def test_too_large_a_step_is_reported_as_diverged(tmp_path):
    run = LocalRun(tmp_path)
    out = train(tiny(init="spectral", lr=50.0), run)
    assert out["eval/diverged"] == 1.0  # diverged at each of seeds 1-5 too
    assert run.history[-1][1]["progress"] == 1.0


def test_resumed_run_ends_where_an_uninterrupted_one_does(tmp_path):
    cfg = tiny(noise_std=0.1, factor_rank=3, checkpoint_every_frac=0.5)
    whole = train(cfg, LocalRun(tmp_path / "whole"))

    with pytest.raises(KeyboardInterrupt):
        train(cfg, DiesAtSave(tmp_path / "cut"))
    resumed = LocalRun(tmp_path / "cut")
    again = train(cfg, resumed)
    assert resumed.restored_step == cfg.steps // 2
    for key in ("eval/best_rse", "eval/best_step", "eval/es_rse", "eval/es_step", "eval/rse"):
        assert again[key] == pytest.approx(whole[key], rel=1e-9), key
    assert {k for k in again if k.startswith(CURVE_PREFIX)} == {k for k in whole if k.startswith(CURVE_PREFIX)}


# --- configs ----------------------------------------------------------------------------------


def test_measurement_split():
    assert measurements(Config()) == (1458, 162)  # m = 6 * 30 * 3 * 3, 10% held out
    assert measurements(smoke()) == (576, 576)


@pytest.mark.parametrize("change, message", [
    ({"factor_rank": 40}, "factor_rank=40 exceeds n=30"),
    ({"rank": 31}, "rank=31 exceeds n=30"),
    ({"val_frac": 0.0}, "val_frac must lie in"),
    ({"oversample": 0.01}, "raise oversample"),
    ({"init": "huge"}, "init must be 'small', 'spectral' or 'large'"),
    ({"init": "large", "large_init_scale": 0.0}, "large_init_scale must be positive"),
    ({"spectral_by": "qr"}, "spectral_by must be"),
    ({"init_scale": 0.0}, "init_scale must be positive"),
    ({"lr": -1.0}, "lr must be positive"),
    ({"steps": 0}, "steps must be positive"),
    ({"es_patience": -1}, "es_patience"),
    ({"threads": -1}, "threads must be"),
    ({"dtype": "float16"}, "dtype must be"),
])
def test_bad_configs_name_the_problem(change, message):
    with pytest.raises(ValueError, match=message):
        validate(dataclasses.replace(Config(), **change))


def test_more_than_one_worker_is_refused():
    with pytest.raises(ConfigError, match="workers=1"):
        registry.load("tubal_fgd").validate(Config(), world_size=2)


# --- claims -----------------------------------------------------------------------------------


LEVEL = 1 / 600
"""The minimax level of the smoke's problem (the fields trials_for writes): errors below are in its units."""


def trials_for(small_best, spectral_best, large_best=None, *, es_factor=1.0, last_factor=2.0, r=2):
    """One seed's trials at R = r..8r; errors in units of LEVEL, so that small_best is also the
    ratio to the minimax level. The large arm defaults to the spectral arm's errors."""
    out = []
    large_best = spectral_best if large_best is None else large_best
    for mult, sb, pb, lb in zip((1, 2, 4, 8), small_best, spectral_best, large_best):
        for init, best in (("small", sb), ("spectral", pb), ("large", lb)):
            best = best * LEVEL
            out.append({"init": init, "factor_rank": mult * r, "rank": r, "seed": 0,
                        "n": 16, "k": 3, "noise_std": 0.1, "oversample": 12.0, "val_frac": 0.5,
                        "eval/best_rse": best, "eval/es_rse": best * es_factor,
                        "eval/rse": best * (last_factor if mult > 1 else 1.0),
                        "eval/es_step": 10.0, "eval/best_step": 12.0, "eval/diverged": 0.0,
                        f"{CURVE_PREFIX}0": 1.0, f"{CURVE_PREFIX}100": best})
    return out


def test_claims_hold_on_the_papers_pattern():
    trials = trials_for([1.0, 1.05, 1.0, 1.1], [1.0, 2.0, 3.0, 3.5], [1.0, 2.5, 3.5, 4.0])
    results = {c.__name__: c(trials) for c in CLAIMS}
    assert all(holds for holds, _ in results.values()), results
    assert all(judged_claim(c, trials) for c in CLAIMS)
    assert all(c(trials)[0] for c in CHECKS) and len(CHECKS) == 3
    assert CLAIMS[0] is small_init_flat_in_rank and CLAIMS[1] is small_init_near_minimax  # the headline first
    assert results["small_init_flat_in_rank"][1]["best_spread"] == pytest.approx(1.1)
    assert results["small_init_near_minimax"][1]["worst_over_minimax"] == pytest.approx(1.1)
    assert results["small_init_near_minimax"][1]["large_best_over_minimax_8r"] == pytest.approx(4.0)
    assert results["large_init_grows_with_rank"][1]["ratio_8r_to_r"] == pytest.approx(4.0)
    assert results["spectral_grows_with_rank"][1]["ratio_8r_to_r"] == pytest.approx(3.5)
    assert results["small_init_overfits_late"][1]["last_over_best_8r"] == pytest.approx(2.0)


def test_claims_fail_when_the_pattern_is_absent():
    assert not judged_claim(small_init_flat_in_rank, trials_for([1.0, 1.1, 1.2, 1.3], [1, 1, 1, 1]))
    assert not judged_claim(spectral_grows_with_rank, trials_for([1, 1, 1, 1], [1.0, 1.2, 1.5, 1.9]))
    assert not judged_claim(large_init_grows_with_rank, trials_for([1, 1, 1, 1], [1, 2, 3, 4], [1.0, 1.1, 1.2, 1.3]))
    assert not judged_claim(early_stopping_near_best, trials_for([1, 1, 1, 1], [1, 1, 1, 1], es_factor=1.2))
    assert not judged_claim(small_init_overfits_late, trials_for([1, 1, 1, 1], [1, 1, 1, 1], last_factor=1.2))
    # flat in R but far above the minimax level: near-minimax fails, flatness holds
    far = trials_for([5.0, 5.0, 5.0, 5.0], [5, 10, 15, 20])
    assert judged_claim(small_init_flat_in_rank, far) and not judged_claim(small_init_near_minimax, far)
    assert small_init_near_minimax(far)[1]["worst_over_minimax"] == pytest.approx(5.0)
    # the early-stopped error alone spreading over R fails the flatness claim too
    es_spread = trials_for([1, 1, 1, 1], [1.0, 2.0, 3.0, 3.5])
    for t in es_spread:
        if t["init"] == "small" and t["factor_rank"] == 16:
            t["eval/es_rse"] = 1.3 * LEVEL
    assert not judged_claim(small_init_flat_in_rank, es_spread)
    assert small_init_flat_in_rank(es_spread)[1]["worst_spread"] == pytest.approx(1.3)


def test_checks_catch_what_cannot_happen():
    good = trials_for([1, 1, 1, 1], [1, 2, 3, 4])
    assert best_is_least_error(good)[0] and small_init_starts_at_zero(good)[0] and no_trial_diverged(good)[0]
    below = [{**t, "eval/es_rse": 0.5 * t["eval/best_rse"]} if t["init"] == "large" else t for t in good]
    assert not best_is_least_error(below)[0]
    assert best_is_least_error(below)[1]["min_gap"] < 0
    started = [{**t, f"{CURVE_PREFIX}0": 0.9} if t["init"] == "small" and t["factor_rank"] == 4 else t for t in good]
    assert not small_init_starts_at_zero(started)[0]
    assert small_init_starts_at_zero(started)[1]["max_start_gap"] == pytest.approx(0.1)
    blown = [{**t, "eval/diverged": 1.0} if t["init"] == "large" and t["factor_rank"] == 2 else t for t in good]
    assert no_trial_diverged(blown) == (False, {"diverged": 1.0})


def test_claims_average_over_seeds_and_need_r_and_8r():
    a = trials_for([1.0, 1.0, 1.0, 1.0], [1.0, 2.0, 3.0, 4.0])
    b = [{**t, "seed": 1, "eval/best_rse": t["eval/best_rse"] * (1.5 if t["factor_rank"] == 16 and t["init"] == "small" else 1.0)}
         for t in a]
    holds, measured = small_init_flat_in_rank(a + b)
    assert measured["best_R16"] == pytest.approx(1.25 * LEVEL) and measured["best_spread"] == pytest.approx(1.25)
    assert not holds
    with pytest.raises(ValueError, match="no trials at R"):
        spectral_grows_with_rank([t for t in a if t["factor_rank"] != 16])


def test_plot_writes_a_png(tmp_path):
    path = tmp_path / "claims.png"
    plot(trials_for([1.0, 1.0, 1.0, 1.0], [1.0, 2.0, 3.0, 4.0]), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- the reproduction -------------------------------------------------------------------------


@pytest.mark.slow
def test_smoke_reproduction_holds(workdir):
    from orchestrator.reproduction.reproduce import reproduce

    rep = reproduce("tubal_fgd", smoke=True, local=True)
    assert not rep.failed_trials
    assert len(rep.trials) == 12  # 3 inits x 4 ranks
    # margin: every claim holds at seeds 1-5, worst small_init_flat_in_rank worst_spread 1.039 (<= 1.15),
    # spectral_grows_with_rank ratio_8r_to_r 2.74 (>= 2), early_stopping_near_best worst_es_over_best
    # 1.045 (<= 1.1), small_init_overfits_late last_over_best_8r 2.23 (>= 1.5); the new claims at seeds
    # 0-4 and 100-104 (seed 10, LADDER_TEST_SEED_SHIFT=10, holds too): worst small_init_near_minimax
    # worst_over_minimax 1.474 (<= 2), large_init_grows_with_rank ratio_8r_to_r 2.79 (>= 2.75, seed 4:
    # the tightest; 3.59 at worst over seeds 100-104)
    assert rep.holds, rep.failures()
    expected = {
        "small_init_flat_in_rank": {"best_spread", "es_spread"},
        "small_init_near_minimax": {"worst_over_minimax", "large_best_over_minimax_8r", "spectral_best_over_minimax_8r"},
        "large_init_grows_with_rank": {"ratio_8r_to_r", "vs_small_at_8r"},
        "spectral_grows_with_rank": {"ratio_8r_to_r", "vs_small_at_8r"},
        "early_stopping_near_best": {"worst_es_over_best"},
        "small_init_overfits_late": {"last_over_best_8r", "last_over_best_r"},
    }
    assert [c.name for c in rep.checks] == ["best_is_least_error", "small_init_starts_at_zero", "no_trial_diverged"]
    assert all(c.holds for c in rep.checks), rep.checks
    for claim in rep.claims:
        assert expected[claim.name] <= set(claim.measured), claim
        assert all(math.isfinite(v) for v in claim.measured.values()), claim


# --- completion of real images ----------------------------------------------------------------


def _write_images(folder, count: int = 2, size: int = 16):
    """Real-format files: smooth colour gradients plus a rectangle and a disk (close to low tubal
    rank), alternately PNG and JPEG, written by PIL."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    i, j = torch.meshgrid(torch.arange(size, dtype=f64), torch.arange(size, dtype=f64), indexing="ij")
    for n in range(count):
        rgb = torch.stack([0.2 + 0.6 * i / size, 0.8 - 0.5 * j / size, 0.3 + 0.3 * (i + j) / (2 * size)], dim=2)
        rgb[3 + n:9 + n, 2:7] = torch.tensor([0.9, 0.2, 0.1], dtype=f64)
        rgb[((i - 11) ** 2 + (j - 10 + n) ** 2) < 10] = torch.tensor([0.1, 0.3, 0.9], dtype=f64)
        pixels = (rgb.clamp(0, 1) * 255).round().to(torch.uint8).numpy()
        suffix, options = (".png", {}) if n % 2 == 0 else (".jpg", {"quality": 95})
        Image.fromarray(pixels, "RGB").save(folder / f"img{n}{suffix}", **options)
    (folder / "notes.txt").write_text("not an image")
    return folder


def completion_smoke(image_dir, **kw) -> Config:
    """tubal_fgd's smoke config on the completion task."""
    base = dict(task="completion", image_dir=str(image_dir), observed_frac=0.5, val_frac=0.2, noise_std=0.03,
                factor_rank=8, steps=600, log_every=20, eval_every=1)
    return dataclasses.replace(smoke(), **{**base, **kw})


def test_outer_product_and_truncated_t_svd():
    from workloads.tubal_fgd.tensor import t_outer, t_spectral_norm, top_pair

    u, v = rand(5, 2, 4, seed=11), rand(7, 2, 4, seed=12)
    x = t_outer(u, v)
    torch.testing.assert_close(x, t_product(u, t_transpose(v)))
    assert tubal_rank(x) == 2
    for k in (3, 4):  # even k: the real Nyquist slice too
        y = t_outer(rand(6, 2, k, seed=13), rand(5, 2, k, seed=14))
        a, b = top_pair(y, 2)
        torch.testing.assert_close(t_outer(a, b), y)
        assert tubal_rank(t_outer(*top_pair(y, 1))) == 1
    m = torch.zeros(3, 2, 3, dtype=f64)
    m[:, :, 0] = torch.tensor([[3.0, 0.0], [0.0, 1.0], [0.0, 0.0]], dtype=f64)
    assert t_spectral_norm(m) == pytest.approx(3.0)


def test_images_load_as_rgb_or_frames_tensors(tmp_path):
    from workloads.tubal_fgd import images

    folder = _write_images(tmp_path / "imgs", count=3)
    assert [p.name for p in images.scan(str(folder))] == ["img0.png", "img1.jpg", "img2.png"]
    x = images.load(str(folder), "rgb", 0, 0, 0)
    assert x.shape == (16, 16, 3) and x.dtype == f64 and 0 <= x.min() and x.max() <= 1
    assert x[0, 0].tolist() == pytest.approx([51 / 255, 204 / 255, 77 / 255], abs=1 / 255)  # PNG is exact
    assert images.load(str(folder), "rgb", 1, 0, 8).shape == (8, 8, 3)
    frames = images.load(str(folder), "frames", 0, 2, 0)
    assert frames.shape == (16, 16, 2)
    assert images.tensor_shape(str(folder), "frames", 0, 0, 10) == (10, 10, 3)


def test_completion_gradients_match_autograd(tmp_path):
    from workloads.tubal_fgd import completion, images

    truth = images.load(str(_write_images(tmp_path / "imgs", count=1)), "rgb", 0, 0, 0)
    c = completion.make_completion(truth, observed_frac=0.4, val_frac=0.25, noise_std=0.1, seed=3)
    assert (c.train_idx.numel(), c.val_idx.numel()) == completion.observed_counts(768, 0.4, 0.25) == (230, 77)
    assert len(set(c.train_idx.tolist()) | set(c.val_idx.tolist())) == 307  # disjoint, no repeats
    u, v = completion.small_pair(c, 4, 1.0, seed=3)
    from workloads.tubal_fgd.tensor import t_spectral_norm
    assert t_spectral_norm(u) == pytest.approx(c.sigma_1 ** 0.5)
    u.requires_grad_(True)
    v.requires_grad_(True)
    completion.loss(c, u, v).backward()
    grad_u, grad_v = completion.gradients(c, u.detach(), v.detach())
    torch.testing.assert_close(grad_u, u.grad)
    torch.testing.assert_close(grad_v, v.grad)


def test_completion_of_real_images_recovers_them_through_the_sweeps_loader(workdir):
    """The smoke of the paper's image completion (`sweeps/repro/tubal_fgd_real.py`): PNG files read
    by the same loader, through `ladder run`'s in-process path. From small initialisation the
    held-out loss falls and the image is recovered far better than by the zero estimate."""
    from orchestrator.runners import launch, registry
    from workloads.tubal_fgd import completion, images

    folder = _write_images(workdir / "imgs", count=1)
    cfg = completion_smoke("imgs")
    registry.load("tubal_fgd").preflight(cfg)
    result = launch.run_local("tubal_fgd", cfg, progress=False, track=False)
    m = result.metrics
    held_out = [h["eval/loss"] for _, h in result.history]
    assert len(held_out) == 30 and all(math.isfinite(x) for x in held_out)
    c = completion.make_completion(images.load(str(folder), "rgb", 0, 0, 0), observed_frac=0.5, val_frac=0.2,
                                   noise_std=0.03, seed=cfg.seed)
    zero_loss = float(c.y_val.square().mean() / 2)  # the held-out loss of X = 0, where U_0 * V_0^T starts
    assert m["eval/init_rse"] == pytest.approx(1.0, abs=1e-6)  # the small init's product is ~0
    # measured: held-out loss 0.162 (zero estimate) -> 0.0100 at its minimum; error 1.0 -> 0.050 early-stopped
    # margin: min(held_out) / zero_loss worst 0.087 (seed 3) over seeds 1-5 (threshold 0.1);
    # held_out[-1] / held_out[0] worst 0.091 over seeds 1-5 (threshold 1)
    assert min(held_out) < 0.1 * zero_loss and held_out[-1] < 1.0 * held_out[0]
    # margin: es_rse worst 0.052 over seeds 1-5 (threshold 0.1); es_rse / best_rse worst 1.178 (seed 3) over
    # seeds 1-5 (threshold 1.2); best_rse <= es_rse by construction (best: the least error of every iterate)
    assert m["eval/es_rse"] < 0.1 and m["eval/best_rse"] <= m["eval/es_rse"] < 1.2 * m["eval/best_rse"]
    # After its minimum the held-out loss rises again (the noise is being fitted), so early stopping
    # (patience 0: the held-out argmin) stops before the end. Whether the last iterate's error is then
    # above the early-stopped one's depends on the seed at 600 steps: rse / es_rse 0.85-1.20 over
    # seeds 1-5 (above 1 at seeds 0 and 2 only), so that is not asserted.
    # margin: held_out[-1] / min(held_out) worst 1.020 (seed 5) over seeds 1-5 (threshold 1);
    # es_step worst 510 over seeds 1-5 (threshold < 600)
    assert held_out[-1] > 1.0 * min(held_out) and m["eval/es_step"] < cfg.steps
    # margin: es_psnr worst 18.5 over seeds 1-5 (threshold 15); not diverged at seeds 1-5
    assert m["eval/es_psnr"] > 15 and m["eval/diverged"] == 0.0
    assert result.history[-1][1]["progress"] == 1.0
    assert result.history[-1][1]["eval/es_psnr"] == m["eval/es_psnr"]  # the real sweep's objective, reported


def test_completion_from_large_or_spectral_init_does_worse_than_from_small(tmp_path):
    folder = _write_images(tmp_path / "imgs", count=1)
    small = train(completion_smoke(folder, steps=300), LocalRun(tmp_path / "small"))
    large = train(completion_smoke(folder, steps=300, init_scale=1.0), LocalRun(tmp_path / "large"))
    spectral = train(completion_smoke(folder, steps=300, init="spectral"), LocalRun(tmp_path / "spectral"))
    # measured best errors: small 0.048, large 1.55, spectral 1.01 (R = 8 factors of a 16 x 16 x 3
    # image fit its 307 training pixels exactly: only small initialisation keeps to the image)
    # margin: large init_rse worst 3.97 over seeds 1-5 (threshold 1); best_rse over small's worst 19.7
    # (large) and 19.7 (spectral) over seeds 1-5 (threshold 3)
    assert large["eval/init_rse"] > 1.0
    assert large["eval/best_rse"] > 3 * small["eval/best_rse"]
    assert spectral["eval/best_rse"] > 3 * small["eval/best_rse"]


def test_completion_frames_run_as_a_video_tensor(tmp_path):
    folder = _write_images(tmp_path / "frames", count=3)
    out = train(completion_smoke(folder, tensor_from="frames", frames=3, steps=300), LocalRun(tmp_path / "run"))
    assert out["eval/es_rse"] < 0.1 * out["eval/init_rse"]  # margin: worst ratio 0.025 over seeds 1-5 (threshold 0.1)


def test_resumed_completion_ends_where_an_uninterrupted_one_does(tmp_path):
    folder = _write_images(tmp_path / "imgs", count=1)
    cfg = completion_smoke(folder, steps=200, checkpoint_every_frac=0.5)
    whole = train(cfg, LocalRun(tmp_path / "whole"))
    with pytest.raises(KeyboardInterrupt):
        train(cfg, DiesAtSave(tmp_path / "cut"))
    resumed = LocalRun(tmp_path / "cut")
    again = train(cfg, resumed)
    assert resumed.restored_step == 100
    for key in ("eval/best_rse", "eval/es_rse", "eval/es_step", "eval/rse", "eval/loss", "eval/init_rse", "train/loss"):
        assert again[key] == pytest.approx(whole[key], rel=1e-9), key


@pytest.mark.parametrize("change, message", [
    ({"task": "completion"}, "task='completion' needs image_dir"),
    ({"image_dir": "imgs"}, "image_dir='imgs' is read only by task='completion'"),
    ({"task": "inpainting"}, "task must be 'simulation' or 'completion'"),
    ({"task": "completion", "image_dir": "imgs", "observed_frac": 0.0}, r"observed_frac must lie in \(0, 1\]"),
    ({"task": "completion", "image_dir": "imgs", "observed_frac": 1.5}, r"observed_frac must lie in \(0, 1\]"),
    ({"task": "completion", "image_dir": "imgs", "tensor_from": "gray"}, "tensor_from must be 'rgb'"),
    ({"task": "completion", "image_dir": "imgs", "image_size": -1}, "image_size must be >= 0"),
    ({"task": "completion", "image_dir": "imgs", "init": "large"}, "init='large' is the simulation's arm"),
])
def test_bad_completion_configs_name_the_field(change, message):
    with pytest.raises(ValueError, match=message):
        validate(dataclasses.replace(Config(), **change))


def test_completion_lifts_the_simulations_rank_bound():
    validate(dataclasses.replace(Config(), task="completion", image_dir="imgs", factor_rank=100))


@pytest.mark.parametrize("change, match", [
    ({"image_dir": "missing"}, "image_dir='missing' is not a folder .* Berkeley Segmentation Dataset"),
    ({"image_dir": "empty"}, "image_dir='empty' holds no image files; expected a folder of image files"),
    ({"image_index": 2}, "image_index=2 but image_dir holds 2 images: use 0..1"),
    ({"tensor_from": "frames", "frames": 3}, "frames=3 but image_dir holds 2 images"),
    ({"factor_rank": 17}, "factor_rank=17 exceeds min\\(n1, n2\\)=16"),
    ({"observed_frac": 0.001}, "raise observed_frac"),
])
def test_missing_or_unfit_image_folders_are_refused_before_the_run(workdir, change, match):
    from orchestrator.runners import registry
    from orchestrator.runners.config import ConfigError

    _write_images(workdir / "imgs", count=2)
    (workdir / "empty").mkdir()
    (workdir / "empty" / "readme.txt").write_text("no images here")
    cfg = completion_smoke(**{"image_dir": "imgs", **change})
    w = registry.load("tubal_fgd")
    w.validate(cfg)
    with pytest.raises(ConfigError, match=match):
        w.preflight(cfg)


def test_the_real_sweep_is_valid_anywhere_and_names_what_it_needs(workdir, monkeypatch):
    from conftest import REPO
    from orchestrator.sweep import load_sweep_file
    from orchestrator.sweeps.tune_run import launch_problems

    monkeypatch.setenv("LADDER_DATA", str(workdir / "data"))
    monkeypatch.delenv("LADDER_IMAGES", raising=False)
    sweep = load_sweep_file(REPO / "sweeps" / "repro" / "tubal_fgd_real.py")
    sweep.check()
    (problem,) = [p for p in launch_problems(sweep) if "image_dir" in p]
    assert f"image_dir='{workdir / 'data' / 'bsd'}' is not a folder" in problem
    assert "https://www2.eecs.berkeley.edu/Research/Projects/CS/vision/bsds/" in problem
    assert sweep.objective == ("eval/es_psnr", "max") and sweep.trial_count() == 180
    # with the images there, nothing is missing but what this machine's CPUs may lack
    _write_images(workdir / "data" / "bsd", count=5)
    assert not [p for p in launch_problems(sweep) if "image_dir" in p or "image_index" in p]
