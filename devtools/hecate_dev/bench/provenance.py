"""Where a figure came from: the machine, the date, the commit and the command.

Every suite's saved result carries these (:func:`envelope`), every picture names them in
its footer (:func:`footer`), and the report repeats them per section, so a number can
always be traced to the run that produced it.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import subprocess
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(
            ["git", *args], capture_output=True, text=True, check=True, cwd=_HERE
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def commit() -> str:
    """``git rev-parse --short HEAD``, with ``-dirty`` when tracked files differ from it."""
    head = _git("rev-parse", "--short", "HEAD")
    if head is None:
        return "unknown"
    changes = _git("status", "--porcelain", "--untracked-files=no")
    return f"{head}-dirty" if changes else head


def cpu_model() -> str:
    """The processor's name from /proc/cpuinfo (Linux), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or "unknown processor"


def vector_units() -> str:
    """The widest vector instructions the processor offers (what the engine's and
    llama.cpp's kernels run on: the same model name covers AVX2-only and AVX-512
    generations), from /proc/cpuinfo's flags; empty where unknown."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    flags = next(
        (ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), []
    )
    if "avx512f" in flags:
        return "AVX-512 with VNNI" if "avx512_vnni" in flags else "AVX-512"
    return "AVX2" if "avx2" in flags else ""


def machine() -> str:
    """One line: architecture, processor and its vector units, cores, OS and Python."""
    units = vector_units()
    return (
        f"{platform.machine()} {cpu_model()}{f' ({units})' if units else ''}, "
        f"{os.cpu_count()} cores, "
        f"{platform.system()} {platform.release()}, Python {platform.python_version()}"
    )


def software() -> str:
    """The versions a bus figure depends on: nats-server and nats-py."""
    from importlib.metadata import PackageNotFoundError, version

    from hecate.bus.server import server_binary

    try:
        server = subprocess.run(
            [server_binary(), "--version"], capture_output=True, text=True, check=True
        ).stdout.split()[-1]
    except Exception:  # no binary, or an unexpected answer: say so, do not fail the run
        server = "unknown"
    try:
        client = version("nats-py")
    except PackageNotFoundError:
        client = "unknown"
    return f"nats-server {server.lstrip('v')}, nats-py {client}"


def today() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")


def command_line(argv: list[str]) -> str:
    """The command as typed: ``hecate`` and its arguments."""
    return shlex.join(["hecate", *argv])


def footer(command: str, run: dict[str, Any] | None = None) -> str:
    """Machine, date, command and commit: what a picture must name. ``run`` is a saved
    result's envelope (the run the figures came from); without it, this run."""
    if run is None:
        run = {"machine": machine(), "date": today(), "commit": commit()}
    return f"{run['machine']} · {run['date']} · `{command}` · commit {run['commit']}"


def envelope(suite: str, command: str, report: Any) -> dict[str, Any]:
    """A suite's result as saved for the report: the figures and where they came from."""
    return {
        "suite": suite,
        "command": command,
        "machine": machine(),
        "cores": os.cpu_count(),
        "date": today(),
        "commit": commit(),
        "software": software(),
        "report": report,
    }


def save(results: Path, suite: str, doc: dict[str, Any]) -> Path:
    """Write ``doc`` as ``results/SUITE.json`` (the folder is created)."""
    results.mkdir(parents=True, exist_ok=True)
    path = results / f"{suite}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path
