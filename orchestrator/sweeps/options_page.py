"""docs/sweep-options.md, generated from the option tables of `orchestrator.sweep`
(`SCHEDULER_OPTIONS`, `REFERENCE_OPTIONS`, `SEARCH_OPTIONS`): every scheduler and search with each
option, its default and meaning.

    python -m orchestrator.sweeps.options_page > docs/sweep-options.md
"""

from __future__ import annotations

from typing import Mapping

from orchestrator.sweep import (REFERENCE_OPTIONS, SCHEDULER_DOCS, SCHEDULER_OPTIONS, SEARCH_DOCS, SEARCH_OPTIONS,
                                Option)


def _table(table: Mapping[str, Option]) -> list[str]:
    if not table:
        return ["No options: `{}` only.", ""]
    lines = ["| Option | Default | Meaning |", "|---|---|---|"]
    for key, option in table.items():
        lines.append(f"| `{key}` | {option.describe_default()} | {option.doc} |")
    return lines + [""]


def markdown() -> str:
    """docs/sweep-options.md: every scheduler and search with each option, its default and meaning."""
    lines = [
        "# Sweep options",
        "",
        "<!-- Generated from orchestrator/sweep.py: python -m orchestrator.sweeps.options_page > "
        "docs/sweep-options.md -->",
        "",
        "A sweep's `scheduler_options` and `search_options` are checked by name against the tables below "
        "before anything starts (`ladder sweep FILE --check`, and every launch): a name not listed is refused "
        "with the closest listed one. An option not given takes its default.",
        "",
        "    sweep = Sweep(..., scheduler=\"asha\", scheduler_options={\"grace_period\": 0.2, \"reduction_factor\": 3})",
        "",
        "Training fractions (`grace_period`, `rungs`, ...) run from 0 to 1 of each trial's budget. The objective "
        "is `Sweep.objective` and the search's seed `Sweep.seed`; neither is an option.",
        "",
        "## Schedulers (`scheduler`, `scheduler_options`)",
        "",
    ]
    for name, table in SCHEDULER_OPTIONS.items():
        lines += [f"### scheduler='{name}'", "", SCHEDULER_DOCS[name], ""] + _table(table)
        if name == "collapse":
            lines += ["#### scheduler_options['reference']", "",
                      "The keys of the collapse scheduler's `reference` mapping.", ""] + _table(REFERENCE_OPTIONS)
    lines += ["## Searches (`search`, `search_options`)", ""]
    for name, table in SEARCH_OPTIONS.items():
        lines += [f"### search='{name}'", "", SEARCH_DOCS[name], ""] + _table(table)
    return "\n".join(lines).rstrip("\n") + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
