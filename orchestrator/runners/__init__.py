"""One trial path, from a workload name and its overrides to a finished run.

`registry` finds a workload, `config` turns strings into its `Config`, `trial` runs one trial
(open tracking, validate, `train`, flush, end the run), and the rest only build a `Run` around
it: `launch` (a local or Ray Train run), `ray_train`, `tune_run` (a sweep's trials under Tune),
`zero` (DeepSpeed ZeRO), `checkpoints` and `console` (what a person sees while it runs).
"""
