"""``hecate schema``: the whole wire contract as an AsyncAPI 3 document."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import msgspec


def render() -> bytes:
    """The AsyncAPI document, indented JSON with a final newline."""
    from hecate.wire.contract import asyncapi

    return msgspec.json.format(msgspec.json.encode(asyncapi()), indent=2) + b"\n"


def _cmd_schema(args: argparse.Namespace) -> int:
    text = render()
    if args.output:
        Path(args.output).write_bytes(text)
    else:
        sys.stdout.write(text.decode())
    return 0


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("schema", help="print the AsyncAPI contract")
    p.add_argument(
        "--output",
        "-o",
        metavar="FILE",
        help="write the document to FILE instead of standard output",
    )
    p.set_defaults(run=_cmd_schema)
