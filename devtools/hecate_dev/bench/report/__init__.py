"""``hecate bench report``: docs/BENCHMARKS.md and its pictures, from saved results.

Each suite saves its result with ``--results DIR`` (``DIR/SUITE.json``: the figures,
the command, the machine, the date and the commit; see
:mod:`hecate_dev.bench.provenance`). :func:`render` turns those results into the document
and is pure (results in, markdown out: every number in the prose is read from them);
:func:`write` is the I/O around it: it reads the folder, draws every picture the
document links and writes the document. A suite with no saved result, or one that
skipped itself (the model not pulled), gets a section that says so.

The README's "Figures" table is the same headline: :func:`figures` renders it (pure)
and :func:`splice` puts it between the README's markers (``FIGURES_START`` /
``FIGURES_END``), leaving every other line of the README as it was.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from hecate.core import HecateError
from hecate_dev.bench.report import concurrency as users
from hecate_dev.bench.report.breaker import section_breaker
from hecate_dev.bench.report.bus import section_bus
from hecate_dev.bench.report.chaos import TIMELINES, section_chaos
from hecate_dev.bench.report.constrain import section_constrain
from hecate_dev.bench.report.core import section_core
from hecate_dev.bench.report.engine import section_engine, section_long
from hecate_dev.bench.report.gateway import section_gateway
from hecate_dev.bench.report.herd import section_herd
from hecate_dev.bench.report.llm import section_llm
from hecate_dev.bench.report.markdown import Doc, Target, provenance, reflow, table, verdict
from hecate_dev.bench.report.memory import section_memory
from hecate_dev.bench.report.prefix import section_prefix
from hecate_dev.bench.report.ring import section_ring
from hecate_dev.bench.report.scale import section_scale
from hecate_dev.bench.report.tokens import section_tokens
from hecate_dev.bench.report.types import section_types
from hecate_dev.bench.report.wan import section_wan
from hecate_dev.chaos import results as chaos_results

Section = Callable[[Doc, str], tuple[str, list[Target]]]

# In the document's order: suite, title, how to produce its result, its section.
SUITES: tuple[tuple[str, str, str, Section], ...] = (
    ("core", "Swarm core: routing decision and planning", "hecate bench core", section_core),
    (
        "bus",
        "The bus: routed requests against raw NATS, same run",
        "hecate bench bus",
        section_bus,
    ),
    (
        "herd",
        "A thundering herd against a rate limit (simulated)",
        "hecate bench herd",
        section_herd,
    ),
    (
        "breaker",
        "Shared circuit breakers: how fast an OPEN reaches every router",
        "hecate bench breaker",
        section_breaker,
    ),
    (
        "gateway",
        "The HTTP gateway: what it adds over a direct NATS request",
        "hecate bench gateway",
        section_gateway,
    ),
    (
        "llm",
        "SmolLM2-135M: one process and across the swarm",
        "hecate bench llm",
        section_llm,
    ),
    (
        "engine",
        "The engine in one process: 1 and 16 sessions, and what a node holds",
        "hecate bench engine",
        section_engine,
    ),
    (
        "long",
        "A long prompt through 3 stages: chunks run ahead, one a send, and numpy",
        "hecate bench long",
        section_long,
    ),
    (
        "tokens",
        "Where a token's time goes: 3 chained stages, 1 and 16 users",
        "hecate bench tokens",
        section_tokens,
    ),
    (
        "ring",
        "Three stages with no bus: what this machine's cores allow",
        "hecate bench ring",
        section_ring,
    ),
    (
        "constrain",
        "Answers held to a JSON Schema: what a token pays",
        "hecate bench constrain",
        section_constrain,
    ),
    (
        "prefix",
        "Chats that resend their prompt: prefix reuse on and off",
        "hecate bench prefix",
        section_prefix,
    ),
    (
        "wan",
        "Wide-area links: SmolLM2 with every node 0 to 40 ms away",
        "hecate bench wan",
        section_wan,
    ),
    (
        "scale",
        "A swarm of many nodes: what each node costs",
        "hecate bench scale",
        section_scale,
    ),
    (
        "memory",
        "Memory at real sizes: a node's share held once, and models pooled over nodes",
        "hecate bench memory --pooled",
        section_memory,
    ),
    (
        "types",
        "Weight types: the engine beside llama-bench on each type people download",
        "hecate bench types",
        section_types,
    ),
    (
        "chaos",
        "Chaos: parts of the swarm killed, frozen and cut off under load",
        "hecate chaos all",
        section_chaos,
    ),
)

INTRO = """# Benchmarks

Written by `make bench` from the results each suite saved in `{source}/` (`hecate bench
report` renders them); edit the renderer in `devtools/hecate_dev/bench/report/`, not this
file. Every section names the command, the machine, the date and the commit of its run
(`-dirty`: the working tree differed from that commit), and every picture names them in
its footer. Nothing here is asserted by timed tests. Each suite ran once: on a shared
virtual machine the same command minutes apart can differ noticeably, so ratios measured
within one run (routed ÷ raw, stages ÷ single process) say more than absolute figures
compared across sections.
"""


FIGURES_START = "<!-- bench:figures:start -->"
FIGURES_END = "<!-- bench:figures:end -->"


class MarkersError(HecateError):
    """The README has no (or broken) figures markers to write the table between."""

    code: ClassVar[str] = "bench_readme_markers"


def _sections(results: dict[str, Doc], img: str, source: str) -> tuple[list[str], list[Target]]:
    """Every suite's section and the targets it judged, in the document's order."""
    sections: list[str] = []
    targets: list[Target] = []
    for suite, title, command, section in SUITES:
        env = results.get(suite)
        if env is None:
            sections.append(
                f"## {title}\n\nNot run for this report: no saved result for `{suite}` "
                f"(`{command} --results {source}` saves one).\n"
            )
            continue
        if "failed" in env["report"]:
            sections.append(
                f"## {title}\n\n{provenance(env)}\nThe run failed before it produced "
                f"figures: `{env['report']['failed']}`.\n"
            )
            targets.append(Target(f"the {suite} suite ran to the end", "failed", False))
            continue
        text, found = section(env, img)
        sections.append(text)
        targets += found
    return sections, targets


def _headline(targets: list[Target]) -> str:
    return table(
        ["target", "this run", "verdict"],
        [[t.what, t.figure, verdict(t.met)] for t in targets],
    )


def render(results: dict[str, Doc], img: str = "img", source: str = "build/bench") -> str:
    """The whole document from ``results`` (suite name -> saved result); pictures are
    linked under ``img`` (relative to the document), ``source`` names the folder the
    results were read from."""
    sections, targets = _sections(results, img, source)
    headline = _headline(targets)
    summary = f"## Headline: every target against this run\n\n{headline}\n"
    if ("bench-bus-load.png", "bus") in pictures(results):
        summary += (
            "\n![throughput and p99 latency against offered load, raw NATS beside routed]"
            f"({img}/bench-bus-load.png)\n"
        )
    return reflow("\n".join([INTRO.format(source=source), summary, *sections]))


def _runs(results: dict[str, Doc]) -> str:
    """Machine, dates and commits of the runs, each named once, in the suites' order."""

    def once(values: list[str]) -> str:
        return ", ".join(dict.fromkeys(values))

    envs = [results[suite] for suite, *_ in SUITES if suite in results]
    machines = once([", ".join(env["machine"].split(", ")[:2]) for env in envs])
    dates = once([env["date"] for env in envs])
    commits = once([f"`{env['commit']}`" for env in envs])
    plural = "s" if len(dict.fromkeys(env["commit"] for env in envs)) > 1 else ""
    return f"{machines}, {dates}, commit{plural} {commits}"


def figures(results: dict[str, Doc], doc: str = "docs/BENCHMARKS.md") -> str:
    """The README's "Figures" block: every target of the report's headline against the
    runs in ``results``, with the machine, date and commit they came from; ``doc`` is
    the report's path as the README links it."""
    _, targets = _sections(results, "img", "build/bench")
    for suite, title, command, _ in SUITES:
        if suite not in results:
            targets.append(Target(title, f"not run (`{command}`)", None))
    if not results:
        return (
            f"No saved benchmark results: `make bench` writes them, and this table and "
            f"[the report]({doc}) from them.\n"
        )
    lead = reflow(
        f"From the latest `make bench` run ({_runs(results)}); "
        f"[the report]({doc}) has the command of every figure and how it was measured:"
    )
    return f"{lead}\n{_headline(targets)}\n"


def splice(text: str, block: str) -> str:
    """``text`` with everything between its figures markers replaced by ``block``;
    raises :class:`MarkersError` unless each marker is there once, start before end."""
    starts, ends = text.count(FIGURES_START), text.count(FIGURES_END)
    if starts != 1 or ends != 1:
        raise MarkersError(
            f"the README needs one {FIGURES_START} line and one {FIGURES_END} line "
            f"(found {starts} and {ends})"
        )
    head, rest = text.split(FIGURES_START)
    if FIGURES_END not in rest:
        raise MarkersError(f"{FIGURES_END} comes before {FIGURES_START} in the README")
    _, tail = rest.split(FIGURES_END)
    return f"{head}{FIGURES_START}\n{block.strip()}\n{FIGURES_END}{tail}"


ALL_PICTURES = (
    "bench-core.png",
    "bench-bus-load.png",
    "bench-herd.png",
    "bench-scale.png",
    users.PICTURE,
    *(f"chaos-{name}.png" for name in TIMELINES),
)


def pictures(results: dict[str, Doc]) -> list[tuple[str, str]]:
    """The pictures :func:`render` links for these results: (file name, suite)."""
    results = {k: v for k, v in results.items() if "failed" not in v["report"]}
    out = []
    if "core" in results:
        out.append(("bench-core.png", "core"))
    if "bus" in results and results["bus"]["report"].get("sweep"):
        out.append(("bench-bus-load.png", "bus"))
    if "herd" in results:
        out.append(("bench-herd.png", "herd"))
    if "scale" in results:
        out.append(("bench-scale.png", "scale"))
    if "llm" in results and users.has_picture(results["llm"]["report"]):
        out.append((users.PICTURE, "llm"))
    if "chaos" in results:
        for s in chaos_results.load(results["chaos"]["report"]).ran:
            if s.scenario in TIMELINES and s.timeline is not None:
                out.append((f"chaos-{s.scenario}.png", "chaos"))
    return out


def load(folder: Path) -> dict[str, Doc]:
    """Every saved result in ``folder`` (``SUITE.json``), by suite."""
    out: dict[str, Doc] = {}
    for suite, *_ in SUITES:
        path = folder / f"{suite}.json"
        if path.exists():
            out[suite] = json.loads(path.read_text())
    return out


def draw(name: str, env: Doc, path: Path) -> None:
    """Draw picture ``name`` from its suite's saved result, footed by that run."""
    from hecate_dev.bench import plots
    from hecate_dev.chaos.plot import record_of, timeline

    report: Any = env["report"]
    if name == "bench-core.png":
        plots.core(report, path, env["command"], env)
    elif name == "bench-bus-load.png":
        plots.bus_load(report, path, env["command"], env)
    elif name == "bench-herd.png":
        plots.herd(report, path, env["command"], env)
    elif name == "bench-scale.png":
        plots.scale(report, path, env["command"], env)
    elif name == users.PICTURE:
        plots.llm_concurrency(report, path, env["command"], env)
    else:
        scenario = name.removeprefix("chaos-").removesuffix(".png")
        result = next(s for s in chaos_results.load(report).ran if s.scenario == scenario)
        assert result.timeline is not None, "pictures() draws only saved timelines"
        # The figures in the title are the saved ones; the record only draws the points.
        timeline(record_of(result.timeline), result, path, env["command"], env)


def write(folder: Path, doc: Path, img: Path, readme: Path | None = None) -> list[Path]:
    """Render the results in ``folder`` into ``doc`` and its pictures into ``img``, and,
    given ``readme``, its figures table between the markers; returns every file written.
    The README is checked before anything is written, so broken markers change nothing."""
    readme_text = None if readme is None else splice(readme.read_text(), "")
    results = load(folder)
    written = []
    drawn = pictures(results)
    for name, suite in drawn:
        draw(name, results[suite], img / name)
        written.append(img / name)
    for name in set(ALL_PICTURES) - {name for name, _ in drawn}:
        (img / name).unlink(missing_ok=True)  # from an earlier run: not this report's
    link = Path(os.path.relpath(img.resolve(), doc.resolve().parent)).as_posix()
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(render(results, link, source=folder.as_posix()))
    written.append(doc)
    if readme is not None and readme_text is not None:
        report = Path(os.path.relpath(doc.resolve(), readme.resolve().parent)).as_posix()
        readme.write_text(splice(readme.read_text(), figures(results, report)))
        written.append(readme)
    return written
