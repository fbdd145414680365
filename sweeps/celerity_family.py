"""A celerity_lm family from the Celerity recipe: three widths at one TPP with the optimal tau for
that TPP, two seeds each. Their normalized loss curves must collapse: after 20% of training, the
spread across widths stays within the seed-to-seed spread (`ladder audit celerity_family`).

The family trains at TPP 80 (about 25 minutes on 2 cores). What was measured at this scale (which
widths, TPPs and normalizations collapse, and from what fraction of training on) is in the report's
notes, `docs/reproductions/celerity_lm.notes.md`.

The paper reports collapse at 0.3B-3.9B parameters; the cluster-size family (0.14B-1.31B) is
`sweeps/celerity_family_cluster.py`.
"""

from orchestrator.recipe import Proxy, ScalingLaws, family
from orchestrator.sweep import Sweep, seeds
from workloads.celerity_lm import Config, build

TPP = 80.0
BASE = Config(width=48, depth=3, head_dim=16, seq_len=128, batch_size=32, base_width=48, base_depth=3, lr=2e-2,
              warmup_frac=0.05, max_bytes=16_000_000, eval_every_frac=0.05, eval_tokens=32768, log_every=10)


def non_embedding_params(width: int, depth: int) -> int:
    from dataclasses import replace

    model, _, _ = build(replace(BASE, width=width, depth=depth))
    return model.non_embedding_params()


PROXY = Proxy(width=48, depth=3, lr=BASE.lr, batch_size=BASE.batch_size, seq_len=BASE.seq_len, tpp=TPP, tau=0.2,
              warmup_frac=BASE.warmup_frac)
MEMBERS = family(PROXY, [(48, 3), (64, 3), (80, 3)], tpp=TPP, laws=ScalingLaws(), param_count=non_embedding_params)

sweep = Sweep(
    name="celerity_family",
    workload="celerity_lm",
    overrides={k: getattr(BASE, k) for k in ("head_dim", "seq_len", "base_width", "base_depth", "lr", "warmup_frac",
                                              "max_bytes", "eval_every_frac", "eval_tokens", "log_every")},
    points=tuple({"width": m.width, "depth": m.depth, "batch_size": m.batch_size, "tpp": TPP, "tau": m.tau}
                 for m in MEMBERS),
    space={"seed": seeds(2)},
    scheduler="fifo",
    objective=("eval/loss", "min"),
)
