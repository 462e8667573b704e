"""``hecate``: one console script, one subcommand per job.

Every failure the user can cause (bad file, unknown node, impossible topology) ends as
one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import sys

# Nothing heavy at module level: the console script imports this module before it can
# call main(), and a Ctrl-C during an import outside main() is Python's traceback. Every
# other import (half a second of them for `hecate up`) happens inside main(), typing's
# too (what mypy reads as typing.TYPE_CHECKING, without its 15 ms import).
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Iterable, Sequence
    from importlib.metadata import EntryPoint
    from typing import Any

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a Ctrl-C


def _swarm_sim(args: argparse.Namespace) -> int:
    from pathlib import Path

    import msgspec

    from hecate.core.chooser import Chooser
    from hecate.sim import parse_topology, simulate

    topology = parse_topology(Path(args.topology).read_bytes())
    report = simulate(
        topology,
        policy=Chooser,  # the router's own policy, so the simulation shows what runs
        kills=tuple(args.kill),
        pipelines=args.pipelines,
        planner=args.planner,
    )
    sys.stdout.write(msgspec.json.format(msgspec.json.encode(report), indent=2).decode() + "\n")
    return 0


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``hecate`` parser. Given the ``command`` about to run, and it is one a
    service or the dev tools add, only that one is added: a service process (``hecate
    router ...``) then imports what it runs and nothing of the other commands (about a
    third of a second of every process's start). Otherwise, every command."""
    import argparse
    from importlib.metadata import entry_points

    parser = argparse.ArgumentParser(prog="hecate", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    points = list(entry_points(group=PLUGIN_GROUP))
    if command is not None and (alone := [p for p in points if p.name == command]):
        _add_plugins(sub, alone)
        return parser

    from hecate.cli.flags import pipelines
    from hecate.core import PLANNERS

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
        "--pipelines",
        type=pipelines,
        default=2,
        help="replicas of the base model, or 'auto': as many as the nodes can form (default 2)",
    )
    sim.add_argument(
        "--planner",
        default="greedy",
        choices=sorted(PLANNERS),
        help="planner strategy (default greedy)",
    )
    sim.set_defaults(run=_swarm_sim)

    from hecate.cli import client, model, schema

    client.add_parsers(sub)
    schema.add_parser(sub)
    model.add_parser(sub)
    _add_plugins(sub, points)
    return parser


# The entry-point group through which the services add their subcommands (``hecate
# router``, ``hecate up``...: pyproject.toml) and another distribution adds its own: the
# dev tools (devtools/pyproject.toml) add ``hecate bench`` and ``hecate chaos``. The
# shared library names no service and nothing of the dev tools; the product's wheel
# ships without them.
PLUGIN_GROUP = "hecate.cli"


def _add_plugins(sub: Any, points: Iterable[EntryPoint] | None = None) -> None:
    """Each ``hecate.cli`` entry point names a function that adds its subcommand. One
    that fails to load leaves its command saying why, and every other command working:
    a broken dev-tools install must not take ``hecate up`` down with it."""
    import contextlib
    import functools
    from importlib.metadata import entry_points

    if points is None:
        points = entry_points(group=PLUGIN_GROUP)
    for point in sorted(points, key=lambda p: p.name):
        try:
            point.load()(sub)
        except Exception as exc:
            why = f"the {point.name!r} command ({point.value}) failed to load: {exc!r}"
            with contextlib.suppress(Exception):  # it may have added itself before failing
                broken = sub.add_parser(point.name, help=f"unavailable: {why}")
                broken.set_defaults(run=functools.partial(_unavailable, why))


def _unavailable(why: str, _args: argparse.Namespace) -> int:
    print(f"hecate: error: {why}", file=sys.stderr)
    return EXIT_USAGE


def positive_int(text: str) -> int:
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1, got {value}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:
        # A Ctrl-C before a command took charge of it (the imports, most likely): the
        # user asked to stop, and nothing had started that needs saying so.
        return EXIT_INTERRUPTED


def _main(argv: Sequence[str] | None) -> int:
    import msgspec

    from hecate.core import HecateError

    given = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(given[0] if given and not given[0].startswith("-") else None)
    args = parser.parse_args(given)
    args.argv = given  # as typed, for provenance
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
