"""Personalized Feature Translation for Expression Recognition: An Efficient Source-Free Domain Adaptation Method (ICLR 2026) — https://arxiv.org/abs/2508.09202

pft: source-free adaptation of an expression classifier to one target subject from that
subject's unlabelled neutral frames only. On synthetic subjects (expression clusters in a latent
space, each subject its own affine style), one trial trains the source model (encoder F and
classifier C) on the source subjects; pre-trains a latent translator T on pairs of source
subjects, F and C frozen, so that T(F(x2)) keeps x2's expression (L_exp) and takes the other
subject's style (L_style, computed on T's output so that its gradient trains T); then adapts T
alone on the target's neutral frames (cross-entropy towards neutral plus L_exp), and evaluates
C(T(F(x))) on the target's frames of every expression. The same trial runs the arms PFT is
compared with: the SFDA baselines SHOT and AaD (`sfda.py`) adapted on the same neutral frames with
the same budget, the unadapted source model, the pre-trained translator before adaptation, a plain
fine-tune of the source model towards 'neutral' on the same frames (a negative control), and PFT
from an untrained translator.

The target subject's offset leans towards one expression (`target_lean`): a resting face that
the source model reads as that expression, the failure that neutral frames can reveal and the
setting the paper addresses. Without the lean, a subject whose offset makes its expressive
frames look neutral gives neutral-only adaptation nothing to correct.

With `data_dir` and `backbone` the frames are real: an image folder per subject and expression
(the paper's BioVid/StressID layout), each frame the pooled feature of a frozen pretrained image
backbone (`frames.py`).

The claims, headline first: on the target, PFT's accuracy beats the best SFDA baseline's (SHOT,
AaD) and the unadapted source model's, and (a control) the plain fine-tune's; without L_exp the
translator collapses towards 'neutral'. The check: PFT changes nothing but the translator.
"""

from workloads.pft.claims import CHECKS, CLAIMS, plot
from workloads.pft.workload import MAX_WORKERS, Config, preflight, smoke, train, validate

__all__ = ["CHECKS", "CLAIMS", "MAX_WORKERS", "Config", "plot", "preflight", "smoke", "train", "validate"]
