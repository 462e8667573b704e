"""``hecate chaos SCENARIO [--short] [--json] [--plot PNG] [--results DIR]``: kill parts
of a swarm under load.

Prints one line per scenario (one JSON object per line with ``--json``): requests sent,
answered correctly, answered with an explicit error, lost, wrong, answered by the
reserve model (degraded), the p99 latency while the fault lasted, the time to recover,
the evidence that the fault hit live traffic, and what the scenario expects. Exit
status 1 if any scenario fails its acceptance (see :mod:`hecate.dev.chaos.acceptance`), so
``make chaos`` fails loudly. ``--results DIR`` also saves every
scenario's figures, and every request of it (for the latency timelines), in
``DIR/chaos.json``, from which ``hecate bench report`` writes its chaos section.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import time
from pathlib import Path
from typing import Any


def _pairs(values: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(values.items()))


def _line(result: dict[str, Any]) -> str:
    codes = _pairs(result["error_codes"])
    lost = _pairs(result["lost_codes"])
    checks = _pairs(result["checks"])
    notes = _pairs(result["notes"])
    expect = result["expect"]
    allowed = _pairs(expect["allowed_errors"]) or "none"
    failed = [k for k, ok in result["acceptance"].items() if not ok]
    return (
        f"{result['scenario']:<14} sent={result['sent']:<6} ok={result['ok']:<6} "
        f"errors={result['errors']:<4} lost={result['lost']:<3} wrong={result['wrong']:<3} "
        f"degraded={result['degraded']:<3} "
        f"p99_ms={result['p99_ms']:<8} max_ms={result['max_ms']:<8} "
        f"recover_s={result['recover_s']}"
        + f"  evidence: {_pairs(result['evidence'])}"
        + (f"  errors: {codes}" if codes else "")
        + (f"  lost: {lost}" if lost else "")
        + (f"  checks: {checks}" if checks else "")
        + (f"  ({notes})" if notes else "")
        + f"  expects: {', '.join(expect['evidence'])} ({expect['because']});"
        + f" errors allowed: {allowed}"
        + (f"  FAILED: {', '.join(failed)}" if failed else "  accepted")
    )


def _cmd_chaos(args: argparse.Namespace) -> int:
    from hecate.dev.bench import provenance
    from hecate.dev.chaos.scenarios import SCENARIOS, Timing, available, run

    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    failed = False
    saved: list[dict[str, Any]] = []
    command = provenance.command_line(args.argv)
    started = time.monotonic()

    def save(result: dict[str, Any]) -> None:  # after every scenario: a partial run counts
        saved.append(result)
        if args.results is not None:
            timing = dataclasses.asdict(Timing.of(args.short))
            report = {"short": args.short, "timing": timing, "scenarios": saved}
            doc = provenance.envelope("chaos", command, report)
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
            save({"scenario": name, "skipped": note.removeprefix("skipped: ")})
            continue
        plot = None
        if args.plot is not None:
            plot = Path(args.plot)
            if len(names) > 1:  # one picture per scenario
                plot = plot.with_name(f"{plot.stem}-{name}{plot.suffix or '.png'}")
        result = asyncio.run(
            run(name, short=args.short, plot=plot, keep_timeline=args.results is not None)
        )
        save(result)
        shown = {k: v for k, v in result.items() if k != "timeline"}
        print(json.dumps(shown) if args.json else _line(shown), flush=True)
        failed = failed or not all(result["acceptance"].values())
    return 1 if failed else 0


def add_parser(sub: Any) -> None:
    from hecate.dev.chaos.scenarios import SCENARIOS

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
