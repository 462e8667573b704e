"""``hecate``: one console script, one subcommand per job.

Every failure the user can cause (bad file, unknown node, impossible topology) ends as
one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import msgspec

from hecate.core import HecateError

EXIT_USAGE = 2


def _swarm_sim(args: argparse.Namespace) -> int:
    from hecate.sim import parse_topology, simulate

    topology = parse_topology(Path(args.topology).read_bytes())
    report = simulate(
        topology, kills=tuple(args.kill), pipelines=args.pipelines, planner=args.planner
    )
    sys.stdout.write(msgspec.json.format(msgspec.json.encode(report), indent=2).decode() + "\n")
    return 0


def _bench(args: argparse.Namespace) -> int:
    if args.suite == "llm":
        from hecate.bench.llm import run_llm_bench

        report: object = run_llm_bench(
            tokens=16 if args.quick else 48, rounds=1 if args.quick else 3
        )
    elif args.suite == "breaker":
        from hecate.bench.breaker import run_breaker_bench

        report = run_breaker_bench(trips=10 if args.quick else 50)
    elif args.suite == "herd":
        from hecate.bench.herd import run_herd_bench

        report = run_herd_bench(seeds=2 if args.quick else 5)
    elif args.suite == "bus":
        from hecate.bench.bus import run_bus_bench

        report = run_bus_bench(seconds=1.0 if args.quick else 5.0, executor=args.executor)
    else:
        from hecate.bench.core import run_core_bench

        report = run_core_bench(quick=args.quick)
    sys.stdout.write(msgspec.json.format(msgspec.json.encode(report), indent=2).decode() + "\n")
    if args.plot:
        from hecate.bench import plots

        draw = {"core": plots.core, "herd": plots.herd}.get(args.suite)
        if draw is None:
            raise HecateError(f"--plot: no picture for the {args.suite} suite yet")
        quick = " --quick" if args.quick else ""
        doc = msgspec.json.decode(msgspec.json.encode(report))
        draw(doc, Path(args.plot), f"hecate bench {args.suite}{quick} --plot {args.plot}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from hecate.core import PLANNERS

    parser = argparse.ArgumentParser(prog="hecate", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sim = sub.add_parser("swarm-sim", help="run the swarm lifecycle in memory, print JSON")
    sim.add_argument("--topology", required=True, help="topology JSON file")
    sim.add_argument(
        "--kill",
        action="append",
        default=[],
        metavar="NODE",
        help="kill this node (repeatable; one failover step each, in order)",
    )
    sim.add_argument(
        "--pipelines", type=_positive, default=2, help="replicas of the base model (default 2)"
    )
    sim.add_argument(
        "--planner",
        default="greedy",
        choices=sorted(PLANNERS),
        help="planner strategy (default greedy)",
    )
    sim.set_defaults(run=_swarm_sim)

    bench = sub.add_parser("bench", help="run a benchmark and print JSON figures")
    bench.add_argument(
        "suite",
        choices=["core", "bus", "herd", "breaker", "llm"],
        help="core: routing decision and planning; bus: routed vs raw NATS; "
        "herd: retry policies against a rate limit; breaker: OPEN propagation; "
        "llm: SmolLM2 generation, single process and across stages",
    )
    bench.add_argument("--quick", action="store_true", help="fewer iterations (smoke run)")
    bench.add_argument(
        "--executor", default="null", help="bus: the nodes' executor (null = no model compute)"
    )
    bench.add_argument(
        "--plot", default=None, metavar="PNG", help="core, herd: also draw the figures as a PNG"
    )
    bench.set_defaults(run=_bench)

    from hecate.cli import chaos, client, model, schema, services, up

    services.add_parsers(sub)
    up.add_parser(sub)
    client.add_parsers(sub)
    schema.add_parser(sub)
    model.add_parser(sub)
    chaos.add_parser(sub)
    return parser


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1, got {value}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # as typed, for provenance
    try:
        code: int = args.run(args)
    except HecateError as exc:
        print(f"hecate: error: {exc.message}", file=sys.stderr)
        return EXIT_USAGE
    except msgspec.DecodeError as exc:  # a configuration file that does not validate
        print(f"hecate: error: invalid configuration: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        print(
            f"hecate: error: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "),
            file=sys.stderr,
        )
        return EXIT_USAGE
    return code


if __name__ == "__main__":
    raise SystemExit(main())
