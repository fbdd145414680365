"""Networks and the TD3 / SAC updates (plain PyTorch, one function per update).

Encoders are a plain ReLU MLP or SimBa (input projection, pre-LayerNorm residual blocks with a 4x
expansion, a final LayerNorm), the architecture of the paper's code. The critic is a pair of Q
networks on concat(s, a); the TD3 actor is deterministic (tanh, scaled to the action box), the SAC
actor a tanh-squashed Gaussian.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F


class ResidualBlock(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)
        for layer in (self.up, self.down):
            nn.init.kaiming_normal_(layer.weight, nonlinearity="relu")
            nn.init.zeros_(layer.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.relu(self.up(self.norm(x))))


def encoder(kind: str, in_dim: int, width: int, depth: int) -> nn.Sequential:
    """[B, in_dim] -> [B, width]: `depth` hidden ReLU layers ('mlp') or residual blocks ('simba')."""
    if kind == "mlp":
        layers: list[nn.Module] = []
        for i in range(depth):
            layers += [nn.Linear(in_dim if i == 0 else width, width), nn.ReLU()]
        return nn.Sequential(*layers)
    proj = nn.Linear(in_dim, width)
    nn.init.orthogonal_(proj.weight)
    nn.init.zeros_(proj.bias)
    return nn.Sequential(proj, *[ResidualBlock(width) for _ in range(depth)], nn.LayerNorm(width))


class QNet(nn.Module):
    def __init__(self, kind: str, obs_dim: int, act_dim: int, width: int, depth: int) -> None:
        super().__init__()
        self.body = encoder(kind, obs_dim + act_dim, width, depth)
        self.head = nn.Linear(width, 1)

    def features(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        return self.body(torch.cat([obs, act], dim=-1))  # [B, width]

    def forward(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(obs, act)).squeeze(-1)  # [B]


class Critic(nn.Module):
    def __init__(self, kind: str, obs_dim: int, act_dim: int, width: int, depth: int) -> None:
        super().__init__()
        self.q1 = QNet(kind, obs_dim, act_dim, width, depth)
        self.q2 = QNet(kind, obs_dim, act_dim, width, depth)

    def forward(self, obs: torch.Tensor, act: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.q1(obs, act), self.q2(obs, act)


class Actor(nn.Module):
    """Deterministic (TD3) or tanh-Gaussian (SAC) policy over a box [low, high]."""

    def __init__(self, kind: str, obs_dim: int, act_dim: int, width: int, depth: int,
                 low: torch.Tensor, high: torch.Tensor, stochastic: bool) -> None:
        super().__init__()
        self.body = encoder(kind, obs_dim, width, depth)
        self.stochastic = stochastic
        self.head = nn.Linear(width, 2 * act_dim if stochastic else act_dim)
        self.register_buffer("scale", (high - low) / 2)
        self.register_buffer("center", (high + low) / 2)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """The deterministic action (TD3's policy, SAC's mean action)."""
        out = self.head(self.body(obs))
        mean = out.chunk(2, dim=-1)[0] if self.stochastic else out
        return torch.tanh(mean) * self.scale + self.center

    def sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """SAC: a reparameterised action and its log-probability [B]."""
        mean, log_std = self.head(self.body(obs)).chunk(2, dim=-1)
        log_std = torch.tanh(log_std)
        log_std = -5 + 0.5 * (2 - (-5)) * (log_std + 1)  # into [-5, 2], as in CleanRL's SAC
        std = log_std.exp()
        u = mean + std * torch.randn_like(mean)
        y = torch.tanh(u)
        log_prob = (-0.5 * ((u - mean) / std) ** 2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        log_prob = log_prob - torch.log(self.scale * (1 - y.pow(2)) + 1e-6).sum(-1)
        return y * self.scale + self.center, log_prob


@dataclass
class Learner:
    """Networks, targets and optimizers of one TD3 or SAC learner."""

    algo: str
    actor: Actor
    critic: Critic
    actor_target: Actor
    critic_target: Critic
    actor_opt: torch.optim.Optimizer
    critic_opt: torch.optim.Optimizer
    log_alpha: torch.Tensor
    alpha_opt: torch.optim.Optimizer | None
    target_entropy: float

    def state_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k).state_dict() for k in
               ("actor", "critic", "actor_target", "critic_target", "actor_opt", "critic_opt")}
        out["log_alpha"] = self.log_alpha.detach().clone()
        if self.alpha_opt is not None:
            out["alpha_opt"] = self.alpha_opt.state_dict()
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for k in ("actor", "critic", "actor_target", "critic_target", "actor_opt", "critic_opt"):
            getattr(self, k).load_state_dict(state[k])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        if self.alpha_opt is not None:
            self.alpha_opt.load_state_dict(state["alpha_opt"])


def make_learner(cfg: Any, obs_dim: int, act_dim: int, low: torch.Tensor, high: torch.Tensor,
               device: torch.device) -> Learner:
    sac = cfg.algo == "sac"
    actor = Actor(cfg.network, obs_dim, act_dim, cfg.actor_width, cfg.actor_depth, low, high, sac).to(device)
    critic = Critic(cfg.network, obs_dim, act_dim, cfg.critic_width, cfg.critic_depth).to(device)
    log_alpha = torch.tensor(math.log(cfg.sac_alpha), device=device, requires_grad=sac and cfg.sac_autotune)
    return Learner(
        algo=cfg.algo, actor=actor, critic=critic,
        actor_target=copy.deepcopy(actor).requires_grad_(False),
        critic_target=copy.deepcopy(critic).requires_grad_(False),
        actor_opt=torch.optim.Adam(actor.parameters(), lr=cfg.lr, foreach=True),
        critic_opt=torch.optim.Adam(critic.parameters(), lr=cfg.lr, foreach=True),
        log_alpha=log_alpha,
        alpha_opt=torch.optim.Adam([log_alpha], lr=cfg.lr) if sac and cfg.sac_autotune else None,
        target_entropy=-float(act_dim),
    )


def critic_loss(learner: Learner, batch: dict[str, torch.Tensor], cfg: Any) -> torch.Tensor:
    """Sum of both Q networks' mean squared TD errors against the (clipped double-Q) target."""
    with torch.no_grad():
        nxt = batch["next_obs"]
        if learner.algo == "td3":  # target policy smoothing
            a = learner.actor_target(nxt)
            noise = (torch.randn_like(a) * cfg.policy_noise).clamp(-cfg.noise_clip, cfg.noise_clip)
            a = torch.max(torch.min(a + noise * learner.actor.scale, learner.actor.center + learner.actor.scale),
                          learner.actor.center - learner.actor.scale)
            q_next = torch.min(*learner.critic_target(nxt, a))
        else:  # SAC: the current policy's next action and its entropy bonus
            a, log_prob = learner.actor.sample(nxt)
            q_next = torch.min(*learner.critic_target(nxt, a)) - learner.log_alpha.exp() * log_prob
        target = batch["rewards"] + cfg.gamma * (1 - batch["terminated"]) * q_next
    q1, q2 = learner.critic(batch["obs"], batch["actions"])
    return F.mse_loss(q1, target) + F.mse_loss(q2, target)


def soft_update(target: nn.Module, online: nn.Module, tau: float) -> None:
    with torch.no_grad():
        for t, o in zip(target.parameters(), online.parameters()):
            t.lerp_(o, tau)


def actor_step(learner: Learner, obs: torch.Tensor) -> dict[str, float]:
    """One actor (and for SAC, temperature) step on the batch's states; the critic is held fixed."""
    if learner.algo == "td3":
        loss = -torch.min(*learner.critic(obs, learner.actor(obs))).mean()  # the paper's code: min of both Qs
    else:
        a, log_prob = learner.actor.sample(obs)
        loss = (learner.log_alpha.exp().detach() * log_prob - torch.min(*learner.critic(obs, a))).mean()
    params = list(learner.actor.parameters())
    for p, g in zip(params, torch.autograd.grad(loss, params)):  # the critic's gradients are not needed
        p.grad = g
    learner.actor_opt.step()
    out = {"actor_loss": float(loss.detach())}
    if learner.alpha_opt is not None:
        alpha_loss = -(learner.log_alpha.exp() * (log_prob.detach() + learner.target_entropy)).mean()
        learner.alpha_opt.zero_grad(set_to_none=True)
        alpha_loss.backward()
        learner.alpha_opt.step()
        out["alpha"] = float(learner.log_alpha.detach().exp())
    return out
