"""The weight types section: the engine's decode and prefill beside llama-bench's on
SmolLM2 re-quantised into each type, and on Gemma 3 270M (``hecate bench types``,
:mod:`hecate_dev.bench.types`)."""

# The report is prose for people: its dashes and multiplication signs are meant.
# ruff: noqa: RUF001

from __future__ import annotations

import statistics
from typing import Any

from hecate_dev.bench.interval import median_interval
from hecate_dev.bench.report.markdown import Doc, Met, Target, provenance, skipped, table
from hecate_dev.bench.report.markdown import verdict as word
from hecate_dev.bench.report.paired import judged

TITLE = "## Weight types: the engine beside llama-bench on each type people download\n\n"


def _rounds(values: list[float], fmt: str = "{:.1f}") -> str:
    return ", ".join(fmt.format(x) for x in values) or "-"


def _median(ratios: list[float]) -> str:
    """The median of the ratios and the interval that holds it (one round: the ratio)."""
    if not ratios:
        return "-"
    if len(ratios) == 1:
        return f"{ratios[0]:.3f} (one round)"
    i = median_interval(ratios)
    return f"{statistics.median(ratios):.3f} ({i.low:.3f}–{i.high:.3f} at {i.confidence:.0%})"


def _name(sp: dict[str, Any], gemma: bool) -> str:
    return f"Gemma 3 270M, {sp['type']}" if gemma else sp["type"]


def _mix(matrices: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in matrices.items()) or "-"


def _files(rows: list[tuple[dict[str, Any], bool]]) -> str:
    """Each file: its size, its matrices by type, and the share of the cores other
    processes took in each round kept."""
    out = []
    for sp, gemma in rows:
        shares = sp.get("others_cpu", [])
        out.append(
            [
                _name(sp, gemma),
                f"{sp['file_mib']:.0f}" if sp.get("file_mib") else "-",
                _mix(sp.get("matrices", {})),
                ", ".join(f"{x:.0%}" for x in shares) or "-",
                str(sp.get("rerun", 0)) if shares else "-",
            ]
        )
    return table(
        ["type", "file MiB", "matrices", "others' share of the cores by round", "rounds run again"],
        out,
    )


def _speeds(rows: list[tuple[dict[str, Any], bool]], what: str) -> str:
    """Tokens/s by round of each side and their ratios: ``what`` ``tg`` (decode) or
    ``pp`` (prefill)."""
    out = []
    for sp, gemma in rows:
        name = _name(sp, gemma)
        if sp.get("failed") or not sp.get(f"{what}_ratio"):
            out.append([name, f"failed: {sp['failed']}" if sp.get("failed") else "-", "", "", ""])
            continue
        differed = what == "tg" and not sp.get("same_tokens")
        out.append(
            [
                name,
                _rounds(sp[f"engine_{what}"]),
                _rounds(sp[f"llama_{what}"]),
                _rounds(sp[f"{what}_ratio"], "{:.3f}"),
                _median(sp[f"{what}_ratio"])
                + (" (tokens differed between rounds)" if differed else ""),
            ]
        )
    return table(
        [
            "type",
            "engine tokens/s",
            "llama-bench tokens/s",
            "engine ÷ llama-bench by round",
            "median (interval holding it)",
        ],
        out,
    )


def _f16(speeds: list[dict[str, Any]], at_least: float) -> Target | None:
    """F16's decode against its target: judged on its median's interval (undecided from
    one round, whose interval holds the median at no confidence)."""
    f16 = next((sp for sp in speeds if sp["type"] == "F16"), None)
    what = (
        f"decode (tg128) on F16 ≥ {at_least}× llama-bench's, same file and threads "
        "(SmolLM2 re-quantised)"
    )
    if f16 is None or f16.get("skipped"):
        return None
    if f16.get("failed") or not f16.get("tg_ratio"):
        return Target(what, f"failed: {f16.get('failed', 'no rounds')}", False)
    met: Met
    met, figure = judged(f16["tg_ratio"], at_least)
    if len(f16["tg_ratio"]) < 2:
        met = "undecided"
    if not f16.get("same_tokens"):
        met, figure = False, figure + "; the engine's tokens differed between rounds"
    return Target(what, figure, met)


def _quiet(quiet: float | None, retries: int | None) -> str:
    """How a round was kept from other load (results saved before it was watched: none)."""
    shared = (
        "The machine is shared, and other work may run beside a run: tokens/s vary between "
        "rounds and between types, and the ratio within a round is what counts."
    )
    if quiet is None:
        return f"{shared}\n\n"
    return (
        f"{shared} That ratio is fair only when both sides met the same load, and "
        "llama.cpp's threads wait for each other at every step: a process beside them that "
        "takes a core can slow llama-bench many times over, and the engine far less. So each "
        "try waits for the machine to fall quiet, the share of its cores other processes "
        "took is measured while each side runs (`/proc/stat` less the run's own processes), "
        f"and a round in which it passed {quiet:.0%} is run again, at most {retries} times; "
        "the share in each round kept is in the first table.\n\n"
    )


def section_types(env: Doc, img: str) -> tuple[str, list[Target]]:
    del img  # no picture
    r = env["report"]
    if (absent := skipped(env, TITLE)) is not None:
        return absent, []
    speeds: list[dict[str, Any]] = r["types"]
    gemma: dict[str, Any] | None = r.get("gemma")
    rows = [(sp, False) for sp in speeds]
    if gemma and not gemma.get("skipped"):
        rows.append((gemma, True))
    quiet, retries = r.get("quiet"), r.get("retries")
    target = _f16(speeds, r["f16_at_least"])
    threads, rounds = r["threads"], r["rounds"]
    notes = [f"* {_name(sp, g)} failed: {sp['failed']}" for sp, g in rows if sp.get("failed")]
    notes += [
        f"* {_name(sp, g)}: the engine's tokens differed between rounds"
        for sp, g in rows
        if not sp.get("failed") and sp.get("tg_ratio") and not sp.get("same_tokens")
    ]
    if quiet is not None:
        notes += [
            f"* {_name(sp, g)}: round {i + 1} kept after {retries + 1} tries with others on "
            f"{share:.0%} of the cores"
            for sp, g in rows
            for i, share in enumerate(sp.get("others_cpu", []))
            if share > quiet
        ]
    if gemma is None or gemma.get("skipped"):
        why = gemma.get("skipped") if gemma else "not run"
        notes.append(f"* Gemma 3 270M: not measured in this run: {why}.")
    else:
        notes.append(
            f"* Gemma 3 270M ran from `{gemma['file']}`: its own {gemma['type']} weights, not "
            "re-quantised."
        )
    verdict = (
        f"* {target.what}: {target.figure}: {word(target.met)}."
        if target is not None
        else "* F16 was not timed in this run."
    )
    text = (
        f"{TITLE}{provenance(env)}\n"
        f"The files are SmolLM2-135M's own {r['source_type']} file re-quantised by llama.cpp's "
        "quantiser into each type (`llama-quantize --allow-requantize SRC OUT TYPE`): the "
        "weights are SmolLM2's rounded twice, so the figures measure the kernels on each "
        "type, not the type's quality. A K-quant type is llama.cpp's mix: rows whose length "
        "is no multiple of 256 take another type, and the matrices column counts what each "
        "file holds. Beside them, Gemma 3 270M on its own file.\n\n"
        "For each file the engine holds the whole model in a process of its own, "
        f"{threads} threads: a 512-token prompt in the chunks a node runs (prefill), then "
        f"128 greedy decode steps one token at a time (decode). Beside it `llama-bench -p 512 "
        f"-n 128 -r 1 -t {threads} --repack 0` on the same file (the repacked kernels crash "
        f"this build here), in {rounds} interleaved round{'s' if rounds != 1 else ''}, the "
        "order swapped each round. A round's ratio is the engine's tokens/s over "
        "llama-bench's in that round, and every round's engine must give the same 128 "
        "tokens.\n\n"
        + _quiet(quiet, retries)
        + f"Target: F16's decode ≥ {r['f16_at_least']}× llama-bench's, judged on the interval "
        "that holds the median of its ratios (met or not only when the interval lies on one "
        "side). The other types' ratios are reported against no target: their median and "
        "the interval holding it.\n\n"
        f"The files and their rounds:\n\n{_files(rows)}\n\n"
        f"Decode, 128 tokens one at a time:\n\n{_speeds(rows, 'tg')}\n\n"
        f"Prefill, a 512-token prompt:\n\n{_speeds(rows, 'pp')}\n\n"
        + "\n".join([verdict, *notes])
        + "\n"
    )
    return text, [] if target is None else [target]
