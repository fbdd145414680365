"""pft: the synthetic subjects' statistics, the style loss's gradient, the SFDA baselines' losses,
what each phase may change, the neutral-only data path, bad configs, resumption, the claims and
the smoke reproduction."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch

from orchestrator.runners import registry
from orchestrator.claims import spec_of
from orchestrator.runners.config import ConfigError
from orchestrator.run import LocalRun
from workloads.pft import CHECKS, CLAIMS, Config, data, method, plot, sfda, smoke, train, validate
from workloads.pft.claims import (
    exp_loss_prevents_collapse, only_translator_adapted, pft_beats_finetune, pft_beats_sfda, pft_beats_source,
)
from workloads.pft.model import Encoder, Translator, changed_tensors, gram, style_distance
from workloads.pft.workload import ARMS, phases
from conftest import judged_claim, shifted


def tiny(**kw) -> Config:
    """Every phase in a few dozen steps: well under a second. Seed 0: the data tests' fixed seed; a
    test that trains and asserts on the run passes `seed=shifted()`."""
    base = dict(dim=8, source_subjects=3, frames_per_class=20, source_eval_per_class=5, target_neutral_frames=24,
                target_eval_per_class=10, hidden=16, feat=8, translator_hidden=16, batch=16, source_steps=40,
                translator_steps=30, target_steps=20, target_batch=8, log_every=10)
    return Config(**{**base, **kw})


class Recorder(LocalRun):
    """A LocalRun that keeps a copy of every checkpoint it writes."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.saved: list[dict] = []

    def save(self, state):
        super().save(state)
        self.saved.append(copy.deepcopy(state))


def phase_end(cfg: Config, name: str) -> int:
    total = 0
    for phase, n in phases(cfg):
        total += n
        if phase == name:
            return total
    raise KeyError(name)


# --- the synthetic subjects -------------------------------------------------------------------


def test_prototypes_neutral_at_zero_and_orthogonal_expressions():
    p = data.prototypes(5, 12, 3.0, data.generator(0, 0))
    assert p.shape == (5, 12)
    assert torch.count_nonzero(p[0]) == 0
    torch.testing.assert_close(p[1:] @ p[1:].T, 9.0 * torch.eye(4), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="need dim >= 5"):
        data.prototypes(6, 4, 1.0, data.generator(0, 0))


def test_subject_style_magnitudes():
    protos = data.prototypes(4, 32, 3.0, data.generator(1, 0))
    subjects = [data.random_subject(protos, rotation=0.2, scale=0.3, shift=4.0, lean=0.0, gen=data.generator(1, 1, i))
                for i in range(60)]
    for s in subjects[:5]:
        torch.testing.assert_close(s.rotation @ s.rotation.T, torch.eye(32), atol=1e-5, rtol=0)
        assert float(torch.linalg.det(s.rotation)) == pytest.approx(1.0, abs=1e-4)
    v = torch.randn(200, 32, generator=torch.Generator().manual_seed(0))
    v = v / v.norm(dim=1, keepdim=True)
    turn = torch.stack([((v @ s.rotation.T) - v).norm(dim=1).mean() for s in subjects]).mean()
    assert float(turn) == pytest.approx(0.2, rel=0.15)  # |Rv - v| ~ angle for small angles
    log_scales = torch.cat([s.scale.log() for s in subjects])
    assert float(log_scales.std()) == pytest.approx(0.3, rel=0.1)
    shift_norm = torch.stack([s.shift.norm() for s in subjects]).pow(2).mean().sqrt()
    assert float(shift_norm) == pytest.approx(4.0, rel=0.1)


def test_lean_moves_the_offset_onto_one_expression():
    protos = data.prototypes(4, 16, 3.0, data.generator(2, 0))
    for i in range(10):
        s = data.random_subject(protos, rotation=0.1, scale=0.1, shift=0.0, lean=2.5, gen=data.generator(2, 1, i))
        along = protos[1:] @ s.shift / 3.0  # offset's coordinate along each expressive direction
        assert float(along.max()) == pytest.approx(2.5, abs=1e-5)
        assert float(along.abs().sort().values[:-1].max()) < 1e-5
        assert float(s.shift.norm()) == pytest.approx(2.5, abs=1e-5)


def test_frames_follow_the_subject_affine_style():
    protos = data.prototypes(4, 10, 3.0, data.generator(3, 0))
    s = data.random_subject(protos, rotation=0.3, scale=0.2, shift=3.0, lean=1.0, gen=data.generator(3, 1))
    n = 20000
    for k in range(4):
        x = data.sample(s, protos, torch.full((n,), k), 0.5, data.generator(3, 2, k))
        expected_mean = s.matrix @ protos[k] + s.shift
        assert float((x.mean(0) - expected_mean).norm()) < 0.05
        expected_cov = 0.25 * s.matrix @ s.matrix.T
        assert float((torch.cov(x.T) - expected_cov).abs().max()) < 0.03


def test_target_neutral_frames_are_unlabelled_neutral_draws_of_their_own_stream():
    cfg = tiny()
    world = method.make_world(cfg)
    target = method.make_target(cfg, world)
    neutral = method.neutral_frames(cfg, world, target)
    assert neutral.shape == (cfg.target_neutral_frames, cfg.dim)
    expected = data.sample(target, world.protos, torch.zeros(cfg.target_neutral_frames, dtype=torch.long), cfg.noise,
                           data.generator(cfg.seed, 5, cfg.target))
    assert torch.equal(neutral, expected)
    # Neutral is e_0 = 0, so the frames centre on the subject's own offset.
    big = data.target_neutral(target, world.protos, seed=0, index=0, frames=20000, noise=cfg.noise)
    assert float((big.mean(0) - target.shift).norm()) < 0.05
    # Evaluation frames are another stream: more of them leave the neutral frames alone.
    more = dataclasses.replace(cfg, target_eval_per_class=50)
    assert torch.equal(method.neutral_frames(more, world, method.make_target(more, world)), neutral)
    other = dataclasses.replace(cfg, target=1)
    assert not torch.equal(method.neutral_frames(other, world, method.make_target(other, world)), neutral)


def test_world_shapes_and_seeding():
    cfg = tiny()
    w = method.make_world(cfg)
    assert w.source_x.shape == (3, 4, 20, 8)
    assert w.source_eval_x.shape == (3 * 4 * 5, 8) and w.source_eval_y.shape == (60,)
    assert torch.equal(method.make_world(cfg).source_x, w.source_x)
    assert not torch.equal(method.make_world(dataclasses.replace(cfg, seed=1)).source_x, w.source_x)


def test_pairs_come_from_two_subjects_with_different_expressions():
    cfg = tiny(source_subjects=4)
    w = method.make_world(cfg)
    flat = w.source_x.reshape(-1, cfg.dim)
    n = cfg.frames_per_class
    for i in range(20):
        x1, x2 = method.pair_batch(w, 16, torch.Generator().manual_seed(i))
        where = [torch.cdist(x, flat).argmin(1) for x in (x1, x2)]
        subj = [idx // (cfg.classes * n) for idx in where]
        label = [(idx // n) % cfg.classes for idx in where]
        assert len(set(subj[0].tolist())) == 1 and len(set(subj[1].tolist())) == 1
        assert subj[0][0] != subj[1][0]
        assert bool((label[0] != label[1]).all())


# --- the losses -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["gram", "meanvar", "moments"])
def test_style_loss_gradient_reaches_every_translator_parameter(kind):
    cfg = tiny(style_loss=kind)
    nets = method.build_models(cfg)
    torch.nn.init.normal_(nets["translator"].out.weight, std=0.1)  # off the identity start, so W1 gets a gradient too
    x1, x2 = torch.randn(16, 8), torch.randn(16, 8) + 2.0
    _, l_style = method.translator_losses(cfg, x1, x2, nets["encoder"], nets["classifier"], nets["translator"])
    assert l_style.requires_grad
    grads = torch.autograd.grad(l_style, list(nets["translator"].parameters()), retain_graph=True)
    assert all(float(g.abs().max()) > 0 for g in grads), [float(g.abs().max()) for g in grads]
    # The source model gets nothing from the style loss: its features are computed without a graph.
    source_params = [p for n in ("encoder", "classifier") for p in nets[n].parameters()]
    assert all(g is None for g in torch.autograd.grad(l_style, source_params, allow_unused=True))


def test_released_style_loss_on_frozen_features_gives_the_translator_nothing():
    cfg = tiny(style_through_translator=False)
    nets = method.build_models(cfg)
    x1, x2 = torch.randn(16, 8), torch.randn(16, 8) + 2.0
    l_exp, l_style = method.translator_losses(cfg, x1, x2, nets["encoder"], nets["classifier"], nets["translator"])
    assert float(l_style) > 0 and not l_style.requires_grad  # a value, but a constant for T
    assert l_exp.requires_grad


def test_style_distances_vanish_for_one_style_and_see_an_affine_change():
    h = torch.randn(256, 6, generator=torch.Generator().manual_seed(0))
    for kind in ("gram", "meanvar", "moments"):
        assert float(style_distance(h, h.clone(), kind)) == 0.0
        assert float(style_distance(h, 1.5 * h + 1.0, kind)) > 0.01
    torch.testing.assert_close(gram(h), h.T @ h / (256 * 6))


def test_information_maximisation_rewards_confident_diverse_predictions():
    k = 4
    spread = 50.0 * torch.eye(k).repeat(2, 1)  # one-hot, every class twice: H(p_i) ~ 0, H(mean p) = log K
    assert float(sfda.information_maximisation(spread)) == pytest.approx(-math.log(k), abs=1e-3)
    one_class = 50.0 * torch.eye(k)[[1] * 8]  # confident but all one class: nothing gained
    assert float(sfda.information_maximisation(one_class)) == pytest.approx(0.0, abs=1e-3)
    unsure = torch.zeros(8, k)  # uniform predictions: the two entropies cancel
    assert float(sfda.information_maximisation(unsure)) == pytest.approx(0.0, abs=1e-3)


def test_shot_pseudo_labels_take_the_nearest_centroid_not_the_classifier():
    # Two clusters of features around (1, 0) and (0, 1); the classifier's bias puts (0.2, 1) in
    # class 0, but it lies near class 1's centroid (cosine, with the appended 1). Class 2 is never
    # predicted, so it gets no centroid and no frame.
    h = torch.tensor([[1.0, 0.0], [1.0, 0.2], [1.0, -0.2], [0.2, 1.0], [0.0, 1.0], [-0.2, 1.0]])
    classifier = torch.nn.Linear(2, 3)
    with torch.no_grad():
        classifier.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]]))
        classifier.bias.copy_(torch.tensor([0.9, 0.0, -10.0]))
    assert classifier(h).argmax(1).tolist() == [0, 0, 0, 0, 1, 1]
    labels = sfda.shot_pseudo_labels(h, torch.nn.Identity(), classifier)
    assert labels.tolist() == [0, 0, 0, 1, 1, 1]


def test_shot_trains_the_encoder_through_a_frozen_classifier():
    cfg = tiny()
    nets = method.build_models(cfg)
    x = torch.randn(8, cfg.dim)
    labels = torch.tensor([0, 1, 2, 3] * 2)
    nets["classifier"].requires_grad_(False)
    loss = sfda.shot_loss(x, labels, nets["shot_encoder"], nets["classifier"], cls_weight=0.3)
    grads = torch.autograd.grad(loss, list(nets["shot_encoder"].parameters()))
    assert all(float(g.abs().max()) > 0 for g in grads)
    assert method.phase_params(cfg, "shot", nets) == list(nets["shot_encoder"].parameters())
    assert not nets["classifier"].weight.requires_grad


def test_aad_loss_by_hand():
    # Identity encoder; a classifier with zero weights predicts p = (0.75, 0.25) for every frame.
    classifier = torch.nn.Linear(2, 2)
    with torch.no_grad():
        classifier.weight.zero_()
        classifier.bias.copy_(torch.tensor([0.75, 0.25]).log())
    x, idx = torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 1])
    feats = torch.tensor([[0.0, 1.0], [1.0, 0.0], [0.8, 0.6]])  # rows 0 and 1 are overwritten by the batch
    scores = torch.tensor([[0.5, 0.5], [0.5, 0.5], [0.9, 0.1]])
    before = feats.clone(), scores.clone()
    loss, new_feats, new_scores = sfda.aad_loss(x, idx, feats, scores, torch.nn.Identity(), classifier, k=1, alpha=0.5)
    # Each frame's nearest other bank entry is row 2 (cosine 0.8 and 0.6 against 0): attract -p.s2 = -0.7;
    # disperse: p.p of the one other frame of the batch = 0.75^2 + 0.25^2 = 0.625, times alpha 0.5.
    assert float(loss.detach()) == pytest.approx(-0.7 + 0.5 * 0.625, abs=1e-6)
    torch.testing.assert_close(new_feats, torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.8, 0.6]]))
    torch.testing.assert_close(new_scores, torch.tensor([[0.75, 0.25], [0.75, 0.25], [0.9, 0.1]]))
    assert torch.equal(feats, before[0]) and torch.equal(scores, before[1])  # new banks, the old left alone
    assert sfda.aad_alpha(0, 10, alpha=2.0, beta=5.0) == 2.0
    assert sfda.aad_alpha(10, 10, alpha=2.0, beta=5.0) == pytest.approx(2.0 * 11 ** -5.0)


def test_translator_starts_as_the_identity():
    t = Translator(8, 16)
    h = torch.randn(5, 8)
    assert torch.equal(t(h), h)
    assert not torch.equal(Translator(8, 16, residual=False, identity_init=False)(h), h)


def test_changed_tensors_sees_a_single_ulp():
    net = Encoder(4, 8, 4)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    assert changed_tensors(before, net) == 0
    with torch.no_grad():
        w = net.net[0].weight
        w[0, 0] = torch.nextafter(w[0, 0], torch.tensor(math.inf))
    assert changed_tensors(before, net) == 1


# --- what each phase changes ------------------------------------------------------------------


def test_adaptation_changes_only_the_translator(tmp_path):
    cfg = tiny(seed=shifted())
    run = Recorder(tmp_path)
    out = train(cfg, run)
    by_step = {s["step"]: s["nets"] for s in run.saved}
    before, after = by_step[phase_end(cfg, "finetune")], by_step[phase_end(cfg, "pft")]
    for name in ("encoder", "classifier", "translator"):
        for k, v in before[name].items():
            assert torch.equal(v, after[name][k]), f"{name}.{k} changed during PFT"
    moved = [k for k, v in before["translator"].items() if not torch.equal(v, after["pft_translator"][k])]
    assert len(moved) == len(before["translator"])  # every tensor of the adapted translator moved
    # The source model is also untouched by translator pretraining and by the plain fine-tune.
    source_end = by_step[phase_end(cfg, "source")]
    for name in ("encoder", "classifier"):
        for k, v in source_end[name].items():
            assert torch.equal(v, after[name][k])
    assert any(not torch.equal(v, after["ft_encoder"][k]) for k, v in source_end["encoder"].items())
    # SHOT moves its encoder against the frozen source classifier; AaD moves its encoder and classifier.
    end = run.saved[-1]["nets"]
    for name, source in (("shot_encoder", "encoder"), ("aad_encoder", "encoder"), ("aad_classifier", "classifier")):
        assert all(not torch.equal(v, end[name][k]) for k, v in source_end[source].items()
                   if k.endswith("weight")), name
    for name in ("encoder", "classifier"):
        for k, v in source_end[name].items():
            assert torch.equal(v, end[name][k]), f"{name}.{k} changed by an SFDA arm"
    assert out["diag/frozen_changed_by_pft"] == 0.0 and out["diag/translator_changed_by_pft"] == 4.0
    assert out["diag/frozen_changed_by_pretraining"] == 0.0


@pytest.mark.parametrize("which, moves", [("classifier", ("ft_classifier",)), ("encoder", ("ft_encoder",)),
                                          ("model", ("ft_encoder", "ft_classifier"))])
def test_finetune_updates_what_it_says(tmp_path, which, moves):
    cfg = tiny(seed=shifted(), finetune_params=which, scratch_arm=False, no_exp_arm=False, sfda_arms=False)
    run = Recorder(tmp_path)
    train(cfg, run)
    end = run.saved[-1]["nets"]
    for name in ("ft_encoder", "ft_classifier"):
        source = end[name.removeprefix("ft_")]
        changed = any(not torch.equal(v, end[name][k]) for k, v in source.items())
        assert changed == (name in moves), name


# --- the neutral-only data path ---------------------------------------------------------------


def test_adaptation_sees_only_the_neutral_frames(tmp_path, monkeypatch):
    cfg = tiny(seed=shifted())
    seen = []
    real_pft, real_ft = method.pft_loss, method.finetune_loss
    monkeypatch.setattr(method, "pft_loss", lambda x, *a, **k: (seen.append(x), real_pft(x, *a, **k))[1])
    monkeypatch.setattr(method, "finetune_loss", lambda x, *a, **k: (seen.append(x), real_ft(x, *a, **k))[1])
    for name in ("shot_loss", "aad_loss", "shot_pseudo_labels", "aad_banks"):  # batches, and the whole-set passes
        real = getattr(sfda, name)
        monkeypatch.setattr(sfda, name, lambda x, *a, _real=real, **k: (seen.append(x), _real(x, *a, **k))[1])
    train(cfg, LocalRun(tmp_path))
    world = method.make_world(cfg)
    neutral = method.neutral_frames(cfg, world, method.make_target(cfg, world))
    refreshes = len(range(0, cfg.target_steps, max(1, cfg.target_steps // sfda.SHOT_REFRESHES)))
    # finetune, pft, scratch, no_exp, shot, aad batches; SHOT's pseudo-label passes; AaD's bank.
    assert len(seen) == 6 * cfg.target_steps + refreshes + 1
    assert sum(len(x) == len(neutral) for x in seen) >= refreshes + 1
    rows = torch.cat(seen)
    assert bool((rows[:, None, :] == neutral[None]).all(-1).any(1).all())  # every adaptation frame is a neutral frame


def test_target_labels_cannot_change_adaptation(tmp_path, monkeypatch):
    from workloads.pft import workload

    cfg = tiny(seed=shifted())
    scored: dict[str, list] = {"honest": [], "lied": []}  # (predictions, labels) of every evaluation, in order
    real_report = workload.accuracy_report

    def recorded(which):
        def report(pred, labels, classes):
            scored[which].append((pred.clone(), labels.clone()))
            return real_report(pred, labels, classes)
        return report

    monkeypatch.setattr(workload, "accuracy_report", recorded("honest"))
    honest = Recorder(tmp_path / "honest")
    train(cfg, honest)
    real = method.eval_frames
    calls = []

    def scrambled(c, world, target):
        calls.append(1)
        x, y = real(c, world, target)
        return x, (y + 1) % c.classes  # every label wrong

    monkeypatch.setattr(method, "eval_frames", scrambled)
    monkeypatch.setattr(workload, "accuracy_report", recorded("lied"))
    lied = Recorder(tmp_path / "lied")
    train(cfg, lied)
    for name in ("pft_translator", "scratch_translator", "no_exp_translator", "ft_encoder", "ft_classifier",
                 "shot_encoder", "aad_encoder", "aad_classifier"):
        for k, v in honest.saved[-1]["nets"][name].items():
            assert torch.equal(v, lied.saved[-1]["nets"][name][k]), name
    assert len(calls) == len(ARMS)  # evaluation, and only evaluation, read the scrambled labels
    # ...and what it reported is the same predictions scored against them: bit-identical nets predict
    # bit-identically, and each arm's report is that of the scrambled labels (by construction, no margin).
    assert len(scored["honest"]) == len(scored["lied"]) == len(ARMS)
    for (pred, labels), (pred_lied, labels_lied) in zip(scored["honest"], scored["lied"]):
        assert torch.equal(pred_lied, pred) and torch.equal(labels_lied, (labels + 1) % cfg.classes)
    assert list(lied.saved[-1]["results"].values()) == [
        real_report(pred, (labels + 1) % cfg.classes, cfg.classes) for pred, labels in scored["honest"]]


# --- the loop ---------------------------------------------------------------------------------


def test_reports_every_arm_and_progress(tmp_path):
    run = LocalRun(tmp_path)
    out = train(tiny(seed=shifted()), run)
    for arm in ARMS:
        for key in ("acc", "recall_neutral", "recall_expr"):
            assert 0.0 <= out[f"eval/{key}/{arm}"] <= 1.0
    assert 0.0 <= out["diag/source_acc"] <= 1.0
    progress = [m["progress"] for _, m in run.history if "progress" in m]
    assert progress == sorted(progress) and progress[-1] == 1.0


def test_arms_can_be_left_out(tmp_path):
    out = train(tiny(seed=shifted(), scratch_arm=False, no_exp_arm=False, sfda_arms=False), LocalRun(tmp_path))
    assert "eval/acc/scratch" not in out and "eval/acc/no_exp" not in out and "eval/acc/pft" in out
    assert "eval/acc/shot" not in out and "eval/acc/aad" not in out


def test_resumed_run_ends_where_an_uninterrupted_one_does(tmp_path):
    cfg = tiny(seed=shifted(), checkpoint_every_frac=0.1, target_steps=45)  # SHOT refreshes its labels every 3 steps
    recorded = Recorder(tmp_path / "whole")
    whole = train(cfg, recorded)
    saved_at = [s["step"] for s in recorded.saved]
    # Killed right after a mid-phase checkpoint (optimizer state restored), after a phase end, and
    # mid-SHOT and mid-AaD, whose pseudo-labels and memory banks must come back from the checkpoint.
    refresh = max(1, cfg.target_steps // sfda.SHOT_REFRESHES)

    def first_save_inside(phase: str, *, between_refreshes: bool = False) -> int:
        start = phase_end(cfg, phase) - cfg.target_steps
        return 1 + next(i for i, step in enumerate(saved_at) if start < step < phase_end(cfg, phase)
                        and not (between_refreshes and (step - start) % refresh == 0))

    # After the SHOT cut the next step does not refresh: it trains on the checkpoint's pseudo-labels.
    mid = (first_save_inside("shot", between_refreshes=True), first_save_inside("aad"))
    for cut_after in (2, 5, *mid):
        class Dies(LocalRun):
            saves = 0

            def save(self, state):
                super().save(state)
                Dies.saves += 1
                if Dies.saves == cut_after:
                    raise KeyboardInterrupt

        folder = tmp_path / f"cut{cut_after}"
        with pytest.raises(KeyboardInterrupt):
            train(cfg, Dies(folder))
        resumed = LocalRun(folder)
        again = train(cfg, resumed)
        assert resumed.restored_step and resumed.restored_step > 0
        assert again.keys() == whole.keys()
        for key in whole:
            if not key.startswith("perf/"):
                assert again[key] == whole[key], key


# --- configs ----------------------------------------------------------------------------------


@pytest.mark.parametrize("change, message", [
    ({"classes": 1}, "classes must be at least 2"),
    ({"classes": 40}, "needs dim >= 39"),
    ({"source_subjects": 1}, "translator pairs need two different subjects"),
    ({"target": -1}, "target is a subject index"),
    ({"noise": 0.0}, "noise must be positive"),
    ({"target_lr": -1e-3}, "target_lr must be positive"),
    ({"target_shift": -1.0}, "target_shift must be non-negative"),
    ({"style_weight": -1.0}, "style_weight must be non-negative"),
    ({"exp_loss": "l1"}, "exp_loss must be"),
    ({"style_loss": "adain"}, "style_loss must be"),
    ({"finetune_params": "all"}, "finetune_params must be"),
    ({"style_loss": "moments", "batch": 1}, "batch >= 2"),
    ({"target_steps": 0}, "target_steps must be positive"),
    ({"target_neutral_frames": 0}, "target_neutral_frames must be positive"),
    ({"checkpoint_every_frac": 0.0}, "checkpoint_every_frac must lie in"),
    ({"threads": -1}, "threads must be"),
])
def test_bad_configs_name_the_problem(change, message):
    with pytest.raises(ValueError, match=message):
        validate(dataclasses.replace(Config(), **change))


def test_more_than_one_worker_is_refused():
    with pytest.raises(ConfigError, match="workers=1"):
        registry.load("pft").validate(Config(), world_size=2)


def test_smoke_and_default_configs_are_valid():
    validate(smoke())
    validate(Config())


# --- claims -----------------------------------------------------------------------------------


def trial(target, *, source=0.6, finetune=0.7, pft=0.8, expr_pft=0.9, expr_no_exp=0.4, shot=0.65, aad=0.6,
          frozen=0.0, moved=4.0, **cfg):
    t = {"seed": 0, "target": target, "dim": 16, **cfg, "trial_id": f"t{target}",
         "diag/frozen_changed_by_pft": frozen, "diag/translator_changed_by_pft": moved}
    for arm, acc, expr in (("source", source, 0.8), ("finetune", finetune, 0.6), ("pft", pft, expr_pft),
                           ("no_exp", 0.5, expr_no_exp), ("translator", source, 0.8), ("scratch", pft, expr_pft),
                           ("shot", shot, 0.9), ("aad", aad, 0.7)):
        t[f"eval/acc/{arm}"], t[f"eval/recall_expr/{arm}"], t[f"eval/recall_neutral/{arm}"] = acc, expr, 0.5
    return t




def test_claims_hold_on_the_papers_pattern():
    trials = [trial(0), trial(1, source=0.7, finetune=0.7, pft=0.78)]
    results = {c.__name__: c(trials) for c in CLAIMS}
    assert all(holds for holds, _ in results.values()), results
    assert all(judged_claim(c, trials) for c in CLAIMS)
    assert results["pft_beats_source"][1]["gain"] == pytest.approx(0.14)
    # The headline is against the better SFDA baseline per setting: SHOT's mean 0.65 beats AaD's 0.6.
    assert results["pft_beats_sfda"][1]["best_sfda"] == pytest.approx(0.65)
    assert results["pft_beats_sfda"][1]["min_gain"] == pytest.approx(0.79 - 0.65)
    assert CLAIMS[0] is pft_beats_sfda
    assert results["pft_beats_finetune"][1]["wins"] == 1.0
    assert results["exp_loss_prevents_collapse"][1]["min_drop"] == pytest.approx(0.5)
    assert CHECKS == [only_translator_adapted] and only_translator_adapted not in CLAIMS
    assert spec_of(only_translator_adapted) is None and only_translator_adapted(trials)[0]


def test_claims_fail_when_the_pattern_is_absent():
    assert not judged_claim(pft_beats_source, [trial(0, source=0.78), trial(1, source=0.8)])
    # Either baseline alone can beat PFT: the headline takes the better one.
    assert not judged_claim(pft_beats_sfda, [trial(0, aad=0.85), trial(1, aad=0.8)])
    assert not judged_claim(pft_beats_sfda, [trial(0, shot=0.85), trial(1, shot=0.8)])
    assert not judged_claim(pft_beats_finetune, [trial(0, finetune=0.8), trial(1, finetune=0.79)])
    assert not judged_claim(exp_loss_prevents_collapse, [trial(0, expr_no_exp=0.88)])
    assert not only_translator_adapted([trial(0), trial(1, frozen=1.0)])[0]
    assert not only_translator_adapted([trial(0, moved=0.0)])[0]


def test_claims_are_judged_per_setting():
    good = [trial(0, dim=16), trial(1, dim=16)]
    bad = [trial(0, dim=32, source=0.79), trial(1, dim=32, source=0.79)]
    holds, measured = pft_beats_source(good + bad)
    assert not holds
    assert measured["gain[dim=16]"] == pytest.approx(0.2) and measured["gain[dim=32]"] == pytest.approx(0.01)
    assert measured["min_gain"] == pytest.approx(0.01)


def test_a_missing_arm_is_an_error_not_a_pass():
    t = trial(0)
    del t["eval/recall_expr/no_exp"]
    with pytest.raises(ValueError, match="no_arm|did not run"):
        exp_loss_prevents_collapse([t])


def test_plot_writes_a_png(tmp_path):
    path = tmp_path / "claims.png"
    plot([trial(0), trial(1, pft=0.7)], path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- the reproduction -------------------------------------------------------------------------


@pytest.mark.slow
def test_smoke_reproduction_holds(workdir):
    from orchestrator.reproduction.reproduce import reproduce

    rep = reproduce("pft", smoke=True, local=True)
    assert not rep.failed_trials
    assert len(rep.trials) == 8
    assert sorted((t["seed"], t["target"]) for t in rep.trials) == [(s, t) for s in (shifted(0), shifted(1))
                                                                      for t in range(4)]
    # margin (every claim's effect at the replicates of seeds 2-13, i.e. at 2, 4, 6, 8 from docs/reproductions.md
    # and 10, 12 measured; the SFDA arms run after these arms and leave them bit-identical):
    # pft_beats_source worst 0.098 (threshold 0.028), pft_beats_finetune worst 0.095 (threshold 0.07),
    # exp_loss_prevents_collapse worst 0.385 (threshold 0.041).
    controls = ["pft_beats_source", "pft_beats_finetune", "exp_loss_prevents_collapse", "only_translator_adapted"]
    assert not rep.failures(controls), rep.failures(controls)
    assert [c.name for c in rep.checks] == ["only_translator_adapted"] and rep.checks[0].verdict == "holds"
    # The headline does not hold at every seed of this size (docs/reproductions/pft.json: its gain over
    # the best SFDA baseline is below its threshold at some calibration and judged seeds), so the test
    # asserts that it was measured against both baselines, not its verdict.
    assert rep.outcomes[0].name == "pft_beats_sfda" and not rep.outcomes[0].error
    assert all(f"eval/acc/{arm}" in t for t in rep.trials for arm in ("shot", "aad"))
    for claim in rep.outcomes:
        assert claim.measured and all(math.isfinite(v) for v in claim.measured.values()), claim


# --- real frames: an image folder per subject through a frozen backbone -------------------------


def _frames_and_backbone(root, subjects: int = 4, per_class: int = 20):
    """Frames in the BioVid/StressID layout (subject/expression/frame.png): a subject is a colour
    tint, 'pain' a bright band across the face; and a tiny ViT saved as a pretrained folder."""
    import numpy as np
    from PIL import Image
    from transformers import ViTConfig, ViTImageProcessor, ViTModel

    rng = np.random.default_rng(0)
    for s in range(subjects):
        tint = rng.uniform(0, 30, size=3)
        for expression in ("neutral", "pain"):
            folder = root / "frames" / f"subject{s:02d}" / expression
            folder.mkdir(parents=True)
            for i in range(per_class):
                img = rng.normal(100, 20, size=(32, 32, 3)) + tint
                if expression == "pain":
                    img[8:24] += 120
                Image.fromarray(np.clip(img, 0, 255).astype("uint8")).save(folder / f"{i:04d}.png")
    torch.manual_seed(0)
    config = ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                       intermediate_size=64)
    ViTModel(config).save_pretrained(root / "vit")
    ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(root / "vit")
    return root / "frames", root / "vit"


REAL = dict(classes=2, dim=0, source_subjects=3, frames_per_class=12, source_eval_per_class=4, target_neutral_frames=10,
            target_eval_per_class=8, hidden=32, feat=16, translator_hidden=32, batch=16, target_batch=8, source_steps=150,
            translator_steps=30, target_steps=30, log_every=10, source_lr=3e-3)


def test_real_frames_train_through_a_frozen_backbone_and_are_extracted_once(workdir, ladder_cache):
    from orchestrator.runners import launch, registry

    frames_dir, vit = _frames_and_backbone(workdir)
    cfg = dataclasses.replace(smoke(), data_dir=str(frames_dir), backbone=str(vit), **REAL)
    w = registry.load("pft")
    w.validate(cfg)
    w.preflight(cfg)
    result = launch.run_local("pft", cfg, progress=False, track=False)
    losses = [m["train/loss"] for step, m in result.history if "train/loss" in m and step <= cfg.source_steps]
    # margin: last/first source loss worst 7.8e-4 over seeds 1-5 (threshold: below 1)
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0], losses
    assert 0.0 <= result.metrics["eval/acc/pft"] <= 1.0 and math.isfinite(result.metrics["eval/acc/source"])
    cached = list((ladder_cache / "pft").glob("features-*.pt"))
    assert len(cached) >= 1
    stamp = {p: p.stat().st_mtime_ns for p in cached}
    launch.run_local("pft", dataclasses.replace(cfg, seed=cfg.seed + 1), progress=False, track=False)
    assert {p: p.stat().st_mtime_ns for p in (ladder_cache / "pft").glob("features-*.pt")} == stamp  # read, not redone


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"backbone": ""}, "data_dir needs backbone"),
        ({"data_dir": "nowhere"}, "data_dir='nowhere' is not a folder .*BioVid"),
        ({"neutral_class": "calm"}, "no 'calm' expression folder .*set neutral_class"),
        ({"classes": 3}, "hold 2 expressions \\(neutral, pain\\): set classes=2"),
        ({"source_subjects": 4}, "only 3 subjects besides the target: set source_subjects=3"),
        ({"frames_per_class": 18}, "subject01/neutral has 20 frames; frames_per_class \\+ source_eval_per_class = 22"),
        ({"target_neutral_frames": 20}, "must leave some to evaluate on"),
        ({"backbone": "./missing-model"}, "neither a transformers model folder .* nor a hub id"),
        ({"backbone": "someone/unknown-model"}, "hf download microsoft/resnet-50"),
    ],
)
def test_bad_frame_folders_are_refused_before_the_run_naming_the_fix(workdir, monkeypatch, changes, match):
    from orchestrator.runners import registry
    from orchestrator.runners.config import ConfigError

    monkeypatch.setenv("HF_HUB_CACHE", str(workdir / "hub"))  # an empty Hugging Face cache
    frames_dir, vit = _frames_and_backbone(workdir, per_class=20)
    cfg = dataclasses.replace(smoke(), **{"data_dir": str(frames_dir), "backbone": str(vit), **REAL, **changes})
    w = registry.load("pft")
    with pytest.raises(ConfigError, match=match):
        w.validate(cfg)
        w.preflight(cfg)
