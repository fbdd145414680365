"""swd_rl: the age weights by hand and the sampler against them, the rank diagnostics on matrices
of known rank, the loop (TD3, SAC, resumption with and without the buffer), bad configs, MuJoCo,
the claims, and the smoke reproduction."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from torch import nn

from conftest import judged_claim, shifted
from orchestrator.run import LocalRun
from orchestrator.claims import spec_of
from orchestrator.runners import registry
from orchestrator.runners.config import ConfigError
from workloads.swd_rl import CHECKS, CLAIMS, Config, plot, smoke, train, validate
from workloads.swd_rl.learners import QNet
from workloads.swd_rl.claims import (
    BENCH_CHECKS, BENCH_CLAIMS, FULL_MIN_STEPS, PLASTICITY_RANK_RATIO, RANDOM_RETURN, agent_learns,
    critic_grad_ordered_late, critic_grad_swd_above_uniform_late, plasticity_loss_in_uniform,
    swd_return_above_uniform, swd_return_not_below_uniform,
)
from workloads.swd_rl.diagnostics import effective_rank, feature_rank, grad_stats, jacobian, ntk_rank
from workloads.swd_rl.replay import (
    ReplayBuffer, _shape_support_and_mass, age_probabilities, age_weights, sample_ages,
)


def tiny(**kw) -> Config:
    """Pendulum, a few hundred steps with 16-wide MLPs: a unit test's loop in about a second. Its
    seed moves with LADDER_TEST_SEED_SHIFT (conftest.shifted)."""
    base = dict(seed=shifted(0),
                env_id="Pendulum-v1", total_steps=800, learning_starts=200, buffer_size=800, decay_steps=200,
                batch_size=32, network="mlp", critic_width=16, critic_depth=1, actor_width=16, actor_depth=1,
                obs_norm=True, eval_every=400, eval_episodes=1, grad_every=1, probe_batches=1, diag_batch=16,
                log_every=100, checkpoint_every_frac=0.5)
    return Config(**{**base, **kw})


# --- the age weights and the sampler ---------------------------------------------------------


def test_age_weights_follow_the_decay_rule_by_hand():
    ages = np.array([1, 5, 9, 10, 20])  # T = 10, w_min = 0.1
    np.testing.assert_allclose(age_weights(ages, "swd", 10, 0.1), [0.9, 0.5, 0.1, 0.1, 0.1])
    np.testing.assert_allclose(age_weights(ages, "reverse", 10, 0.1), [0.2, 0.6, 1.0, 1.0, 1.0])
    np.testing.assert_allclose(age_weights(ages, "uniform", 10, 0.1), [1, 1, 1, 1, 1])
    # A buffer of 4 with T = 4: swd weights (0.75, 0.5, 0.25, 0.1) / 1.6, reverse (0.35, 0.6, 0.85, 1) / 2.8.
    np.testing.assert_allclose(age_probabilities(4, "swd", 4, 0.1), [0.46875, 0.3125, 0.15625, 0.0625])
    np.testing.assert_allclose(age_probabilities(4, "reverse", 4, 0.1), np.array([0.35, 0.6, 0.85, 1.0]) / 2.8)
    np.testing.assert_allclose(age_probabilities(4, "uniform", 4, 0.1), [0.25] * 4)


def test_reverse_is_the_mirror_of_swd():
    T, w_min = 50, 0.2
    ramp = np.arange(1, int(T * (1 - w_min)) + 1)  # on the ramp the two weights sum to 1 + w_min
    np.testing.assert_allclose(age_weights(ramp, "swd", T, w_min) + age_weights(ramp, "reverse", T, w_min), 1 + w_min)
    beyond = np.arange(int(T * (1 - w_min)) + 1, 3 * T)  # past it: swd sits on its floor, reverse on its cap
    np.testing.assert_allclose(age_weights(beyond, "swd", T, w_min), w_min)
    np.testing.assert_allclose(age_weights(beyond, "reverse", T, w_min), 1.0)


@pytest.mark.parametrize("n, ramp", [(1, 3.0), (10, 3.0), (10, 4.0), (10, 12.5), (100, 0.5), (7, 7.0)])
def test_closed_form_mass_of_the_shape(n, ramp):
    a = np.arange(1, n + 1)
    for sampler, g in (("swd", np.maximum(0, 1 - a / ramp)), ("reverse", np.minimum(1, a / ramp))):
        support, mass = _shape_support_and_mass(n, sampler, ramp)
        assert mass == pytest.approx(g.sum(), abs=1e-12), sampler
        assert np.all(g[support:] == 0) and (support == 0 or g[support - 1] > 0), sampler


@pytest.mark.parametrize("sampler, n, T, w_min", [
    ("swd", 60, 20, 0.1), ("reverse", 60, 20, 0.1), ("uniform", 60, 20, 0.1),
    ("swd", 60, 20, 0.0), ("reverse", 60, 90, 0.0), ("swd", 40, 1, 0.3), ("swd", 30, 100, 0.1),
])
def test_sampler_draws_the_exact_distribution(sampler, n, T, w_min):
    # Chi-square goodness of fit of 200k draws; the 0.999 quantile of chi2 with 59 dof is about 98.3.
    draws = 200_000
    ages = sample_ages(np.random.default_rng(7), n, draws, sampler, T, w_min)
    assert ages.min() >= 1 and ages.max() <= n
    expected = age_probabilities(n, sampler, T, w_min) * draws
    observed = np.bincount(ages, minlength=n + 1)[1:]
    nonzero = expected > 0
    assert np.all(observed[~nonzero] == 0)
    chi2 = float(((observed[nonzero] - expected[nonzero]) ** 2 / expected[nonzero]).sum())
    assert chi2 < 98.3, chi2


def test_buffer_stamps_ages_and_wraparound():
    buf = ReplayBuffer(capacity=3, obs_dim=1, act_dim=1)
    for i in range(5):  # entries 0..4; capacity 3 keeps 2, 3, 4
        buf.add(np.array([i]), np.array([0.0]), float(i), np.array([i + 1]), False)
    assert buf.size == 3 and buf.clock == 5
    assert sorted(buf.ages().tolist()) == [1, 2, 3]
    idx = buf.index_of_age(np.array([1, 2, 3]))
    np.testing.assert_array_equal(buf.obs[idx, 0], [4, 3, 2])  # age 1 is the newest
    np.testing.assert_array_equal(buf.clock - buf.stamps[idx], [1, 2, 3])


def test_buffer_sampling_by_stored_age_matches_the_rule():
    buf = ReplayBuffer(capacity=40, obs_dim=1, act_dim=1)
    for i in range(100):  # wrapped twice and a half
        buf.add(np.array([i]), np.array([0.0]), 0.0, np.array([i]), False)
    idx = buf.sample(np.random.default_rng(0), 100_000, "swd", 10, 0.1)
    stored_age = buf.clock - buf.stamps[idx]
    empirical = np.bincount(stored_age, minlength=41)[1:] / idx.size
    np.testing.assert_allclose(empirical, age_probabilities(40, "swd", 10, 0.1), atol=0.004)


# --- the diagnostics -------------------------------------------------------------------------


def test_effective_rank_by_hand():
    assert effective_rank(torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0])) == 3
    assert effective_rank(torch.tensor([10.0, 1.0, 0.001])) == 2  # 10 / 11.001 < 0.99 <= 11 / 11.001
    assert effective_rank(torch.tensor([10.0, 1.0, 0.001]), delta=0.1) == 1  # 10 / 11.001 >= 0.9
    assert effective_rank(torch.zeros(4)) == 0


def test_feature_rank_falls_when_features_collapse():
    # Plasticity loss as the bench measures it: features whose columns collapse onto fewer
    # directions have a lower srank than well-spread ones of the same shape.
    g = torch.Generator().manual_seed(1)
    spread = torch.randn(64, 32, generator=g, dtype=torch.float64)
    collapsed = torch.randn(64, 4, generator=g, dtype=torch.float64) @ torch.randn(4, 32, generator=g, dtype=torch.float64)
    assert feature_rank(collapsed) <= 4 < feature_rank(spread)
    model = Linear2()
    x = torch.randn(12, 4, generator=g)
    low = x[:, :1].repeat(1, 4)  # every input on one direction
    assert ntk_rank(model, (low[:, :3], low[:, 3:])) == 1 < ntk_rank(model, (x[:, :3], x[:, 3:]))


def test_feature_rank_of_a_matrix_of_known_rank():
    g = torch.Generator().manual_seed(0)
    u, _ = torch.linalg.qr(torch.randn(50, 50, generator=g, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(20, 20, generator=g, dtype=torch.float64))
    for rank in (1, 3, 7):
        m = u[:, :rank] @ v[:, :rank].T  # equal singular values, exactly rank `rank`
        assert feature_rank(m) == rank
        assert feature_rank(m + 1e-9 * torch.randn(50, 20, generator=g, dtype=torch.float64)) == rank


class Linear2(nn.Module):
    """Q(s, a) = w . [s, a]: its per-sample gradient is the input itself."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Linear(4, 1, bias=False)

    def forward(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        return self.w(torch.cat([obs, act], -1)).squeeze(-1)


def test_ntk_rank_of_a_linear_model_is_the_rank_of_its_inputs():
    e = torch.eye(4)
    for rank in (1, 2, 3):
        x = e[torch.arange(12) % rank]  # 12 rows spanning `rank` orthonormal directions equally
        obs, act = x[:, :3], x[:, 3:]
        torch.testing.assert_close(jacobian(Linear2(), (obs, act)), x)
        assert ntk_rank(Linear2(), (obs, act)) == rank


def test_jacobian_rows_are_per_sample_gradients():
    torch.manual_seed(0)
    q = QNet("simba", 3, 1, 8, 1)
    obs, act = torch.randn(5, 3), torch.randn(5, 1)
    j = jacobian(q, (obs, act))
    for i in range(5):
        q.zero_grad()
        q(obs[i:i + 1], act[i:i + 1]).sum().backward()
        torch.testing.assert_close(j[i], torch.cat([p.grad.flatten() for p in q.parameters()]))


def test_grad_stats_by_hand():
    p = nn.Parameter(torch.zeros(4))
    p.grad = torch.tensor([3.0, -4.0, 0.0, 1e-9])
    s = grad_stats([p])
    assert s["l1"] == pytest.approx(7.0) and s["l2"] == pytest.approx(5.0) and s["grama"] == 0.5


# --- the loop ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_short_run_reports_returns_gradients_and_ranks(tmp_path, algo):
    run = LocalRun(tmp_path)
    out = train(tiny(algo=algo), run)
    for key in ("eval/return", "eval/return_late", "train/grad_l1_late", "train/grad_l2_late", "train/grama_late",
                "diag/feature_rank", "diag/ntk_rank", "diag/probe_l1/swd", "diag/probe_l1/reverse"):
        assert math.isfinite(out[key]), key
    assert -1700 * 4 < out["eval/return"] <= 0  # Pendulum returns per 200-step episode lie in [-16.3 * 200, 0]
    assert 1 <= out["diag/feature_rank"] <= 16 and 1 <= out["diag/ntk_rank"] <= 16
    # ||g||_1 >= ||g||_2 for every gradient (equal only with one non-zero entry), so their late means too
    assert out["train/grad_l1_late"] > out["train/grad_l2_late"] > 0
    assert {k for k in out if k.startswith("curve/return/")} == {"curve/return/400", "curve/return/800"}
    losses = [m["train/loss"] for _, m in run.history if "train/loss" in m]
    assert losses and all(math.isfinite(v) for v in losses)
    if algo == "sac":
        assert any("train/alpha" in m for _, m in run.history)


class KeepsCritics(LocalRun):
    """A LocalRun that keeps a copy of the critic's weights at each checkpoint, by step."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.critics: dict[int, dict[str, torch.Tensor]] = {}

    def save(self, state):
        super().save(state)
        self.critics[int(state["step"])] = {k: v.clone() for k, v in state["learner"]["critic"].items()}


@pytest.mark.slow
def test_samplers_share_warmup_and_differ_after_the_first_update(tmp_path):
    runs = {s: KeepsCritics(tmp_path / s) for s in ("swd", "reverse")}
    out = {s: train(tiny(sampler=s, total_steps=400, eval_every=200), run) for s, run in runs.items()}
    a, b = runs["swd"].critics, runs["reverse"].critics
    assert sorted(a) == sorted(b) == [200, 400]  # the first episode end at half the run, and the end
    # No update before step 201 (learning_starts = 200): the same critic bit for bit, the same evaluation.
    assert all(torch.equal(a[200][k], b[200][k]) for k in a[200])
    assert out["swd"]["curve/return/200"] == out["reverse"]["curve/return/200"]
    # Then 200 updates on batches the two samplers draw differently: the critics' weights differ.
    assert not all(torch.equal(a[400][k], b[400][k]) for k in a[400])


class Dies(LocalRun):
    def save(self, state):
        super().save(state)
        raise KeyboardInterrupt


@pytest.mark.slow
def test_resumed_run_with_its_buffer_ends_where_an_uninterrupted_one_does(tmp_path):
    cfg = tiny()
    whole = train(cfg, LocalRun(tmp_path / "whole"))
    with pytest.raises(KeyboardInterrupt):
        train(cfg, Dies(tmp_path / "cut"))
    resumed = LocalRun(tmp_path / "cut")
    again = train(cfg, resumed)
    assert resumed.restored_step == 400  # the first episode end at or after half of the run
    assert again == pytest.approx(whole, rel=1e-9, nan_ok=True)


@pytest.mark.slow
def test_resumed_run_without_its_buffer_refills_before_updating(tmp_path):
    cfg = tiny(checkpoint_buffer=False)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, Dies(tmp_path))
    resumed = LocalRun(tmp_path)
    out = train(cfg, resumed)
    assert resumed.restored_step == 400
    with_loss = [s for s, m in resumed.history if "train/loss" in m]
    # learning_starts = 200 new transitions go into the empty buffer before the next update.
    assert with_loss and min(with_loss) == 600
    assert math.isfinite(out["train/grad_l1_late"])


# --- configs ----------------------------------------------------------------------------------


@pytest.mark.parametrize("change, message", [
    ({"sampler": "swa"}, "sampler must be 'swd', 'reverse' or 'uniform'"),
    ({"decay_steps": -80_000}, "sampler='reverse'|'reverse' for its T < 0"),
    ({"decay_steps": 0}, "'uniform' for the paper's T = 0"),
    ({"min_weight": 1.5}, "min_weight must lie in"),
    ({"algo": "ddpg"}, "algo must be"),
    ({"network": "resnet"}, "network must be"),
    ({"utd": 0}, "utd must be at least 1"),
    ({"learning_starts": 100, "batch_size": 256}, "below batch_size=256"),
    ({"learning_starts": 2_000_000}, "learning_starts=2000000 must lie in"),
    ({"late_frac": 0.0}, "late_frac must lie in"),
    ({"late_frac": 1.0}, "late window starts before learning_starts"),
    ({"gamma": 1.0}, "0 <= gamma < 1"),
    ({"diag_batch": 20_000}, "lower diag_batch"),
    ({"env_id": "Pendulum-v9"}, "not a registered gymnasium environment"),
    ({"env_id": "CartPole-v1"}, "need a Box action"),
    ({"threads": -1}, "threads must be"),
])
def test_bad_configs_name_the_problem(change, message):
    with pytest.raises(ValueError, match=message):
        validate(dataclasses.replace(smoke(), **change))


def test_more_than_one_worker_is_refused():
    with pytest.raises(ConfigError, match="workers=1"):
        registry.load("swd_rl").validate(smoke(), world_size=2)


def test_mujoco_imports_and_its_tasks_step(workdir):
    pytest.importorskip("mujoco")
    import gymnasium as gym

    validate(Config())  # HalfCheetah-v5, the full size
    for env_id in ("HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5"):
        env = gym.make(env_id)
        obs, _ = env.reset(seed=0)
        for _ in range(5):
            obs, reward, *_ = env.step(env.action_space.sample())
        assert np.all(np.isfinite(obs)) and math.isfinite(float(reward)), env_id
        env.close()


def test_a_mujoco_task_without_mujoco_is_refused_with_the_fix(tmp_path, monkeypatch):
    from workloads.swd_rl import config

    monkeypatch.setattr(config, "mujoco_available", lambda: False)
    validate(Config())  # a sweep's driver may lack MuJoCo while its workers have it
    with pytest.raises(ValueError, match=r"needs MuJoCo: pip install 'ladder\[mujoco\]'"):
        train(Config(), LocalRun(tmp_path))
    assert not (tmp_path / "checkpoints").exists()


# --- claims -----------------------------------------------------------------------------------


def trials_for(grads: dict[str, list[float]], returns: dict[str, list[float]], *, steps=4000, env="Pendulum-v1"):
    out = []
    for sampler in ("reverse", "uniform", "swd"):
        for seed, (g, r) in enumerate(zip(grads[sampler], returns[sampler])):
            out.append({"env_id": env, "algo": "td3", "utd": 1, "sampler": sampler, "seed": seed, "total_steps": steps,
                        "train/grad_l1_late": g, "eval/return_late": r,
                        "curve/grad_l1/1000": g, "curve/return/1000": r, "curve/ntk_rank/1000": 10.0})
    return out




def test_every_claim_is_declared():
    assert all(spec_of(fn) is not None for fn in CLAIMS) and CHECKS == []


def test_gradient_claim_measures_the_ordering():
    ordered = {"reverse": [1.0, 1.2], "uniform": [2.0, 2.2], "swd": [3.0, 3.4]}
    rets = {s: [-100.0, -110.0] for s in ordered}
    assert judged_claim(critic_grad_ordered_late, trials_for(ordered, rets))
    measured = critic_grad_ordered_late(trials_for(ordered, rets))[1]
    assert measured["swd"] == pytest.approx(3.2) and measured["uniform_over_reverse"] == pytest.approx(2.1 / 1.1)
    assert measured["smallest_ratio"] == pytest.approx(3.2 / 2.1)
    swapped = {"reverse": [2.5, 2.5], "uniform": [2.0, 2.2], "swd": [3.0, 3.4]}
    assert not judged_claim(critic_grad_ordered_late, trials_for(swapped, rets))
    swd_smallest = {"reverse": [1.0, 1.2], "uniform": [2.0, 2.2], "swd": [1.5, 1.6]}  # the smoke size's pattern
    assert not judged_claim(critic_grad_ordered_late, trials_for(swd_smallest, rets))
    with pytest.raises(ValueError, match="all three samplers"):
        critic_grad_ordered_late([t for t in trials_for(ordered, rets) if t["sampler"] != "reverse"])


def test_return_claim_is_not_judged_at_smoke_size_and_judged_at_full_size():
    grads = {"reverse": [1.0] * 5, "uniform": [2.0] * 5, "swd": [3.0] * 5}
    close = {"reverse": [0.0] * 5, "uniform": [3000, 3100, 2900, 3050, 2950], "swd": [2980, 3120, 2880, 3000, 2960]}
    holds, measured = swd_return_not_below_uniform(trials_for(grads, close))
    assert holds is None and measured["gap"] == pytest.approx(-12.0)  # smoke steps: numbers shown, not judged
    one_seed = swd_return_not_below_uniform(trials_for(grads, {k: v[:1] for k, v in close.items()}))
    assert one_seed[0] is None and math.isnan(one_seed[1]["worst_gap_in_seed_noise"])
    full = trials_for(grads, close, steps=FULL_MIN_STEPS, env="Hopper-v5")
    assert judged_claim(swd_return_not_below_uniform, full) is True
    worse = {**close, "swd": [2000, 2100, 1900, 2050, 1950]}
    worse_trials = trials_for(grads, worse, steps=FULL_MIN_STEPS, env="Hopper-v5")
    holds, measured = swd_return_not_below_uniform(worse_trials)
    assert judged_claim(swd_return_not_below_uniform, worse_trials) is False
    assert measured["gap"] < -2 * measured["seed_noise"]
    assert measured["worst_gap_in_seed_noise"] == pytest.approx(measured["gap"] / measured["seed_noise"])
    two_seeds = {s: v[:2] for s, v in close.items()}
    assert swd_return_not_below_uniform(trials_for(grads, two_seeds, steps=FULL_MIN_STEPS))[0] is None


def bench_seed(returns: dict[str, float], grads: dict[str, float], ntk: list[float]) -> list[dict]:
    """One bench seed's three trials (10,000 steps, evaluations every 1,000, late window > 7,500); the
    uniform arm's NTK-rank curve is `ntk` at steps 1000..10000, the other arms' a flat 50."""
    out = []
    for sampler in ("reverse", "uniform", "swd"):
        ranks = ntk if sampler == "uniform" else [50.0] * 10
        t = {"env_id": "Pendulum-v1", "algo": "td3", "utd": 4, "sampler": sampler, "seed": 100, "total_steps": 10_000,
             "learning_starts": 1000, "late_frac": 0.25, "eval/return_late": returns[sampler],
             "train/grad_l1_late": grads[sampler]}
        for i, r in enumerate(ranks):
            step = 1000 * (i + 1)
            t |= {f"curve/ntk_rank/{step}": r, f"curve/grad_l1/{step}": 100.0 + step / 100,
                  f"curve/feature_rank/{step}": 20.0, f"curve/return/{step}": returns[sampler]}
        out.append(t)
    return out


def test_bench_claims_measure_the_paired_effects_and_the_rank_fall():
    assert all(spec_of(fn) is not None for fn in BENCH_CLAIMS) and all(spec_of(fn) is None for fn in BENCH_CHECKS)
    assert registry.load("swd_rl").claims_at("bench") == BENCH_CLAIMS
    falls = [60, 56, 50, 46, 44, 40, 36, 30, 30, 27]  # early: step 2000 (56); late: steps 8000-10000 (29)
    trials = bench_seed({"reverse": -300.0, "uniform": -200.0, "swd": -180.0}, {"reverse": 1.0, "uniform": 2.0, "swd": 3.0},
                        falls)
    held, m = swd_return_above_uniform(trials)
    assert held and m["return_gap"] == pytest.approx(20.0)
    held, m = critic_grad_swd_above_uniform_late(trials)
    assert held and m["swd_over_uniform"] == pytest.approx(1.5)
    held, m = plasticity_loss_in_uniform(trials)
    assert m["uniform_ntk_rank_late_over_early"] == pytest.approx(29 / 56) and held == (29 / 56 <= PLASTICITY_RANK_RATIO)
    assert m["ntk_rank_late_jitter"] == pytest.approx(3 / 30)
    flat = bench_seed({"reverse": -300.0, "uniform": -200.0, "swd": -260.0}, {"reverse": 3.0, "uniform": 2.0, "swd": 1.0},
                      [60.0] * 10)
    assert not swd_return_above_uniform(flat)[0] and not critic_grad_swd_above_uniform_late(flat)[0]
    assert not plasticity_loss_in_uniform(flat)[0]
    assert agent_learns(trials)[0] and not agent_learns(bench_seed(
        {"reverse": 0.0, "uniform": RANDOM_RETURN, "swd": 0.0}, {"reverse": 1.0, "uniform": 1.0, "swd": 1.0}, falls))[0]
    with pytest.raises(ValueError, match="one seed a build"):
        swd_return_above_uniform(trials + trials)


def test_the_bench_size_builds_and_passes_its_check(workdir):
    """`ladder reproduce swd_rl --size bench --check`: the bench (run on demand, not in CI) builds at
    every seed, as the smoke's three samplers at one seed, longer and at a high UTD, and this
    machine can run it."""
    from orchestrator.reproduction import reproduce

    smoke_sweep, bench = (reproduce.load_repro("swd_rl", size=size, seed=shifted(0)) for size in ("smoke", "bench"))
    assert bench.name == "repro-swd_rl-bench" and bench.trial_count() == smoke_sweep.trial_count() == 3
    assert {p["sampler"] for p in bench.trial_params()} == {"reverse", "uniform", "swd"}
    b, s = bench.base_config(), smoke_sweep.base_config()
    assert b.seed == s.seed == shifted(0) and b.env_id == "Pendulum-v1" and b.algo == "td3"
    assert b.utd >= 4 > s.utd and b.total_steps > s.total_steps and b.buffer_size >= b.total_steps
    assert b.utd * (b.total_steps - b.learning_starts) >= 4 * s.utd * (s.total_steps - s.learning_starts)  # updates
    said = reproduce.check("swd_rl", size="bench", local=True)
    assert said.startswith("swd_rl at bench size: 9 trials (3 a seed") and said.endswith("ready to run"), said


def test_plot_writes_a_png(tmp_path):
    path = tmp_path / "claims.png"
    plot(trials_for({"reverse": [1.0], "uniform": [2.0], "swd": [3.0]}, {"reverse": [-1.0], "uniform": [-1.0], "swd": [-1.0]}), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- the reproduction -------------------------------------------------------------------------


def test_reproduction_sweeps():
    from orchestrator.reproduction.reproduce import load_repro

    small = load_repro("swd_rl", smoke=True, seed=4)
    assert small.trial_count() == 3 and small.base_config().seed == 4
    assert {p["sampler"] for p in small.trial_params()} == {"reverse", "uniform", "swd"}
    full = load_repro("swd_rl", smoke=False, seed=0)
    assert full.trial_count() == 4 * 2 * 2 * 3 * 5
    assert {p["env_id"] for p in full.trial_params()} == {"HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5"}
    assert {p["utd"] for p in full.trial_params()} == {1, 4}


@pytest.mark.slow
def test_smoke_reproduction(workdir):
    from orchestrator.reproduction.reproduce import format_claims, reproduce

    rep = reproduce("swd_rl", smoke=True, local=True)
    assert not rep.failed_trials and len(rep.trials) == 3
    by_name = {c.name: c for c in rep.claims}
    assert set(by_name) == {c.__name__ for c in CLAIMS} and not rep.checks
    returns = by_name["swd_return_not_below_uniform"]
    assert returns.holds is None and not returns.error  # Pendulum at 4,000 steps: shown, not judged
    assert all(math.isfinite(returns.measured[k]) for k in ("return_swd", "return_uniform", "gap"))
    assert "not judged" in format_claims(rep)
    grads = by_name["critic_grad_ordered_late"]
    assert not grads.error and all(math.isfinite(v) and v > 0 for v in grads.measured.values())
    # The ordering itself is judged and reported by `ladder reproduce`, not asserted: at this size
    # SWD's late critic gradient is the smallest of the three on seeds 0-3 (swd/uniform 0.83, 0.86,
    # 0.90, 0.78) and the largest on seed 4 (1.09); the paper measures it over a million steps.
    assert grads.judged
