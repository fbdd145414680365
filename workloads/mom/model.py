"""The MoM layer, its baselines and the small language model built from them.

Every model is the same pre-norm stack (embedding, `layers` x [RMSNorm, token mixer, optional MLP],
RMSNorm, output head); only the token mixer differs:

- 'mom': the mixture of memories (`memory.py`): a router sends each token to `topk` of
  `num_memories` memories, each with its own key/value (and beta/decay) projections, plus a shared
  memory every token uses; the query projection is shared by all of them.
- 'single': the same layer with one memory and no router (single-memory linear attention with the
  same update rule, per-memory state and head sizes).
- 'single_expanded': one memory whose value dimension is expanded to hold as much memory state as
  all of MoM's memories together (num_memories routed + the shared one): the paper's Table 4
  control ("expanded single memory"), which separates MoM's routing from its larger state.
- 'softmax': causal softmax attention over a growing key/value cache.

Each memory model runs any update rule of `memory.py`; the equal-state baselines of the smoke are
'single_expanded' with MoM's rule, with a data-dependent decay gate ('gated': the scalar-gate form
of GLA, "Gated Linear Attention Transformers with Hardware-Efficient Training",
https://arxiv.org/abs/2312.06635, and of Mamba-2, "Transformers are SSMs",
https://arxiv.org/abs/2405.21060) and with the gated delta rule (Gated DeltaNet, "Gated Delta
Networks: Improving Mamba2 with Delta Rule", https://arxiv.org/abs/2412.06464, the paper's main
linear baseline). Both gates use Mamba-2's parametrisation alpha = exp(-exp(A_log) softplus(a + dt_bias)).

All of them put a short causal depthwise convolution (SiLU) on q, k and v: it is the only positional
signal (no position embeddings), and it lets one layer pair a key with the token after it.

A forward pass takes and returns a per-layer inference state, so generation is `forward` on one
token at a time: the memory models carry their memory matrices and convolution windows (a fixed
size), the softmax model its key/value cache (growing with every token).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from workloads.mom.memory import chunked, load_balancing_loss, recurrent_reference, route

MIXERS = ("mom", "single", "single_expanded", "softmax")


class ShortConv(nn.Module):
    """Causal depthwise convolution over time with SiLU; the window of the last size-1 inputs is its state."""

    def __init__(self, channels: int, size: int) -> None:
        super().__init__()
        self.size = size
        self.weight = nn.Parameter(torch.randn(size, channels) / math.sqrt(size))

    def forward(self, x: torch.Tensor, window: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, T, ..., C] (the weights are shared over the middle axes); window [B, size-1, ..., C]."""
        if window is None:
            window = x.new_zeros(x.shape[0], self.size - 1, *x.shape[2:])
        xp = torch.cat([window, x], dim=1)
        T = x.shape[1]
        shape = (self.size,) + (1,) * (x.dim() - 2) + (x.shape[-1],)
        w = self.weight.reshape(shape)
        y = sum(xp[:, j : j + T] * w[j] for j in range(self.size))
        return F.silu(y), xp[:, T:]


class MemoryMixer(nn.Module):
    """Mixture of memories (num_memories > 1) or a single memory (num_memories = 1, no router)."""

    def __init__(
        self, d_model: int, heads: int, head_dim: int, expand_v: int, *, num_memories: int, topk: int,
        shared_memory: bool, update: str, conv_size: int, chunk: int, impl: str,
    ) -> None:
        super().__init__()
        self.heads, self.dk, self.dv = heads, head_dim, head_dim * expand_v
        self.num_memories, self.topk, self.shared_memory = num_memories, topk, shared_memory
        self.update, self.chunk, self.impl = update, chunk, impl
        self.E = num_memories + int(shared_memory)  # memory matrices per head, the shared one last
        hk, hv = heads * self.dk, heads * self.dv
        self.q_proj = nn.Linear(d_model, hk, bias=False)
        self.router = nn.Linear(d_model, num_memories, bias=False) if num_memories > 1 else None
        self.k_proj = nn.Linear(d_model, self.E * hk, bias=False)  # one W_K per memory, stacked
        self.v_proj = nn.Linear(d_model, self.E * hv, bias=False)
        if update == "gated_delta":
            self.b_proj = nn.Linear(d_model, self.E * heads, bias=False)  # beta, per memory
        if update in ("gated", "gated_delta"):
            self.a_proj = nn.Linear(d_model, self.E * heads, bias=False)  # decay input, per memory
            # Decay alpha = exp(-exp(A_log) softplus(a + dt_bias)), Mamba-2's initialisation.
            self.A_log = nn.Parameter(torch.empty(heads).uniform_(1, 16).log())
            dt = torch.exp(torch.rand(heads) * (math.log(0.1) - math.log(0.001)) + math.log(0.001)).clamp(min=1e-4)
            self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        self.q_conv = ShortConv(hk, conv_size)
        self.k_conv = ShortConv(hk, conv_size)  # shared by the memories, as in the paper's code
        self.v_conv = ShortConv(hv, conv_size)
        self.g_proj = nn.Linear(d_model, hv, bias=False)
        self.o_norm = nn.RMSNorm(self.dv, eps=1e-5)
        self.o_proj = nn.Linear(hv, d_model, bias=False)

    def routing(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(weights [B, T, E], routed [B, T, E], router logits or None) with the shared memory last."""
        B, T, _ = x.shape
        if self.router is None:
            weights, routed, logits = x.new_ones(B, T, 1), torch.ones(B, T, 1, dtype=torch.bool, device=x.device), None
        else:
            logits = self.router(x)
            weights, routed = route(logits, self.topk)
        if self.shared_memory:
            weights = torch.cat([weights, x.new_ones(B, T, 1)], dim=-1)
            routed = torch.cat([routed, torch.ones(B, T, 1, dtype=torch.bool, device=x.device)], dim=-1)
        return weights, routed, logits

    def forward(self, x: torch.Tensor, state: dict[str, torch.Tensor] | None = None):
        B, T, _ = x.shape
        E, H, dk, dv = self.E, self.heads, self.dk, self.dv
        state = state or {}
        weights, routed, logits = self.routing(x)
        q, cq = self.q_conv(self.q_proj(x), state.get("q_window"))
        k, ck = self.k_conv(self.k_proj(x).reshape(B, T, E, H * dk), state.get("k_window"))
        v, cv = self.v_conv(self.v_proj(x).reshape(B, T, E, H * dv), state.get("v_window"))
        q = F.normalize(q.reshape(B, T, H, dk), dim=-1)
        k = F.normalize(k.reshape(B, T, E, H, dk), dim=-1)
        v = v.reshape(B, T, E, H, dv)
        beta = log_alpha = x.new_zeros(B, T, E, H)  # what the linear rule leaves unused
        if self.update == "gated_delta":
            beta = torch.sigmoid(self.b_proj(x)).reshape(B, T, E, H)
        if self.update in ("gated", "gated_delta"):
            log_alpha = -self.A_log.exp() * F.softplus(self.a_proj(x).reshape(B, T, E, H) + self.dt_bias)
        args = (q, k, v, log_alpha, beta, weights, routed)
        if self.impl == "recurrent" or T == 1:  # generation steps take the reference path: exact, no padding
            o, memory = recurrent_reference(*args, update=self.update, state=state.get("memory"))
        else:
            o, memory = chunked(*args, update=self.update, chunk=self.chunk, state=state.get("memory"))
        gate = F.silu(self.g_proj(x)).reshape(B, T, H, dv)
        y = self.o_proj((self.o_norm(o) * gate).reshape(B, T, H * dv))
        return y, logits, {"memory": memory, "q_window": cq, "k_window": ck, "v_window": cv}


class SoftmaxMixer(nn.Module):
    """Causal softmax attention; its inference state is the key/value cache of every token so far."""

    def __init__(self, d_model: int, heads: int, head_dim: int, *, conv_size: int) -> None:
        super().__init__()
        self.heads, self.dk = heads, head_dim
        hk = heads * head_dim
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(d_model, hk, bias=False) for _ in range(3))
        self.q_conv, self.k_conv, self.v_conv = (ShortConv(hk, conv_size) for _ in range(3))
        self.o_proj = nn.Linear(hk, d_model, bias=False)

    def forward(self, x: torch.Tensor, state: dict[str, torch.Tensor] | None = None):
        B, T, _ = x.shape
        state = state or {}
        q, cq = self.q_conv(self.q_proj(x), state.get("q_window"))
        k, ck = self.k_conv(self.k_proj(x), state.get("k_window"))
        v, cv = self.v_conv(self.v_proj(x), state.get("v_window"))
        q, k, v = (t.reshape(B, T, self.heads, self.dk).transpose(1, 2) for t in (q, k, v))  # [B, H, T, dk]
        past = state.get("keys")
        if past is not None:
            k, v = torch.cat([past, k], dim=2), torch.cat([state["values"], v], dim=2)
        # The T new queries sit at the end of the cached sequence: query i sees keys 0 .. P + i.
        P = k.shape[2] - T
        mask = torch.ones(T, P + T, dtype=torch.bool, device=x.device).tril(diagonal=P)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        y = self.o_proj(o.transpose(1, 2).reshape(B, T, -1))
        return y, None, {"keys": k, "values": v, "q_window": cq, "k_window": ck, "v_window": cv}


class MLP(nn.Module):
    def __init__(self, d_model: int, hidden: int) -> None:
        super().__init__()
        self.fc, self.out = nn.Linear(d_model, hidden, bias=False), nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, d_model: int, mixer: nn.Module, mlp_hidden: int) -> None:
        super().__init__()
        self.norm, self.mixer = nn.RMSNorm(d_model, eps=1e-5), mixer
        self.mlp_norm = nn.RMSNorm(d_model, eps=1e-5) if mlp_hidden else None
        self.mlp = MLP(d_model, mlp_hidden) if mlp_hidden else None

    def forward(self, x: torch.Tensor, state: dict | None):
        y, logits, state = self.mixer(self.norm(x), state)
        x = x + y
        if self.mlp is not None:
            x = x + self.mlp(self.mlp_norm(x))
        return x, logits, state


class LM(nn.Module):
    """Embedding, `layers` blocks of one mixer kind, a final norm and an untied output head."""

    def __init__(
        self, *, vocab: int, d_model: int, layers: int, mixer: str, heads: int, head_dim: int, expand_v: int = 1,
        num_memories: int = 4, topk: int = 2, shared_memory: bool = True, update: str = "gated_delta",
        conv_size: int = 4, mlp_hidden: int = 0, chunk: int = 32, impl: str = "chunked",
    ) -> None:
        super().__init__()
        if mixer not in MIXERS:
            raise ValueError(f"mixer must be one of {MIXERS}, got {mixer!r}")
        self.mixer_kind, self.topk = mixer, topk

        def make() -> nn.Module:
            if mixer == "softmax":
                return SoftmaxMixer(d_model, heads, head_dim, conv_size=conv_size)
            many = mixer == "mom"
            # The Table 4 control holds as many memory numbers as all of MoM's memories together.
            expand = expand_v * (num_memories + int(shared_memory)) if mixer == "single_expanded" else expand_v
            return MemoryMixer(
                d_model, heads, head_dim, expand, num_memories=num_memories if many else 1,
                topk=topk if many else 1, shared_memory=shared_memory and many, update=update,
                conv_size=conv_size, chunk=chunk, impl=impl,
            )

        self.embed = nn.Embedding(vocab, d_model)
        self.blocks = nn.ModuleList(Block(d_model, make(), mlp_hidden) for _ in range(layers))
        self.norm = nn.RMSNorm(d_model, eps=1e-5)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, tokens: torch.Tensor, state: list | None = None) -> tuple[torch.Tensor, torch.Tensor, list]:
        """tokens [B, T] -> (logits [B, T, V], load-balancing loss (mean over layers; 0 without a router),
        the inference state after the last token, to pass back in with the next tokens)."""
        x = self.embed(tokens)
        state = state or [None] * len(self.blocks)
        new_state, balance = [], []
        for block, s in zip(self.blocks, state):
            x, router_logits, s = block(x, s)
            new_state.append(s)
            if router_logits is not None:
                balance.append(load_balancing_loss(router_logits, self.topk))
        aux = torch.stack(balance).mean() if balance else x.new_zeros(())
        return self.head(self.norm(x)), aux, new_state


def state_bytes(state: Any) -> int:
    """Bytes held by every tensor of an inference state (nested lists and dicts)."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(state_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(state_bytes(v) for v in state)
    return 0


def param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
