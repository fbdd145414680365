"""One trial path, from a workload name and its overrides to a finished run.

`registry` finds a workload and checks it against the contract, `config` turns strings into its
`Config`, and `trial` runs one trial (open tracking, validate, `train`, flush, end the run with its
status). The rest only build a `Run` around it: `launch` (a local run, or Ray Train for
`ladder run --workers N`), `ray_train` (the Ray Train worker and its `Run`), `zero` (DeepSpeed ZeRO)
and `console` (what a person sees while it runs). A sweep's trials go through the same `trial`
(`orchestrator.sweeps.tune_run`).
"""
