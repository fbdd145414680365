"""The `ladder` command line: list workloads, run one (in-process or under Ray Train), serve the UI.

Every check that can fail on bad input (workload name, config fields and types, resources) runs
before any Ray work starts, and prints one message that names the problem and the fix.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from orchestrator.runners import registry
from orchestrator.claims import FULL_SEEDS as FULL_REPRO_SEEDS, SIZES
from orchestrator.runners.config import ConfigError, apply_overrides, describe_type, field_docs, parse_sets


class UsageError(Exception):
    pass


WORKLOAD_HELP = "workload: a name from `ladder list`, or a module path importable from here (mylab.sparse_moe)"


def _cmd_list(args: argparse.Namespace) -> int:
    known = registry.known()  # the built-in workloads, then installed plugins (entry points)
    width = max(len(n) for n in known)
    for name in sorted(known):
        src = known[name]
        origin = f"  [plugin: {src.dist or src.module}]" if src.kind == "plugin" else ""
        print(f"{name:<{width}}  {registry.paper_title(name)}{origin}")
    return 0


def _cmd_new(args: argparse.Namespace) -> int:
    from orchestrator.commands import scaffold

    folder, module = scaffold.new(args.name, args.dir)
    # Commands run from here when the package imports from here, else from the folder it is in.
    importable_here = scaffold.module_path(folder, Path.cwd()) is not None
    base = Path.cwd() if importable_here else folder.parent
    shown = os.path.relpath(folder, base)
    print(f"wrote {os.path.relpath(folder)}/: __init__.py, workload.py (Config, smoke, train), test_{args.name}.py, sweep.py")
    # Where the commands run, runs and the MLflow store land: keep them out of git and of Ray jobs.
    written, lacking = scaffold.write_ignore_files(base)
    if written:
        print(f"wrote {', '.join(os.path.relpath(base / n) for n in written)}: {', '.join(scaffold.IGNORED)} "
              "stay out of git and of `ray job submit --working-dir .`")
    for name, missing in lacking.items():
        print(f"note: {os.path.relpath(base / name)} does not list {', '.join(missing)}: add "
              f"{'them' if len(missing) > 1 else 'it'}, or git and `ray job submit --working-dir .` take "
              f"{'them' if len(missing) > 1 else 'it'} along")
    print("next:" if importable_here else f"next, from {folder.parent}:")
    rows = [(f"ladder check {module}", "the workload contract, judged by running it"),
            (f"ladder run {module} --smoke --local", "train in this process"),
            (f"ladder sweep {shown}/sweep.py", "an ASHA sweep on the local Ray"),
            (f"pytest {shown}", "its tests")]
    width = max(len(c) for c, _ in rows)
    for command, what in rows:
        print(f"  {command:<{width}}  # {what}")
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    import tempfile

    from orchestrator.commands import check

    with tempfile.TemporaryDirectory(prefix="ladder-check-") as folder:
        report = check.check(args.name, folder, objective=args.objective, ray=args.ray)
    print(check.format_report(report))
    return 0 if report.ok else 1


def _cmd_show(args: argparse.Namespace) -> int:
    import dataclasses
    import typing

    workload = registry.load(args.name)
    cfg = workload.smoke() if args.smoke else workload.Config()
    docs = field_docs(workload.Config)
    hints = typing.get_type_hints(workload.Config)
    print(f"{workload.name}: {workload.paper}")
    print(f"config ({'smoke' if args.smoke else 'defaults'}):")
    for f in dataclasses.fields(cfg):
        print(f"  {f.name} = {getattr(cfg, f.name)!r}  [{describe_type(hints[f.name])}]  {docs.get(f.name, '')}")
    return 0


def _build_config(args: argparse.Namespace, recorded: dict | None = None, *, gpu: bool = False):
    """The workload, loaded once, and the config it runs with (a resumed run's is the `recorded`
    one), validated once before anything launches; the trial validates it again where it runs."""
    from orchestrator.runners.config import from_dict

    workload = registry.load(args.name)
    if recorded is not None:
        cfg = from_dict(workload.Config, recorded)
    else:
        cfg = workload.smoke() if args.smoke else workload.Config()
        cfg = apply_overrides(cfg, parse_sets(args.set or []))
    workload.validate(cfg, world_size=getattr(args, "workers", 1), gpus=gpu or bool(getattr(args, "gpus_per_worker", 0)))
    workload.preflight(cfg)  # this machine runs it (or the cluster at RAY_ADDRESS, which sees the same paths)
    return workload, cfg


def _cmd_run(args: argparse.Namespace) -> int:
    from orchestrator.runners import launch

    if args.resume:
        record = launch.load_run_record(args.resume)
        if args.name and args.name != record["workload"]:
            raise UsageError(f"{args.resume} is a run of {record['workload']!r}, not {args.name!r}: "
                             f"drop the name (ladder run --resume {args.resume}) or resume a run of {args.name!r}")
        args.name = args.name or record["workload"]
        if args.set:
            raise UsageError("--set cannot change a resumed run's config; start a new run instead")
    if not args.name:
        raise UsageError("ladder run needs a workload name (see `ladder list`) or --resume RUN_DIR")
    if args.workers is None:  # a resumed Ray run keeps its own worker count
        args.workers = int(record.get("workers", 1)) if args.resume and not args.local else 1
    if args.local and args.workers != 1:
        raise UsageError("--local runs in this process with one worker; drop --workers or drop --local")
    if args.local and args.gpus_per_worker:
        raise UsageError("--gpus-per-worker is for Ray Train workers; with --local choose the device with --device "
                         "(cuda when this machine has one)")
    if args.device and not args.local:
        raise UsageError(f"--device chooses where --local trains; Ray Train workers train on the GPUs Ray gives "
                         f"them: use --gpus-per-worker 1 (or add --local to train here on {args.device})")
    from orchestrator.run import devices

    device = devices.resolve(args.device) if args.local else None  # refused here, before anything is recorded
    workload, cfg = _build_config(args, record["config"] if args.resume else None,
                                  gpu=device is not None and device.type == "cuda")
    if args.local:
        print(f"{workload.name}: training in this process on {devices.describe(device)}"
              f"{'' if device.type == 'cuda' or args.device else ' (no CUDA device here)'}", flush=True)
        result = launch.run_local(workload, cfg, resume=args.resume, track=not args.no_track, wandb=args.wandb,
                                  device=device)
    else:
        result = launch.run_ray(  # checks the workers fit before anything starts
            workload,
            cfg,
            workers=args.workers,
            cpus_per_worker=args.cpus_per_worker,
            gpus_per_worker=args.gpus_per_worker,
            max_failures=args.max_failures,
            resume=args.resume,
            track=not args.no_track,
            wandb=args.wandb,
        )
    print(launch.summary(result))
    return 0


def _cmd_sweep(args: argparse.Namespace) -> int:
    from orchestrator import sweep as sweep_mod
    from orchestrator.sweeps import tune_run

    definition = sweep_mod.load_sweep_file(args.file)
    if args.check:
        definition.check()
        print(f"{args.file}: sweep {definition.name!r} is valid: {definition.trial_count()} trials of {definition.workload}, "
              f"each {definition.describe_resources()}")
        # What a launch from here would run at once: this machine's CPUs (or the cap on a cluster).
        at_once, where = tune_run.concurrency_here(definition)
        if definition.model_based:
            print(f"  search: {definition.describe_search(at_once, where)}")
        elif at_once:
            print(f"  at most {at_once} trial{'s' if at_once != 1 else ''} at once {where}")
        # Where it can run is another question than whether it is valid: say it, do not fail on it.
        for note in tune_run.launch_problems(definition):
            print(f"  not runnable here, checked again where it launches: {note}")
        return 0
    try:
        result = tune_run.run_sweep(definition, resume=args.resume, wandb=args.wandb, verbose=args.verbose)
    except tune_run.SweepInterrupted as stop:
        if stop.result is not None:
            print(tune_run.format_trials(stop.result))
            left = sum(t["state"] == "interrupted" for t in stop.result.trials)
            what = f"{left} of {len(stop.result.trials)} trials were interrupted"
        else:
            what = "no trial had started"
        print(f"ladder: {stop} ({what}); its MLflow runs are KILLED and it resumes where it stopped, finished trials "
              f"kept: ladder sweep {args.file} --resume", file=sys.stderr)
        return stop.exit_code
    print(tune_run.format_trials(result))
    from orchestrator.sweeps.summary import experiment_page

    print(f"sweep {result.name!r} finished in {result.wall_s:.0f} s; MLflow experiment {result.name!r}, parent run "
          f"{result.parent_run_id} — open it with `ladder ui`")
    local = not str(result.tracking_uri).startswith(("http://", "https://"))
    print(f"its trials side by side in the UI{' (after `ladder ui`)' if local else ''}: "
          f"{experiment_page(result.tracking_uri, result.name)}")
    failed = [t for t in result.trials if t["error"]]
    if failed:
        first = failed[0]["error"].strip().splitlines()
        print(f"ladder: {len(failed)} of {len(result.trials)} trials failed after their retries "
              f"({', '.join(t['trial_id'] for t in failed)}); the first: {first[-1] if first else 'no message'}. "
              f"Their runs in MLflow are FAILED with the error; `ladder sweep {args.file} --resume` runs them again "
              "and keeps every finished trial", file=sys.stderr)
        return 1
    return 0


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: give 1 or more")
    return value


def _cmd_reproduce(args: argparse.Namespace) -> int:
    from orchestrator.reproduction import reproduce

    if args.local and args.resume:
        raise UsageError("--resume continues a reproduction on Ray; drop --local")
    if args.check and args.resume:
        raise UsageError("--check runs nothing, so there is nothing to resume: give one of them")
    size = reproduce.size_of(args.size, args.smoke)
    if args.check:
        print(reproduce.check(args.name, size=size, seed=args.seed, seeds=args.seeds, local=args.local))
        return 0
    from orchestrator.sweeps.tune_run import SweepInterrupted

    try:
        rep = reproduce.reproduce(args.name, size=size, seed=args.seed, seeds=args.seeds, local=args.local,
                                  resume=args.resume, verbose=args.verbose)
    except SweepInterrupted as stop:
        again = [args.name] + reproduce.size_flags(size) + (["--seed", str(args.seed)] if args.seed else []) \
            + (["--seeds", str(args.seeds)] if args.seeds else [])
        print(f"ladder: reproduction of {args.name!r} interrupted ({stop}); its MLflow runs are KILLED and nothing was "
              f"judged. Continue it: ladder reproduce {' '.join(again)} --resume", file=sys.stderr)
        return stop.exit_code
    print(reproduce.format_claims(rep))
    if rep.parent_run_id:
        print(f"claim tables, numbers and plot logged to MLflow experiment {rep.sweep.name!r}, run {rep.parent_run_id} "
              "— open it with `ladder ui`")
    return 0 if rep.ok else 1


def _cmd_report(args: argparse.Namespace) -> int:
    from orchestrator.reproduction import report

    if args.from_mlflow and args.local:
        raise UsageError("--from-mlflow reads recorded reproductions; --local says how to run them: give one or the other")
    from orchestrator.reproduction.reproduce import DEFAULT_SEEDS, size_of

    size = size_of(args.size, args.smoke)
    seeds = args.seeds or (report.SEEDS if size == "smoke" else DEFAULT_SEEDS[size])
    out = report.build(args.names or None, size=size, seeds=seeds, local=args.local,
                       use_mlflow=args.from_mlflow, out=Path(args.out), seed=args.seed)
    print(f"wrote {out} (and its data in {out.parent / 'reproductions'})")
    return 0


def _cmd_audit(args: argparse.Namespace) -> int:
    from orchestrator.sweeps.audit import main_audit

    return main_audit(args)


def _cmd_audit_adapter(args: argparse.Namespace) -> int:
    from components.adapters.audit import AdapterError, audit, format_report

    options = {"base_name": args.base, "spectral_only": args.spectral_only}
    if args.threshold is not None:
        options["threshold"] = args.threshold
    try:
        report = audit(args.path, **options)
    except AdapterError as exc:
        raise UsageError(str(exc)) from exc
    print(format_report(report, modules=args.modules, as_json=args.json))
    return 1 if report.flagged else 0


def _cmd_base(args: argparse.Namespace) -> int:
    from components.basemodel import BaseModelError, base_info

    try:
        info = base_info(args.name, seed=args.seed)
    except BaseModelError as exc:
        raise UsageError(str(exc)) from exc
    print(f"{args.name} (seed {args.seed}): {info['path']}")
    if "metrics" in info:
        print(f"  {info['params']} parameters, vocabulary {info['vocab_size']}, built in {info['build_cpu_s']:.0f} s CPU "
              f"({info['build_wall_s']:.0f} s wall), recipe {info['recipe']}")
        print(f"  {'held-out metric':<22} {'trained':>8} {'init':>8}")
        for key, value in info["metrics"].items():
            print(f"  {key:<22} {value:>8.3f} {info['init_metrics'][key]:>8.3f}")
    return 0


def _cmd_ui(args: argparse.Namespace) -> int:
    from orchestrator.tracking import sink as tracking

    uri = tracking.tracking_uri()
    if uri.startswith(("http://", "https://")):
        print(f"MLFLOW_TRACKING_URI points at a server: open {uri.rstrip('/')}/{tracking.UI_PAGE} in a browser")
        return 0
    cmd, env = tracking.ui_command(uri, args.host, args.port)
    print(f"serving {uri}: open http://{args.host}:{args.port}/{tracking.UI_PAGE} in a browser "
          "once it answers (Ctrl-C stops)", flush=True)
    os.execve(cmd[0], cmd, env)  # the server takes this process's place: one process, Ctrl-C goes to it
    return 0  # not reached


def _cmd_sync(args: argparse.Namespace) -> int:
    from orchestrator.tracking import outbox

    folder = args.folder or outbox.default_dir()
    if args.folder and not os.path.isdir(args.folder):
        raise UsageError(f"no outbox folder {args.folder!r}: runs keep undelivered metrics in ./{outbox.OUTBOX_DIR}")
    return 1 if outbox.sync(folder) else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ladder",
        description="Run, sweep and scale research training workloads on Ray; results in MLflow.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("list", help="list workloads with their papers")
    p.set_defaults(func=_cmd_list)

    p = sub.add_parser("new", help="write a new workload package that follows the contract",
                       description="Write NAME/ (a documented frozen Config, smoke(), a training loop that reports, "
                                   "checkpoints and resumes, a test and a sweep file) under --dir. It passes `ladder "
                                   "check` as written; run it by its module path (NAME, or DIR.NAME from here).")
    p.add_argument("name", help="the package's name: a Python module name, e.g. sparse_moe")
    p.add_argument("--dir", default=".", help="folder to create NAME/ in; default the current one")
    p.set_defaults(func=_cmd_new)

    p = sub.add_parser("check", help="judge a workload against the contract by running its smoke config",
                       description="Run WORKLOAD's smoke config uninterrupted, killed after a checkpoint and restarted, "
                                   "and print which parts of the workload contract hold: Config fields typed and "
                                   "documented, train/loss and progress reported, progress reaching 1, steps "
                                   "increasing, the restart continuing from the checkpoint with the same metrics, "
                                   "reports a Tune scheduler can rank. Exits 1 when a check fails.")
    p.add_argument("name", help=WORKLOAD_HELP)
    p.add_argument("--objective", help="the metric sweeps will rank it on; default: its reproduction sweep's, else eval/loss")
    p.add_argument("--ray", action="store_true",
                   help="also kill a Ray Train run (2 workers when the workload accepts them) after a checkpoint "
                        "and check that it restores it (starts a local Ray: a minute or two on two cores)")
    p.set_defaults(func=_cmd_check)

    p = sub.add_parser("show", help="show a workload's config fields, defaults and docs")
    p.add_argument("name", help=WORKLOAD_HELP)
    p.add_argument("--smoke", action="store_true", help="show the CPU-sized smoke config")
    p.set_defaults(func=_cmd_show)

    p = sub.add_parser("run", help="train one workload", description="Train one workload under Ray Train (default) or in-process (--local).")
    p.add_argument("name", nargs="?", help=WORKLOAD_HELP)
    p.add_argument("--smoke", action="store_true", help="start from the CPU-sized smoke config")
    p.add_argument("--set", nargs="+", metavar="FIELD=VALUE", action="extend", help="override config fields (see `ladder show NAME`)")
    p.add_argument("--workers", type=int, default=None,
                   help="Ray Train workers (DDP over gloo on CPU); default 1, or with --resume the run's own")
    p.add_argument("--cpus-per-worker", type=float, default=1.0, help="CPUs reserved per worker; default 1")
    p.add_argument("--gpus-per-worker", type=float, default=0.0,
                   help="GPUs reserved per Ray Train worker (NCCL between GPU workers); default 0, CPU workers")
    p.add_argument("--max-failures", type=int, default=0, help="restarts from the last checkpoint after a worker failure")
    p.add_argument("--local", action="store_true", help="train in this process, without Ray")
    p.add_argument("--device", help="with --local: auto (default: cuda when this machine has one, else cpu), cpu, "
                                    "cuda or cuda:N")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its folder's last checkpoint")
    p.add_argument("--no-track", action="store_true", help="do not record the run in MLflow")
    p.add_argument("--wandb", action="store_true", help="also log to Weights & Biases (set WANDB_MODE=offline without an account)")
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser("sweep", help="run a sweep file on Ray Tune", description="Run the Sweep defined in FILE on the local Ray (or RAY_ADDRESS). Exits 1 when a trial failed after its retries (the others are kept: --resume runs the failed ones again).")
    p.add_argument("file", help="a Python file assigning a Sweep to `sweep` (see sweeps/)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted sweep: finished trials are kept, decisions too")
    p.add_argument("--check", action="store_true", help="validate the sweep and exit without running it")
    p.add_argument("--wandb", action="store_true",
                   help="each trial also logs to Weights & Biases, project ladder-SWEEP (WANDB_MODE=offline without an account)")
    p.add_argument("--verbose", action="store_true", help="also show Ray's own output: Tune's configuration box and "
                   "status tables, its TensorBoard hint, Ray Train's line per report")
    p.set_defaults(func=_cmd_sweep)

    p = sub.add_parser("reproduce", help="run a workload's reproduction sweep and check its paper's claims",
                       description="Run sweeps/repro/NAME.py at one or more seeds, judge the workload's CLAIMS across "
                                   "the seeds (mean effect, 95% interval: holds, fails or inconclusive) and its CHECKS "
                                   "at every seed, print both tables and log them to MLflow. Exits 1 when a claim "
                                   "fails, a check fails or a trial failed; an inconclusive claim exits 0.")
    p.add_argument("name", help=WORKLOAD_HELP)
    p.add_argument("--size", choices=SIZES, default=None,
                   help="smoke: CPU-sized, about a minute a seed (what CI runs); bench: the largest one 2-core machine "
                        "finishes for 3 seeds in 90 minutes, for effects a minute cannot show; full (default): the "
                        "paper's comparison at cluster size")
    p.add_argument("--smoke", action="store_true", help="short for --size smoke")
    p.add_argument("--seed", type=int, default=0, help="first seed of the reproduction; claims should hold for any")
    p.add_argument("--seeds", type=_positive_int, default=None,
                   help="seeds to judge the claims over, run as one sweep (default 1 at smoke size, 3 at bench, "
                        f"{FULL_REPRO_SEEDS} at full size); one seed gives no interval")
    p.add_argument("--check", action="store_true", help="run nothing: build every seed's sweep and check its configs, "
                   "the data and base models it needs and the CPUs it asks for, then say what would run")
    p.add_argument("--local", action="store_true", help="run the trials one after another in this process, without Ray")
    p.add_argument("--resume", action="store_true", help="continue an interrupted reproduction on Ray")
    p.add_argument("--verbose", action="store_true", help="also show Ray's own output: Tune's configuration box and "
                   "status tables, its TensorBoard hint, Ray Train's line per report")
    p.set_defaults(func=_cmd_reproduce)

    p = sub.add_parser("report", help="run the reproductions at several seeds and write the reproduction report",
                       description="Run `ladder reproduce NAME --seeds K` for each NAME (every workload with CLAIMS by "
                                   "default), or read the newest recorded ones from MLflow, and write the report: per "
                                   "paper, each claim with the paper's number, ours, its 95% interval, the seeds, the "
                                   "verdict, the size, date and commit, and the claim plot. Sections of workloads not "
                                   "named are kept.")
    p.add_argument("names", nargs="*", metavar="NAME", help="workloads to (re)measure; default: all with CLAIMS")
    p.add_argument("--size", choices=SIZES, default=None, help="smoke, bench or full (default full): as for "
                   "`ladder reproduce`; the report keeps a row per size measured")
    p.add_argument("--smoke", action="store_true", help="short for --size smoke")
    p.add_argument("--seeds", type=_positive_int, default=None,
                   help="seeds per reproduction (default 5 at smoke size, 3 at bench, "
                        f"{FULL_REPRO_SEEDS} at full size)")
    p.add_argument("--seed", type=int, default=0, help="first seed (default 0)")
    p.add_argument("--local", action="store_true", help="run the trials in this process, without Ray")
    p.add_argument("--from-mlflow", action="store_true", help="read the newest finished reproductions of this size and "
                   "seed count from MLflow instead of running them")
    p.add_argument("--out", default="docs/reproductions.md", help="the page to write (default docs/reproductions.md)")
    p.set_defaults(func=_cmd_report)

    p = sub.add_parser("audit", help="replay stopping policies on a finished sweep's curves",
                       description="Replay collapse, ASHA, median, current-best and random stopping on the full curves "
                                   "of a sweep and print compute used and regret for each.")
    p.add_argument("experiment", help="MLflow experiment of a sweep whose trials ran to the end (scheduler='fifo')")
    p.add_argument("--metric", default="eval/loss", help="curve to replay; default eval/loss")
    p.add_argument("--reference", dest="reference_experiment", help="experiment of reference runs (default: leave-one-out)")
    p.add_argument("--reference-kind", choices=["empirical", "parametric"], default="empirical", help="reference built from them")
    p.add_argument("--no-plot", dest="plot", action="store_false", help="skip the charts logged to the sweep's parent run")
    p.set_defaults(func=_cmd_audit)

    p = sub.add_parser("audit-adapter", help="inspect a peft LoRA adapter's weights and report whether it looks backdoored",
                       description="Read a peft LoRA folder (adapter_config.json, adapter_model.safetensors; pickled "
                                   ".bin files are refused, never loaded), compute the spectral statistics of every "
                                   "module's update B A, read them in token coordinates through the base model, and "
                                   "judge them with the rule calibrated by the jailbreak_lora workload. Exits 1 when "
                                   "the adapter is flagged, 0 when not.")
    p.add_argument("path", help="adapter folder written by peft's save_pretrained (or its .safetensors file)")
    p.add_argument("--base", help="base model (hub id, folder or tiny-local); default: the adapter config's")
    p.add_argument("--spectral-only", action="store_true", help="print the spectral statistics without loading the base "
                                                                "(no verdict)")
    p.add_argument("--threshold", type=float, help="flag above this score instead of the calibrated threshold")
    p.add_argument("--modules", action="store_true", help="also print every module's statistics")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=_cmd_audit_adapter)

    p = sub.add_parser("sync", help="send metrics kept locally while the tracking server was unreachable",
                       description="Deliver the outbox: metric points, final metrics and end statuses that runs kept "
                                   "on disk because the MLflow server did not answer. Exits 1 while some still wait.")
    p.add_argument("folder", nargs="?", help="outbox folder; default ./ladder-runs/outbox")
    p.set_defaults(func=_cmd_sync)

    p = sub.add_parser("base", help="build or describe the base model of the LLM fine-tuning workloads",
                       description="`build` builds tiny-local into the cache ($LADDER_CACHE, default ~/.cache/ladder) "
                                   "when missing; `info` does the same and prints where it is and its held-out metrics.")
    p.add_argument("action", choices=["build", "info"], help="build: make sure it is cached; info: also print its metrics")
    p.add_argument("name", nargs="?", default="tiny-local", help="tiny-local[:key=value,...], a folder or a hub id")
    p.add_argument("--seed", type=int, default=0, help="tiny-local build seed; default 0")
    p.set_defaults(func=_cmd_base)

    p = sub.add_parser("ui", help="serve the MLflow UI on the tracking store (localhost only)")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind; default 127.0.0.1")
    p.add_argument("--port", type=int, default=5000, help="port; default 5000")
    p.set_defaults(func=_cmd_ui)
    return parser


OFFLINE_ENV = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
"""Set to 1 by every ladder command unless already set: the Hugging Face clients' offline mode."""


def main(argv: list[str] | None = None) -> int:
    from orchestrator.run.checkpoints import CheckpointError
    from orchestrator.run.devices import DeviceError
    from orchestrator.runners.launch import ResourceError
    from orchestrator.tracking.sink import TrackingError

    # Nothing is downloaded at run time (components.pretrained): the Hugging Face clients look in
    # their local cache and never wait on the hub, which offline costs minutes of retries. Before
    # any of them is imported (they read it once); a user's own setting wins.
    for name in OFFLINE_ENV:
        os.environ.setdefault(name, "1")
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except (registry.UnknownWorkload, ConfigError, ResourceError, UsageError, CheckpointError, TrackingError,
            DeviceError) as exc:
        print(f"ladder: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        # What was recorded says so (a run ends KILLED); a traceback of where Ctrl-C landed says nothing.
        print(f"ladder: interrupted (ladder {args.command}); what it had recorded is kept, and a run it had open "
              "in MLflow is ended KILLED", file=sys.stderr)
        resume = getattr(exc, "resume_command", None)
        if resume:
            print(f"ladder: the run's folder is {exc.run_dir}; `{resume}` continues it from its last checkpoint",
                  file=sys.stderr)
        return 128 + signal.SIGINT


if __name__ == "__main__":
    sys.exit(main())
