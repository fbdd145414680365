"""The Normalized Feature Norm (NFN) of every linear projection of a decoder, from one forward pass.

For a module y = W z with W in R^{d_out x d_in}, and the inputs z_t it receives at the non-padding
positions t of the task data:

    W_hat = W / rms(W),   z_hat_t = z_t / ||z_t||,   actual = mean_t ||W_hat z_hat_t|| / sqrt(d_out)
    random = the same mean with z_hat_t replaced by u_t / ||u_t||, u_t ~ N(0, I_{d_in}) i.i.d.
    NFN = actual / random

computed per batch and averaged over batches; a module kind's score (Llama's q_proj, ...,
down_proj; GPT-2's c_attn, attn.c_proj, c_fc, mlp.c_proj) is the mean NFN of the modules of that
kind over the layers. The modules are the model's linear projections as `projections` finds them
(nn.Linear or GPT-2's Conv1D, whose weight is read as [out, in]). NFN > 1: W amplifies the
directions the task's features take more than a random direction of the same norm (the module is
aligned with the task); NFN ~ 1: no alignment.

Why NFN ~ 1 at random initialisation: the input z_t that a module sees is computed by the layers
*before* it, never by its own W, so z_t is independent of W. A freshly initialised W has i.i.d.
entries N(0, sigma^2), whose distribution is invariant under rotations (W Q has the law of W for
any orthogonal Q): for any unit vector v independent of W, ||W v||^2 / sigma^2 is chi-square with
d_out degrees of freedom whatever the direction of v. A data direction and a Gaussian direction
therefore get the same expected amplification, and the ratio concentrates at 1 with a relative
spread of about 1/sqrt(2 d_out) per module (less once averaged over layers and over many
directions). Training breaks the independence: W and the features of the data shape each other,
and the ratio moves away from 1.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable

import torch

from components.basemodel import Projection, projections, weight_oi


def rms(weight: torch.Tensor) -> torch.Tensor:
    return weight.float().square().mean().sqrt()


def mean_gain(weight_hat: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """mean_t ||W_hat z_t / ||z_t|| || / sqrt(d_out) over the rows z_t of z [N, d_in]."""
    unit = z / z.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(z.dtype).tiny)
    return (unit @ weight_hat.T).norm(dim=-1).mean() / math.sqrt(weight_hat.shape[0])


def nfn(weight: torch.Tensor, z: torch.Tensor, reference: torch.Tensor) -> tuple[float, float]:
    """(actual, random) mean gains of one module on inputs z [N, d_in] and reference directions
    [M, d_in] (Gaussian in the scorer; any directions in a hand-built test). NFN = actual / random."""
    w_hat = weight.float() / rms(weight)
    return float(mean_gain(w_hat, z.float())), float(mean_gain(w_hat, reference.float()))


def decoder_projections(model: torch.nn.Module) -> dict[str, Projection]:
    """Every linear projection of the transformer blocks (`projections`), by full name, in module
    order: embeddings, norms and the output head are not scored (PLoP places LoRA on the blocks'
    projections only)."""
    return projections(model)


def module_kinds(model: torch.nn.Module) -> dict[str, str]:
    """Full module name -> its projection kind (`q_proj`, `attn.c_proj`, ...)."""
    return {n: p.kind for n, p in projections(model).items()}


def module_type(name: str) -> str:
    """The last segment of a module name: the kind when a block's projections have distinct names (Llama)."""
    return name.rsplit(".", 1)[-1]


@dataclass
class NFNRecorder:
    """Forward hooks that turn each module's input into its (actual, random) gains, batch by batch.

    `mask` must be set to the current batch's attention mask [B, T] before each forward pass:
    padding positions are left out (the reference implementation includes them)."""

    model: torch.nn.Module
    seed: int = 0
    mask: torch.Tensor | None = None
    ratios: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    tokens: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    handles: list = field(default_factory=list)

    def __post_init__(self) -> None:
        # The reference directions come from their own generator (on the device the inputs are
        # on): scores do not depend on what else consumed the global RNG, and two recorders with
        # one seed agree exactly.
        self.gens: dict[torch.device, torch.Generator] = {}
        for name, p in decoder_projections(self.model).items():
            self.handles.append(p.module.register_forward_hook(self._hook(name)))

    def generator(self, device: torch.device) -> torch.Generator:
        if device not in self.gens:
            self.gens[device] = torch.Generator(device=device).manual_seed(self.seed)
        return self.gens[device]

    def _hook(self, name: str):
        def hook(module: torch.nn.Module, args: tuple, _output: torch.Tensor) -> None:
            z = args[0].detach()  # [B, T, d_in]
            if self.mask is not None:
                z = z[self.mask.to(z.device).bool()]  # [N, d_in], padding dropped
            z = z.reshape(-1, z.shape[-1]).float()
            reference = torch.randn(z.shape, generator=self.generator(z.device), device=z.device)
            actual, random = nfn(weight_oi(module), z, reference)
            self.ratios[name].append(actual / random)
            self.tokens[name] += z.shape[0]
        return hook

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()

    def scores(self) -> dict[str, float]:
        """Module name -> NFN averaged over the batches seen."""
        return {n: sum(r) / len(r) for n, r in self.ratios.items()}


@torch.no_grad()
def score_modules(model: torch.nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]], *,
                  seed: int = 0) -> dict[str, float]:
    """NFN of every projection of the transformer blocks over `batches` of (input_ids [B, T], attention_mask [B, T]),
    one no-grad forward pass each."""
    was_training = model.training
    model.eval()
    rec = NFNRecorder(model, seed=seed)
    try:
        dev = next(model.parameters()).device
        for ids, mask in batches:
            rec.mask = mask
            model(input_ids=ids.to(dev), attention_mask=mask.to(dev))
    finally:
        rec.remove()
        model.train(was_training)
    if not rec.ratios:
        raise ValueError("no projection of the transformer blocks saw any input: were the batches empty?")
    return rec.scores()


def by_type(scores: dict[str, float], kinds: dict[str, str] | None = None) -> dict[str, float]:
    """Module kind -> mean NFN of its modules over the layers, in first-seen order. `kinds` maps a
    module name to its kind (`module_kinds(model)`: GPT-2's two `c_proj` are `attn.c_proj` and
    `mlp.c_proj`); without it, a name's last segment is its kind."""
    groups: dict[str, list[float]] = defaultdict(list)
    for name, value in scores.items():
        groups[kinds[name] if kinds is not None else module_type(name)].append(value)
    return {t: sum(v) / len(v) for t, v in groups.items()}


def select(type_scores: dict[str, float], k: int, *, rule: str = "lowest") -> list[str]:
    """PLoP's placement: the `k` types of lowest NFN ('lowest', the paper's rule: least aligned,
    most room to adapt) or highest ('highest', PLoP^-1, the control). Ties break by name."""
    if not 1 <= k <= len(type_scores):
        raise ValueError(f"cannot choose {k} of {len(type_scores)} module types")
    sign = 1.0 if rule == "lowest" else -1.0 if rule == "highest" else None
    if sign is None:
        raise ValueError(f"rule must be 'lowest' or 'highest', got {rule!r}")
    ranked = sorted(type_scores, key=lambda t: (sign * type_scores[t], t))
    return ranked[:k]


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def kendall_tau(a: dict[str, float], b: dict[str, float]) -> float:
    """Kendall's tau-b between two scorings of the same keys: 1 for the same order, -1 for the
    reverse; tied pairs count for neither (so a scoring with ties against itself gives 1)."""
    keys = sorted(a)
    if sorted(b) != keys or len(keys) < 2:
        raise ValueError(f"kendall_tau needs two scorings of the same >= 2 keys, got {sorted(a)} and {sorted(b)}")
    concordant, ties_a, ties_b, pairs = 0, 0, 0, 0
    for i in range(len(keys)):
        for j in range(i + 1, len(keys)):
            sa = _sign(a[keys[i]] - a[keys[j]])
            sb = _sign(b[keys[i]] - b[keys[j]])
            concordant += sa * sb
            ties_a += sa == 0
            ties_b += sb == 0
            pairs += 1
    denom = math.sqrt((pairs - ties_a) * (pairs - ties_b))
    return concordant / denom if denom else math.nan
