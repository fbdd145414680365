"""pft: the method's pieces on the synthetic world: batches, the PFT losses, who is trained when.

The translator's source phase, as in the released train_source.py: for a frame x2 of subject s2
and a frame x1 of another subject s1 showing another expression, T(F(x2)) must keep x2's
expression (L_exp against the frozen model's prediction) and take s1's style (L_style between the
translated batch and F(x1)). Its target phase, as in train_target.py: on the target's neutral
frames, cross-entropy towards 'neutral' plus L_exp against the frozen model, T alone trained.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as nnf

from workloads.pft import data
from workloads.pft.config import Config
from workloads.pft.model import Encoder, ExpLoss, Translator, expression_loss, style_distance


def make_world(cfg: Config) -> data.World:
    return data.make_world(
        seed=cfg.seed, dim=cfg.dim, classes=cfg.classes, expr_radius=cfg.expr_radius, noise=cfg.noise,
        subjects=cfg.source_subjects, per_class=cfg.frames_per_class, eval_per_class=cfg.source_eval_per_class,
        rotation=cfg.style_rotation, scale=cfg.style_scale, shift=cfg.style_shift, lean=cfg.style_lean,
    )


def make_target(cfg: Config, world: data.World) -> data.Subject:
    return data.target_subject(world.protos, seed=cfg.seed, index=cfg.target, rotation=cfg.target_rotation,
                               scale=cfg.target_scale, shift=cfg.target_shift, lean=cfg.target_lean)


def neutral_frames(cfg: Config, world: data.World, subject: data.Subject) -> torch.Tensor:
    """The target's unlabelled neutral frames: the adaptation arms' only data."""
    return data.target_neutral(subject, world.protos, seed=cfg.seed, index=cfg.target,
                               frames=cfg.target_neutral_frames, noise=cfg.noise)


def eval_frames(cfg: Config, world: data.World, subject: data.Subject) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's labelled frames of every expression: read only by evaluation."""
    return data.target_eval(subject, world.protos, seed=cfg.seed, index=cfg.target,
                            per_class=cfg.target_eval_per_class, noise=cfg.noise)


def build_models(cfg: Config) -> dict[str, torch.nn.Module]:
    """Every network of the run, initialised from the seed; arm copies are overwritten when their phase starts."""
    with torch.random.fork_rng(devices=[]):  # seeded initialisation without moving the caller's global RNG
        torch.manual_seed(cfg.seed)
        encoder = Encoder(cfg.dim, cfg.hidden, cfg.feat)
        classifier = torch.nn.Linear(cfg.feat, cfg.classes)
        translator = Translator(cfg.feat, cfg.translator_hidden, residual=cfg.translator_residual,
                                identity_init=cfg.translator_residual)
    return {
        "encoder": encoder, "classifier": classifier, "translator": translator,
        "ft_encoder": copy.deepcopy(encoder), "ft_classifier": copy.deepcopy(classifier),
        "pft_translator": copy.deepcopy(translator), "scratch_translator": copy.deepcopy(translator),
        "no_exp_translator": copy.deepcopy(translator), "shot_encoder": copy.deepcopy(encoder),
        "aad_encoder": copy.deepcopy(encoder), "aad_classifier": copy.deepcopy(classifier),
    }


def source_batch(world: data.World, batch: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    s, k, n, dim = world.source_x.shape
    idx = torch.randint(s * k * n, (batch,), generator=gen)
    return world.source_x.reshape(-1, dim)[idx], (idx // n) % k


def pair_batch(world: data.World, batch: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(x1, x2): `batch` frames of subject s1 and of a different subject s2, each x1 showing a
    different expression from its x2 (the released pairing rule: other subject, other label)."""
    s, k, n, _ = world.source_x.shape
    s2 = int(torch.randint(s, (1,), generator=gen))
    s1 = (s2 + int(torch.randint(1, s, (1,), generator=gen))) % s
    y2 = torch.randint(k, (batch,), generator=gen)
    y1 = (y2 + torch.randint(1, k, (batch,), generator=gen)) % k
    i1, i2 = torch.randint(n, (batch,), generator=gen), torch.randint(n, (batch,), generator=gen)
    return world.source_x[s1, y1, i1], world.source_x[s2, y2, i2]


def translator_losses(cfg: Config, x1: torch.Tensor, x2: torch.Tensor, encoder, classifier, translator) -> tuple[torch.Tensor, torch.Tensor]:
    """(L_exp, L_style) of one pair batch: T(F(x2)) keeps x2's expression and takes s1's style."""
    with torch.no_grad():
        h1, h2 = encoder(x1), encoder(x2)
        frozen_logits = classifier(h2)
    t2 = translator(h2)
    l_exp = expression_loss(frozen_logits, classifier(t2), cfg.exp_loss)
    l_style = style_distance(t2 if cfg.style_through_translator else h2, h1, cfg.style_loss)
    return l_exp, l_style


def pft_loss(x: torch.Tensor, encoder, classifier, translator, *, exp_weight: float, exp_loss: ExpLoss) -> torch.Tensor:
    """Target phase: CE(C(T(F(x))), neutral) + w * L_exp(C(F(x)), C(T(F(x)))) on neutral frames x."""
    with torch.no_grad():
        h = encoder(x)
        frozen_logits = classifier(h)
    logits = classifier(translator(h))
    neutral = torch.full((len(x),), data.NEUTRAL, dtype=torch.long)
    loss = nnf.cross_entropy(logits, neutral)
    if exp_weight:
        loss = loss + exp_weight * expression_loss(frozen_logits, logits, exp_loss)
    return loss


def finetune_loss(x: torch.Tensor, encoder, classifier) -> torch.Tensor:
    """The plain fine-tune: cross-entropy of the source model's prediction towards 'neutral'."""
    return nnf.cross_entropy(classifier(encoder(x)), torch.full((len(x),), data.NEUTRAL, dtype=torch.long))


def phase_params(cfg: Config, phase: str, nets: dict[str, torch.nn.Module]) -> list[torch.nn.Parameter]:
    """The parameters each phase's optimizer updates; everything else stays frozen."""
    if phase == "source":
        return [*nets["encoder"].parameters(), *nets["classifier"].parameters()]
    if phase == "translator":
        return list(nets["translator"].parameters())
    if phase == "finetune":
        parts = {"model": ("ft_encoder", "ft_classifier"), "classifier": ("ft_classifier",), "encoder": ("ft_encoder",)}
        return [p for name in parts[cfg.finetune_params] for p in nets[name].parameters()]
    if phase == "shot":  # SHOT freezes the source hypothesis (the classifier)
        return list(nets["shot_encoder"].parameters())
    if phase == "aad":  # the released AaD code trains the classifier too
        return [*nets["aad_encoder"].parameters(), *nets["aad_classifier"].parameters()]
    return list(nets[f"{phase}_translator"].parameters())


