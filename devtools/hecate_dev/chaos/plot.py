"""The latency timeline of a chaos scenario, as a PNG: every request at the time it
started (seconds from the first fault) and its latency, coloured by outcome, with each
fault and heal marked and the recovery window shaded. The footer names the machine,
the date, the command and the commit, so the picture can be traced to its run.

A scenario's record can be saved with its figures (:func:`timeline_doc`, times in
seconds from the first fault) and the picture drawn later from that alone
(:func:`record_of`), which is how ``hecate bench report`` draws it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from hecate_dev.bench.plots import footer, pyplot
from hecate_dev.chaos.load import Record, Sample
from hecate_dev.chaos.results import ScenarioResult, Timeline

COLOURS = {"ok": "#4c72b0", "error": "#dd8452", "lost": "#c44e52", "wrong": "#8172b3"}


def timeline_doc(record: Record) -> dict[str, Any]:
    """Every request (start, latency, outcome) and every fault, as JSON-ready columns,
    times in seconds from the first fault."""
    t0 = (
        record.faults[0][0]
        if record.faults
        else min((s.started for s in record.samples), default=0)
    )
    return {
        "faults": [[round(when - t0, 4), what] for when, what in record.faults],
        "started_s": [round(s.started - t0, 4) for s in record.samples],
        "latency_ms": [round(s.latency_ms, 3) for s in record.samples],
        "status": [s.status for s in record.samples],
    }


def record_of(doc: Timeline | dict[str, Any]) -> Record:
    """The record :func:`timeline_doc` saved (enough of it to draw the timeline)."""
    t = doc if isinstance(doc, Timeline) else msgspec.convert(doc, Timeline)
    record = Record()
    record.faults = list(t.faults)
    record.samples = [
        Sample(started, started + latency / 1000, status)
        for started, latency, status in zip(t.started_s, t.latency_ms, t.status, strict=True)
    ]
    return record


def timeline(
    record: Record,
    result: ScenarioResult,
    path: Path,
    command: str,
    run: dict[str, Any] | None = None,
) -> None:
    """Draw the timeline; ``run``: the saved run's envelope, for the footer."""
    plt = pyplot()
    t0 = record.faults[0][0] if record.faults else record.samples[0].started
    fig, ax = plt.subplots(figsize=(10, 4.5), dpi=110)
    for status, colour in COLOURS.items():
        picked = [s for s in record.samples if s.status == status]
        if picked:
            ax.scatter(
                [s.started - t0 for s in picked],
                [max(s.latency_ms, 0.1) for s in picked],
                s=4,
                color=colour,
                label=f"{status} ({len(picked)})",
            )
    ax.set_yscale("log")
    ax.set_xlabel("request start, seconds from the first fault")
    ax.set_ylabel("latency (ms, log)")
    top = max((s.latency_ms for s in record.samples), default=1.0)
    for when, what in record.faults:
        ax.axvline(when - t0, color="black", linewidth=0.8, linestyle="--")
        ax.text(when - t0, top, f" {what}", rotation=90, va="top", fontsize=7)
    recover_s = result.recover_s
    if recover_s:
        ax.axvspan(0, recover_s, color="#c44e52", alpha=0.08, label="recovering")
        ax.axvline(recover_s, color="#c44e52", linewidth=0.8, linestyle=":")
        ax.text(
            recover_s, 0.02, f" recovered (+{recover_s} s)",
            rotation=90, va="bottom", fontsize=7, color="#c44e52",
            transform=ax.get_xaxis_transform(),
        )  # fmt: skip
    ax.set_title(
        f"hecate chaos {result.scenario}: sent {result.sent}, ok {result.ok}, "
        f"errors {result.errors}, lost {result.lost}, wrong {result.wrong}; "
        f"recovered in {recover_s} s",
        fontsize=9,
    )
    # At least a decade of latency, so that the log axis has a labelled tick.
    low = min((max(s.latency_ms, 0.1) for s in record.samples), default=0.1)
    ax.set_ylim(bottom=min(low, top / 10) * 0.8, top=top * 1.5)
    ax.legend(loc="best", fontsize=7, markerscale=3)
    fig.text(0.01, 0.01, footer(command, run), fontsize=7, color="#555555")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
