"""``hecate schema``: the whole wire contract as an AsyncAPI 3 document."""

from __future__ import annotations

import argparse
from typing import Any


def _cmd_schema(args: argparse.Namespace) -> int:
    raise NotImplementedError


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("schema", help="print the AsyncAPI contract")
    p.set_defaults(run=_cmd_schema)
