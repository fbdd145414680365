from __future__ import annotations

import math

import pytest
import torch

import workloads.celerity_lm as clm
from conftest import assert_claims_hold, judged_claim, shifted
from workloads.celerity_lm.claims import (
    curves_complete, family_collapses, family_controls_match, final_loss_predicted_from_prefix, seed_noise,
    tau_sets_the_curve_shape,
)
from components.lm.corpus import DataError, corpus_files, is_heldout, load_corpus
from components.lm.schedule import lr_factor
from orchestrator.run import LocalRun


def test_stdlib_split_is_deterministic_and_disjoint():
    root, files = corpus_files("stdlib")
    rels = [p.relative_to(root).as_posix() for p in files]
    held = {r for r in rels if is_heldout(r, 0.1)}
    assert 0.05 < len(held) / len(rels) < 0.15
    assert all(is_heldout(r, 0.1) for r in held)  # same answer every time
    assert not any("site-packages" in r for r in rels)
    a_train, a_held = load_corpus("stdlib", heldout_frac=0.1, max_bytes=300_000)
    b_train, b_held = load_corpus("stdlib", heldout_frac=0.1, max_bytes=300_000)
    assert (a_train == b_train).all() and (a_held == b_held).all()
    assert bytes(a_held[:2000]) not in bytes(a_train)


def test_a_folder_of_text_files_is_a_corpus(tmp_path):
    for i in range(40):
        (tmp_path / f"doc{i}.txt").write_text(f"document {i}: " + "the quick brown fox " * 50)
    train, held = load_corpus(str(tmp_path), heldout_frac=0.2, max_bytes=0)
    assert len(train) > len(held) > 0
    with pytest.raises(DataError, match="does not exist"):
        load_corpus(str(tmp_path / "nope"), heldout_frac=0.1, max_bytes=0)


def test_tau_solves_weight_decay_and_back():
    cfg = clm.Config(width=96, tau=0.2)
    plan = clm.budget(cfg, params=336_000)
    assert plan.hidden_lr == pytest.approx(cfg.lr * 48 / 96)
    assert plan.tau == pytest.approx(0.2)
    assert plan.batch_tokens / (plan.hidden_lr * plan.weight_decay * plan.tokens) == pytest.approx(0.2)
    assert plan.tokens >= cfg.tpp * plan.params > plan.tokens - plan.batch_tokens
    fixed = clm.budget(clm.Config(width=96, weight_decay=0.1), params=336_000)
    assert fixed.weight_decay == 0.1 and fixed.tau == pytest.approx(
        fixed.batch_tokens / (fixed.hidden_lr * 0.1 * fixed.tokens)
    )


def test_schedule_warms_up_then_decays_to_zero():
    steps = 100
    values = [lr_factor(s, steps, 0.1) for s in range(1, steps + 1)]
    assert values[9] == 1.0 and values[0] == pytest.approx(0.1)
    assert all(b <= a for a, b in zip(values[9:], values[10:]))
    assert values[-1] == 0.0


def _logit_change_after_one_step(width: int, base_width: int) -> float:
    torch.manual_seed(shifted(0))  # the initialisation and the batch move with LADDER_TEST_SEED_SHIFT
    cfg = clm.Config(width=width, depth=2, head_dim=16, seq_len=32, base_width=base_width, base_depth=2)
    model, optimizer, _ = clm.build(cfg)
    x = torch.randint(0, 256, (8, 32), generator=torch.Generator().manual_seed(shifted(1)))
    before = model(x).detach()
    torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten()).backward()
    optimizer.step()
    return (model(x).detach() - before).std().item()


def test_mup_makes_the_first_update_width_independent():
    # With muP the logit change of one Adam step stays O(1) as width grows 8x; with the same
    # learning rates in standard parameterization (base_width = width) it grows with width.
    mup = _logit_change_after_one_step(384, 48) / _logit_change_after_one_step(48, 48)
    standard = _logit_change_after_one_step(384, 384) / _logit_change_after_one_step(48, 48)
    assert 0.5 < mup < 2.0, mup  # margin: 0.579 to 0.687 over seeds 1-9 (thresholds 0.5, 2.0)
    assert standard > 3.0, standard  # margin: worst 11.4 over seeds 1-9 (threshold 3.0)


def test_smoke_loss_falls():
    run = LocalRun_tmp()
    final = clm.train(clm.smoke(), run)
    losses = [m["train/loss"] for _, m in run.history if "train/loss" in m]
    assert losses[-1] < 0.7 * losses[0]  # margin: worst ratio 0.521 over seeds 1-9 (threshold 0.7)
    assert final["eval/loss"] < math.log(256) * 0.7  # margin: worst 0.484 x ln 256 over seeds 1-9 (threshold 0.7)
    assert final["tau"] > 0 and final["tpp"] == pytest.approx(4.0, rel=0.05)
    # the held-out curve comes back in the final metrics, one key per evaluation
    curve = sorted((float(k[len(clm.CURVE_PREFIX):]), v) for k, v in final.items() if k.startswith(clm.CURVE_PREFIX))
    reported = [(m["progress"], m["eval/loss"]) for _, m in run.history if "eval/loss" in m]
    assert len(curve) == len(reported) == 10
    for (frac, loss), (progress, reported_loss) in zip(curve, reported):
        assert frac == pytest.approx(progress, abs=1e-4) and loss == reported_loss
    assert curve[-1] == (1.0, final["eval/loss"])


def test_resumed_run_matches_an_uninterrupted_one(tmp_path):
    cfg = clm.smoke()
    whole = LocalRun(tmp_path / "whole")
    expect = clm.train(cfg, whole)

    class Crash(Exception):
        pass

    class CrashAfterSecondSave(LocalRun):
        saves = 0

        def save(self, state):
            super().save(state)
            self.saves += 1
            if self.saves == 2:
                raise Crash()

    with pytest.raises(Crash):
        clm.train(cfg, CrashAfterSecondSave(tmp_path / "split"))
    resumed = LocalRun(tmp_path / "split")
    got = clm.train(cfg, resumed)
    assert resumed.restored_step > 0
    # Model, optimizer and data order all come back: the curve continues exactly.
    assert got["train/loss"] == pytest.approx(expect["train/loss"], rel=1e-5)
    assert got["eval/loss"] == pytest.approx(expect["eval/loss"], rel=1e-5)
    # the curve evaluated before the crash comes back from the checkpoint
    curve = sorted(k for k in expect if k.startswith(clm.CURVE_PREFIX))
    assert sorted(k for k in got if k.startswith(clm.CURVE_PREFIX)) == curve and len(curve) == 10
    assert [got[k] for k in curve] == pytest.approx([expect[k] for k in curve], rel=1e-5)


def test_validate_rejects_bad_configs(tmp_path):
    with pytest.raises(ValueError, match="multiple of head_dim"):
        clm.validate(clm.Config(width=50, head_dim=16))
    with pytest.raises(ValueError, match="split over 3 workers"):
        clm.validate(clm.Config(batch_size=16), world_size=3)
    # The data folder is the launching machine's concern (a cluster's shared storage need not
    # exist where the sweep is checked): `validate` accepts it, `preflight` names it.
    missing = clm.Config(data=str(tmp_path / "missing"))
    clm.validate(missing)
    with pytest.raises(ValueError, match="does not exist"):
        clm.preflight(missing)


def LocalRun_tmp():
    import tempfile

    return LocalRun(tempfile.mkdtemp())


def test_every_rank_resumes_its_own_windows_from_rank_zeros_checkpoint():
    """Under data parallelism only rank 0 writes the checkpoint and every rank restores it: rank 1
    must continue with its own windows (not rank 0's), exactly as if it had never stopped."""
    from components.lm.corpus import BatchSampler

    data = torch.arange(5000, dtype=torch.int64).numpy() % 251
    ranks = [BatchSampler(data, 16, 4, seed=7, rank=r) for r in (0, 1)]
    for _ in range(9):
        for s in ranks:
            s.next()
    written = ranks[0].state()  # what rank 0 saved
    uninterrupted = [s.next()[0] for s in ranks]
    assert not torch.equal(uninterrupted[0], uninterrupted[1])  # the ranks draw different windows
    for rank, want in zip((0, 1), uninterrupted):
        restarted = BatchSampler(data, 16, 4, seed=7, rank=rank)
        restarted.load_state(written)
        assert torch.equal(restarted.next()[0], want), f"rank {rank} resumed on other windows"


# --- claims and checks, on hand-built trials ----------------------------------------------------


def shape(t, tau):
    """A normalized-curve shape that depends on tau: larger tau drops more early, less late."""
    return 1.0 + (0.6 if tau > 0.1 else 1.2) * (1.0 - t) ** (0.5 if tau > 0.1 else 2.0)


def family_trials(*, widths=(32, 48), taus=(0.05, 0.8), size_bend=0.0, seed=0, fracs=None, last=1.0):
    """One seed's trials: width w ends at loss 2/w^0.1 and follows shape(t, tau), bent by
    `size_bend` x (1 - t) per width step (0: perfect collapse). Batches follow B ∝ D^0.5."""
    fracs = fracs or [round(0.05 * i, 4) for i in range(1, 21)]
    fracs = [f for f in fracs if f <= last + 1e-9]
    out = []
    for tau in taus:
        for i, w in enumerate(widths):
            params = 12 * w * w * 2
            final = 2.0 / w**0.1
            batch = round(16 * math.sqrt(params / (12 * 48 * 48 * 2)))
            t = {"width": w, "depth": 2, "tau": tau, "tpp": 4.0, "params": float(params), "batch_size": batch,
                 "seq_len": 64, "seed": seed, "trial_id": f"w{w}-tau{tau}"}
            for f in fracs:
                t[f"{clm.CURVE_PREFIX}{f:.4f}"] = final * (shape(f, tau) + size_bend * i * (1.0 - f)) / shape(1.0, tau)
            t["eval/loss"] = t[f"{clm.CURVE_PREFIX}{fracs[-1]:.4f}"]
            out.append(t)
    return out


def test_claims_hold_on_the_papers_pattern():
    trials = family_trials()
    results = {c.__name__: c(trials) for c in clm.CLAIMS}
    assert all(judged_claim(c, trials) for c in clm.CLAIMS), results
    assert results["family_collapses"][1]["max_spread"] == pytest.approx(0.0, abs=1e-12)
    assert results["final_loss_predicted_from_prefix"][1]["worst_rel_error"] < 1e-4  # the reference grid's interpolation
    assert results["tau_sets_the_curve_shape"][1]["tau_over_size"] > 1e6
    for check in clm.CHECKS:
        holds, measured = check(trials)
        assert holds, (check.__name__, measured)


def test_claims_fail_when_the_family_does_not_collapse():
    bent = family_trials(size_bend=0.3)  # the wider member's curve lies 0.3 x (1 - t) higher
    assert not judged_claim(family_collapses, bent)
    assert family_collapses(bent)[1]["max_spread"] == pytest.approx(0.3 * 0.7)
    assert not judged_claim(final_loss_predicted_from_prefix, bent)
    assert not judged_claim(tau_sets_the_curve_shape, bent)
    same_shape = family_trials(taus=(0.5, 0.8), size_bend=0.01)  # tau moves nothing: no tau effect
    assert tau_sets_the_curve_shape(same_shape)[1]["tau_over_size"] == pytest.approx(0.0, abs=1e-9)
    assert not judged_claim(tau_sets_the_curve_shape, same_shape)


def test_claims_need_a_family_at_every_tau_and_one_seed():
    with pytest.raises(ValueError, match="two or more widths"):
        family_collapses(family_trials(widths=(48,)))
    with pytest.raises(ValueError, match="two or more taus"):
        tau_sets_the_curve_shape(family_trials(taus=(0.05,)))
    with pytest.raises(ValueError, match="one seed"):
        family_collapses(family_trials() + family_trials(seed=1))
    with pytest.raises(ValueError, match="curve points"):
        family_collapses([{k: v for k, v in t.items() if not k.startswith("curve/")} for t in family_trials()])


def test_seed_noise_puts_seeds_in_place_of_widths():
    a, b = family_trials(seed=100), family_trials(seed=101, size_bend=0.0)
    for t in b:  # the second seed's curves lie higher early on, at every width alike
        for k in [k for k in t if k.startswith(clm.CURVE_PREFIX)]:
            t[k] *= 1.0 + 0.05 * (1.0 - float(k[len(clm.CURVE_PREFIX):]))
    noise = seed_noise(family_collapses, a + b)
    assert len(noise) == 2  # two widths x one pair of seeds
    fracs = [0.05 * i for i in range(6, 21)]
    gap = max(shape(f, tau) / shape(1.0, tau) * 0.05 * (1.0 - f) for tau in (0.05, 0.8) for f in fracs)
    assert noise == pytest.approx([gap, gap])
    assert seed_noise(final_loss_predicted_from_prefix, a + b)[0] > 0.01
    with pytest.raises(ValueError, match="two or more seeds"):
        seed_noise(family_collapses, a)


def test_checks_fail_on_a_broken_curve_or_recipe():
    short = family_trials()
    for t in short[:1]:
        del t[f"{clm.CURVE_PREFIX}1.0000"]
    holds, measured = curves_complete(short)
    assert not holds and measured["min_last_fraction"] == pytest.approx(0.95)
    off_law = family_trials()
    off_law[1]["batch_size"] *= 2  # the wider member's batch no longer grows as D^0.5
    holds, measured = family_controls_match(off_law)
    assert not holds and measured["batch_law_gap"] > measured["batch_law_allowed"]
    off_tpp = family_trials()
    off_tpp[0]["tpp"] = 8.0
    assert not family_controls_match(off_tpp)[0]


def test_plot_writes_a_png(tmp_path):
    path = tmp_path / "claims.png"
    clm.plot(family_trials() + family_trials(seed=1), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_reproduction_sweeps_are_a_recipe_family_at_two_taus():
    import runpy

    from conftest import REPO
    from orchestrator.reproduction import reproduce

    sizes = runpy.run_path(str(REPO / "sweeps" / "repro" / "celerity_lm.py"))
    for smoke in (True, False):
        sweep = reproduce.load_repro("celerity_lm", smoke=smoke, seed=7)
        base = sweep.check()
        proxy = sizes["SMOKE" if smoke else "FULL"]["base"]
        assert base.seed == 7
        taus = sorted({p["tau"] for p in sweep.points})
        assert len(taus) == 2 and taus[1] / taus[0] >= 4
        by_tau = [[p for p in sweep.points if p["tau"] == tau] for tau in taus]
        assert by_tau[0] == [{**p, "tau": taus[0]} for p in by_tau[1]]  # the same members at each tau
        for p in by_tau[0]:
            assert p["tpp"] == by_tau[0][0]["tpp"]
            if (p["width"], p["depth"]) == (proxy.width, proxy.depth):  # the proxy keeps its own batch
                assert p["batch_size"] == proxy.batch_size
        widths = [p["width"] for p in by_tau[0]]
        batches = [p["batch_size"] for p in by_tau[0]]
        assert len(widths) >= 2 and widths == sorted(widths) and batches == sorted(batches) and batches[0] < batches[-1]


# --- the reproduction -------------------------------------------------------------------------


@pytest.mark.slow
def test_smoke_reproduction_runs_and_its_checks_hold(workdir):
    from orchestrator.reproduction.reproduce import reproduce

    rep = reproduce("celerity_lm", smoke=True, local=True)
    assert not rep.failed_trials and len(rep.trials) == 4
    assert_claims_hold(rep, ["curves_complete", "family_controls_match"])
    expected = {"tau_sets_the_curve_shape": "tau_over_size", "family_collapses": "max_spread",
                "final_loss_predicted_from_prefix": "worst_rel_error"}
    assert {c.name for c in rep.claims} == set(expected)
    for c in rep.claims:
        assert not c.error, c
        assert expected[c.name] in c.measured and all(math.isfinite(v) for v in c.measured.values()), c


# --- the bench size ----------------------------------------------------------------------------


def spiked_family(bump: float):
    """Three collapsing widths at two taus, plus the middle width again at tau 0.8 whose held-out
    loss, equal to its twin's up to 50%, lies `bump` x (t - 0.5) / 0.05 (relative) above it after."""
    trials = family_trials(widths=(32, 48, 64))
    twin = next(t for t in trials if t["width"] == 48 and t["tau"] == 0.8)
    sick = {**twin, "lr_spike_at": 0.5, "lr_spike_len": 0.05, "lr_spike_factor": 10.0, "steps": 1000.0,
            "pathology/lr_spike_steps": 50.0, "trial_id": "spiked"}
    for k in [k for k in sick if k.startswith(clm.CURVE_PREFIX)]:
        f = float(k[len(clm.CURVE_PREFIX):])
        sick[k] = twin[k] * (1.0 + bump * max(0.0, f - 0.5) / 0.05)
    sick["eval/loss"] = sick[f"{clm.CURVE_PREFIX}1.0000"]
    return trials + [sick]


def test_pathology_claim_flags_a_bump_before_the_raw_loss(monkeypatch):
    import workloads.celerity_lm.claims as claims

    # deviation alarm at 1% of the final loss; raw alarm at 0.05 nats (final losses here ~1.35)
    monkeypatch.setattr(claims, "THETA_DEVIATION", 0.01)
    monkeypatch.setattr(claims, "THETA_RAW", 0.05)
    bumped = spiked_family(bump=0.005)  # +0.5% per evaluation after 50%
    holds, measured = claims.pathology_flagged_early(bumped)
    assert judged_claim(claims.pathology_flagged_early, bumped), measured
    # r(t) = bump (t-0.5)/0.05 x l(t) first exceeds 0.01 at 0.6 (0.01 x 1.38); the raw gap
    # bump (t-0.5)/0.05 x L(t) first exceeds 0.05 nats at 0.8 (0.03 x 1.72)
    assert measured["deviation_flag_at"] == pytest.approx(0.6)
    assert measured["raw_flag_at"] == pytest.approx(0.8) and measured["lead"] == pytest.approx(0.2)
    assert claims.pathology_injected(bumped)[0]
    flat = spiked_family(bump=0.0)  # no fault: neither alarm fires, so no lead
    holds, measured = claims.pathology_flagged_early(flat)
    assert not holds and measured["lead"] == 0.0 and measured["deviation_flag_at"] > 1.0
    assert not claims.pathology_injected(flat)[0]  # a "spiked" run whose curve never departed
    with pytest.raises(ValueError, match="exactly one spiked"):
        claims.pathology_flagged_early(family_trials(widths=(32, 48, 64)))


def test_the_bench_size_builds_and_passes_its_check(workdir):
    """`ladder reproduce celerity_lm --size bench --check`: three widths at TPP >= 20 at two taus, one
    run with an injected LR spike, and this machine can run it (the bench itself runs on demand)."""
    from orchestrator.reproduction import reproduce

    sweep = reproduce.load_repro("celerity_lm", size="bench", seed=shifted(0))
    points = list(sweep.trial_params())
    sick = [p for p in points if p.get("lr_spike_factor", 1.0) != 1.0]
    plain = [p for p in points if p not in sick]
    taus = sorted({p["tau"] for p in plain})
    assert len(taus) == 2 and taus[1] / taus[0] >= 4
    for tau in taus:
        assert len({p["width"] for p in plain if p["tau"] == tau}) >= 3
    assert all(p["tpp"] >= 20 for p in points)
    assert len(sick) == 1 and sick[0]["tau"] == taus[1] and sick[0]["lr_spike_factor"] >= 10
    assert {k: v for k, v in sick[0].items() if not k.startswith("lr_spike")} in plain  # a clean twin
    said = reproduce.check("celerity_lm", size="bench", local=True)
    assert said.startswith("celerity_lm at bench size: 21 trials (7 a seed") and said.endswith("ready to run"), said
