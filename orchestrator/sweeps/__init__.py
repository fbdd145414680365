"""Running a sweep and reading it back: `tune_run` runs a `Sweep` on Ray Tune (each trial through
`orchestrator.runners.trial`), with proposals from `search`, stopping from `schedulers` (the
loss-curve-collapse maths in `collapse`, its references in `references`); `curves`, `summary`,
`plots` and `audit` read a finished sweep back (its MLflow summary, its plots, stopping policies
replayed on its curves)."""
