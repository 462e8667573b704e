"""PNG pictures of benchmark reports (``hecate bench core|herd --plot FILE.png``).

Each names, in its footer, the machine, the date, the command and the commit."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path
from typing import Any


def footer(command: str) -> str:
    """Machine, date, command and commit: what a picture must name."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parent,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    machine = f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}"
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    return f"{machine} · {date} · `{command}` · commit {commit}"


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (files only, no screen)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def core(report: dict[str, Any], path: Path, command: str) -> None:
    """Routing decision cost (p50, p99) against the swarm's shape, beside the floor
    (allocating the Route alone) and the 5 µs target."""
    plt = pyplot()
    shapes = list(report["route_us"])
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    xs = range(len(shapes))
    for key, label, style in (
        ("route_us", "decision", "-o"),
        ("floor_us", "floor: building the Route", "--s"),
    ):
        for pct, alpha in (("p50", 1.0), ("p99", 0.5)):
            ax.plot(
                xs,
                [report[key][s][pct] for s in shapes],
                style,
                alpha=alpha,
                label=f"{label}, {pct}",
            )
    ax.axhline(5.0, color="#c44e52", linewidth=0.8, linestyle=":", label="target: 5 µs")
    ax.set_xticks(list(xs), [f"{s} (pipelines x stages)" for s in shapes], fontsize=8)
    ax.set_ylabel("µs per routing decision")
    ax.set_ylim(bottom=0)
    ax.set_title("Routing decision cost by swarm shape", fontsize=10)
    ax.legend(fontsize=7)
    fig.text(0.01, 0.01, footer(command), fontsize=7, color="#555555")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def herd(report: dict[str, Any], path: Path, command: str) -> None:
    """Attempts per success and time of the last success, per retry policy, against
    the issue's targets and the ideal finish."""
    plt = pyplot()
    names = list(report["policies"])
    attempts = [report["policies"][n]["attempts_per_success"] for n in names]
    last = [report["policies"][n]["last_success_s"] for n in names]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4), dpi=110)
    left.bar(names, attempts, color="#4c72b0")
    for target, label in ((1.95, "target hecate ≤ 1.95"), (1.05, "target hecate-queue ≤ 1.05")):
        left.axhline(target, color="#c44e52", linewidth=0.8, linestyle=":")
        left.text(len(names) - 0.5, target, label, fontsize=7, ha="right", va="bottom")
    left.set_ylabel("attempts per success")
    right.bar(names, last, color="#55a868")
    right.axhline(report["ideal_last_success_s"], color="black", linewidth=0.8, linestyle=":")
    right.text(0, report["ideal_last_success_s"], " ideal", fontsize=7, va="bottom")
    right.set_ylabel("last success (s)")
    for ax in (left, right):
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    fig.suptitle("1,000 callers against a 100 req/s limit, per retry policy", fontsize=10)
    fig.text(0.01, 0.01, footer(command), fontsize=7, color="#555555")
    fig.tight_layout(rect=(0, 0.04, 1, 0.95))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
