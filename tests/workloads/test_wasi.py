"""wasi: the custom Function against autograd, subspace iteration and Tucker compression against
their definitions, explained-variance rank by hand, the saved-bytes meter on known answers, the
loop's resumption, bad configs, the claims, and the smoke reproduction."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from conftest import judged_claim, assert_claims_hold, shifted
from orchestrator.runners import registry
from orchestrator.runners.config import ConfigError
from orchestrator.run import LocalRun
from workloads.wasi import CHECKS, CLAIMS, Config, plot, smoke, train, validate
from workloads.wasi.claims import (
    accuracy_within_one_point, flops_fewer, inference_faster, memory_ten_times_lower, peak_memory_lower, training_faster,
)
from workloads.wasi.data import augment_batch, make_splits
from workloads.wasi.lowrank import (
    WASILinearFunction, energy_rank, init_weight_factors, orthonormalize, subspace_step, subspace_step_flops,
    tucker_core, tucker_power_step, tucker_power_step_flops, tucker_restore,
)
from workloads.wasi.measure import PeakMemoryMeter, SavedTensorMeter, count_flops, measure_peak, time_steps
from workloads.wasi.model import Dense, ViT, WASILinear, to_dense, to_wasi

f64 = torch.float64


def rand(*shape: int, seed: int = 0, dtype=f64) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def with_spectrum(m: int, n: int, s: list[float], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(W = U diag(s) V^T with random orthonormal U, V; U)."""
    u = torch.linalg.qr(rand(m, len(s), seed=seed))[0]
    v = torch.linalg.qr(rand(n, len(s), seed=seed + 1))[0]
    return u @ torch.diag(torch.tensor(s, dtype=f64)) @ v.t(), u


def sin_angle(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest principal-angle sine between the column spaces of orthonormal a and b."""
    return float(torch.linalg.matrix_norm(a - b @ (b.t() @ a), ord=2))


# --- explained-variance rank and the weight subspace ------------------------------------------


def test_energy_rank_by_hand():
    # s = (3, 2, 1): energies 9, 4, 1 of 14, cumulative 9/14 = 0.643, 13/14 = 0.929, 1.
    s = torch.tensor([3.0, 2.0, 1.0])
    assert energy_rank(s, 0.5) == 1
    assert energy_rank(s, 9 / 14) == 1  # reaching the threshold exactly is enough
    assert energy_rank(s, 0.65) == 2
    assert energy_rank(s, 13 / 14) == 2
    assert energy_rank(s, 0.93) == 3
    assert energy_rank(s, 1.0) == 3
    assert energy_rank(torch.zeros(4), 0.9) == 1
    with pytest.raises(ValueError, match="threshold must lie"):
        energy_rank(s, 0.0)


def test_initial_factors_are_the_truncated_svd():
    w, u = with_spectrum(8, 6, [5.0, 4.0, 1.0, 0.5], seed=1)
    left, right, k = init_weight_factors(w, 0.9)  # energies 25, 16, 1, 0.25: 25/42.25 = 0.59, 41/42.25 = 0.97
    assert k == 2
    torch.testing.assert_close(left.t() @ left, torch.eye(2, dtype=f64))
    assert sin_angle(left, u[:, :2]) < 1e-10
    best = u[:, :2] @ (u[:, :2].t() @ w)
    torch.testing.assert_close(left @ right, best)


def test_warm_started_subspace_iteration_converges_to_the_top_subspace():
    s = [10.0, 9.0, 8.0, 2.0, 1.0, 0.5]
    w, u = with_spectrum(20, 12, s, seed=2)
    left = orthonormalize(rand(20, 3, seed=3))  # a cold start: a random basis
    errors = []
    for _ in range(12):
        left, right = subspace_step(w, left)
        errors.append(sin_angle(left, u[:, :3]))
    assert errors[-1] < 1e-10
    # Each step multiplies the angle by about (s4 / s3)^2 = 1/16 (W W^T is iterated).
    ratios = [b / a for a, b in zip(errors[1:5], errors[2:6])]
    assert all(r < 1.3 / 16 for r in ratios), ratios
    torch.testing.assert_close(left.t() @ left, torch.eye(3, dtype=f64))
    torch.testing.assert_close(left @ right, u[:, :3] @ (u[:, :3].t() @ w))
    # Warm start after W moves a little: one step shrinks the angle to the new top subspace by
    # the same factor (s4 / s3)^2, where a cold start would begin again from an angle near 1.
    w2 = w + 0.01 * rand(20, 12, seed=4)
    u2 = torch.linalg.svd(w2)[0][:, :3]
    before = sin_angle(left, u2)
    assert 1e-4 < before < 0.05
    assert sin_angle(subspace_step(w2, left)[0], u2) < 1.3 / 16 * before


def test_r_from_previous_is_the_released_update():
    w, u = with_spectrum(9, 7, [4.0, 3.0, 1.0, 0.1], seed=5)
    left = orthonormalize(u[:, :2] + 0.01 * rand(9, 2, seed=6))
    new_l, prev_r = subspace_step(w, left, r_from="previous")
    torch.testing.assert_close(prev_r, left.t() @ w)
    _, new_r = subspace_step(w, left, r_from="new")
    torch.testing.assert_close(new_r, new_l.t() @ w)
    # Sign-fixed QR keeps the orientation of a basis that barely moves: both updates agree closely.
    assert float(torch.linalg.matrix_norm(new_l @ prev_r - new_l @ new_r)) < 0.05 * float(torch.linalg.matrix_norm(w))


# --- Tucker compression -----------------------------------------------------------------------


def test_full_rank_modes_are_kept_whole_and_factors_are_orthonormal():
    x = rand(5, 4, 6, seed=7)
    for whole in ((5, 4, 6), (0, 0, 0), (9, 9, 9)):  # 0 or a rank reaching the size keeps the mode
        core, factors = tucker_power_step(x, whole, None, torch.Generator().manual_seed(0))
        assert factors == [None, None, None] and torch.equal(core, x)
    core, factors = tucker_power_step(x, (0, 2, 0), None, torch.Generator().manual_seed(0))
    assert core.shape == (5, 2, 6) and factors[0] is None and factors[2] is None
    torch.testing.assert_close(factors[1].t() @ factors[1], torch.eye(2, dtype=f64))
    projected = torch.einsum("bnc,nN->bNc", x, factors[1] @ factors[1].t())
    torch.testing.assert_close(tucker_restore(core, factors), projected)


def test_sequential_tucker_is_also_a_multilinear_projection():
    y = rand(9, 5, 7, seed=26)
    core, (u1, u2, u3) = tucker_power_step(y, (3, 2, 4), None, torch.Generator().manual_seed(4), sequential=True)
    assert core.shape == (3, 2, 4)
    projected = torch.einsum("bnc,bB,nN,cC->BNC", y, u1 @ u1.t(), u2 @ u2.t(), u3 @ u3.t())
    torch.testing.assert_close(tucker_restore(core, [u1, u2, u3]), projected)
    full, fs = tucker_power_step(y, (9, 5, 7), None, torch.Generator().manual_seed(5), sequential=True)
    torch.testing.assert_close(tucker_restore(full, fs), y)


def test_tucker_truncation_is_the_multilinear_projection_and_recovers_exact_low_rank():
    # x of exact multilinear rank (2, 2, 3): one randomised power step finds its subspaces.
    g = rand(2, 2, 3, seed=8)
    a, b, c = rand(6, 2, seed=9), rand(5, 2, seed=10), rand(7, 3, seed=11)
    x = torch.einsum("ijl,bi,nj,cl->bnc", g, a, b, c)
    core, factors = tucker_power_step(x, (2, 2, 3), None, torch.Generator().manual_seed(1))
    torch.testing.assert_close(tucker_restore(core, factors), x)
    # On a generic x the restored tensor is x projected on every mode's factor span.
    y = rand(6, 5, 7, seed=12)
    core, (u1, u2, u3) = tucker_power_step(y, (3, 2, 4), factors and None, torch.Generator().manual_seed(2))
    projected = torch.einsum("bnc,bB,nN,cC->BNC", y, u1 @ u1.t(), u2 @ u2.t(), u3 @ u3.t())
    torch.testing.assert_close(tucker_restore(core, [u1, u2, u3]), projected)
    # Warm-started power steps on a fixed tensor with gapped mode spectra converge to the
    # leading subspace of every unfolding.
    z = torch.einsum("ijl,bi,nj,cl->bnc", rand(3, 2, 4, seed=21), rand(6, 3, seed=22), rand(5, 2, seed=23),
                     rand(7, 4, seed=24)) + 0.01 * rand(6, 5, 7, seed=25)
    fs = None
    for _ in range(20):
        _, fs = tucker_power_step(z, (3, 2, 4), fs, torch.Generator().manual_seed(3))
    for mode, (u, r) in enumerate(zip(fs, (3, 2, 4))):
        top = torch.linalg.svd(z.movedim(mode, 0).reshape(z.shape[mode], -1))[0][:, :r]
        assert sin_angle(u, top) < 1e-8, mode


# --- the custom Function against autograd -----------------------------------------------------


def _function_grads(x, w, b, left, right, ranks=None, factors=None):
    if factors is None:
        core, factors = tucker_power_step(x, ranks, None, torch.Generator().manual_seed(0))
    else:
        core = tucker_core(x, factors)
    xs, ws, bs = (t.clone().requires_grad_(True) for t in (x, w, b))
    y = WASILinearFunction.apply(xs, ws, bs, left, right, core, *factors)
    g = rand(*y.shape, seed=20)
    y.backward(g)
    return y, xs.grad, ws.grad, bs.grad, g, core, factors


@pytest.mark.parametrize("factored", [False, True])
def test_function_equals_autograd_at_full_rank(factored):
    x, w, b = rand(4, 3, 5, seed=13), rand(6, 5, seed=14), rand(6, seed=15)
    left, right, k = init_weight_factors(w, 1.0)
    assert k == 5
    if factored:  # full-rank square orthogonal factors: every contraction of the backward runs
        factors = [torch.linalg.qr(rand(n, n, seed=30 + n))[0] for n in (4, 3, 5)]
        y, gx, gw, gb, g, *_ = _function_grads(x, w, b, left, right, factors=factors)
    else:  # whole modes: no factor at all
        y, gx, gw, gb, g, *_ = _function_grads(x, w, b, left, right, (0, 0, 0))
    xr, wr, br = (t.clone().requires_grad_(True) for t in (x, w, b))
    yr = F.linear(xr, wr, br)
    yr.backward(g)
    torch.testing.assert_close(y, yr)
    torch.testing.assert_close(gx, xr.grad)
    torch.testing.assert_close(gw, wr.grad)
    torch.testing.assert_close(gb, br.grad)


def test_truncated_gradients_are_the_expected_projections():
    x, w, b = rand(8, 5, 6, seed=16), rand(7, 6, seed=17), rand(7, seed=18)
    left, right, k = init_weight_factors(w, 0.7)
    assert 1 <= k < 6
    y, gx, gw, gb, g, core, factors = _function_grads(x, w, b, left, right, (3, 2, 4))
    assert all(u is not None for u in factors)
    x_tilde = tucker_restore(core, factors)
    torch.testing.assert_close(y, x @ (left @ right).t() + b)  # forward with the rank-k weight
    torch.testing.assert_close(gx, g @ (left @ right))  # grad_x through the rank-k weight
    torch.testing.assert_close(gw, torch.einsum("bno,bnc->oc", g, x_tilde))  # g^T x~, x~ never built
    torch.testing.assert_close(gb, g.sum(dim=(0, 1)))
    exact = torch.einsum("bno,bnc->oc", g, x)
    err = float(torch.linalg.matrix_norm(gw - exact))
    assert err == pytest.approx(float(torch.linalg.matrix_norm(torch.einsum("bno,bnc->oc", g, x - x_tilde))))
    assert err > 1e-3  # truncation does change the gradient


# --- flops and saved bytes --------------------------------------------------------------------


@pytest.mark.parametrize("sequential", [False, True])
@pytest.mark.parametrize("ranks", [(4, 3, 5), (0, 3, 5), (4, 0, 12)])
def test_flop_formulas_match_the_counter(sequential, ranks):
    x = rand(16, 9, 12, dtype=torch.float32)
    cold, (_, factors) = count_flops(lambda: tucker_power_step(x, ranks, None, sequential=sequential))
    assert cold == tucker_power_step_flops((16, 9, 12), ranks, warm=False, sequential=sequential)
    counted, _ = count_flops(lambda: tucker_power_step(x, ranks, factors, sequential=sequential))
    assert counted == tucker_power_step_flops((16, 9, 12), ranks, warm=True, sequential=sequential)
    w, left = rand(10, 7, dtype=torch.float32), orthonormalize(rand(10, 3, dtype=torch.float32))
    for r_from in ("new", "previous"):
        counted, _ = count_flops(lambda: subspace_step(w, left, r_from))
        assert counted == subspace_step_flops(10, 7, 3, r_from)


def test_saved_bytes_on_known_answers():
    model = torch.nn.Sequential(Dense(4, 5, bias=False))
    x = torch.randn(3, 4, requires_grad=True)
    with SavedTensorMeter(model, torch.nn.Linear) as meter:
        y = model(x)
        z = (y * y).sum() + torch.exp(x[:, :2]).sum()  # mul saves y twice; exp saves its output
    z.backward()
    saved = meter.result()
    assert saved.linear_activation == 3 * 4 * 4  # the input x, float32
    assert saved.linear_weight == 5 * 4 * 4  # the weight (the input requires grad: grad_x needs W)
    assert saved.other_activation == 3 * 5 * 4 + 3 * 2 * 4  # y once, although saved twice; exp's output
    assert saved.other_weight == 0


def test_a_view_is_charged_its_whole_storage_once():
    model = torch.nn.Sequential(Dense(2, 2, bias=False))
    base = torch.randn(10, 2, requires_grad=True)
    with SavedTensorMeter(model, torch.nn.Linear) as meter:
        h = base * 1.0  # a fresh [10, 2] storage
        out = model(h[:3]).sum() + model(h[5:]).sum()  # both linears save views of h's storage
    out.backward()
    assert meter.result().linear_activation == 10 * 2 * 4


def test_wasi_layer_saves_only_the_factors():
    layer = WASILinear(6, 5, True, (2, 0, 4), seed=0)
    layer.init_subspace(0.9)
    x = torch.randn(4, 3, 6, requires_grad=True)
    with SavedTensorMeter(layer, torch.nn.Linear) as meter:
        y = layer(x)
    y.sum().backward()
    saved = meter.result()
    core_bytes = 4 * (2 * 3 * 4 + 4 * 2 + 6 * 4)  # S [2, 3, 4], U1 [4, 2], U3 [6, 4]; the token mode is whole
    assert saved.linear_activation == core_bytes
    assert saved.linear_weight == 4 * layer.rank * (5 + 6)  # L [5, k] and R [k, 6]
    assert layer.weight.grad is not None and layer.weight.grad.shape == (5, 6)


def test_peak_meter_on_a_hand_worked_sequence():
    a = torch.zeros(1000)  # 4000 bytes, alive before: resident
    with PeakMemoryMeter([a, a[:10]]) as meter:  # a view of a counts once
        b = a + 1  # 8000 alive
        c = b * 2  # 12000: the peak
        del b  # 8000
        d = c[:10] + 0  # a fresh 40-byte storage: 8040
        c.add_(1)  # in place: nothing new
    assert (meter.resident, meter.peak, meter.current) == (4000, 12000, 8040)
    del d


def test_peak_of_a_step_holds_the_weights_state_and_saved_activations():
    """The whole-step peak is at least what the step holds at the end of its forward: resident
    state (weights, AdamW's two moments, the previous gradients, the batch) plus every tensor
    saved for the backward; a WASI step of the same model saves less and peaks lower."""
    torch.manual_seed(0)
    model = ViT(8, 2, 16, 1, 2, 2, 3, 0.02)
    x, y = torch.rand(32, 8, 8), torch.randint(0, 3, (32,))
    params = sum(p.numel() * 4 for p in model.parameters())
    out = measure_peak(model, x, y, "adamw", 2.0)
    # W, its gradient, AdamW's two moments and step count (a float32 scalar per parameter), the batch
    assert out["perf/resident_bytes"] == 4 * params + 4 * len(list(model.parameters())) + x.numel() * 4 + y.numel() * 8
    with SavedTensorMeter(model, torch.nn.Linear) as meter:
        torch.nn.functional.cross_entropy(model(x), y)
    assert out["perf/peak_step_bytes"] >= out["perf/resident_bytes"] + meter.result().total
    wasi = ViT(8, 2, 16, 1, 2, 2, 3, 0.02)
    wasi.load_state_dict(model.state_dict())
    for layer in to_wasi(wasi, (4, 4, 4), "new", 0, sequential=True):
        layer.init_subspace(0.5)
    assert measure_peak(wasi, x, y, "adamw", 2.0)["perf/peak_step_bytes"] < out["perf/peak_step_bytes"]


def test_dense_twin_has_the_same_weights_and_timing_reports_each_model():
    torch.manual_seed(0)
    model = ViT(8, 2, 16, 1, 2, 2, 3, 0.02)
    x, y = torch.rand(32, 8, 8), torch.randint(0, 3, (32,))
    expected = model(x)
    wasi = ViT(8, 2, 16, 1, 2, 2, 3, 0.02)
    wasi.load_state_dict(model.state_dict())
    for layer in to_wasi(wasi, (4, 4, 4), "new", 0):
        layer.init_subspace(0.5)
    twin = to_dense(wasi)
    assert not any(isinstance(m, WASILinear) for m in twin.modules()) and any(isinstance(m, WASILinear) for m in wasi.modules())
    assert torch.allclose(twin(x), expected)  # the dense W, not the rank-k L R
    times = time_steps({"wasi": wasi, "dense": twin}, x, y, "sgd", 2.0, rounds=2, warmup=1)
    assert set(times) == {"wasi/train", "wasi/infer", "dense/train", "dense/infer"} and min(times.values()) > 0


# --- data -------------------------------------------------------------------------------------


def _rows(x: torch.Tensor) -> set:
    return {tuple(r.flatten().tolist()) for r in x}


def test_class_transfer_splits_are_disjoint_stratified_and_relabelled():
    pre, fine = make_splits("classes", (0, 1, 2, 3, 4), 0.5, 8, seed=0)
    assert pre.classes == 5 and fine.classes == 5
    assert len(fine.y_test) == pytest.approx(len(fine.y_train), abs=5)
    for c in range(5):
        assert abs(int((fine.y_test == c).sum()) - int((fine.y_train == c).sum())) <= 1
    assert not _rows(fine.x_test) & _rows(fine.x_train)
    assert not _rows(fine.x_test) & (_rows(pre.x_train) | _rows(pre.x_test))
    # The fine-tuning split follows `seed`, the pretraining split `pretrain_seed`.
    other = make_splits("classes", (0, 1, 2, 3, 4), 0.5, 8, seed=1, pretrain_seed=0)
    assert not torch.equal(other[1].x_test, fine.x_test) and torch.equal(other[0].x_train, pre.x_train)
    assert make_splits("classes", (0, 1, 2, 3, 4), 0.5, 16, seed=0)[1].x_train.shape[1:] == (16, 16)


def test_rotated_transfer_pretrains_on_rotated_training_images_only():
    pre, fine = make_splits("rotated", (), 0.5, 8, seed=0)
    assert fine.classes == 10 and len(fine.y_test) > 850
    upright = torch.rot90(torch.cat([pre.x_train, pre.x_test]), -1, dims=(1, 2))
    assert _rows(upright) == _rows(fine.x_train)  # the pretraining images are the training split, turned
    assert not _rows(upright) & _rows(fine.x_test)


def test_augmentation_strength_zero_is_identity():
    x = torch.rand(4, 8, 8)
    assert augment_batch(x, 0.0, torch.Generator()) is x
    warped = augment_batch(x, 1.0, torch.Generator().manual_seed(0))
    assert warped.shape == x.shape and not torch.allclose(warped, x)


# --- the loop ---------------------------------------------------------------------------------


def tiny(**kw) -> Config:
    """A fine-tuning run small enough for a unit test: a 1-block ViT on 8x8 digits. Its seed moves
    with LADDER_TEST_SEED_SHIFT (conftest.shifted)."""
    base = dict(seed=shifted(0),
                image_size=8, patch=2, dim=16, depth=1, heads=2, mlp_ratio=2, act_ranks=(4, 4, 4), threshold=0.8,
                pretrain_steps=8, finetune_steps=8, batch_size=32, pretrain_batch_size=32, log_every=2,
                eval_every_frac=0.5, checkpoint_every_frac=0.5, probe_thresholds=(0.5, 0.9), probe_act_scales=(0.5, 1.0),
                time_rounds=2)
    return Config(**{**base, **kw})


class Killed(Exception):
    pass


class DiesAtSave(LocalRun):
    def __init__(self, *args, die_at: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.die_at = die_at

    def save(self, state):
        super().save(state)
        if state["step"] == self.die_at:
            raise Killed()


@pytest.mark.parametrize("method", ["vanilla", "wasi"])
@pytest.mark.parametrize("die_at", [4, 12])  # mid-pretraining, mid-fine-tuning
def test_resumed_run_ends_where_an_uninterrupted_one_does(tmp_path, method, die_at):
    from workloads.wasi import workload

    cfg = tiny(method=method)
    workload._PRETRAINED.clear()
    whole = train(cfg, LocalRun(tmp_path / "whole"))
    workload._PRETRAINED.clear()  # a fresh process: the pretrained model is not cached
    with pytest.raises(Killed):
        train(cfg, DiesAtSave(tmp_path / "cut", die_at=die_at))
    resumed = LocalRun(tmp_path / "cut")
    again = train(cfg, resumed)
    assert resumed.restored_step == die_at
    assert resumed.history[0][0] > die_at
    for key in ("eval/acc", "train/loss", "eval/pretrain_acc", "perf/saved_linear_bytes", "perf/flops_step",
                "perf/peak_step_bytes"):
        assert again[key] == pytest.approx(whole[key], rel=1e-6), key
    cached = train(cfg, LocalRun(tmp_path / "cached"))  # pretraining from the cache changes nothing
    assert cached["eval/acc"] == whole["eval/acc"] and cached["train/loss"] == pytest.approx(whole["train/loss"], rel=1e-6)


def test_wasi_run_reports_ranks_probes_and_orthonormal_factors(tmp_path):
    out = train(tiny(method="wasi"), LocalRun(tmp_path))
    # ranks lie in [1, dim = 16] by construction; orth_err: a QR's float error (worst 8.4e-7 over seeds 1-5)
    assert 1 <= out["diag/rank_mean"] <= 16 and out["diag/orth_err_max"] < 1e-4
    assert 0 <= out["diag/subspace_drift"] < 0.5  # margin: worst 0.0015 over seeds 1-5 (threshold 0.5)
    low, high = out["perf/probe/eps=0.5/saved_linear_weight_bytes"], out["perf/probe/eps=0.9/saved_linear_weight_bytes"]
    # A lower threshold keeps a lower rank (never a higher one, by construction) and fewer weight bytes.
    # margin: low / high worst 0.46 and rank_mean(0.5) / rank_mean(0.9) worst 0.44 over seeds 1-5 (threshold 1)
    assert low < 1.0 * high
    assert out["perf/probe/eps=0.5/rank_mean"] < 1.0 * out["perf/probe/eps=0.9/rank_mean"]
    # activation ranks (2, 2, 2) against (4, 4, 4), every mode below its size: fewer bytes by construction
    assert out["perf/probe/act=0.5/saved_linear_act_bytes"] < out["perf/probe/act=1/saved_linear_act_bytes"]
    # The probe at the trial's own act ranks measures the same bytes as the trial.
    assert out["perf/probe/act=1/saved_linear_bytes"] == out["perf/saved_linear_bytes"]


# --- configs ----------------------------------------------------------------------------------


@pytest.mark.parametrize("change, message", [
    ({"method": "lora"}, "method must be one of"),
    ({"threshold": 0.0}, "threshold is an explained-variance fraction"),
    ({"threshold": 1.5}, "threshold is an explained-variance fraction"),
    ({"act_ranks": (4, 4)}, "act_ranks must be three ranks"),
    ({"act_ranks": (4, -1, 4)}, "act_ranks must be three ranks"),
    ({"tucker": "cp"}, "tucker must be"),
    ({"r_from": "old"}, "r_from must be"),
    ({"optimizer": "adam"}, "optimizer must be"),
    ({"image_size": 10, "patch": 4}, "divisible by patch"),
    ({"image_size": 4, "patch": 2}, "must be >= 8"),
    ({"dim": 50, "heads": 3}, "divisible by heads"),
    ({"pretrain_classes": (0, 1, 2, 3, 4, 5, 6, 7, 8)}, "leaving at least 2"),
    ({"pretrain_classes": (0, 0, 1)}, "distinct digits"),
    ({"pretrain_classes": (3, 11)}, "distinct digits"),
    ({"test_frac": 0.95}, "test_frac must lie"),
    ({"batch_size": 600}, "exceeds the"),
    ({"finetune_steps": 0}, "finetune_steps must be positive"),
    ({"lr": 0.0}, "lr must be positive"),
    ({"grad_clip": -1.0}, "grad_clip must be >= 0"),
    ({"augment": 3.0}, "augment in"),
    ({"probe_thresholds": (0.5, 1.2)}, "probe_thresholds must lie"),
    ({"threads": -1}, "threads must be"),
    ({"time_rounds": -1}, "time_rounds must be"),
    ({"checkpoint_every_frac": 0.0}, "checkpoint_every_frac must lie"),
])
def test_bad_configs_name_the_problem(change, message):
    with pytest.raises(ValueError, match=message):
        validate(dataclasses.replace(Config(), **change))


def test_more_than_one_worker_is_refused():
    with pytest.raises(ConfigError, match="workers=1"):
        registry.load("wasi").validate(Config(), world_size=2)


def test_defaults_and_smoke_are_valid():
    validate(Config())
    validate(smoke())


# --- claims -----------------------------------------------------------------------------------


def trial(method, seed, *, acc, linear_bytes, flops, peak=20e6, speedup=1.5, threshold=0.8, act_ranks=(16, 8, 16)):
    out = {"method": method, "seed": seed, "threshold": threshold, "act_ranks": act_ranks, "r_from": "new",
           "eval/acc": acc, "eval/test_size": 448.0, "diag/rank_mean": 20.0,
           "perf/saved_linear_bytes": linear_bytes, "perf/saved_linear_act_bytes": 0.9 * linear_bytes,
           "perf/saved_linear_weight_bytes": 0.1 * linear_bytes, "perf/saved_total_bytes": 3 * linear_bytes,
           "perf/peak_step_bytes": peak, "perf/resident_bytes": 1e6,
           "perf/flops_step": flops, "perf/flops_forward": flops / 3, "perf/flops_backward": 2 * flops / 3,
           "perf/probe/eps=0.5/saved_linear_bytes": linear_bytes / 2, "perf/probe/eps=0.5/saved_linear_weight_bytes": 1.0,
           "perf/probe/eps=0.5/rank_mean": 5.0, "perf/probe/act=1/saved_linear_bytes": linear_bytes,
           "perf/probe/act=1/saved_linear_weight_bytes": 1.0, "perf/probe/act=1/act_rank_sum": 40.0}
    if method == "wasi":  # timed in the WASI trial against its dense twin
        out.update({f"perf/{k}_speedup": speedup for k in ("train", "infer")})
        out.update({f"perf/{k}_step_s": 0.01 for k in ("train", "infer")})
        out.update({f"perf/dense_{k}_step_s": 0.01 * speedup for k in ("train", "infer")})
    return out


def paper_pattern(gaps=(0.5, -0.2, 0.9), mem=12.0, flops=0.7, peak=2.0, speedup=1.5):
    out = []
    for s, gap in enumerate(gaps):
        out.append(trial("vanilla", s, acc=0.96, linear_bytes=8e6, flops=1e9))
        out.append(trial("wasi", s, acc=0.96 - gap / 100, linear_bytes=8e6 / mem, flops=flops * 1e9, peak=20e6 / peak,
                         speedup=speedup))
    return out


def test_claims_hold_on_the_papers_pattern():
    results = {c.__name__: c(paper_pattern()) for c in CLAIMS}
    judged = [c for c in CLAIMS if c is not inference_faster]  # not judged at smoke size (claims.INFER_JUDGED)
    assert all(results[c.__name__][0] for c in judged), results
    assert results["inference_faster"][0] is None
    assert all(judged_claim(c, paper_pattern()) for c in judged) and CHECKS == []
    assert all(judged_claim(c, paper_pattern(gaps=(0.5,))) for c in judged)  # one seed per build, as the smoke runs
    assert CLAIMS[0] is peak_memory_lower  # the headline
    assert results["peak_memory_lower"][1]["worst_ratio"] == pytest.approx(2.0)
    assert results["peak_memory_lower"][1]["vanilla_peak_MB"] == pytest.approx(20.0)
    mem = results["memory_ten_times_lower"][1]
    assert mem["eps0.8_r16x8x16/min_ratio"] == pytest.approx(12.0) and mem["worst_ratio"] == pytest.approx(12.0)
    acc = results["accuracy_within_one_point"][1]
    assert acc["eps0.8_r16x8x16/gap_pts"] == pytest.approx(0.4) and acc["worst_gap_pts"] == pytest.approx(0.4)
    assert acc["eps0.8_r16x8x16/gap_pts_seed2"] == pytest.approx(0.9)
    assert acc["eps0.8_r16x8x16/gap_sd_pts"] == pytest.approx(math.sqrt(((0.1) ** 2 + 0.6**2 + 0.5**2) / 2))
    assert results["flops_fewer"][1]["eps0.8_r16x8x16/min_factor"] == pytest.approx(1 / 0.7)
    assert results["flops_fewer"][1]["worst_factor"] == pytest.approx(1 / 0.7)
    assert results["training_faster"][1]["worst_speedup"] == pytest.approx(1.5)
    assert results["inference_faster"][1]["eps0.8_r16x8x16/dense_ms"] == pytest.approx(15.0)


def test_claims_fail_when_the_pattern_is_absent():
    assert not judged_claim(peak_memory_lower, paper_pattern(peak=1.0))
    assert not judged_claim(memory_ten_times_lower, paper_pattern(mem=9.0))
    assert not judged_claim(accuracy_within_one_point, paper_pattern(gaps=(1.5, 0.5, 1.2)))
    assert judged_claim(accuracy_within_one_point, paper_pattern(gaps=(1.5, 0.5, 0.9)))  # judged on the mean gap
    assert not judged_claim(accuracy_within_one_point, paper_pattern(gaps=(1.5,)))  # one seed: its own gap
    assert not judged_claim(flops_fewer, paper_pattern(flops=1.05))
    assert not judged_claim(training_faster, paper_pattern(speedup=0.9))
    assert inference_faster(paper_pattern(speedup=0.9))[1]["worst_speedup"] == pytest.approx(0.9)  # measured, not judged


def test_only_arms_run_at_every_seed_are_judged():
    trials = paper_pattern() + [trial("wasi", 0, acc=0.5, linear_bytes=1e5, flops=1e8, threshold=0.3)]
    holds, measured = accuracy_within_one_point(trials)  # the eps=0.3 point ran at one seed of three
    assert holds and not any(k.startswith("eps0.3") for k in measured)
    judged = trials + [trial("wasi", s, acc=0.5, linear_bytes=1e5, flops=1e8, threshold=0.3) for s in (1, 2)]
    assert not accuracy_within_one_point(judged)[0]
    with pytest.raises(ValueError, match="no vanilla trials"):
        memory_ten_times_lower([t for t in trials if t["method"] == "wasi"])
    with pytest.raises(ValueError, match="ran at every vanilla seed"):
        flops_fewer([t for t in trials if t["method"] == "vanilla" or t["seed"] == 0])


def test_plot_writes_a_png(tmp_path):
    path = tmp_path / "claims.png"
    plot(paper_pattern(), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- the reproduction -------------------------------------------------------------------------

CI_FINETUNE_STEPS = 400
"""This test runs one seed of the smoke reproduction at 400 fine-tuning steps, not the report's 800
(sweeps/repro/wasi.py): the memory, peak and flops claims it asserts do not depend on the step
count (the ranks are fixed at the start of fine-tuning), and 800 steps would add about a minute
to this file."""


@pytest.mark.slow
def test_smoke_reproduction(workdir, monkeypatch):
    from orchestrator.reproduction import reproduce as reproduction

    built = reproduction.load_repro

    def shorter(*args, **kwargs):
        sweep = built(*args, **kwargs)
        return dataclasses.replace(sweep, overrides={**sweep.overrides, "finetune_steps": CI_FINETUNE_STEPS})

    monkeypatch.setattr(reproduction, "load_repro", shorter)
    rep = reproduction.reproduce("wasi", smoke=True, local=True)
    assert not rep.failed_trials
    seed = shifted(0)
    assert sorted((t["method"], t["seed"]) for t in rep.trials) == [("vanilla", seed), ("wasi", seed)]  # one seed
    claims = {c.name: c for c in rep.claims}
    # margin: over the calibration seeds 100-104: peak_memory_lower worst_ratio 1.281
    # (>= 1.20); memory_ten_times_lower worst_ratio 13.25 (>= 10); flops_fewer worst_factor 1.304 (>= 1)
    assert_claims_hold(rep, ["peak_memory_lower", "memory_ten_times_lower", "flops_fewer"])
    memory = claims["memory_ten_times_lower"].measured
    # The whole step's saved bytes fall far less than the linear layers' (attention, norms and
    # activations are not compressed). margin: whole_step_ratio / min_ratio worst 0.119 (1.62 / 13.6)
    # over seeds 1-5 (threshold 1)
    assert memory["eps0.8_r16x8x16/whole_step_ratio"] < 1.0 * memory["eps0.8_r16x8x16/min_ratio"]
    # The whole step's peak is above the linear layers' saved bytes (it holds them and more), for both.
    peak = claims["peak_memory_lower"].measured
    assert peak["vanilla_peak_MB"] > memory["vanilla_MB"] and peak["eps0.8_r16x8x16/wasi_peak_MB"] > memory["eps0.8_r16x8x16/wasi_MB"]
    # Inference speed is not judged at smoke size (unstable on seeds 100-104), but it is measured.
    assert claims["inference_faster"].holds is None and claims["inference_faster"].measured["worst_speedup"] > 0
    # accuracy_within_one_point is judged across seeds by `ladder reproduce --seeds K`, not asserted:
    # one seed of 448 test images cannot decide 1 point, and the processor moves it. Asserted
    # instead: WASI trains to above 90% and trails vanilla by less than 3 points at this seed.
    accuracy = claims["accuracy_within_one_point"].measured
    # margin: acc worst 0.942 (seed 101) and gap_pts worst 0.95 (seed 101) over seeds 100-104 at 400
    # fine-tuning steps (thresholds 0.9 and 3)
    assert accuracy["eps0.8_r16x8x16/acc"] > 0.9, accuracy
    assert accuracy["eps0.8_r16x8x16/gap_pts"] < 3.0, accuracy


# --- the paper's setting: datasets through Hugging Face `datasets`, a ViT by `from_pretrained` --------


def _picture(label: int, rng, side: int = 12):
    """An RGB picture whose dominant channel is its class (a learnable task for a few steps)."""
    from PIL import Image

    pixels = rng.random((side, side, 3)) * 0.3
    pixels[..., label % 3] += 0.6
    return Image.fromarray((pixels * 255).astype("uint8"))


def _cifar_layout(folder, train: int = 64, test: int = 16, classes: int = 4) -> None:
    """CIFAR-10's published layout as `datasets` saves it: 'img' and 'label' columns, train/test splits."""
    import datasets
    import numpy as np

    rng = np.random.default_rng(0)
    features = datasets.Features({"img": datasets.Image(), "label": datasets.ClassLabel(num_classes=classes)})
    split = lambda n: datasets.Dataset.from_dict(  # noqa: E731
        {"img": [_picture(i % classes, rng) for i in range(n)], "label": [i % classes for i in range(n)]}, features=features)
    datasets.DatasetDict({"train": split(train), "test": split(test)}).save_to_disk(str(folder))


def _tiny_vit(folder) -> None:
    """A ViT of ViT-B/32's kind, hidden size 32, 2 layers, written by save_pretrained (a few KB)."""
    from transformers import ViTConfig, ViTModel

    torch.manual_seed(0)
    ViTModel(ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                       image_size=16, patch_size=8)).save_pretrained(str(folder))


def _losses(result) -> list[float]:
    return [m["train/loss"] for _, m in result.history if "train/loss" in m]


def test_cifar10_layout_fine_tunes_a_pretrained_vit_with_wasi_through_the_workload(workdir):
    """The smoke of the paper's setting (`sweeps/repro/wasi_real.py`): a save_to_disk folder in
    CIFAR-10's layout and a transformers ViT folder, through the same loaders, WASI in its linears."""
    from orchestrator.runners import launch, registry

    _cifar_layout(workdir / "cifar10")
    _tiny_vit(workdir / "vit")
    cfg = dataclasses.replace(smoke(), data_path="cifar10", model="vit", transfer="none", pretrain_steps=0,
                              image_size=12, batch_size=16, finetune_steps=30, log_every=5, act_ranks=(8, 4, 8),
                              probe_thresholds=(0.8,), probe_act_scales=(1.0,), test_views=2)
    w = registry.load("wasi")
    w.validate(cfg)
    w.preflight(cfg)
    result = launch.run_local("wasi", cfg, progress=False, track=False)
    losses = _losses(result)
    # margin: losses[-1] / losses[0] worst 0.614 (seed 2) over seeds 1-5 (threshold 0.8)
    assert len(losses) == 6 and all(math.isfinite(x) for x in losses) and losses[-1] < 0.8 * losses[0]
    out = result.metrics
    # margin: acc worst 0.75 over seeds 1-5 (threshold 0.5)
    assert out["eval/test_size"] == 16 and out["eval/acc"] > 0.5  # four classes: chance is 0.25
    assert out["diag/rank_mean"] >= 1 and out["diag/orth_err_max"] < 1e-4
    # every encoder linear of the transformers ViT (q, k, v, o, fc1, fc2 per layer) became a WASI layer
    assert out["perf/saved_linear_bytes"] > 0 and out["perf/flops_refresh"] > 0


def test_an_image_folder_trains_the_local_vit_with_class_transfer(workdir):
    """A folder of PNGs, one subfolder per class, no test split (held out by test_frac), read by
    load_dataset('imagefolder'), pretraining on two classes and fine-tuning on the other two."""
    import numpy as np
    from orchestrator.runners import launch, registry

    rng = np.random.default_rng(1)
    for label, name in enumerate(("cat", "dog", "frog", "ship")):
        (workdir / "pets" / name).mkdir(parents=True)
        for i in range(24):
            _picture(label, rng, side=10).save(workdir / "pets" / name / f"{i}.png")
    cfg = dataclasses.replace(smoke(), data_path="pets", pretrain_classes=(0, 1), image_size=12, patch=4, dim=24,
                              heads=2, pretrain_steps=12, pretrain_batch_size=16, finetune_steps=24, batch_size=16,
                              log_every=4, act_ranks=(8, 4, 8), probe_thresholds=(0.8,), probe_act_scales=(1.0,),
                              test_views=2)
    registry.load("wasi").preflight(cfg)
    result = launch.run_local("wasi", cfg, progress=False, track=False)
    finetune = [m["train/loss"] for step, m in result.history if "train/loss" in m and step > 12]
    # margin: finetune[-1] / finetune[0] worst 0.473 over seeds 1-5 (threshold 1)
    assert all(math.isfinite(x) for x in finetune) and finetune[-1] < 1.0 * finetune[0]
    assert result.metrics["eval/test_size"] == 24  # half of the two fine-tuning classes' 48 images
    # margin: acc 1.0 at each of seeds 1-5 (threshold 0.5)
    assert 0 <= result.metrics["eval/pretrain_acc"] <= 1 and result.metrics["eval/acc"] > 0.5


@pytest.mark.parametrize("change, match", [
    ({"data_path": "nowhere"}, r"data_path='nowhere' does not exist .*save_to_disk.*uoft-cs/cifar10"),
    ({"model": "no_vit"}, r"model='no_vit' is neither a folder with config.json nor .*vit-base-patch32-224-in21k"),
    ({"model": "google/vit-base-patch32-224-in21k"}, r"nothing is downloaded at run time.*hf download"),
    ({"model": "gpt"}, r"model='gpt' is a 'gpt2' model, not a ViT"),
    ({"label_column": "fine_label"}, r"no label column 'fine_label' among \['img', 'label'\]"),
    ({"batch_size": 100}, r"holds 64 fine-tuning training images, fewer than batch_size=100"),
    ({"transfer": "classes", "pretrain_steps": 5, "model": "", "pretrain_classes": (0, 7)}, r"classes \[0, 1, 2, 3\]"),
])
def test_missing_or_wrong_files_are_refused_before_the_run_naming_the_fix(workdir, monkeypatch, change, match):
    from transformers import GPT2Config, GPT2LMHeadModel
    from orchestrator.runners import registry
    from orchestrator.runners.config import ConfigError

    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(workdir / "empty-cache"))  # a hub id is looked up there, never fetched
    _cifar_layout(workdir / "cifar10")
    _tiny_vit(workdir / "vit")
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=16, n_positions=8)).save_pretrained(str(workdir / "gpt"))
    cfg = dataclasses.replace(smoke(), **{"data_path": "cifar10", "model": "vit", "transfer": "none", "pretrain_steps": 0,
                                          "batch_size": 16, **change})
    w = registry.load("wasi")
    w.validate(cfg)
    with pytest.raises(ConfigError, match=match):
        w.preflight(cfg)


def test_a_pretrained_model_needs_no_pretraining_here():
    with pytest.raises(ValueError, match="set transfer='none' and pretrain_steps=0"):
        validate(dataclasses.replace(smoke(), model="vit"))
    with pytest.raises(ValueError, match="pretrain_steps must be 0 exactly when transfer='none'"):
        validate(dataclasses.replace(smoke(), transfer="none"))


def test_the_real_sweep_is_valid_anywhere_and_names_what_it_needs(workdir, monkeypatch):
    from conftest import REPO
    from orchestrator.sweep import load_sweep_file
    from orchestrator.sweeps.tune_run import launch_problems

    monkeypatch.setenv("LADDER_DATA", str(workdir / "data"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(workdir / "empty-cache"))
    sweep = load_sweep_file(REPO / "sweeps" / "repro" / "wasi_real.py")
    sweep.check()
    (problem,) = [p for p in launch_problems(sweep) if "data_path" in p]
    assert "model='google/vit-base-patch32-224-in21k' is neither a folder" in problem
    assert f"data_path='{workdir / 'data' / 'cifar10'}' does not exist" in problem and "uoft-cs/cifar10" in problem
    assert sweep.gpus_per_worker == 1 and sweep.trial_count() == 6


def test_the_bench_size_builds_and_passes_its_check(workdir):
    """`ladder reproduce wasi --size bench --check`: the bench (run on demand, not in CI) builds at
    every seed, fine-tunes longer than the smoke, and this machine can run it."""
    from orchestrator.reproduction import reproduce

    smoke, bench = (reproduce.load_repro("wasi", size=size, seed=shifted(0)) for size in ("smoke", "bench"))
    assert bench.name == "repro-wasi-bench" and bench.trial_count() == smoke.trial_count() == 2
    assert bench.base_config().finetune_steps > smoke.base_config().finetune_steps
    said = reproduce.check("wasi", size="bench", local=True)
    assert said.startswith("wasi at bench size: 6 trials (2 a seed") and said.endswith("ready to run"), said
