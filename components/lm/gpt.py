"""The Celerity-shaped GPT decoder, parameterized so hyperparameters transfer across width and depth.

muP for width (Adam): hidden-matrix init std and learning rate scale with base_width / width,
logits are multiplied by base_width / width and the readout starts at zero; embeddings, norms,
biases and the readout use the base learning rate. CompleteP for depth: each residual branch is
multiplied by base_depth / depth, so depth can grow without retuning. The head dimension is held
fixed across widths, so attention's 1/sqrt(head_dim) is unchanged and only the head count grows.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int, n_heads: int, ffn_mult: int, activation: str, branch_mult: float) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, ffn_mult * width)
        self.out = nn.Linear(ffn_mult * width, width)
        self.activation = activation
        self.branch_mult = branch_mult
        # Attention over q, k, v [B, H, T, D] -> [B, H, T, D]; None is PyTorch's causal SDPA.
        # Workloads that study an attention kernel set it (lowprec_attention).
        self.attention = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, self.n_heads, C // self.n_heads).unbind(2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if self.attention is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = self.attention(q, k, v)
        x = x + self.branch_mult * self.proj(y.transpose(1, 2).reshape(B, T, C))  # [B, T, C]
        h = self.fc(self.ln2(x))
        h = F.relu(h).square() if self.activation == "relu2" else F.gelu(h)
        return x + self.branch_mult * self.out(h)


class GPT(nn.Module):
    def __init__(
        self,
        *,
        vocab: int,
        width: int,
        depth: int,
        head_dim: int,
        seq_len: int,
        ffn_mult: int,
        activation: str,
        base_width: int,
        base_depth: int,
        init_std: float,
    ) -> None:
        super().__init__()
        if width % head_dim:
            raise ValueError(f"width {width} must be a multiple of head_dim {head_dim}")
        self.width_mult = width / base_width
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(seq_len, width)
        self.blocks = nn.ModuleList(
            Block(width, width // head_dim, ffn_mult, activation, base_depth / depth) for _ in range(depth)
        )
        self.ln_f = nn.LayerNorm(width)
        self.readout = nn.Linear(width, vocab, bias=False)
        self._init(init_std)

    def _init(self, init_std: float) -> None:
        hidden_std = init_std / math.sqrt(self.width_mult)
        for name, p in self.named_parameters():
            if name.startswith(("tok.", "pos.")):
                nn.init.normal_(p, std=init_std)
            elif name.startswith("readout."):
                nn.init.zeros_(p)  # muP: a zero readout keeps width-independent initial logits
            elif p.ndim == 2:
                nn.init.normal_(p, std=hidden_std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def hidden_matrices(self) -> list[nn.Parameter]:
        return [p for n, p in self.named_parameters() if p.ndim == 2 and n.startswith("blocks.")]

    def other_params(self) -> list[nn.Parameter]:
        hidden = {id(p) for p in self.hidden_matrices()}
        return [p for p in self.parameters() if id(p) not in hidden]

    def non_embedding_params(self) -> int:
        return sum(p.numel() for n, p in self.named_parameters() if not n.startswith(("tok.", "pos.")))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(T, device=idx.device))[None]
        for block in self.blocks:
            x = block(x)
        return self.readout(self.ln_f(x)) / self.width_mult  # [B, T, vocab]


def adamw(model: GPT, *, hidden_lr: float, lr: float, weight_decay: float,
          betas: tuple[float, float]) -> torch.optim.AdamW:
    """AdamW with muP's two parameter groups: the hidden matrices at `hidden_lr` with weight decay,
    everything else (embeddings, norms, biases, readout) at the base `lr` without."""
    return torch.optim.AdamW(
        [
            {"params": model.hidden_matrices(), "lr": hidden_lr, "weight_decay": weight_decay},
            {"params": model.other_params(), "lr": lr, "weight_decay": 0.0},
        ],
        betas=betas,
    )
