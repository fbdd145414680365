"""The Rank and Gradient Lost in Non-stationarity: Sample Weight Decay for Mitigating Plasticity Loss in Reinforcement Learning (ICLR 2026) — https://arxiv.org/abs/2604.01913

swd_rl: TD3 or SAC on a gymnasium continuous-control task whose replay buffer samples by age.
Sample Weight Decay (SWD) weights a transition of age a by max(w_min, 1 - a/T), so recent data
is drawn more often; the paper's control ("SWA", here `reverse`) weights it by min(1, w_min + a/T);
`uniform` is plain experience replay. The paper's argument: under uniform replay of a growing
buffer the newest policy's data is a 1/k share of the loss, so the critic's gradient decays like
1/k and the NTK Gram matrix loses rank (plasticity loss); SWD restores the gradient magnitude.

One trial trains one (algorithm, sampler, seed) at one update-to-data ratio. It reports the
returns (training episodes, and the deterministic policy on seeded evaluation episodes), the
critic's gradient L1/L2 norms and GraMa (fraction of near-zero entries) on its own training
batches, a paired probe (the gradient norms of batches drawn by every sampler from the trial's
own buffer and networks), and the effective ranks of the critic's features and of its NTK Gram
matrix. Pendulum-v1 is the CI size; the MuJoCo tasks and the DeepMind Control Suite's (the
`mujoco` extra; `env_id='dm_control/humanoid-run-v0'`, `sweeps/repro/swd_rl_dmc.py`) are the cluster's.

The claims: late in training the critic's gradient norm on each arm's own training batches is
ordered reverse < uniform < SWD (the paired probe is reported beside it, not judged); SWD's final
return is not below uniform's beyond seed noise, judged only on the full configuration (MuJoCo,
several seeds). At the sizes a CPU runs the measured gradient ordering is the opposite (see
`claims`): the paper states it for million-step MuJoCo runs.
"""

from workloads.swd_rl.claims import BENCH_CHECKS, BENCH_CLAIMS, CHECKS, CLAIMS, plot
from workloads.swd_rl.config import MAX_WORKERS
from workloads.swd_rl.workload import Config, preflight, smoke, train, validate

__all__ = ["BENCH_CHECKS", "BENCH_CLAIMS", "CHECKS", "CLAIMS", "MAX_WORKERS", "Config", "plot", "preflight", "smoke", "train", "validate"]
