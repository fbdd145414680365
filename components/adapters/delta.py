"""One adapted module's weight change, as the audit reads it and the lens uses it."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ModuleDelta:
    """One adapted module: dW = scale * B @ A, B [out, r], A [r, in]."""

    name: str
    a: torch.Tensor
    b: torch.Tensor
    scale: float

    def delta(self) -> torch.Tensor:
        return self.scale * (self.b.float() @ self.a.float())
