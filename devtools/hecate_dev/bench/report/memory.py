"""The memory section: each range's resident memory and peak over its share of the file,
llama.cpp's beside (``hecate bench memory``, :mod:`hecate_dev.bench.memory`), and the
pooled runs: HECATE's nodes and llama.cpp's RPC servers each in a memory cgroup
(:mod:`hecate_dev.bench.pooled_swarm`)."""

# ruff: noqa: RUF001

from __future__ import annotations

import statistics
from typing import Any

from hecate_dev.bench.report.markdown import Doc, Target, provenance, skipped, table
from hecate_dev.bench.report.paired import judged


def _cell(value: float | None, fmt: str = "{:.0f}") -> str:
    return "-" if value is None else fmt.format(value)


def _ranges(models: list[dict[str, Any]]) -> str:
    rows = []
    for m in models:
        for r in m["ranges"]:
            rows.append(
                [
                    m["model"],
                    f"[{r['start']}, {r['end']})",
                    _cell(r["share_mib"]),
                    f"{_cell(r.get('resident_mib'))} ({_cell(r.get('resident_x'), '{:.2f}')}×)",
                    f"{_cell(r.get('peak_mib'))} ({_cell(r.get('peak_x'), '{:.2f}')}×)",
                    _cell(r["target_mib"]),
                    _cell(r.get("load_s"), "{:.1f}"),
                ]
            )
        cpp = m["llama_cpp"]
        rows.append(
            [
                m["model"],
                "llama.cpp, whole file",
                _cell(m["file_mib"]),
                f"{_cell(cpp.get('resident_mib'))} ({_cell(cpp.get('resident_x'), '{:.2f}')}×)",
                _cell(cpp.get("peak_mib")),
                "",
                _cell(cpp.get("load_s"), "{:.1f}"),
            ]
        )
    return table(
        ["model", "range", "share MiB", "resident MiB", "peak MiB", "target MiB", "build s"],
        rows,
    )


def _ratios(per_round: list[float]) -> str:
    return (
        f"{statistics.median(per_round):.2f}× (rounds {', '.join(f'{x:.2f}' for x in per_round)})"
    )


def _rates(arm: dict[str, Any]) -> str:
    """Tokens/s by users: each round's, the median first."""
    per_round = arm.get("per_round", {})
    return (
        "; ".join(
            f"{k}: {statistics.median(v):.2f} ({', '.join(f'{x:.2f}' for x in v)})"
            for k, v in per_round.items()
            if v
        )
        or "-"
    )


def _pooled(runs: list[dict[str, Any]]) -> str:
    rows = []
    for run in runs:
        ours, theirs = run["hecate"], run["llama_cpp"]
        held = "; ".join(
            f"{u['layers'][0]}–{u['layers'][1]}: {u['cgroup_max_mib']:.0f}"
            if u.get("layers")
            else f"none: {u['cgroup_max_mib']:.0f}"
            for u in ours.get("node_use", [])
        )
        rows.append(
            [
                f"{run['model']}, HECATE",
                f"3 × {ours['limit_mib']:.0f}",
                held + (" (an OOM kill)" if any(u["oom_killed"] for u in ours["node_use"]) else ""),
                _cell(ours.get("load_s"), "{:.1f}"),
                _rates(ours),
            ]
        )
        rows.append(
            [
                f"{run['model']}, llama.cpp RPC",
                f"3 × {theirs['limit_mib']:.0f}",
                "; ".join(f"{u['cgroup_max_mib']:.0f}" for u in theirs.get("rpc", [])),
                _cell(theirs.get("load_s"), "{:.1f}"),
                _rates(theirs),
            ]
        )
    return table(
        [
            "run",
            "limits MiB",
            "each process's group peak MiB",
            "load s",
            "tokens/s by users: median (rounds)",
        ],
        rows,
    )


def _speed(speeds: list[dict[str, Any]]) -> tuple[str, list[Target]]:
    """The engine beside llama-bench: a row per model and side, and a target each."""
    rows, targets = [], []
    for sp in speeds:
        if sp.get("skipped") or sp.get("failed"):
            rows.append([sp["model"], sp.get("skipped") or sp["failed"], "", "", ""])
            continue
        for kind, label in (("tg", "decode, tg128"), ("pp", "prefill, pp512")):
            ratios = sp[f"{kind}_ratio"]
            rows.append(
                [
                    sp["model"],
                    label,
                    ", ".join(f"{x:.1f}" for x in sp[f"engine_{kind}"]),
                    ", ".join(f"{x:.1f}" for x in sp[f"llama_{kind}"]),
                    ", ".join(f"{x:.3f}" for x in ratios),
                ]
            )
            met, figure = judged(ratios, 1.0)
            if kind == "tg" and not sp.get("same_tokens"):
                met, figure = False, figure + "; the engine's tokens differed between rounds"
            targets.append(
                Target(f"{label} at {sp['model']} ≥ 1.0× llama-bench, same threads", figure, met)
            )
    body = table(
        ["model", "what", "engine tokens/s", "llama-bench tokens/s", "engine ÷ llama-bench"],
        rows,
    )
    return body, targets


def section_memory(env: Doc, img: str) -> tuple[str, list[Target]]:
    del img  # no picture
    r = env["report"]
    title = "## Memory at real sizes: a node's share held once, and models pooled over nodes\n\n"
    if (absent := skipped(env, title)) is not None:
        return absent, []
    models, runs = r["models"], r.get("pooled", [])
    targets = [
        Target(f"memory, {m['model']}: every range {r['target']}", m["verdict"], m["met"])
        for m in models
    ]
    for run in runs:
        ours = run["hecate"]
        targets.append(
            Target(
                f"pooled {run['model']}: 3 nodes answer one process's tokens, no OOM kill, "
                "≥ 1.0× llama.cpp's RPC split at 1 user and ≥ 1.5× at 4, same limits",
                "; ".join(f"{_ratios(v)} at {k}" for k, v in run["ratio"].items())
                + f"; answers equal: {ours.get('answers_equal')}",
                run["met"],
            )
        )
    speed_table, speed_targets = _speed(r.get("speed", []))
    targets += speed_targets
    refusals = [
        f"* {run['model']}, told to hold every layer in {run['hecate']['limit_mib']:.0f} MiB: "
        f"“{run['hecate']['refused']}”"
        for run in runs
        if run["hecate"].get("refused")
    ]
    verdicts = "\n".join(f"* {run['model']}: {run['verdict']}" for run in runs)
    text = (
        f"{title}{provenance(env)}\n"
        "Each range of blocks is built by the nodes' engine in a fresh process of its own, "
        f"{r['threads']} threads, {r['slots']} session slots, in a memory cgroup that "
        "limits nothing but counts; its resident memory once built and its peak while "
        "building are the process's own (`VmRSS`, `VmHWM`) above what it held before. "
        "The share is the range's tensors' bytes in the file. llama.cpp's `llama-server` "
        "holds the whole file beside it (`--load-mode none`, context 4,096). The target "
        f"per range: {r['target']}.\n\n"
        f"{_ranges(models)}\n\n"
        + "\n".join(f"* {m['model']}: {m['verdict']}" for m in models)
        + "\n\n"
        + (
            "The pooled runs: HECATE's nodes (one engine thread each, a KV budget of "
            "4,096 positions a layer) and llama.cpp's `ggml-rpc-server`s (one thread each, "
            "behind `llama-server --rpc -np 4 -c 4096`), each process in a memory cgroup of "
            "the limit shown, both standing at once and timed in alternating rounds (the "
            "order swapped each round; a ratio within a round); greedy generations of "
            f"{', '.join(str(run['hecate']['max_tokens']) for run in runs)} tokens, users at "
            "once. HECATE's first node is told to hold every layer and must refuse, naming "
            "the bytes, and join again with what fits; every HECATE answer is checked "
            "against one unconstrained process's.\n\n"
            f"{_pooled(runs)}\n\n" + "\n".join(refusals) + "\n\n" + verdicts + "\n"
            if runs
            else "The pooled runs were not asked for (`--pooled`).\n"
        )
        + (
            "\nSpeed at each size: the engine holding the whole model in a process of its "
            "own, a 512-token prompt in the chunks a node runs then 128 greedy decode steps, "
            "beside `llama-bench -p 512 -n 128 -r 1 --repack 0` on the same file and "
            "threads (the repacked kernels crash this build here; where they run, llama.cpp "
            "is faster than this baseline), interleaved, the order "
            "swapped each round; a ratio within a round.\n\n"
            f"{speed_table}\n"
            if r.get("speed")
            else ""
        )
    )
    return text, targets
