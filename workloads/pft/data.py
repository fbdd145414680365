"""pft: synthetic subjects in a latent space, each an affine style over shared expression clusters.

A frame of subject s showing expression y is

    x = A_s (e_y + eps) + b_s,    A_s = R_s diag(c_s),    eps ~ N(0, noise^2 I)

- e_y are the expression prototypes, shared by every subject: e_0 = 0 (neutral is the absence of
  an expression) and e_1..e_{K-1} orthogonal, of norm `expr_radius`;
- R_s = exp(theta S) is a rotation near the identity (S a random skew-symmetric matrix scaled so
  that a unit vector turns by about theta radians), c_s = exp(scale * N(0, 1)) per axis, and
  b_s = u + lean * e_k / |e_k| with u ~ N(0, shift^2 / dim I) (|u| about `shift`) and k a random
  expressive class: together the subject's style. The lean is a resting face that looks like
  expression k, the case the paper is about: a source model reads such a subject's neutral frames
  as an expression, and only the neutral frames are there to correct it.

Because e_0 = 0, a subject's neutral frames are centred on its own offset b_s: neutral frames
reveal the shift (and, through their covariance, the scale) but not the rotation, which only
shows on expressive frames.

Every random draw comes from a generator seeded by (seed, stream, index), so the source subjects,
a target subject, its neutral frames and its evaluation frames are separate streams: adding
evaluation frames or changing them never changes what adaptation sees.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

NEUTRAL = 0
"""Class index of the neutral expression."""

# Stream tags that make every draw its own generator.
_PROTOTYPES, _SOURCE_STYLE, _SOURCE_FRAMES, _SOURCE_EVAL, _TARGET_STYLE, _TARGET_NEUTRAL, _TARGET_EVAL = range(7)


def generator(seed: int, stream: int, index: int = 0) -> torch.Generator:
    """A CPU generator for one named stream of one seed."""
    return torch.Generator().manual_seed(1_000_003 * seed + 7919 * stream + index)


@dataclass(frozen=True)
class Subject:
    """One subject's affine style: x = rotation @ (scale * z) + shift for a latent z."""

    rotation: torch.Tensor
    scale: torch.Tensor
    shift: torch.Tensor

    @property
    def matrix(self) -> torch.Tensor:
        """A_s = R_s diag(c_s)."""
        return self.rotation * self.scale

    def apply(self, z: torch.Tensor) -> torch.Tensor:  # [N, dim] -> [N, dim]
        return (z * self.scale) @ self.rotation.T + self.shift


def prototypes(classes: int, dim: int, radius: float, gen: torch.Generator) -> torch.Tensor:
    """[classes, dim]: e_0 = 0 and classes - 1 orthogonal prototypes of norm `radius`."""
    if classes - 1 > dim:
        raise ValueError(f"classes - 1 = {classes - 1} orthogonal prototypes need dim >= {classes - 1}, got dim={dim}")
    q, _ = torch.linalg.qr(torch.randn(dim, classes - 1, generator=gen))
    return torch.cat([torch.zeros(1, dim), radius * q.T], dim=0)


def random_subject(protos: torch.Tensor, *, rotation: float, scale: float, shift: float, lean: float,
                   gen: torch.Generator) -> Subject:
    """A subject with a rotation of about `rotation` radians, log-scales of std `scale`, and an offset
    of norm ~`shift` in a random direction plus `lean` towards one random expressive prototype."""
    dim = protos.shape[1]
    g = torch.randn(dim, dim, generator=gen) / dim ** 0.5
    skew = (g - g.T) / 2 ** 0.5  # |skew @ v| ~ |v| for a random v
    rot = torch.linalg.matrix_exp(rotation * skew)
    log_scale = scale * torch.randn(dim, generator=gen)
    offset = shift * torch.randn(dim, generator=gen) / dim ** 0.5
    k = int(torch.randint(1, protos.shape[0], (1,), generator=gen))
    offset = offset + lean * protos[k] / protos[k].norm()
    return Subject(rot, log_scale.exp(), offset)


def sample(subject: Subject, protos: torch.Tensor, labels: torch.Tensor, noise: float, gen: torch.Generator) -> torch.Tensor:
    """Frames of `subject` showing `labels` ([N] class indices) -> [N, dim]."""
    z = protos[labels] + noise * torch.randn(len(labels), protos.shape[1], generator=gen)
    return subject.apply(z)


def balanced_labels(classes: int, per_class: int) -> torch.Tensor:
    """[classes * per_class]: 0..0, 1..1, ..."""
    return torch.arange(classes).repeat_interleave(per_class)


@dataclass(frozen=True)
class World:
    """Everything drawn from one seed except the target subjects: prototypes and source subjects."""

    protos: torch.Tensor
    """[K, dim] expression prototypes."""
    sources: list[Subject]
    source_x: torch.Tensor
    """[S, K, n, dim] training frames of each source subject and class."""
    source_eval_x: torch.Tensor
    """[M, dim] held-out frames of the source subjects (all classes), for the source model's accuracy."""
    source_eval_y: torch.Tensor


def make_world(*, seed: int, dim: int, classes: int, expr_radius: float, noise: float, subjects: int,
               per_class: int, eval_per_class: int, rotation: float, scale: float, shift: float, lean: float) -> World:
    protos = prototypes(classes, dim, expr_radius, generator(seed, _PROTOTYPES))
    sources = [random_subject(protos, rotation=rotation, scale=scale, shift=shift, lean=lean, gen=generator(seed, _SOURCE_STYLE, s))
               for s in range(subjects)]
    labels = balanced_labels(classes, per_class)
    source_x = torch.stack([
        sample(subj, protos, labels, noise, generator(seed, _SOURCE_FRAMES, s)).reshape(classes, per_class, dim)
        for s, subj in enumerate(sources)
    ])
    eval_labels = balanced_labels(classes, eval_per_class)
    eval_x = torch.cat([sample(subj, protos, eval_labels, noise, generator(seed, _SOURCE_EVAL, s)) for s, subj in enumerate(sources)])
    return World(protos, sources, source_x, eval_x, eval_labels.repeat(subjects))


def target_subject(protos: torch.Tensor, *, seed: int, index: int, rotation: float, scale: float, shift: float,
                   lean: float) -> Subject:
    """Held-out subject `index` of this seed (its style is drawn apart from every source subject's)."""
    return random_subject(protos, rotation=rotation, scale=scale, shift=shift, lean=lean, gen=generator(seed, _TARGET_STYLE, index))


def target_neutral(subject: Subject, protos: torch.Tensor, *, seed: int, index: int, frames: int, noise: float) -> torch.Tensor:
    """[frames, dim] unlabelled neutral frames of the target: all that adaptation may see.

    Only frames come back, no labels: they are neutral by construction, and the adaptation code
    has no argument through which a target label could reach it.
    """
    labels = torch.full((frames,), NEUTRAL, dtype=torch.long)
    return sample(subject, protos, labels, noise, generator(seed, _TARGET_NEUTRAL, index))


def target_eval(subject: Subject, protos: torch.Tensor, *, seed: int, index: int, per_class: int,
                noise: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Labelled frames of every expression of the target subject, for evaluation only."""
    labels = balanced_labels(protos.shape[0], per_class)
    return sample(subject, protos, labels, noise, generator(seed, _TARGET_EVAL, index)), labels
