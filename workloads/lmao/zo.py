"""MeZO, the zeroth-order half of LMAO, and the hooks that count forward and backward passes.

The perturbation z ~ N(0, I) over all perturbed parameters is never stored: it is regenerated
from one integer seed each time it is needed (perturb +eps, perturb -2 eps, restore +eps, update),
parameter by parameter in a fixed order, so the memory cost is one parameter's worth of noise.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

NO_DECAY = ("bias", "norm")
"""Parameter-name parts exempt from the zeroth-order weight decay (biases and LayerNorm/RMSNorm weights)."""


def zo_seed(seed: int, step: int) -> int:
    """The per-step perturbation seed, a function of the trial seed and the step alone (so a resumed
    run draws the same z as an uninterrupted one)."""
    return (seed * 1_000_003 + step * 7_919) % (2**63 - 1)


def _noise(params: Sequence[torch.Tensor], seed: int):
    gens: dict[torch.device, torch.Generator] = {}
    for p in params:
        if p.device not in gens:
            gens[p.device] = torch.Generator(device=p.device).manual_seed(seed)
        yield p, torch.randn(p.shape, generator=gens[p.device], device=p.device, dtype=p.dtype)


@torch.no_grad()
def perturb(params: Sequence[torch.Tensor], seed: int, scale: float) -> None:
    """theta <- theta + scale * z(seed), in place."""
    for p, z in _noise(params, seed):
        p.add_(z, alpha=scale)


@torch.no_grad()
def update(params: Sequence[torch.Tensor], seed: int, lr: float, projected_grad: float, weight_decay: float = 0.0,
           decay: Sequence[bool] | None = None) -> None:
    """theta <- theta - lr * (g * z(seed) + lambda * theta), lambda only where `decay` is True (plain SGD)."""
    decay = decay if decay is not None else [True] * len(params)
    for (p, z), d in zip(_noise(params, seed), decay):
        if weight_decay and d:
            p.mul_(1 - lr * weight_decay)
        p.add_(z, alpha=-lr * projected_grad)


@torch.no_grad()
def zo_step(params: Sequence[torch.Tensor], loss_fn: Callable[[], torch.Tensor], seed: int, *, eps: float, lr: float,
            weight_decay: float = 0.0, decay: Sequence[bool] | None = None) -> tuple[float, float, float]:
    """One MeZO step on `params` with two forward passes of `loss_fn` (same batch, same z).
    Returns (loss at theta + eps z, loss at theta - eps z, projected gradient g)."""
    perturb(params, seed, eps)
    loss_plus = float(loss_fn())
    perturb(params, seed, -2 * eps)
    loss_minus = float(loss_fn())
    perturb(params, seed, eps)  # back to theta (up to rounding)
    g = (loss_plus - loss_minus) / (2 * eps)
    update(params, seed, lr, g, weight_decay, decay)
    return loss_plus, loss_minus, g


def decay_mask(named: Sequence[tuple[str, torch.Tensor]]) -> list[bool]:
    """Which parameters the weight decay reaches: not biases nor norm weights, told by the name
    (NO_DECAY) or by being a vector (GPT-2's `ln_1.weight` says neither bias nor norm)."""
    return [p.dim() >= 2 and not any(part in name for part in NO_DECAY) for name, p in named]


class PassCounter:
    """Counts forward passes of `module` (a forward hook) and backward passes through its output
    (a hook on the output logits, registered when they require grad), while `active`."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.forwards = 0
        self.backwards = 0
        self.active = True
        self._handle = module.register_forward_hook(self._on_forward)

    def _on_forward(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if not self.active:
            return
        self.forwards += 1
        logits = output.logits if hasattr(output, "logits") else output
        if isinstance(logits, torch.Tensor) and logits.requires_grad:
            logits.register_hook(self._on_backward)

    def _on_backward(self, grad: torch.Tensor) -> None:
        if self.active:
            self.backwards += 1

    def snapshot(self) -> tuple[int, int]:
        return self.forwards, self.backwards

    def remove(self) -> None:
        self._handle.remove()


def params_holding_grad(params: Sequence[torch.Tensor]) -> int:
    """How many of `params` hold a gradient (.grad is not None)."""
    return sum(p.grad is not None for p in params)
