"""PNG pictures of benchmark reports (``hecate bench core|bus|herd --plot FILE.png``, and
``hecate bench report``, which draws every picture from saved results).

Each names, in its footer, the machine, the date, the command and the commit: of the
run the figures came from (``run``, a saved result's envelope), else of this process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hecate_dev.bench.provenance import footer

__all__ = ["bus_load", "core", "footer", "herd", "llm_concurrency", "pyplot"]


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (files only, no screen)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def core(
    report: dict[str, Any], path: Path, command: str, run: dict[str, Any] | None = None
) -> None:
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
    _save(plt, fig, path, footer(command, run))


def herd(
    report: dict[str, Any], path: Path, command: str, run: dict[str, Any] | None = None
) -> None:
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
    _save(plt, fig, path, footer(command, run), top=0.95)


SWEEP_LABELS = {
    "raw": ("raw NATS (echo)", "#4c72b0", "o"),
    "routed_1": ("routed, 1 stage", "#dd8452", "s"),
    "routed_3": ("routed, 3 stages (hop)", "#8172b2", "v"),
    "routed_3_chain": ("routed, 3 stages (chain)", "#55a868", "^"),
    "routed_1_secure": ("routed, 1 stage, locked-down bus", "#937860", "D"),
}


def bus_load(
    report: dict[str, Any], path: Path, command: str, run: dict[str, Any] | None = None
) -> None:
    """The open-loop sweep: achieved throughput and p99 latency against the offered
    rate, raw NATS beside the routed configurations. A p99 at the timeout (requests
    failed or timed out) is drawn hollow: the real figure is at least that. Each
    configuration's capacity (the highest rate served in full) is ringed."""
    plt = pyplot()
    sweep: dict[str, list[dict[str, Any]]] = report["sweep"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=110)
    top = 0.0
    for label, points in sweep.items():
        name, colour, marker = SWEEP_LABELS.get(label, (label, None, "o"))
        offered = [p["offered_rps"] for p in points]
        top = max(top, *offered)
        left.plot(offered, [p["achieved_rps"] for p in points], f"-{marker}", color=colour)
        left.plot([], [], f"-{marker}", color=colour, label=name)
        best = (report.get("capacity") or {}).get(label, {}).get("rps")
        at = [p for p in points if p["offered_rps"] == best]
        if at:
            left.scatter(
                [best], [at[0]["achieved_rps"]], s=140, facecolors="none", edgecolors="black"
            )
        right.plot(offered, [p["p99_us"] / 1000 for p in points], f"-{marker}", color=colour)
        capped = [p for p in points if p["p99_capped"]]
        if capped:
            right.scatter(
                [p["offered_rps"] for p in capped],
                [p["p99_us"] / 1000 for p in capped],
                s=80,
                facecolors="none",
                edgecolors="#c44e52",
            )
        right.plot([], [], f"-{marker}", color=colour, label=name)
    low = min(p["offered_rps"] for points in sweep.values() for p in points)
    left.plot(
        [low, top], [low, top], ":", color="#888888", linewidth=0.8, label="achieved = offered"
    )
    left.set_xlabel("offered load (requests/s, log)")
    left.set_ylabel("achieved throughput (correct replies/s, log)")
    left.set_title("Throughput vs offered load", fontsize=10)
    bound = (report.get("meta") or {}).get("served_in_full", {}).get("p99_bound_ms")
    if bound:
        right.axhline(bound, color="#c44e52", linewidth=0.8, linestyle=":")
        right.text(low, bound, f" served in full: p99 ≤ {bound:g} ms", fontsize=7, va="bottom")
    right.set_yscale("log")
    right.set_xlabel("offered load (requests/s, log)")
    right.set_ylabel("p99 latency from scheduled send (ms, log)")
    right.set_title("p99 latency vs offered load (hollow: at the timeout)", fontsize=10)
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    plain = FuncFormatter(lambda value, _pos: f"{value:,.0f}")
    left.set_yscale("log")
    for ax in (left, right):
        ax.set_xscale("log")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3, which="both")
    for axis in (left.xaxis, left.yaxis, right.xaxis, right.yaxis):
        axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(plain)
        axis.set_minor_formatter(NullFormatter())
    _save(plt, fig, path, footer(command, run))


def _one_process_marks(report: dict[str, Any], users: list[int], left: Any, right: Any) -> None:
    """At the level the engine's targets are about: the one-process baseline (its median
    round) and the swarm's targets against it, and the TTFT bound."""
    from hecate_dev.bench.concurrency import (
        BASELINE_SESSIONS,
        TARGET_AGGREGATE,
        TARGET_OVER_ONE,
        TARGET_TTFT_MS,
    )

    rounds = report["concurrency"].get("rounds") or []
    ones = sorted(
        float(r["one_process"]["aggregate_tokens_per_s"]) for r in rounds if r.get("one_process")
    )
    if BASELINE_SESSIONS not in users or not ones:
        return
    at, one = BASELINE_SESSIONS, ones[len(ones) // 2]
    left.scatter([at], [one], marker="*", s=90, color="#55a868", zorder=3)
    left.text(at, one, f" one process, {at} sessions", fontsize=7, va="bottom", ha="right")
    floor = max(TARGET_AGGREGATE, TARGET_OVER_ONE * one)
    left.scatter([at], [floor], marker="_", s=400, color="#c44e52")
    left.text(
        at,
        floor,
        f" target ≥ {TARGET_AGGREGATE:g} and ≥ {TARGET_OVER_ONE:g}x it",
        fontsize=7,
        va="top",
    )
    right.scatter([at], [TARGET_TTFT_MS / 1000], marker="_", s=400, color="#c44e52")
    right.text(at, TARGET_TTFT_MS / 1000, f" target p99 ≤ {TARGET_TTFT_MS / 1000:g} s", fontsize=7)


def llm_concurrency(
    report: dict[str, Any], path: Path, command: str, run: dict[str, Any] | None = None
) -> None:
    """Many users at once on the SmolLM2 swarm (``hecate bench llm``): aggregate and
    per-user tokens/s, and TTFT p50 and p99, against the number of users, each target
    marked where it applies. A level where not every request was answered is labelled
    with answered/sent in red."""
    from hecate_dev.bench.concurrency import TARGET_AT, TARGET_SPEEDUP, TARGET_TTFT

    plt = pyplot()
    levels: dict[str, dict[str, Any]] = report["concurrency"]["levels"]
    users = [int(k) for k in levels]
    figures = list(levels.values())
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4), dpi=110)
    for key, label, style in (
        ("aggregate_tokens_per_s", "aggregate", "-o"),
        ("per_user_tokens_per_s", "per user (median)", "--s"),
    ):
        left.plot(users, [f[key] for f in figures], style, label=label)
    for key, label, style in (("ttft_p50_ms", "p50", "-o"), ("ttft_p99_ms", "p99", "--v")):
        points = [(n, f[key] / 1000) for n, f in zip(users, figures, strict=True) if f[key]]
        right.plot([n for n, _ in points], [y for _, y in points], style, label=label)
    one = levels.get("1")
    if one is not None and TARGET_AT in users:
        target = TARGET_SPEEDUP * one["aggregate_tokens_per_s"]
        left.scatter([TARGET_AT], [target], marker="_", s=400, color="#c44e52")
        left.text(TARGET_AT, target, f" target ≥ {TARGET_SPEEDUP:g}x 1 user", fontsize=7)
        if one["ttft_p50_ms"]:
            target = TARGET_TTFT * one["ttft_p50_ms"] / 1000
            right.scatter([TARGET_AT], [target], marker="_", s=400, color="#c44e52")
            right.text(TARGET_AT, target, f" target p99 ≤ {TARGET_TTFT:g}x 1 user", fontsize=7)
    _one_process_marks(report, users, left, right)
    for n, f in zip(users, figures, strict=True):
        if f["answered"] < f["sent"]:
            left.annotate(
                f"{f['answered']}/{f['sent']}",
                (n, f["aggregate_tokens_per_s"]),
                textcoords="offset points",
                xytext=(0, 8),
                fontsize=7,
                color="#c44e52",
                ha="center",
            )
    left.set_ylabel("tokens/s")
    left.set_title("Throughput (red: answered/sent where not all were)", fontsize=10)
    right.set_ylabel("time to first token (s)")
    right.set_title("Time to first token", fontsize=10)
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(users, [str(n) for n in users])
        ax.set_xlabel("users generating at once")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    _save(plt, fig, path, footer(command, run))


def scale(
    report: dict[str, Any], path: Path, command: str, run: dict[str, Any] | None = None
) -> None:
    """Per size (one telemetry replica, one router): the bytes a router receives a
    second following the swarm and the telemetry CPU a beat (left); the seconds until
    every node was alive, and the routing decision's p99 beside the 5 µs target
    (right)."""
    plt = pyplot()
    levels = [
        lv
        for lv in report["levels"]
        if lv.get("routers", 1) == 1 and lv.get("telemetry_shards", 1) == 1
    ]
    nodes = [lv["nodes"] for lv in levels]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.8), dpi=110)
    _two_scales(
        left,
        "Following the swarm",
        nodes,
        ([lv["follow_bytes_per_s"] / 1e6 for lv in levels], "a router follows (MB/s)"),
        "MB a second, one router",
        ([lv["telemetry_cpu_us_per_beat"] for lv in levels], "telemetry µs a beat"),
        "telemetry CPU per beat (µs)",
    )
    decision = _two_scales(
        right,
        "Forming, and deciding",
        nodes,
        ([lv["all_alive_s"] for lv in levels], "all alive after (s)"),
        "seconds",
        ([lv["route_idle_us"]["p99"] for lv in levels], "decision p99 (µs)"),
        "routing decision p99 (µs)",
        color="#55a868",
    )
    decision.axhline(5.0, color="#c44e52", linewidth=0.8, linestyle=":", label="target: 5 µs")
    decision.legend(loc="lower right", fontsize=7)
    _save(plt, fig, path, footer(command, run))


def _save(plt: Any, fig: Any, path: Path, foot: str, *, top: float = 1.0) -> None:
    """Foot ``fig`` with the run it shows, lay it out above that (and below ``top``),
    write it to ``path`` and let it go."""
    fig.text(0.01, 0.01, foot, fontsize=7, color="#555555")
    fig.tight_layout(rect=(0, 0.04, 1, top))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def _two_scales(
    ax: Any,
    title: str,
    xs: list[int],
    first: tuple[list[float], str],
    first_unit: str,
    second: tuple[list[float], str],
    second_unit: str,
    *,
    color: str = "#dd8452",
) -> Any:
    """Two series against ``xs`` on one panel, each on its own axis from zero; the
    second's axis, for what else goes on it."""
    ax.plot(xs, first[0], "-o", label=first[1])
    ax.set_xlabel("nodes")
    ax.set_ylabel(first_unit)
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left", fontsize=7)
    ax.set_title(title, fontsize=10)
    other = ax.twinx()
    other.plot(xs, second[0], "--s", color=color, label=second[1])
    other.set_ylabel(second_unit)
    other.set_ylim(bottom=0)
    other.legend(loc="lower right", fontsize=7)
    return other
