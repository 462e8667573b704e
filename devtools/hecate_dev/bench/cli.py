"""``hecate bench SUITE``: run a benchmark and print its figures as JSON (saved with
their provenance under ``--results``, drawn with ``--plot``), or write the report from
saved results. Registered by :mod:`hecate.cli.main`.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from hecate.cli.main import positive_int
from hecate.core import HecateError


def add_parser(sub: Any) -> None:
    bench = sub.add_parser(
        "bench", help="run a benchmark and print JSON figures, or write the report"
    )
    bench.add_argument(
        "suite",
        choices=[
            "core",
            "bus",
            "herd",
            "breaker",
            "gateway",
            "llm",
            "engine",
            "long",
            "tokens",
            "ring",
            "constrain",
            "prefix",
            "wan",
            "scale",
            "memory",
            "types",
            "report",
        ],
        help="core: routing decision and planning; bus: routed vs raw NATS, closed loop "
        "and offered load; herd: retry policies against a rate limit; breaker: OPEN "
        "propagation; gateway: what the HTTP gateway adds over a direct NATS request "
        "(toy model; SmolLM2 streaming when pulled); llm: SmolLM2 generation, single "
        "process and across stages; engine: the nodes' engine in one process at 1 and 16 "
        "sessions beside the numpy model and llama.cpp, and the memory a third of the "
        "model holds; long: a 3,989-token prompt's first token through 3 stages, the "
        "engine against the numpy model; tokens: where a token's time goes across 3 stages at 1 "
        "and 16 users, from every process's spans; ring: 3 stages in processes passing each "
        "step over pipes, no bus, against one process: what this machine's cores allow; "
        "constrain: an answer held to a JSON Schema, its mask per step and tokens/s; "
        "prefix: 8-turn chats of 16 users resending a 500-token system prompt, time to "
        "first token with prefix reuse on and off, and one user at a time (the serial arm); "
        "wan: SmolLM2 with every node behind a slow link, hop "
        "against chain dispatch and the router's preference for the nearer pipeline; "
        "scale: node hosts of 100 to 5,000 node identities, what forming, beating and "
        "following the swarm costs per node; "
        "memory: a range's resident memory and peak while building, over its share of the "
        "file, per third and whole of SmolLM2 and the 1B and 8B shapes, each in a memory "
        "cgroup, beside llama.cpp's; "
        "types: the engine's decode (tg128) and prefill (pp512) on SmolLM2 re-quantised into "
        "each weight type people download, and on Gemma 3 270M, beside llama-bench's on the "
        "same file and threads, interleaved rounds; "
        "report: write --doc and its pictures from the results saved in --results",
    )
    bench.add_argument("--quick", action="store_true", help="fewer iterations (smoke run)")
    bench.add_argument(
        "--sizes", default=None, metavar="N,N", help="scale: the swarm sizes to run (nodes)"
    )
    bench.add_argument(
        "--cutoff-racks",
        type=int,
        default=None,
        metavar="N",
        help="scale: racks of 100 nodes on hosts apart for the cut-off (0: none; default 10)",
    )
    bench.add_argument(
        "--speed",
        action="store_true",
        help="memory: also the engine's decode (tg128) and prefill (pp512) beside "
        "llama-bench's on each model, same threads, interleaved rounds",
    )
    bench.add_argument(
        "--pooled",
        action="store_true",
        help="memory: also the pooled run of the 1B shape (and the 8B without --quick): "
        "HECATE over 3 nodes and llama.cpp's RPC split over 3 servers, each process in a "
        "memory cgroup, at 1 and 4 users",
    )
    bench.add_argument(
        "--executor", default="null", help="bus: the nodes' executor (null = no model compute)"
    )
    bench.add_argument(
        "--plot",
        default=None,
        metavar="PNG",
        help="core, bus, herd: also draw the figures as a PNG",
    )
    bench.add_argument(
        "--results",
        default=None,
        metavar="DIR",
        help="save the figures with their machine, date, command and commit as DIR/SUITE.json; "
        "report: the folder to read",
    )
    bench.add_argument(
        "--if-present",
        action="store_true",
        help="llm, wan, types: if the model is not pulled, record the suite as skipped instead "
        "of pulling",
    )
    bench.add_argument(
        "--concurrency",
        type=_levels,
        default=None,
        metavar="N,N,...",
        help="llm: how many users generate at once, one level after another "
        "(default 1,2,4,8,16,32; --quick 1,2)",
    )
    bench.add_argument(
        "--only-concurrency",
        action="store_true",
        help="llm: run only the many-users part (the make run swarm at each --concurrency)",
    )
    bench.add_argument(
        "--rounds",
        type=positive_int,
        default=None,
        help="llm: interleaved rounds (default 8; --quick 1); wan: (default 3; --quick 1); "
        "prefix: (default 2; --quick 1); types: (default 3; --quick 1)",
    )
    bench.add_argument(
        "--tokens",
        type=positive_int,
        default=None,
        help="llm: tokens per generation (default 48; --quick 16); wan: (default 32; --quick 8)",
    )
    bench.add_argument(
        "--arms",
        type=_arms,
        default=None,
        metavar="ARM,ARM",
        help="prefix: the arms to run, of burst (16 users at once, 8 turns) and serial (one "
        "chat after another, each next turn sent at once); default both",
    )
    bench.add_argument(
        "--serial-chats",
        type=positive_int,
        default=None,
        metavar="N",
        help="prefix: the serial arm's chats, one after another (default 16; --quick 4)",
    )
    bench.add_argument(
        "--serial-turns",
        type=positive_int,
        default=None,
        metavar="N",
        help="prefix: the serial arm's turns per chat (default 4; --quick 3)",
    )
    bench.add_argument(
        "--doc",
        default="docs/BENCHMARKS.md",
        metavar="MD",
        help="report: the document to write (default docs/BENCHMARKS.md)",
    )
    bench.add_argument(
        "--img",
        default="docs/img",
        metavar="DIR",
        help="report: where the pictures go (default docs/img)",
    )
    bench.add_argument(
        "--readme",
        default=None,
        metavar="MD",
        help="report: also rewrite the figures table between this file's "
        "<!-- bench:figures:start --> and <!-- bench:figures:end --> lines",
    )
    bench.set_defaults(run=_bench)


def _bench(args: argparse.Namespace) -> int:
    if args.suite == "report":
        return _bench_report(args)
    from hecate_dev.bench import provenance

    command = provenance.command_line(args.argv)
    started = time.monotonic()
    try:
        report = _run_suite(args)
    except Exception as exc:
        if not args.results:
            raise
        # The report says the suite failed and why, instead of going without it.
        failed = {"failed": f"{type(exc).__name__}: {exc}"}
        saved = provenance.envelope(args.suite, command, failed)
        saved["elapsed_s"] = round(time.monotonic() - started, 1)
        provenance.save(Path(args.results), args.suite, saved)
        raise
    sys.stdout.write(msgspec.json.format(msgspec.json.encode(report), indent=2).decode() + "\n")
    doc = msgspec.json.decode(msgspec.json.encode(report))
    if args.results:
        saved = provenance.envelope(args.suite, command, doc)
        saved["elapsed_s"] = round(time.monotonic() - started, 1)
        provenance.save(Path(args.results), args.suite, saved)
    if args.plot:
        from hecate_dev.bench import plots

        draw = {"core": plots.core, "herd": plots.herd, "bus": plots.bus_load}.get(args.suite)
        if draw is None:
            raise HecateError(f"--plot: no picture for the {args.suite} suite yet")
        if args.suite == "bus" and not doc.get("sweep"):
            raise HecateError("--plot: the bus picture needs the offered-load sweep")
        draw(doc, Path(args.plot), command)
    # Figures that came with a failed check (the model suite's wrong text) are saved and
    # reported as failed, and fail the command.
    return 1 if isinstance(doc, dict) and doc.get("failed_checks") else 0


def _run_suite(args: argparse.Namespace) -> object:
    if args.suite == "llm":
        from hecate.llm.store import present
        from hecate_dev.bench.llm import MODEL, run_llm_bench
        from hecate_dev.bench.results_llm import LlmResult

        if args.if_present and not present(MODEL):
            return LlmResult(skipped=f"{MODEL} is not pulled (hecate model pull {MODEL})")
        from hecate_dev.bench.concurrency import DEFAULT_LEVELS

        return run_llm_bench(
            tokens=args.tokens or (16 if args.quick else 48),
            # Eight: the median's interval then leaves out the highest and lowest round
            # (the one-process baseline beside the swarm runs at one of two speeds).
            rounds=args.rounds or (1 if args.quick else 8),
            concurrency=args.concurrency or ((1, 2) if args.quick else DEFAULT_LEVELS),
            only_concurrency=args.only_concurrency,
        )
    if args.suite in ("engine", "long"):
        if (absent := _not_pulled(args)) is not None:
            return absent
        if args.suite == "long":
            from hecate_dev.bench.long_prefill import run as run_long

            return run_long(rounds=args.rounds or (1 if args.quick else 3))
        from hecate_dev.bench.engine import run_suite as run_engine

        return run_engine(
            rounds=args.rounds or (1 if args.quick else 11),
            steps=args.tokens or (8 if args.quick else 24),
        )
    if args.suite in ("tokens", "ring", "constrain"):
        from hecate_dev.bench.constrain import run as run_constrain
        from hecate_dev.bench.stage_ring import run as run_ring
        from hecate_dev.bench.token_time import run as run_tokens

        runs: dict[str, tuple[Callable[..., Any], int]] = {
            "tokens": (run_tokens, 3),
            "ring": (run_ring, 3),
            "constrain": (run_constrain, 5),
        }
        run, rounds = runs[args.suite]
        return _on_the_model(args, run, rounds)
    if args.suite == "prefix":
        from hecate.llm.store import present as have
        from hecate_dev.bench.prefix import ARMS, Shape
        from hecate_dev.bench.prefix import MODEL as PREFIX_MODEL
        from hecate_dev.bench.prefix import run as run_prefix

        if args.if_present and not have(PREFIX_MODEL):
            return {"skipped": f"{PREFIX_MODEL} is not pulled"}
        return run_prefix(
            users=4 if args.quick else 16,
            turns=3 if args.quick else 8,
            tokens=8 if args.quick else 12,
            rounds=args.rounds or (1 if args.quick else 2),
            shape=Shape(
                arms=args.arms or ARMS,
                chats=args.serial_chats or (4 if args.quick else 16),
                turns=args.serial_turns or (3 if args.quick else 4),
            ),
        )
    if args.suite == "wan":
        from hecate.llm.store import present as pulled
        from hecate_dev.bench.llm_single import MODEL as WAN_MODEL
        from hecate_dev.bench.results_wan import WanResult

        if args.if_present and not pulled(WAN_MODEL):
            return WanResult(skipped=f"{WAN_MODEL} is not pulled (hecate model pull {WAN_MODEL})")
        from hecate_dev.bench.wan import run_wan_bench

        return run_wan_bench(
            tokens=args.tokens or (8 if args.quick else 32),
            rounds=args.rounds or (1 if args.quick else 3),
            requests=4 if args.quick else 16,
            warmup=2 if args.quick else 4,
            preference_tokens=4 if args.quick else 8,
        )
    if args.suite == "memory":
        from hecate_dev.bench.memory import run as run_memory

        return run_memory(quick=args.quick, pooled_runs=args.pooled, speed=args.speed)
    if args.suite == "types":
        from hecate_dev.bench.types import run as run_types

        return run_types(quick=args.quick, rounds=args.rounds, if_present=args.if_present)
    if args.suite == "scale":
        from hecate_dev.bench.scale import run_scale_bench

        sizes = tuple(int(n) for n in args.sizes.split(",")) if args.sizes else None
        return run_scale_bench(quick=args.quick, sizes=sizes, cutoff_racks=args.cutoff_racks)
    if args.suite == "gateway":
        from hecate_dev.bench.gateway import QUICK, run_gateway_bench

        return run_gateway_bench(**(QUICK if args.quick else {}))
    if args.suite == "breaker":
        from hecate_dev.bench.breaker import run_breaker_bench

        return run_breaker_bench(trips=10 if args.quick else 50)
    if args.suite == "herd":
        from hecate_dev.bench.herd import run_herd_bench

        return run_herd_bench(seeds=2 if args.quick else 5)
    if args.suite == "bus":
        from hecate_dev.bench.bus import QUICK_SWEEP, SWEEP, run_bus_bench

        return run_bus_bench(
            seconds=1.0 if args.quick else 3.0,
            rounds=1 if args.quick else 3,
            executor=args.executor,
            sweep=QUICK_SWEEP if args.quick else SWEEP,
            sweep_seconds=1.0 if args.quick else 3.0,
        )
    from hecate_dev.bench.core import run_core_bench

    return run_core_bench(quick=args.quick)


def _bench_report(args: argparse.Namespace) -> int:
    from hecate_dev.bench.report import write

    if not args.results:
        raise HecateError("bench report: --results DIR is required (where the suites saved)")
    folder = Path(args.results)
    if not folder.is_dir():
        raise HecateError(f"bench report: no results folder {folder}")
    readme = Path(args.readme) if args.readme else None
    for path in write(folder, Path(args.doc), Path(args.img), readme):
        print(path)
    return 0


def _levels(text: str) -> tuple[int, ...]:
    from hecate_dev.bench.concurrency import parse_levels

    try:
        return parse_levels(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _arms(text: str) -> tuple[str, ...]:
    """``burst,serial``: the prefix suite's arms, once each (on each swarm the burst arm
    runs first, whatever the order named)."""
    from hecate_dev.bench.prefix import ARMS

    arms = tuple(dict.fromkeys(a.strip() for a in text.split(",") if a.strip()))
    if not arms or any(a not in ARMS for a in arms):
        raise argparse.ArgumentTypeError(f"arms are {', '.join(ARMS)}, comma-separated: {text!r}")
    return arms


def _on_the_model(args: Any, run: Callable[..., Any], rounds: int) -> Any:
    """A suite on SmolLM2 (``tokens`` and ``rounds`` from the flags, fewer with
    ``--quick``), or its skip when ``--if-present`` and the model is not pulled."""
    if (absent := _not_pulled(args)) is not None:
        return absent
    return run(
        tokens=args.tokens or (16 if args.quick else 48),
        rounds=args.rounds or (1 if args.quick else rounds),
    )


def _not_pulled(args: Any) -> dict[str, str] | None:
    """The skip a suite on SmolLM2 saves with ``--if-present`` when the model is not
    pulled; None when it is (or when the suite should pull it)."""
    from hecate.llm.store import present
    from hecate_dev.bench.llm_single import MODEL

    if args.if_present and not present(MODEL):
        return {"skipped": f"{MODEL} is not pulled (hecate model pull {MODEL})"}
    return None
