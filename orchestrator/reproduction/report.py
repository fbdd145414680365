"""`ladder report`: the reproduction report, one page of what ladder reproduces of each paper.

    ladder report [--size smoke|bench|full] [--seeds K] [--local] [--from-mlflow] [--out docs/reproductions.md] [NAMES...]

For each workload with CLAIMS (every built-in one when no NAMES are given) it runs the reproduction
at K seeds, exactly as `ladder reproduce NAME --seeds K` does (so every run is also in MLflow), or
with `--from-mlflow` reads the newest finished one of that size and seed count back from its parent
run's `claims.json`. Each workload's judged outcomes are kept as `<out folder>/reproductions/NAME.json`
with its claim plot beside it, and the page is written from every such file present: a run for a few
NAMES updates their sections and keeps the others. Each section says the size, the seeds, the date
and the commit it was measured at, and ends with the paper's measurement notes (`NAME.notes.md`
beside its JSON, written by hand) where there are any.

Each size measured has its own record: `NAME.json` (smoke), `NAME.bench.json`, `NAME.full.json`,
each with its plot and notes beside it (`NAME.bench.png`, `NAME.bench.notes.md`), its own row in
the table and its own section; a bench or full record also keeps the processor it ran on, since
its wall time and numbers depend on it. The summary counts each size's headlines (a paper's first
claim) apart.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from orchestrator import claims as judging
from orchestrator.runners import registry
from orchestrator.reproduction import reproduce
from orchestrator.tracking import sink as tracking
from orchestrator.runners.config import ConfigError

DEFAULT_OUT = Path("docs/reproductions.md")
SEEDS = 5
NOTES_SUFFIX = ".notes.md"
"""`<out folder>/reproductions/NAME.notes.md`, written by hand and kept by the report: what was
measured when a threshold or a size was chosen (seeds, settings, what was tried), shown under the
paper's section. Code docstrings say what a claim judges; these notes say what was measured."""


def workloads_with_claims() -> list[str]:
    return [name for name in registry.WORKLOADS if registry.load(name).claims]


def stem(name: str, size: str) -> str:
    """The file name (without suffix) of `name`'s record at `size`: NAME for smoke (the size CI
    measures, and every record made before there were other sizes), NAME.SIZE otherwise."""
    return name if size == "smoke" else f"{name}.{size}"


def size_of_record(record: dict[str, Any]) -> str:
    return record.get("size") or ("smoke" if record.get("smoke") else "full")


def entry(rep: reproduce.Reproduction) -> dict[str, Any]:
    """What the report keeps of one reproduction."""
    return {
        "name": rep.name, "paper": registry.paper_title(rep.name), "size": rep.size, "smoke": rep.smoke,
        "processor": reproduce.processor(), "seeds": rep.seeds,
        "trials": len(rep.trials), "failed_trials": rep.failed_trials, "wall_s": round(rep.wall_s, 1),
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d"), "commit": reproduce.source_commit(),
        "run_id": rep.parent_run_id, "outcomes": [reproduce.outcome_record(o) for o in rep.outcomes],
    }


def from_mlflow(name: str, *, size: str, seeds: int, data_dir: Path) -> dict[str, Any]:
    """The newest finished reproduction of `name` at this size and seed count, read back from MLflow."""
    uri = tracking.tracking_uri()
    c = tracking.client(uri)
    experiment = reproduce.experiment_name(name, size)
    exp = c.get_experiment_by_name(experiment)
    runs = [] if exp is None else c.search_runs(
        [exp.experiment_id], filter_string="tags.`ladder.kind` = 'reproduce' and attributes.status = 'FINISHED'",
        order_by=["attributes.start_time DESC"], max_results=200)
    for run in runs:
        tags = run.data.tags
        if tags.get("ladder.seeds", "").count(",") + 1 != seeds or "ladder.claims" not in tags:
            continue
        with tempfile.TemporaryDirectory(prefix="ladder-report-") as tmp:
            path = c.download_artifacts(run.info.run_id, "claims.json", tmp)
            outcomes = json.loads(Path(path).read_text())
            plots = [a.path for a in c.list_artifacts(run.info.run_id) if a.path.endswith("_claims.png")]
            if plots:
                shutil.copy(c.download_artifacts(run.info.run_id, plots[0], tmp), data_dir / f"{stem(name, size)}.png")
        started = dt.datetime.fromtimestamp(run.info.start_time / 1000, dt.timezone.utc)
        return {"name": name, "paper": registry.paper_title(name), "size": size, "smoke": size == "smoke",
                "processor": tags.get("ladder.processor", ""),
                "seeds": [int(s) for s in tags["ladder.seeds"].split(",")], "trials": None, "failed_trials": [],
                "wall_s": ((run.info.end_time or run.info.start_time) - run.info.start_time) / 1000,
                "date": started.strftime("%Y-%m-%d"), "commit": tags.get("ladder.commit", ""),
                "run_id": run.info.run_id, "outcomes": outcomes}
    shown = "".join(f" {w}" for w in reproduce.size_flags(size))
    raise ConfigError(f"{name}: no finished reproduction at {size} size with {seeds} seeds in "
                      f"MLflow experiment {experiment!r} ({uri}): run `ladder reproduce {name}"
                      f"{shown} --seeds {seeds}` first, or drop --from-mlflow")


def build(names: list[str] | None = None, *, size: str | None = None, smoke: bool | None = None, seeds: int = SEEDS,
          local: bool = False, use_mlflow: bool = False, out: Path = DEFAULT_OUT, seed: int = 0) -> Path:
    """Run (or read) the reproductions of `names` at `size` (default smoke; `smoke=False`: full)
    and rewrite the report at `out`."""
    size = reproduce.size_of(size or ("full" if smoke is False else "smoke"))
    names = list(names or workloads_with_claims())
    for name in names:  # every input checked before anything runs
        reproduce.plan(name, size=size, seed=seed, seeds=seeds)
    data_dir = out.parent / "reproductions"
    data_dir.mkdir(parents=True, exist_ok=True)
    errors = []
    for name in names:
        try:
            if use_mlflow:
                record = from_mlflow(name, size=size, seeds=seeds, data_dir=data_dir)
            else:
                rep = reproduce.reproduce(name, size=size, seed=seed, seeds=seeds, local=local)
                print(reproduce.format_claims(rep), flush=True)
                record = entry(rep)
                plot = reproduce.draw_plot(rep, registry.load(name), data_dir / f"{stem(name, size)}.png")
                if plot is None:
                    (data_dir / f"{stem(name, size)}.png").unlink(missing_ok=True)
        except ConfigError:
            raise
        except Exception as exc:  # one broken reproduction must not cost the others theirs
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
            tracking.warn(f"report: {errors[-1]}")
            continue
        (data_dir / f"{stem(name, size)}.json").write_text(json.dumps(record, indent=1) + "\n")
        out.write_text(render(data_dir))  # after each one: an interrupted report keeps what it measured
    out.write_text(render(data_dir))
    if errors:
        raise RuntimeError("some reproductions could not run (their sections are unchanged): " + "; ".join(errors))
    return out


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _num(value: float | None) -> str:
    return "-" if value is None else reproduce._fmt(value)


def render(data_dir: Path) -> str:
    """The markdown page from every NAME.json in `data_dir`."""
    records = [json.loads(p.read_text()) for p in data_dir.glob("*.json")]
    order = {name: i for i, name in enumerate(sorted({r["name"] for r in records}))}
    records.sort(key=lambda r: (order[r["name"]], reproduce.SIZES.index(size_of_record(r))))
    lines = [
        "# Reproductions",
        "",
        "What ladder reproduces of each paper, as measured. Generated by `ladder report`; do not edit by hand.",
        "",
        "Each paper's **claims** are the effects it reports. Every claim is measured at several seeds, as a",
        "difference or ratio between the method and its baseline within one seed, and judged on the set:",
        "the mean effect with a 95% Student-t interval. **holds** means the whole interval is on the paper's",
        "side of the threshold, **fails** means it is wholly on the other side, and **inconclusive** means",
        "it straddles the threshold. A threshold is the paper's own number where it gives one; where we had",
        "to choose one, the table says how. **Checks** are invariants and mechanism sanity: the code is",
        "right or it is not, whatever training does. They must hold at every seed and are not counted as",
        "reproduced results. *Smoke* size means CPU-sized models and data (tiny-local and generated tasks), not",
        "the paper's scale: a smoke verdict says whether the effect appears at that size, not whether the",
        "paper's numbers do. *Bench* size is the largest run one 2-core machine finishes for 3 seeds in about",
        "90 minutes, for effects a minute of training cannot show; it is run on demand, and its section names",
        "the processor and the wall time. A paper's **headline** is its first claim: the effect its abstract",
        "leads with. A section's measurement notes, where there are any, are written by hand",
        f"(`{data_dir.name}/NAME{NOTES_SUFFIX}`): what was measured when a threshold or a size was chosen.",
        "",
        "| paper | workload | size | seeds | claims hold | inconclusive | fail | checks hold | measured |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        claims = [o for o in r["outcomes"] if o["kind"] == "claim"]
        checks = [o for o in r["outcomes"] if o["kind"] == "check"]
        count = lambda *vs: sum(o["verdict"] in vs for o in claims)  # noqa: E731
        lines.append(
            f"| {_cell((r['paper'] or r['name']).split(' — ')[0])} | [`{r['name']}`](#{anchor(r)}) | {size_of_record(r)} "
            f"| {len(r['seeds'])} | {count(judging.HOLDS)}/{len(claims)} | {count(judging.INCONCLUSIVE, judging.NOT_JUDGED)} "
            f"| {count(judging.FAILS, 'error')} | "
            + (f"{sum(o['verdict'] == judging.HOLDS for o in checks)}/{len(checks)}" if checks else "none") + " "
            f"| {r['date']}, {r['commit'] or '?'} |")
    lines += ["", headline_summary(records)]
    measured = {r["name"] for r in records}
    without = [n for n in registry.WORKLOADS if n not in measured and not registry.load(n).claims]
    if without:
        lines += ["", "Built-in workloads without CLAIMS, so not in this report: " + "; ".join(
            f"`{n}` ({_cell(registry.paper_title(n))})" for n in without) + "."]
    for r in records:
        seeds, size = r["seeds"], size_of_record(r)
        title = r["name"] if size == "smoke" else f"{r['name']}, {size} size"
        lines += ["", f"<a id=\"{anchor(r)}\"></a>", f"## {title}: {_cell(r['paper'])}", "",
                  f"{size.capitalize()} size, seeds {seeds[0]}-{seeds[-1]} ({len(seeds)}), "
                  + (f"{r['trials']} trials, " if r.get("trials") is not None else "")
                  + f"{r['wall_s'] / 60:.1f} min"
                  + (f" on {r['processor']}" if size != "smoke" and r.get("processor") else "")
                  + f", measured {r['date']} at commit {r['commit'] or 'unknown'}"
                  + (f"; MLflow run {r['run_id']}" if r.get("run_id") else "") + ".", ""]
        for failed in r.get("failed_trials") or []:
            lines.append(f"- trial failed: `{_cell(failed)}`")
        lines += ["| claim | the paper | judged at | ours: mean | 95% interval | per seed | verdict |",
                  "|---|---|---|---|---|---|---|"]
        for o in (o for o in r["outcomes"] if o["kind"] == "claim"):
            spec, iv = o.get("spec"), o.get("interval")
            if spec:
                effects = [s["measured"].get(spec["effect"]) for s in o["per_seed"]]
                judged_at = f"`{spec['effect']} {spec['direction']} {spec['threshold']:g}` ({_cell(spec['source'])})"
                mean = _num(iv["mean"]) if iv else "-"
                interval = ("-" if not iv or iv["n"] < 2 else f"[{_num(iv['low'])}, {_num(iv['high'])}]")
                per_seed = " ".join(_num(v) for v in effects)
            else:
                judged_at, mean = "share of seeds where it held (undeclared effect)", "-"
                interval = "-" if not iv else f"{round(iv['mean'] * iv['n'])}/{iv['n']} seeds, [{iv['low']:.2f}, {iv['high']:.2f}]"
                per_seed = " ".join("-" if s["holds"] is None else "yes" if s["holds"] else "no" for s in o["per_seed"])
            verdict = o["verdict"] if o["verdict"] in (judging.HOLDS, judging.INCONCLUSIVE, judging.NOT_JUDGED) \
                else f"**{o['verdict']}**"
            lines.append(f"| `{o['name']}`: {_cell(o['statement'])} | {_cell(spec['paper']) if spec else '-'} | "
                         f"{judged_at} | {mean} | {interval} | {per_seed} | {verdict} |")
        checks = [o for o in r["outcomes"] if o["kind"] == "check"]
        if checks:
            shown = []
            for o in checks:
                judged = [s for s in o["per_seed"] if s["holds"] is not None]
                held = sum(bool(s["holds"]) for s in judged)
                shown.append(f"`{o['name']}` {held}/{len(judged)}" + ("" if held == len(judged) and judged else " **fails**"))
            lines += ["", "Checks (held at / seeds judged): " + ", ".join(shown) + "."]
        notes = [n for o in r["outcomes"] for n in o.get("notes") or []]
        lines += [f"- note: {_cell(n)}" for n in notes]
        name = stem(r["name"], size)
        if (data_dir / f"{name}.png").exists():
            lines += ["", f"![{title} claim plot]({data_dir.name}/{name}.png)"]
        notes = data_dir / f"{name}{NOTES_SUFFIX}"
        if notes.is_file():
            lines += ["", f"### {title}: measurement notes", "", notes.read_text().strip()]
    return "\n".join(lines) + "\n"


def anchor(record: dict[str, Any]) -> str:
    """The section's anchor: the workload's name for its smoke record, NAME-SIZE for another size."""
    size = size_of_record(record)
    return record["name"] if size == "smoke" else f"{record['name']}-{size}"


def headline_summary(records: list[dict[str, Any]]) -> str:
    """'Headlines (each paper's first claim), by size: smoke, 19 papers: 8 hold, 7 inconclusive, 4 fail; ...'."""
    parts = []
    for size in reproduce.SIZES:
        heads = [next((o for o in r["outcomes"] if o["kind"] == "claim"), None)
                 for r in records if size_of_record(r) == size]
        if not heads:
            continue
        verdicts = [o["verdict"] if o else judging.NOT_JUDGED for o in heads]
        counts = [(sum(v == judging.HOLDS for v in verdicts), "hold"),
                  (sum(v in (judging.INCONCLUSIVE, judging.NOT_JUDGED) for v in verdicts), "inconclusive"),
                  (sum(v in (judging.FAILS, "error") for v in verdicts), "fail")]
        parts.append(f"{size}, {len(heads)} paper{'s' * (len(heads) != 1)}: "
                     + ", ".join(f"{n} {word}" for n, word in counts if n))
    return "Headlines (each paper's first claim), by size: " + ("; ".join(parts) or "none measured") + "."
