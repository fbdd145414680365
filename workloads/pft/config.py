"""pft's Config: every field of a run, documented (the loop is in workload.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


ARMS = ("source", "translator", "finetune", "pft", "scratch", "no_exp", "shot", "aad")
"""Evaluated arms: the unadapted source model, the pretrained translator before adaptation, the
plain fine-tune on neutral frames, PFT, PFT from an untrained (identity) translator, PFT
without L_exp in the target phase, and the SFDA baselines SHOT and AaD on the same neutral frames."""


MAX_WORKERS = 1
"""pft runs on one worker (the problem is small): the runner refuses more."""


@dataclass(frozen=True)
class Config:
    dim: int = 32
    """Dimension of the latent frames (with data_dir: the backbone's feature size, which dim=0 takes)."""
    classes: int = 4
    """Expression classes K; class 0 is neutral (needs classes - 1 <= dim)."""
    expr_radius: float = 3.0
    """Distance of every expressive prototype from the neutral one (e_0 = 0)."""
    noise: float = 0.5
    """Std of the per-frame latent noise (before the subject's style)."""
    source_subjects: int = 8
    """Source subjects, every expression labelled."""
    frames_per_class: int = 100
    """Training frames per source subject and class."""
    source_eval_per_class: int = 25
    """Held-out frames per source subject and class, for the source model's own accuracy."""
    style_rotation: float = 0.3
    """Source styles: typical rotation angle (radians) of R_s."""
    style_scale: float = 0.2
    """Source styles: std of the per-axis log-scales."""
    style_shift: float = 3.0
    """Source styles: typical norm of the random part of the offset b_s."""
    style_lean: float = 0.0
    """Source styles: part of b_s along one random expressive prototype (a resting face that looks
    like that expression)."""
    target: int = 0
    """Index of the held-out target subject (each index is a different subject of the same seed)."""
    target_rotation: float = 0.3
    """Target style: typical rotation angle; neutral frames cannot reveal it."""
    target_scale: float = 0.2
    """Target style: std of the per-axis log-scales."""
    target_shift: float = 4.0
    """Target style: typical norm of the random part of the offset, larger than the sources'."""
    target_lean: float = 2.5
    """Target style: part of the offset along one random expressive prototype, so that the source
    model reads the target's neutral face as that expression (the case neutral frames can reveal)."""
    target_neutral_frames: int = 200
    """Unlabelled neutral frames of the target: the only target data adaptation sees."""
    target_eval_per_class: int = 200
    """Labelled target frames per class, used only to evaluate."""
    hidden: int = 128
    """Encoder hidden width."""
    feat: int = 64
    """Feature width (the space the translator works in)."""
    translator_hidden: int = 128
    """Translator MLP hidden width."""
    translator_residual: bool = True
    """T(h) = h + MLP(h) (True, starting at the identity) or MLP(h) as in the released FeatureTranslator
    (False); the released code's MLP has no skip, a reconstruction choice for a latent translator."""
    batch: int = 64
    """Source-model batch, and frames per subject of each translator pair."""
    source_steps: int = 1500
    """Adam steps of the source model (F and C, cross-entropy on every source frame)."""
    source_lr: float = 1e-3
    """Source-model learning rate."""
    translator_steps: int = 1500
    """Adam steps of translator pretraining on source subject pairs (F and C frozen)."""
    translator_lr: float = 1e-4
    """Translator pretraining learning rate, the released code's 1e-4. Pretrained at 1e-3 over the
    default 1,500 steps, the translator adapted badly in the 32-d world (PFT 0.47 against the
    source model's 0.51 over 8 target subjects; its logits were not inflated, the cause is open)."""
    exp_loss: Literal["ce", "mse", "kl"] = "ce"
    """L_exp: cross-entropy against the frozen model's argmax (the released default), logit MSE, or KL."""
    style_loss: Literal["gram", "meanvar", "moments"] = "gram"
    """L_style between a batch of subject s1 and the translated batch of s2: Gram matrices over the
    subject's frames (the released code's Gram, frames standing in for positions), mean/std, or
    mean/covariance; vectors have no spatial positions, so this is a reconstruction."""
    style_through_translator: bool = True
    """True: the style of the *translated* features T(F(x2)) is matched, so L_style trains T (the
    paper's intent). False: the released train_source.py, which matches the frozen F(x2), a
    constant that gives T no gradient."""
    exp_weight: float = 1.0
    """Weight of L_exp in translator pretraining (loss weights are not published)."""
    style_weight: float = 1.0
    """Weight of L_style in translator pretraining (loss weights are not published)."""
    target_steps: int = 300
    """Adam steps of each adaptation arm (fine-tune, PFT, PFT from scratch) on the neutral frames."""
    target_lr: float = 3e-4
    """Learning rate of every adaptation arm (the released code: 1e-4 for 25 epochs)."""
    target_batch: int = 32
    """Neutral frames per adaptation step (32 in the released code)."""
    target_exp_weight: float = 1.0
    """Weight of L_exp(C(F(x)), C(T(F(x)))) next to the neutral cross-entropy when adapting T
    (the released code adds the two with weight 1; 0 drops it)."""
    finetune_params: Literal["model", "classifier", "encoder"] = "model"
    """What the plain fine-tune updates with cross-entropy towards 'neutral' on the neutral frames:
    the whole source model F and C ('model'), only C, or only F. It has PFT's steps, batch and lr."""
    scratch_arm: bool = True
    """Also run PFT from an untrained identity translator (no source pretraining), an ablation."""
    no_exp_arm: bool = True
    """Also run PFT without L_exp in the target phase (neutral cross-entropy alone), an ablation."""
    sfda_arms: bool = True
    """Also run the SFDA baselines the paper compares with, SHOT and AaD (`sfda.py`), on the same
    neutral frames with the same steps, batch, lr and minibatch draws as PFT."""
    shot_cls_weight: float = 0.3
    """SHOT: weight of the pseudo-label cross-entropy next to information maximisation (released cls_par)."""
    aad_k: int = 5
    """AaD: nearest bank neighbours whose predictions attract a frame's (released K)."""
    aad_alpha: float = 1.0
    """AaD: initial weight of the dispersion term (released alpha)."""
    aad_beta: float = 5.0
    """AaD: decay exponent of the dispersion weight, alpha (1 + 10 t/T)^-beta (released beta)."""
    log_every: int = 50
    """Report the training loss every this many steps."""
    checkpoint_every_frac: float = 0.25
    """Save a checkpoint at every multiple of this training fraction, and at every phase's end."""
    threads: int = 1
    """Intra-op CPU threads of the trial, pinned by the runner around `train` (0 leaves torch's
    setting): these tensors are tiny."""
    data_dir: str = ""
    """Real frames instead of the synthetic subjects: a folder DATA_DIR/<subject>/<expression>/<frame>
    (the paper's BioVid/StressID layout, frames extracted), subjects and frames in sorted order."""
    backbone: str = ""
    """With data_dir: the frozen ImageNet-pretrained image model (a transformers folder, or a hub id
    already in the Hugging Face cache) whose mean last hidden state is each frame's feature;
    features are extracted once and cached."""
    neutral_class: str = "neutral"
    """With data_dir: the expression folder of the neutral frames (class 0)."""
    seed: int = 0
    """Seed of the prototypes, the source and target subjects, the frames and the initialisation."""
