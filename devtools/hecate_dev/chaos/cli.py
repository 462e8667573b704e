"""``hecate chaos SCENARIO [--short] [--json] [--plot PNG] [--results DIR]``: kill parts
of a swarm under load.

Prints one line per scenario (one JSON object per line with ``--json``): requests sent,
answered correctly, answered with an explicit error, lost, wrong, answered by the
reserve model (degraded), the p99 latency while the fault lasted, the time to recover,
the evidence that the fault hit live traffic, and what the scenario expects. Exit
status 1 if any scenario fails its acceptance (see :mod:`hecate_dev.chaos.acceptance`), so
``make chaos`` fails loudly. ``--results DIR`` also saves every
scenario's figures, and every request of it (for the latency timelines), in
``DIR/chaos.json``, from which ``hecate bench report`` writes its chaos section.
Without ``--json``, each scenario's line is followed by its explanation: what the
figures mean and why it passed or failed. A scenario whose fault hit no live traffic
(its evidence its only shortfall) is run again, up to :data:`RUNS_TO_BITE` runs, and its
result says how many missed.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from hecate_dev.chaos.results import ScenarioResult, Skipped


def _pairs(values: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(values.items()))


def _line(r: ScenarioResult) -> str:
    codes = _pairs(r.error_codes)
    lost = _pairs(r.lost_codes)
    checks = _pairs(r.checks)
    notes = _pairs(r.notes)
    allowed = _pairs(r.expect.allowed_errors) or "none"
    failed = [k for k, ok in r.acceptance.items() if not ok]
    return (
        f"{r.scenario:<14} sent={r.sent:<6} ok={r.ok:<6} "
        f"errors={r.errors:<4} lost={r.lost:<3} wrong={r.wrong:<3} "
        f"degraded={r.degraded:<3} "
        f"p99_ms={r.p99_ms:<8} max_ms={r.max_ms:<8} "
        f"recover_s={r.recover_s}"
        + f"  evidence: {_pairs(r.evidence)}"
        + (f"  errors: {codes}" if codes else "")
        + (f"  lost: {lost}" if lost else "")
        + (f"  failed sends: {_pairs(r.send_failures)}" if r.send_failures else "")
        + (f"  checks: {checks}" if checks else "")
        + (f"  ({notes})" if notes else "")
        + f"  expects: {', '.join(r.expect.evidence)} ({r.expect.because});"
        + f" errors allowed: {allowed}"
        + (f"  FAILED: {', '.join(failed)}" if failed else "  accepted")
    )


# A fault that hit no live traffic proves nothing either way: such a run is run again, at
# most this many runs in all (the tests do the same); one that lost, erred or answered
# wrong never is.
RUNS_TO_BITE = 3


def run_until_it_bites(
    run: Callable[[], ScenarioResult], runs: int = RUNS_TO_BITE
) -> ScenarioResult:
    """``run()`` again while its only shortfall is its evidence, at most ``runs`` runs in
    all; the last result, counting the runs whose fault missed (``missed``)."""
    result = run()
    missed = 0
    while result.missed_its_traffic and missed + 1 < runs:
        missed += 1
        result = run()
    return msgspec.structs.replace(result, missed=missed)


def _cmd_chaos(args: argparse.Namespace) -> int:
    from hecate_dev.bench import provenance
    from hecate_dev.chaos.results import ChaosResult, TimingDoc
    from hecate_dev.chaos.scenarios import SCENARIOS, Timing, available, run_scenario

    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    failed = False
    saved: list[ScenarioResult | Skipped] = []
    command = provenance.command_line(args.argv)
    started = time.monotonic()
    timing = msgspec.convert(dataclasses.asdict(Timing.of(args.short)), TimingDoc)

    def save(result: ScenarioResult | Skipped) -> None:  # after every one: a partial run counts
        saved.append(result)
        if args.results is not None:
            report = ChaosResult(short=args.short, timing=timing, scenarios=saved)
            doc = provenance.envelope("chaos", command, msgspec.to_builtins(report))
            doc["elapsed_s"] = round(time.monotonic() - started, 1)
            provenance.save(Path(args.results), "chaos", doc)

    for name in names:
        if not available(name):
            note = "skipped: its model is not pulled (hecate model pull smollm2-135m)"
            print(
                json.dumps({"scenario": name, "skipped": note})
                if args.json
                else f"{name:<14} {note}"
            )
            save(Skipped(scenario=name, skipped=note.removeprefix("skipped: ")))
            continue
        plot = None
        if args.plot is not None:
            plot = Path(args.plot)
            if len(names) > 1:  # one picture per scenario
                plot = plot.with_name(f"{plot.stem}-{name}{plot.suffix or '.png'}")

        def once(name: str = name, plot: Path | None = plot) -> ScenarioResult:
            keep = args.results is not None
            return asyncio.run(run_scenario(name, short=args.short, plot=plot, keep_timeline=keep))

        result = run_until_it_bites(once)
        save(result)
        if args.json:
            print(json.dumps(result.figures()), flush=True)
        else:
            print(f"{_line(result)}\n{'':<14} {SCENARIOS[name].explain(result)}", flush=True)
        failed = failed or not result.accepted
    return 1 if failed else 0


def add_parser(sub: Any) -> None:
    from hecate_dev.chaos.scenarios import SCENARIOS

    p: argparse.ArgumentParser = sub.add_parser(
        "chaos", help="kill parts of a local swarm under load; count lost and wrong answers"
    )
    p.add_argument("scenario", choices=[*SCENARIOS, "all"])
    p.add_argument("--short", action="store_true", help="short timings (as the tests run)")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument(
        "--plot",
        default=None,
        metavar="PNG",
        help="draw the latency timeline around the fault (with 'all': one file per scenario)",
    )
    p.add_argument(
        "--results",
        default=None,
        metavar="DIR",
        help="also save the figures and every request's timing in DIR/chaos.json "
        "(what hecate bench report reads)",
    )
    p.set_defaults(run=_cmd_chaos)
