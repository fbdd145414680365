from __future__ import annotations

import math

import pytest
import torch

import workloads.celerity_lm as clm
from workloads.celerity_lm.data import DataError, corpus_files, is_heldout, load_corpus
from workloads.celerity_lm.workload import lr_factor
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
    torch.manual_seed(0)
    cfg = clm.Config(width=width, depth=2, head_dim=16, seq_len=32, base_width=base_width, base_depth=2)
    model, optimizer, _ = clm.build(cfg)
    x = torch.randint(0, 256, (8, 32), generator=torch.Generator().manual_seed(1))
    before = model(x).detach()
    torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten()).backward()
    optimizer.step()
    return (model(x).detach() - before).std().item()


def test_mup_makes_the_first_update_width_independent():
    # With muP the logit change of one Adam step stays O(1) as width grows 8x; with the same
    # learning rates in standard parameterization (base_width = width) it grows with width.
    mup = _logit_change_after_one_step(384, 48) / _logit_change_after_one_step(48, 48)
    standard = _logit_change_after_one_step(384, 384) / _logit_change_after_one_step(48, 48)
    assert 0.5 < mup < 2.0, mup
    assert standard > 3.0, standard


def test_smoke_loss_falls():
    run = LocalRun_tmp()
    final = clm.train(clm.smoke(), run)
    losses = [m["train/loss"] for _, m in run.history if "train/loss" in m]
    assert losses[-1] < 0.7 * losses[0]
    assert final["eval/loss"] < math.log(256) * 0.7
    assert final["tau"] > 0 and final["tpp"] == pytest.approx(4.0, rel=0.05)


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
    from workloads.celerity_lm.data import BatchSampler

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
