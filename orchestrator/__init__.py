"""ladder's orchestrator: everything that is not a method (CLI, registry, runs, sweeps, tracking).

Submodules are imported where used, so that `ladder list` stays free of torch and Ray.
"""
