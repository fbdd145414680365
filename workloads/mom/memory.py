"""The mixture-of-memories recurrence: routing, the load-balancing loss, a readable token-by-token
reference and the chunked form used for training.

Per memory e and head h the state is a matrix S in R^{dk x dv}. A token routed to memory e updates it
with one of two rules (unrouted memories stay exactly as they were):

- 'linear':      S <- S + k v^T                                  (the paper's simplest rule, Eq. 5)
- 'gated':       S <- alpha S + k v^T                            (a data-dependent decay gate, the
                 scalar-gate form of GLA and Mamba-2; a baseline of the paper's Table 2)
- 'gated_delta': S <- alpha (I - beta k k^T) S + beta k v^T       (the backend of the paper's code)

and the token reads o = sum_e w_e q^T S_e over the memories it was routed to, with the router's
renormalised top-k weights w_e, plus the shared memory with weight 1 (paper Eqs. 6-8).

The chunked form folds routing into the rules: a token not routed to e becomes a no-op for e by
setting its write strength beta to 0 and its decay log(alpha) to 0. Within a chunk of C tokens the
gated delta rule is solved in closed form (the WY/UT representation of Gated DeltaNet): with
Gamma_i the cumulative decay inside the chunk, the pseudo-values u_i that satisfy
S_i = Gamma_i S_0 + sum_{j<=i} (Gamma_i / Gamma_j) k_j u_j^T are U = T (beta V - beta Gamma K S_0),
T = (I + A)^-1, A_ij = beta_i (Gamma_i / Gamma_j) k_i . k_j for j < i, a unit-triangular solve.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

UPDATES = ("linear", "gated", "gated_delta")


def _at_least_float32(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype == torch.float64 else x.float()  # routing decisions in half precision flip


def route(logits: torch.Tensor, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k routing: (weights [..., M], routed [..., M] bool).

    weights are softmax(logits) kept at the top-k memories and renormalised to sum to 1 per token
    (g_t = s_t / sum s_t, paper Eq. 3); routed marks exactly those k memories.
    """
    probs = torch.softmax(_at_least_float32(logits), dim=-1)
    top, idx = torch.topk(probs, topk, dim=-1)
    top = top / top.sum(dim=-1, keepdim=True)
    weights = torch.zeros_like(probs).scatter(-1, idx, top).to(logits.dtype)
    routed = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, idx, True)
    return weights, routed


def load_balancing_loss(logits: torch.Tensor, topk: int) -> torch.Tensor:
    """Switch/Mixtral load balancing: M * sum_e f_e P_e over all tokens of `logits` [..., M].

    f_e is the fraction of tokens whose top-k holds e (summed over the k slots, so sum_e f_e = k) and
    P_e the mean router probability of e; balanced routing gives k, collapse onto k memories up to M.
    """
    m = logits.shape[-1]
    probs = torch.softmax(_at_least_float32(logits.reshape(-1, m)), dim=-1)
    idx = torch.topk(probs, topk, dim=-1).indices
    tokens_per_memory = F.one_hot(idx, m).float().mean(dim=0)  # [k, M]
    return m * (tokens_per_memory * probs.mean(dim=0)).sum()


def memory_update(
    state: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_alpha: torch.Tensor, beta: torch.Tensor,
    update: str,
) -> torch.Tensor:
    """One token's write into every memory of `state` [..., dk, dv] (k [..., dk], v [..., dv],
    log_alpha and beta [...]); the caller keeps the old state where the token was not routed."""
    if update == "linear":
        return state + k[..., :, None] * v[..., None, :]
    alpha, beta = log_alpha.exp()[..., None, None], beta[..., None, None]
    if update == "gated":
        return alpha * state + k[..., :, None] * v[..., None, :]
    kS = torch.einsum("...k,...kv->...v", k, state)  # k^T S
    return alpha * (state - beta * k[..., :, None] * kS[..., None, :]) + beta * k[..., :, None] * v[..., None, :]


def recurrent_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_alpha: torch.Tensor, beta: torch.Tensor,
    weights: torch.Tensor, routed: torch.Tensor, *, update: str, state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The mixture of memories token by token, as the paper writes it.

    q [B, T, H, dk] (one query projection shared by all memories), k [B, T, E, H, dk],
    v [B, T, E, H, dv], log_alpha and beta [B, T, E, H], weights and routed [B, T, E] (the shared
    memory, when there is one, is a memory with weight 1 that every token is routed to).
    Returns the mixed output [B, T, H, dv] and the final states [B, E, H, dk, dv].
    """
    B, T, E, H, dk = k.shape
    if state is None:
        state = q.new_zeros(B, E, H, dk, v.shape[-1])
    out = []
    for t in range(T):
        written = memory_update(state, k[:, t], v[:, t], log_alpha[:, t], beta[:, t], update)
        state = torch.where(routed[:, t, :, None, None, None], written, state)  # unrouted: untouched
        o_e = torch.einsum("bhk,behkv->behv", q[:, t], state)  # each memory read after its update
        out.append((weights[:, t, :, None, None] * o_e).sum(dim=1))
    return torch.stack(out, dim=1), state


def chunked(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_alpha: torch.Tensor, beta: torch.Tensor,
    weights: torch.Tensor, routed: torch.Tensor, *, update: str, chunk: int,
    state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same inputs and result as `recurrent_reference`, computed `chunk` tokens at a time.

    Any T works: the sequence is padded to a multiple of `chunk` with no-op tokens (beta = 0,
    log_alpha = 0) whose outputs are dropped.
    """
    B, T, E, H, dk = k.shape
    dv = v.shape[-1]
    r = routed.to(k.dtype)[..., None]  # [B, T, E, 1]
    linear, delta = update == "linear", update == "gated_delta"
    beta = beta * r if delta else r.expand(B, T, E, H)  # the write strength; 0 where not routed
    log_alpha = log_alpha * r  # no decay where not routed
    q = q[:, :, None]  # [B, T, 1, H, dk]: one query for every memory
    pad = (-T) % chunk
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, 0, 0, 0, 0, pad)) for x in (q, k, v))
        beta, log_alpha = F.pad(beta, (0, 0, 0, 0, 0, pad)), F.pad(log_alpha, (0, 0, 0, 0, 0, pad))
    n = (T + pad) // chunk

    def blocks(x: torch.Tensor) -> torch.Tensor:  # [B, T', E, H, ...] -> [B, E, H, n, C, ...]
        x = x.reshape(B, n, chunk, *x.shape[2:])
        return x.permute(0, 3, 4, 1, 2, *range(5, x.dim()))

    q, k, v, beta = blocks(q), blocks(k), blocks(v), blocks(beta)
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    if linear:  # no decay: S_i = S_0 + sum_{j<=i} r_j k_j v_j^T
        g = None
        scores = (q @ k.transpose(-1, -2)).masked_fill(~causal, 0.0)  # [B, E, H, n, C, C]
        u_free, w = beta[..., None] * v, None
    else:
        g = blocks(log_alpha).cumsum(-1)  # log Gamma_i
        decay = (g[..., :, None] - g[..., None, :]).masked_fill(~causal, float("-inf")).exp()  # Gamma_i / Gamma_j
        scores = (q @ k.transpose(-1, -2)) * decay
        if delta:
            eye = torch.eye(chunk, dtype=k.dtype, device=k.device)
            a = ((beta[..., :, None] * (k @ k.transpose(-1, -2))) * decay).tril(-1)
            tri = torch.linalg.solve_triangular(eye + a, eye.expand_as(a), upper=False, unitriangular=True)
            u_free = tri @ (beta[..., None] * v)  # the pseudo-values with S_0 = 0
            w = tri @ (beta[..., None] * g.exp()[..., None] * k)  # how S_0 enters them
        else:  # gated, no delta: the values are written as they are (T = I, S_0 enters only by decay)
            u_free, w = beta[..., None] * v, None
    s = k.new_zeros(B, E, H, dk, dv) if state is None else state
    outs = []
    for c in range(n):
        if g is None:
            outs.append(q[:, :, :, c] @ s + scores[:, :, :, c] @ u_free[:, :, :, c])
            s = s + k[:, :, :, c].transpose(-1, -2) @ u_free[:, :, :, c]
            continue
        u = u_free[:, :, :, c] if w is None else u_free[:, :, :, c] - w[:, :, :, c] @ s
        gc = g[:, :, :, c]  # [B, E, H, C]
        outs.append((q[:, :, :, c] * gc.exp()[..., None]) @ s + scores[:, :, :, c] @ u)
        tail = (gc[..., -1:] - gc).exp()[..., None]  # Gamma_C / Gamma_j
        s = gc[..., -1].exp()[..., None, None] * s + (k[:, :, :, c] * tail).transpose(-1, -2) @ u
    o = torch.stack(outs, dim=3).reshape(B, E, H, n * chunk, dv).permute(0, 3, 1, 2, 4)[:, :T]  # [B, T, E, H, dv]
    return (weights[..., None, None] * o).sum(dim=2), s
