"""ladder's orchestrator: everything that is not a method (CLI, registry, runs, sweeps, tracking).

The public API, whose import paths users' workloads and sweep files rely on:

- `orchestrator.run`: the `Run` protocol a workload's `train(cfg, run)` sees, `LocalRun` (to run
  a workload in a test), `fraction_steps`, `pinned_threads`, `MetricError`; `orchestrator.run.checkpoints`
  is the checkpoint format both runners write.
- `orchestrator.claims`: `claim`, `Spec`, `judge_effect`, `judge_rate` and the intervals a
  workload's `CLAIMS` are judged with.
- `orchestrator.sweep`: `Sweep`, `grid`, `choice`, `uniform`, `loguniform`, `seeds`, `data_root`:
  what a sweep file builds.
- `orchestrator.recipe`: the Celerity recipe (`family`, `scale`, `optimal_tau`, ...) for sweep files
  that build model families.

Everything else is internal and grouped by job: `runners/` (one trial path: registry, config,
trial, launch, Ray Train, ZeRO, console), `sweeps/` (Tune, search, schedulers, collapse, reading a
sweep back), `tracking/` (MLflow, outbox), `reproduction/` (reproduce, report) and `commands/`
(the `ladder` CLI, check, new). docs/architecture.md draws the layers.

Submodules are imported where used, so that `ladder list` stays free of torch and Ray.
"""

__all__ = ["claims", "recipe", "run", "sweep"]
