"""frl: the solvers against exact solutions, the spectral maths against hand-computed values, the
FRL layers' resolution alignment, the losses, the claims on synthetic trials, config errors, and
the smoke reproduction."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from orchestrator.runners import registry
from orchestrator.claims import spec_of
from orchestrator.runners.config import ConfigError
from orchestrator.run import LocalRun
from workloads.frl import claims as C
from workloads.frl import workload as W
from workloads.frl.losses import cross_scale_loss, rel_mse, spectral_loss
from workloads.frl.model import CNN, FNO, AlignedConv, FRLSpectralConv, SpectralConv, frequency_channels
from workloads.frl.transformer import GalerkinAttention, GalerkinTransformer, physical_coordinates
from workloads.frl.solver import Burgers, NavierStokes2d, burgers_initial, truncate, upsample
from conftest import assert_claims_hold, judged_claim, shifted, narrowed_reproduction

TWO_PI = 2 * math.pi


@pytest.fixture(autouse=True)
def one_thread():
    """These tensors are tiny: with more threads than free cores, synchronising costs more than it saves."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def grid(n: int) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float64) * (TWO_PI / n)


# --- spectral resampling ---------------------------------------------------------------------


def test_truncate_keeps_exactly_the_modes_below_half_the_target_grid():
    x = grid(256)
    u = torch.sin(3 * x) + 0.5 * torch.cos(15 * x) + 0.25 * torch.sin(16 * x) + 0.1 * torch.sin(40 * x)
    x32 = grid(32)
    # |k| < 16 survive; k = 16 is the 32-grid's Nyquist and k = 40 lies above it.
    expected = torch.sin(3 * x32) + 0.5 * torch.cos(15 * x32)
    torch.testing.assert_close(truncate(u, 32), expected, atol=1e-12, rtol=0)


def test_upsample_is_trigonometric_interpolation():
    u16 = torch.sin(3 * grid(16)) + torch.cos(5 * grid(16))
    torch.testing.assert_close(upsample(u16, 128), torch.sin(3 * grid(128)) + torch.cos(5 * grid(128)), atol=1e-12, rtol=0)


def test_truncate_and_upsample_in_two_dimensions():
    x = grid(64)[:, None]
    y = grid(64)[None, :]
    u = torch.sin(2 * x) * torch.cos(3 * y) + torch.cos(-5 * x + 7 * y) + torch.sin(20 * x)
    x16, y16 = grid(16)[:, None], grid(16)[None, :]
    expected = torch.sin(2 * x16) * torch.cos(3 * y16) + torch.cos(-5 * x16 + 7 * y16)
    low = truncate(u, 16, dims=2)
    torch.testing.assert_close(low, expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(upsample(low, 64, dims=2), u - torch.sin(20 * x), atol=1e-12, rtol=0)


# --- solvers against exact solutions ----------------------------------------------------------


def test_burgers_matches_the_cole_hopf_solution():
    # phi = a + b exp(-nu t) cos x solves the heat equation, so u = -2 nu phi_x / phi solves Burgers.
    nu, a, b, t = 0.1, 1.5, 1.0, 0.5
    x = grid(128)
    exact = lambda s: 2 * nu * b * math.exp(-nu * s) * torch.sin(x) / (a + b * math.exp(-nu * s) * torch.cos(x))  # noqa: E731
    solver = Burgers(128, nu, 1e-3)
    u = solver.evolve(exact(0.0)[None], t)[0]
    assert (u - exact(t)).abs().max() < 1e-9


def test_burgers_initial_condition_is_band_limited_and_scaled():
    u = burgers_initial(5, 128, 8, torch.Generator().manual_seed(0))
    assert u.abs().amax(dim=1).sub(1).abs().max() < 1e-12
    spectrum = torch.fft.rfft(u).abs()
    assert spectrum[:, 9:].max() < 1e-10 and spectrum[:, 1:9].max() > 1e-3


def test_navier_stokes_taylor_green_decays_at_its_exact_rate():
    # w = 2 cos x cos y is a steady Euler flow (w = 2 psi); viscosity and drag damp it at 2 nu + drag.
    nu, drag, t = 0.05, 0.1, 0.5
    x, y = grid(32)[:, None], grid(32)[None, :]
    w0 = 2 * torch.cos(x) * torch.cos(y)
    solver = NavierStokes2d(32, nu, 1e-2, forcing_amp=0.0, drag=drag)
    w = solver.evolve(w0[None], t)[0]
    torch.testing.assert_close(w, w0 * math.exp(-(2 * nu + drag) * t), atol=1e-10, rtol=0)


def test_kolmogorov_flow_is_a_steady_state():
    # w = A sin(4y) / (16 nu + drag) balances forcing, viscosity and drag; its advection vanishes.
    nu, drag, amp = 0.02, 0.1, 0.1
    y = grid(32)[None, :].expand(32, 32)
    w0 = amp * torch.sin(4 * y) / (16 * nu + drag)
    w = NavierStokes2d(32, nu, 1e-2, forcing_amp=amp, drag=drag).evolve(w0[None], 1.0)[0]
    torch.testing.assert_close(w, w0, atol=1e-10, rtol=0)


# --- layers ----------------------------------------------------------------------------------


def test_baseline_spectral_conv_is_blind_above_its_modes():
    torch.manual_seed(0)
    conv = SpectralConv(4, 16, 1)
    x = grid(128).float()
    high = torch.sin(20 * x).expand(2, 4, 128)
    assert conv(high).abs().max() < 1e-5  # the blind zone: no response at all at k = 20
    low = torch.sin(3 * x).expand(2, 4, 128)
    assert conv(low).abs().max() > 1e-2


def test_frl_physical_weights_are_aligned_across_grids_and_held_above_the_training_nyquist():
    torch.manual_seed(0)
    layer = FRLSpectralConv(3, 1, rho0=32, coord="physical")
    w32, _ = layer.weights(32, torch.device("cpu"))
    w128, keep = layer.weights(128, torch.device("cpu"))
    torch.testing.assert_close(w128[:16], w32[:16])  # the same physical mode, the same weight
    torch.testing.assert_close(w128[40], w128[16])  # held above k_Nyq(rho0) = 16
    assert keep[:64].all() and not keep[64]  # every mode below the 128-grid's Nyquist is used
    # The notes' coordinate: |k| / k_Nyq(rho) plus log2(rho / rho0).
    nyq = FRLSpectralConv(3, 1, rho0=32, coord="nyquist")
    f64, _ = nyq.coordinates(64, torch.device("cpu"))
    f32, _ = nyq.coordinates(32, torch.device("cpu"))
    torch.testing.assert_close(f64[10, :-1], f32[5, :-1])  # nu = 10/32 = 5/16
    assert f64[10, -1] == 1.0 and f32[5, -1] == 0.0


def test_frequency_channels_with_index_coordinate_are_the_same_physical_function():
    fine = frequency_channels((64,), 4, "index", torch.float64, torch.device("cpu"))
    coarse = frequency_channels((32,), 4, "index", torch.float64, torch.device("cpu"))
    torch.testing.assert_close(fine[:, ::2], coarse)
    torch.testing.assert_close(fine[1], torch.sin(4 * grid(64)))  # m = 2: sin(2 m x_phys)
    fine_p = frequency_channels((64,), 4, "physical", torch.float64, torch.device("cpu"))
    coarse_p = frequency_channels((32,), 4, "physical", torch.float64, torch.device("cpu"))
    assert (fine_p[:, ::2] - coarse_p).abs().max() > 0.1


def test_aligned_conv_is_the_ordinary_convolution_on_the_training_grid():
    torch.manual_seed(0)
    layer = AlignedConv(3, 1, rho0=32, radius=2)
    conv = torch.nn.Conv1d(3, 3, 5, padding=2, padding_mode="circular")
    with torch.no_grad():
        conv.weight.copy_(layer.weight.flip(-1))  # Conv1d correlates; the layer convolves
        conv.bias.copy_(layer.bias)
    h = truncate(torch.randn(2, 3, 32, dtype=torch.float64), 32).float()  # no Nyquist mode
    torch.testing.assert_close(layer(h), conv(h), atol=1e-5, rtol=0)


def test_aligned_conv_is_the_same_physical_filter_on_a_finer_grid():
    torch.manual_seed(0)
    layer = AlignedConv(2, 1, rho0=32, radius=2)
    conv = torch.nn.Conv1d(2, 2, 5, padding=2, padding_mode="circular")
    smooth = lambda n: torch.stack([torch.sin(grid(n)), torch.cos(3 * grid(n))])[None].float()  # noqa: E731
    with torch.no_grad():
        a32, a128 = layer(smooth(32)), layer(smooth(128))
        c32, c128 = conv(smooth(32)), conv(smooth(128))
    torch.testing.assert_close(a128[..., ::4], a32, atol=1e-5, rtol=0)
    assert (c128[..., ::4] - c32).abs().max() > 1e-2  # grid taps shrink with the cell


def test_frl_weights_in_two_dimensions_are_aligned_held_and_not_only_radial():
    torch.manual_seed(0)
    layer = FRLSpectralConv(2, 2, rho0=16, coord="physical")
    w16, _ = layer.weights(16, torch.device("cpu"))
    w64, keep = layer.weights(64, torch.device("cpu"))
    # Mode (kx, ky) = (3, 5) and (-3, 5): the same on both grids, and told apart (advection is not isotropic).
    torch.testing.assert_close(w64[3, 5], w16[3, 5])
    torch.testing.assert_close(w64[-3, 5], w16[-3, 5])
    assert (w16[3, 5] - w16[-3, 5]).abs().max() > 1e-4
    torch.testing.assert_close(w64[20, 30], w64[8, 8])  # held at the training Nyquist on both axes
    assert keep[:32, :32].all() and not keep[32].any()


# --- the Galerkin Transformer ------------------------------------------------------------------


def test_galerkin_attention_by_hand():
    # Two tokens, two channels, one head, Q = K = V = the input: a layer norm of two channels maps
    # [1, 0] to [1, -1] and [0, 1] to [-1, 1], so K^T V / n = ([1,-1]^T[1,-1] + [-1,1]^T[-1,1]) / 2
    # = [[1, -1], [-1, 1]], and z = Q K^T V / n = [[1, -1], [-1, 1]].
    attn = GalerkinAttention(2, heads=1)
    with torch.no_grad():
        attn.qkv.weight.copy_(torch.eye(2).repeat(3, 1))
        attn.qkv.bias.zero_()
        attn.out.weight.copy_(torch.eye(2))
        attn.out.bias.zero_()
    z = attn(torch.eye(2)[None])
    torch.testing.assert_close(z[0], torch.tensor([[1.0, -1.0], [-1.0, 1.0]]), atol=1e-4, rtol=0)


def test_galerkin_attention_is_a_quadrature_so_refining_the_grid_keeps_the_operator():
    # Every token twice: the mean over points (1/n K^T V) is unchanged, so each token's output is too.
    torch.manual_seed(0)
    attn = GalerkinAttention(8, heads=2)
    h = torch.randn(3, 10, 8)
    torch.testing.assert_close(attn(h.repeat_interleave(2, dim=1))[:, ::2], attn(h), atol=1e-5, rtol=0)
    # Softmax-free and linear in the number of points: permuting the tokens permutes the outputs.
    perm = torch.randperm(10)
    torch.testing.assert_close(attn(h[:, perm]), attn(h)[:, perm], atol=1e-5, rtol=0)


def test_transformer_positions_are_a_function_of_the_physical_coordinate():
    fine = physical_coordinates((64,), torch.float64, torch.device("cpu"))
    torch.testing.assert_close(fine[:, ::4], physical_coordinates((16,), torch.float64, torch.device("cpu")))
    torch.testing.assert_close(fine[0], torch.sin(grid(64)))
    two = physical_coordinates((8, 4), torch.float64, torch.device("cpu"))
    assert two.shape == (4, 8, 4) and (two[2, 0] == two[2, 5]).all()  # the y channels do not vary along x


def test_baseline_transformer_has_no_learned_response_above_its_modes():
    # The baseline's spectral regressor is a table of `modes` (Theorem 1's blind zone above it);
    # FRL's regressor is a function of the wavenumber and responds there.
    torch.manual_seed(0)
    base = GalerkinTransformer(1, 8, 2, 4, 8, False, residual=False)
    frl = GalerkinTransformer(1, 8, 2, 4, 8, True, residual=False)
    assert isinstance(base.spectral[0], SpectralConv) and isinstance(frl.spectral[0], FRLSpectralConv)
    h = torch.sin(12 * grid(64)).float().expand(2, 8, 64)  # k = 12 above the training Nyquist of 4
    assert base.spectral[0](h).abs().max() < 1e-5 and frl.spectral[0](h).abs().max() > 1e-3


@pytest.mark.parametrize("backbone", ["fno", "cnn", "transformer"])
@pytest.mark.parametrize("frl", [False, True])
@pytest.mark.parametrize("dims", [1, 2])
def test_backbones_map_any_grid_to_itself(backbone, frl, dims):
    torch.manual_seed(0)
    if backbone == "transformer":
        model = GalerkinTransformer(dims, 8, 2, 4, 8, frl)
    else:
        cls = FNO if backbone == "fno" else CNN
        model = cls(dims, 8, 2, 4 if backbone == "fno" else 3, 8, frl)
    for n in (8, 16, 32):
        u = torch.randn(2, *([n] * dims))
        assert model(u).shape == u.shape


# --- losses ----------------------------------------------------------------------------------


def test_rel_mse_by_hand():
    y = torch.tensor([[3.0, 4.0]])
    assert rel_mse(torch.tensor([[3.0, 2.0]]), y).item() == pytest.approx(4 / 25)


def test_spectral_loss_weighs_each_octave_alike():
    x = grid(32)
    y = (torch.cos(x) + torch.cos(5 * x))[None]
    # An error of a tenth of the k = 5 mode: its octave [4, 8) has relative error 0.01, the other
    # three octaves below the Nyquist of 16 ({0, 1}, [2, 4), [8, 16)) none.
    p = y + 0.1 * torch.cos(5 * x)[None]
    n_octaves = 4
    expected = 0.01 / (1 + 1e-6 * 2) / n_octaves  # floor: 1e-6 of the sample's energy
    assert spectral_loss(p, y, 1).item() == pytest.approx(expected, rel=1e-4)
    # The same error as a plain relative L2 counts against the whole field's energy (half as much).
    assert rel_mse(p, y).item() == pytest.approx(0.01 / 2, rel=1e-6)
    assert spectral_loss(y, y, 1).item() == 0.0


def test_cross_scale_loss_is_zero_for_a_truncation_consistent_model():
    u = torch.randn(3, 32, dtype=torch.float64)
    fine = truncate(u, 32)
    coarse = truncate(u, 16)
    assert cross_scale_loss(fine, coarse, coarse, 1).item() == pytest.approx(0.0, abs=1e-20)
    assert cross_scale_loss(fine, torch.zeros_like(coarse), coarse, 1).item() == pytest.approx(1.0)


def test_blind_band_measures_error_persistence_and_transmission_in_the_blind_zone():
    x = grid(128)
    inp = (torch.sin(2 * x) + 0.1 * torch.sin(30 * x))[None]
    y = (torch.sin(2 * x) + 0.1 * torch.sin(31 * x))[None]  # the fine scale moved: orthogonal to the input's
    silent = (2 * torch.sin(2 * x))[None]  # wrong below 16, nothing above: all of the band is missed
    band = W.blind_band(silent, inp, y, 16, 1)
    assert band["err"] == pytest.approx(1.0) and band["transmit"] == pytest.approx(0.0, abs=1e-12)
    assert band["persistence"] == pytest.approx(math.sqrt(2))  # copying a decorrelated band doubles its error energy
    assert band["energy"] == pytest.approx(0.1 / math.sqrt(1.01))  # |0.1 sin 31x| / |sin 2x + 0.1 sin 31x|
    copy = W.blind_band(inp + 0.5 * torch.sin(3 * x)[None], inp, y, 16, 1)
    assert copy["transmit"] == pytest.approx(1.0) and copy["err"] == pytest.approx(math.sqrt(2))
    assert W.blind_band(y, inp, y, 16, 1)["err"] == pytest.approx(0.0, abs=1e-12)


def test_lr_factor_warms_up_and_decays_to_zero():
    assert W.lr_factor(5, 100) == pytest.approx(1.0)
    assert W.lr_factor(1, 100) == pytest.approx(0.2)
    assert W.lr_factor(100, 100) == pytest.approx(0.0, abs=1e-12)


# --- claims on synthetic trials ----------------------------------------------------------------


def _trial(backbone: str, frl: bool, e1: float, e4: float, solver=(0.1, 0.01), pde: str = "burgers") -> dict:
    cfg = W.Config(pde=pde, backbone=backbone, frl=frl, multires_levels=2 if frl else 0,
                   spectral_weight=0.1 if frl else 0.0, cross_scale_weight=0.1 if frl else 0.0)
    t = dataclasses.asdict(cfg)
    t.update({"eval/rel_l2/x1": e1, "eval/rel_l2/x2": (e1 + e4) / 2, "eval/rel_l2/x4": e4,
              "eval/rel_l2_grid/x1": e1, "eval/rel_l2_grid/x2": e1, "eval/rel_l2_grid/x4": e4,
              "eval/solver_rel_l2/x1": solver[0], "eval/solver_rel_l2/x2": 0.05, "eval/solver_rel_l2/x4": solver[1]})
    return t


def _paper_pattern() -> list[dict]:
    """Anchored baselines and FRL errors that fall, each FRL at 4x at 0.8 of its threshold times the baseline's."""
    out = []
    for pde, threshold in (("burgers", C.FAR_BELOW_1D), ("navier_stokes", C.FAR_BELOW_2D)):
        for backbone, (e1, e4) in {"fno": (0.05, 0.052), "cnn": (0.06, 0.12), "transformer": (0.05, 0.06)}.items():
            frl4 = 0.8 * threshold * e4
            out += [_trial(backbone, False, e1, e4, pde=pde), _trial(backbone, True, 1.1 * frl4, frl4, pde=pde)]
    return out


def test_claims_hold_on_the_paper_pattern_and_fail_without_it():
    paper = _paper_pattern()
    assert C.CLAIMS[0] is C.frl_far_below_baseline  # the headline first
    assert C.CHECKS == [C.solver_calibration] and spec_of(C.solver_calibration) is None
    assert 0 < C.FAR_BELOW_1D <= 1 and 0 < C.FAR_BELOW_2D <= 1
    for claim in C.CLAIMS + C.CHECKS:
        holds, measured = claim(paper)
        assert holds, claim.__name__
        assert all(math.isfinite(v) for v in measured.values())
    for claim in C.CLAIMS:
        assert judged_claim(claim, paper)
    holds, measured = C.baseline_anchored(paper)
    assert measured["burgers/fno/baseline_ratio"] == pytest.approx(1.04)
    assert measured["least_baseline_ratio"] == pytest.approx(1.04)  # the CNN's is 2, the Transformer's 1.2
    assert "navier_stokes/fno/baseline_ratio" not in measured  # each PDE is judged apart
    holds, measured = C.frl_far_below_baseline(paper)
    assert measured["worst_frl_over_baseline"] == pytest.approx(0.8 * C.FAR_BELOW_1D)
    assert measured["burgers/transformer/frl_over_baseline_x4"] == pytest.approx(0.8 * C.FAR_BELOW_1D)

    def swap(trials, pde, backbone, frl, e1, e4):
        return [t for t in trials if not (t["pde"] == pde and t["backbone"] == backbone and C.is_frl(t) == frl)] + \
               [_trial(backbone, frl, e1, e4, pde=pde)]

    unanchored = swap(paper, "burgers", "fno", False, 0.05, 0.04)
    assert not judged_claim(C.baseline_anchored, unanchored) and judged_claim(C.baseline_anchored_2d, unanchored)
    rising = swap(paper, "burgers", "transformer", True, 0.03, 0.036)
    assert not judged_claim(C.frl_error_falls, rising)
    assert C.frl_error_falls(rising)[1]["worst_frl_ratio"] == pytest.approx(1.2)
    # One backbone whose FRL error falls but at 4x only meets the baseline's: the headline fails.
    close = swap(paper, "burgers", "cnn", True, 0.13, 0.1201)
    assert judged_claim(C.frl_error_falls, close) and not judged_claim(C.frl_far_below_baseline, close)
    ns_close = swap(paper, "navier_stokes", "fno", True, 0.06, 0.0521)
    assert judged_claim(C.frl_far_below_baseline, ns_close) and not judged_claim(C.frl_far_below_baseline_2d, ns_close)
    assert not C.solver_calibration([_trial("fno", False, 0.05, 0.05, solver=(0.01, 0.02))])[0]


def test_claims_average_seeds_and_need_both_variants():
    trials = [_trial("fno", False, 0.05, 0.06), _trial("fno", False, 0.05, 0.02),
              _trial("fno", True, 0.05, 0.01)]
    holds, measured = C.baseline_anchored(trials)
    assert measured["burgers/fno/baseline_x4"] == pytest.approx(0.04) and not holds
    with pytest.raises(LookupError, match="no frl"):
        C.frl_far_below_baseline(trials[:2])
    with pytest.raises(LookupError, match="of navier_stokes"):
        C.frl_far_below_baseline_2d(trials)


def test_plot_writes_a_png(tmp_path):
    trials = [_trial("fno", False, 0.05, 0.052), _trial("fno", True, 0.05, 0.02)]
    path = tmp_path / "frl.png"
    C.plot(trials, path)
    assert path.stat().st_size > 10_000


# --- config errors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"pde": "heat"}, "pde must be one of"),
        ({"backbone": "gnn"}, "backbone must be one of"),
        ({"modes": 17}, "modes=17 must lie in 1..rho0/2=16"),
        ({"eval_factors": (2, 4)}, "include 1 \\(the training resolution\\)"),
        ({"ref_n": 64}, "rho0 \\* max\\(eval_factors\\) = 128 <= ref_n = 64"),
        ({"cross_scale_weight": 0.1}, "set multires_levels >= 1"),
        ({"multires_levels": 4}, "rho0=32 with multires_levels=4"),
        ({"kernel": 4, "backbone": "cnn"}, "positive odd number"),
        ({"backbone": "transformer", "width": 30}, "multiple of heads=4"),
        ({"backbone": "transformer", "modes": 17}, "modes=17 must lie in"),
        ({"frl_coord": "log"}, "frl_coord must be"),
        ({"lag": 0.0}, "lag must be positive"),
    ],
)
def test_bad_configs_name_the_problem(changes, match):
    with pytest.raises(ValueError, match=match):
        W.validate(dataclasses.replace(W.Config(), **changes))


def test_more_than_one_worker_is_refused():
    with pytest.raises(ConfigError, match="workers=1"):
        registry.load("frl").validate(W.Config(), world_size=2)


# --- training --------------------------------------------------------------------------------


TINY_NS = dict(pde="navier_stokes", nu=2e-2, dns_n=32, dns_dt=2e-2, ref_n=32, rho0=8, modes=4,
               t_starts=(0.2,), lag=0.2, n_train=8, n_test=4, steps=3, width=8, depth=2,
               batch_size=4, log_every=1, eval_batch=4)


@pytest.mark.parametrize("backbone", ["fno", "cnn", "transformer"])
def test_frl_trains_in_two_dimensions(backbone, tmp_path):
    cfg = dataclasses.replace(W.Config(), backbone=backbone, frl=True, multires_levels=1,
                              spectral_weight=0.1, cross_scale_weight=0.1, seed=shifted(0), **TINY_NS)
    final = W.train(cfg, LocalRun(tmp_path))
    for f in (1, 2, 4):
        assert math.isfinite(final[f"eval/rel_l2/x{f}"]) and math.isfinite(final[f"eval/rel_l2_grid/x{f}"])
    assert final["eval/solver_rel_l2/x4"] < 1e-9  # at the reference grid the solver is the DNS


CI_PDES = ("burgers",)
"""The smoke reproduction as CI runs it: its six 1-D Burgers trials, not its 2-D Navier-Stokes pair
(about a third of a seed's time); `ladder reproduce frl --smoke` and the report run both, and the
2-D path trains for every backbone in test_frl_trains_in_two_dimensions."""


@pytest.mark.slow
def test_smoke_reproduction(workdir, monkeypatch):
    from orchestrator.reproduction import reproduce as reproduction

    full = narrowed_reproduction(monkeypatch, "frl", lambda sweep: dataclasses.replace(
        sweep, points=tuple(p for p in sweep.points if p["pde"] in CI_PDES)))
    assert {p["pde"] for p in full.points} == {"burgers", "navier_stokes"} and full.trial_count() == 8
    rep = reproduction.reproduce("frl", smoke=True, local=True)
    assert not rep.failed_trials and len(rep.trials) == 6
    assert {c.name for c in rep.checks} == {c.__name__ for c in C.CHECKS}
    by_name = {c.name: c for c in rep.claims}
    assert set(by_name) == {c.__name__ for c in C.CLAIMS}
    two_d = {name for name in by_name if name.endswith("_2d")}
    assert two_d == {"frl_far_below_baseline_2d", "frl_error_falls_2d", "baseline_anchored_2d"}
    for claim in rep.claims + rep.checks:
        if claim.name in two_d:  # no 2-D trials here: each says so rather than judging nothing
            assert claim.error and not claim.holds, claim.name
            continue
        assert claim.measured and not claim.error, claim.name
    for backbone in ("fno", "cnn", "transformer"):
        assert f"burgers/{backbone}/baseline_ratio" in by_name["baseline_anchored"].measured
        assert f"burgers/{backbone}/frl_ratio" in by_name["frl_error_falls"].measured
        assert f"burgers/{backbone}/frl_over_baseline_x4" in by_name["frl_far_below_baseline"].measured
    # margin, calibration seeds 100-104: least_baseline_ratio 1.206 1.209 1.260 1.176 1.223 (threshold 1);
    # solver_calibration held at all five.
    assert_claims_hold(rep, ["baseline_anchored", "solver_calibration"])
    # The headline (threshold 0.93) does not hold at every seed (worst_frl_over_baseline 0.775 0.841 0.997
    # 0.759 0.899 at seeds 100-104, the Transformer each time): one seed cannot judge it (`ladder report
    # frl --seeds 5` does). Asserted per backbone where its margin allows: the FNO's FRL at 4x is below
    # 0.9 of the baseline's (0.683 0.710 0.786 0.655 0.782), and no backbone's FRL is more than 10% above
    # its baseline (the worst measured 0.997).
    far = by_name["frl_far_below_baseline"].per_seed[0].measured
    assert far["burgers/fno/frl_over_baseline_x4"] < 0.9, far
    assert far["worst_frl_over_baseline"] < 1.1, far
    # frl_error_falls (threshold 1) does not hold at every seed either: worst_frl_ratio 0.981 0.937 1.022
    # 0.859 1.035 at seeds 100-104. Asserted by a written rule (issue 35): halfway between the worst FRL
    # ratio measured (1.035, seed 104) and the least anchored baseline ratio measured (1.176, seed 103),
    # 1.1: FRL's error never grows with resolution as the baseline's does.
    worst = by_name["frl_error_falls"].per_seed[0].measured["worst_frl_ratio"]
    assert worst < 1.1, by_name["frl_error_falls"].per_seed[0].measured
    # The regime the claims are about: at the forecast horizon the input's own band above rho0/2 no
    # longer predicts the target's (copying it is no better than leaving it out), so no model gains
    # at 4x without a learned response there; the baseline FNO passes the input's band on almost unchanged.
    # margin, seeds 100-104: persistence 1.18-1.28 (Burgers), 2.03-2.16 (Navier-Stokes) (threshold 1);
    # the Burgers baseline FNO's transmission 0.95-0.99 (threshold 0.5)
    for t in rep.trials:
        assert t["eval/blind_band_persistence/x4"] > 1.0, (t["pde"], t["eval/blind_band_persistence/x4"])
    fno_base = [t for t in rep.trials if t["pde"] == "burgers" and t["backbone"] == "fno" and C.is_baseline(t)]
    assert fno_base and fno_base[0]["eval/blind_band_transmit/x4"] > 0.5


# --- PDEBench-format files ---------------------------------------------------------------------


def _pdebench_burgers(path, trajectories: int, n: int = 128, dt: float = 0.1, steps: int = 16) -> torch.Tensor:
    """A 1-D Burgers file laid out as PDEBench's: `tensor` [N, T, X] (float32), `x-coordinate` on
    [0, 1), `t-coordinate` with one stamp more than the stored steps."""
    import h5py

    solver = Burgers(n, 0.02, 5e-3)
    u = burgers_initial(trajectories, n, 8, torch.Generator().manual_seed(7))
    frames = [u]
    for _ in range(steps - 1):
        u = solver.evolve(u, dt)
        frames.append(u)
    tensor = torch.stack(frames, 1).float()
    with h5py.File(path, "w") as f:
        f["tensor"] = tensor.numpy()
        f["x-coordinate"] = (torch.arange(n) / n).numpy()
        f["t-coordinate"] = (torch.arange(steps + 1) * dt).numpy()
    return tensor


def test_a_pdebench_burgers_file_trains_through_the_workload(workdir):
    """The smoke on a PDEBench-format file: pairs read at the file's time stamps from disjoint
    trajectories, truncated to the reference grid, and a loss that goes down."""
    from orchestrator.runners import launch, registry
    from workloads.frl.data import make_dataset

    tensor = _pdebench_burgers(workdir / "1D_Burgers_Sols_Nu0.02.hdf5", trajectories=30)
    cfg = dataclasses.replace(W.smoke(), data_path="1D_Burgers_Sols_Nu0.02.hdf5", ref_n=128, t_starts=(0.2, 0.4, 0.6),
                              lag=0.5, n_train=60, n_test=24, steps=60, log_every=10)
    registry.load("frl").preflight(cfg)
    data = make_dataset(W.data_spec(cfg))
    assert data.x_train.shape == (60, 128) and data.x_test.shape == (24, 128)
    # Trajectory-major: the first pairs are trajectory 0 at t = 0.2 and 0.4; test starts after the 20 training ones.
    assert torch.allclose(data.x_train[1], truncate(tensor[0, 4].double(), 128), atol=1e-12)
    assert torch.allclose(data.y_train[0], truncate(tensor[0, 7].double(), 128), atol=1e-12)
    assert torch.allclose(data.x_test[0], truncate(tensor[20, 2].double(), 128), atol=1e-12)
    result = launch.run_local("frl", cfg, progress=False, track=False)
    losses = [m["train/loss"] for _, m in result.history if "train/loss" in m]
    # margin: last over first loss, worst 0.126 over seeds 1-3, 10, 20 (threshold 0.5)
    assert all(math.isfinite(x) for x in losses) and losses[-1] < 0.5 * losses[0], losses
    assert math.isfinite(result.metrics["eval/rel_l2/x4"]) and "eval/solver_rel_l2/x1" not in result.metrics


def test_vorticity_is_derived_from_a_periodic_velocity_file(tmp_path):
    """2-D: Taylor-Green velocity (Vx = sin x cos y, Vy = -cos x sin y on [0, 1)^2 scaled to
    2 pi) stored as PDEBench's CFD files store it gives the vorticity 2 (2 pi) sin x sin y."""
    import h5py

    from workloads.frl.files import read_pairs

    n = 32
    s = torch.arange(n, dtype=torch.float64) / n
    x, y = torch.meshgrid(2 * math.pi * s, 2 * math.pi * s, indexing="ij")
    vx, vy = torch.sin(x) * torch.cos(y), -torch.cos(x) * torch.sin(y)
    with h5py.File(tmp_path / "2D_CFD_periodic.hdf5", "w") as f:
        f["Vx"] = torch.stack([vx * (1 + 0.1 * i) for i in range(3)]).unsqueeze(1).expand(3, 4, n, n).numpy()
        f["Vy"] = torch.stack([vy * (1 + 0.1 * i) for i in range(3)]).unsqueeze(1).expand(3, 4, n, n).numpy()
        f["x-coordinate"] = s.numpy()
        f["t-coordinate"] = torch.arange(5, dtype=torch.float64).numpy() * 0.5
    x_tr, y_tr, x_te, _ = read_pairs(str(tmp_path / "2D_CFD_periodic.hdf5"), "vorticity", 2, (0.5,), 1.0, 2, 1, 32, truncate)
    expected = 2 * (2 * math.pi) * torch.sin(x) * torch.sin(y)
    assert torch.allclose(x_tr[0], expected, atol=1e-9) and torch.allclose(x_tr[1], 1.1 * expected, atol=1e-9)
    assert torch.allclose(x_te[0], 1.2 * expected, atol=1e-9) and torch.allclose(y_tr[0], expected, atol=1e-9)


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"data_path": "burgers.npz"}, "is not an HDF5 file .*darus"),
        ({"data_path": "missing.hdf5"}, "does not exist .* PDEBench"),
        ({"data_field": "density"}, "data_field='density' is not in the file; it holds t-coordinate, tensor, x-coordinate"),
        ({"pde": "navier_stokes", "rho0": 8, "modes": 4}, r"has shape \(6, 16, 64\); pde=navier_stokes needs"),
        ({"lag": 0.55}, "time 0.75 is not among the file's stamps"),
        ({"n_train": 50}, "has 6 trajectories; n_train=50 and n_test=10 at 5 pairs each need 12"),
        ({"ref_n": 128, "rho0": 32}, "has 64 grid points per axis, below ref_n=128"),
    ],
)
def test_bad_trajectory_files_are_refused_before_the_run_naming_the_fix(workdir, changes, match):
    from orchestrator.runners import registry
    from orchestrator.runners.config import ConfigError

    _pdebench_burgers(workdir / "burgers.hdf5", trajectories=6, n=64, steps=16)
    cfg = dataclasses.replace(W.smoke(), **{"data_path": "burgers.hdf5", "ref_n": 64, "rho0": 16, "modes": 8,
                                            "n_train": 20, "n_test": 10, "lag": 0.5, **changes})
    w = registry.load("frl")
    with pytest.raises(ConfigError, match=match):
        w.validate(cfg)
        w.preflight(cfg)
