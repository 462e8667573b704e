"""What every section of the report is written with: tables, figures, verdicts, the
provenance line and :class:`Target`, a target and whether this run met it."""

# The report is prose for people: its dashes and multiplication signs are meant.
# ruff: noqa: RUF001

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

Doc = dict[str, Any]  # a saved result (see hecate_dev.bench.provenance.envelope)

# Met, not met, undecided (the figure's interval spans the target: hecate_dev.bench
# .interval), or None: not measured in this run.
Met = bool | Literal["undecided"] | None


@dataclass(frozen=True)
class Target:
    """One target, the figure this run measured against it, and whether it was met."""

    what: str
    figure: str
    met: Met


def num(x: float, digits: int = 1) -> str:
    """A figure with thousands separators: 24837.0 -> '24,837', 5.481 -> '5.48'."""
    if x >= 1000:
        return f"{x:,.0f}"
    return f"{x:,.{digits}f}"


def verdict(met: Met) -> str:
    if met == "undecided":
        return "undecided"
    return {True: "met", False: "**not met**", None: "not measured"}[met]


def span(values: Sequence[float], digits: int = 2) -> str:
    lo, hi = min(values), max(values)
    return (
        num(lo, digits)
        if num(lo, digits) == num(hi, digits)
        else f"{num(lo, digits)}–{num(hi, digits)}"
    )


def provenance(env: Doc) -> str:
    """The run a section's figures came from."""
    software = f", {env['software']}" if env.get("software") else ""
    elapsed = env.get("elapsed_s")
    took = ""
    if elapsed is not None:
        took = f" It took {elapsed:.0f} s." if elapsed >= 1 else " It took under a second."
    return (
        f"Command: `{env['command']}`.{took} Machine: {env['machine']}{software}. "
        f"Date: {env['date']}. Commit: `{env['commit']}`.\n"
    )


def skipped(env: Doc, title: str) -> str | None:
    """A suite's section when it did not run (its title, its run and why), else None."""
    why = env["report"].get("skipped")
    return None if why is None else f"{title}{provenance(env)}\nNot measured in this run: {why}.\n"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def shape(key: str) -> str:
    return key.replace("x", " × ")


def reflow(text: str, width: int = 88) -> str:
    """Refill every paragraph and list item of ``text`` to ``width`` columns, the way
    this repository's documents are written; headings, tables and pictures are left
    as they are. (Sections are written as templates whose filled-in figures would
    otherwise leave ragged lines.)"""
    blocks = []
    for block in text.split("\n\n"):
        lines = block.strip("\n").splitlines()
        if not lines:
            continue
        if lines[0].startswith(("#", "|", "!", "```")):
            blocks.append(block.strip("\n"))
            continue
        items: list[list[str]] = []
        for line in lines:
            if line.startswith("* ") or not items:
                items.append([line])
            else:
                items[-1].append(line)
        out = []
        for item in items:
            joined = " ".join(part.strip() for part in item)
            bullet = joined.startswith("* ")
            out.append(
                textwrap.fill(
                    joined,
                    width,
                    subsequent_indent="  " if bullet else "",
                    break_long_words=False,
                    break_on_hyphens=False,
                )
            )
        blocks.append("\n".join(out))
    return "\n\n".join(blocks) + "\n"
