"""The one supervisor (``hecate_launcher.Supervisor``) that ``hecate up``, the chaos
harness, the benchmarks and these tests' swarm all start their processes with: real
child processes (small Python programs), real signals."""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hecate_launcher import ProcessSpec, Supervisor

PYTHON = (sys.executable,)

# Says it is up, then waits; on SIGTERM appends its label to a file and exits 0.
DRAINS = """
import signal, sys, time
label, out = sys.argv[1], sys.argv[2]
def bye(*_):
    with open(out, "a") as f:
        f.write(label + "\\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, bye)
print("up", label, flush=True)
while True:
    time.sleep(60)
"""

# Ignores SIGTERM: only SIGKILL stops it.
STUBBORN = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("up", flush=True)
while True:
    time.sleep(60)
"""


def _spec(label: str, out: Path, program: str = DRAINS) -> ProcessSpec:
    return ProcessSpec(label, ("-c", program, label, str(out)), program=PYTHON)


def _wait_for_line(lines: queue.Queue[tuple[str, str]], label: str) -> str:
    while True:
        got, line = lines.get(timeout=30)
        if got == label:
            return line


def test_output_goes_to_each_log_and_a_restart_keeps_the_spec(tmp_path: Path) -> None:
    with Supervisor(logs=tmp_path) as sup:
        first = sup.start(ProcessSpec("say", ("-c", "print('hello')"), program=PYTHON))
        first.wait(30)
        assert sup.log("say") == "hello\n"
        assert not sup.alive("say")
        second = sup.restart("say")
        second.wait(30)
        assert second.pid != first.pid
        assert sup.log("say") == "hello\nhello\n"  # appended across restarts


def test_lines_reach_the_sink_with_their_label_and_the_env_is_laid_over() -> None:
    lines: queue.Queue[tuple[str, str]] = queue.Queue()
    code = "import os; print(os.environ['BASE'], os.environ['OWN'])"
    sup = Supervisor(env={"BASE": "b", "PATH": "/usr/bin:/bin"}, on_line=lambda *x: lines.put(x))
    with sup:
        sup.start(ProcessSpec("env", ("-c", code), {"OWN": "o"}, program=PYTHON))
        assert _wait_for_line(lines, "env") == "b o"


def test_a_running_label_is_not_started_twice(tmp_path: Path) -> None:
    lines: queue.Queue[tuple[str, str]] = queue.Queue()
    with Supervisor(on_line=lambda *x: lines.put(x)) as sup:
        sup.start(_spec("a", tmp_path / "out"))
        _wait_for_line(lines, "a")
        with pytest.raises(RuntimeError, match="already running"):
            sup.start(_spec("a", tmp_path / "out"))


def test_stop_goes_group_by_group_in_order_and_services_drain(tmp_path: Path) -> None:
    out = tmp_path / "order"
    lines: queue.Queue[tuple[str, str]] = queue.Queue()
    sup = Supervisor(on_line=lambda *x: lines.put(x))
    for label in ("node x", "router-1", "telemetry", "gateway"):
        sup.start(_spec(label, out))
    for _ in range(4):  # each has installed its SIGTERM handler
        lines.get(timeout=30)
    assert sup.stop(("gateway", "router", "node", "")) == []
    assert out.read_text().split("\n")[:-1] == ["gateway", "router-1", "node x", "telemetry"]
    assert all(p.returncode == 0 for p in sup.procs.values())


def test_a_process_deaf_to_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    lines: queue.Queue[tuple[str, str]] = queue.Queue()
    sup = Supervisor(on_line=lambda *x: lines.put(x))
    sup.start(ProcessSpec("deaf", ("-c", STUBBORN), program=PYTHON))
    sup.start(_spec("kind", tmp_path / "out"))
    for _ in range(2):
        lines.get(timeout=30)
    assert sup.stop(grace_s=0.5) == ["deaf"]
    assert sup.procs["deaf"].returncode == -signal.SIGKILL
    assert sup.procs["kind"].returncode == 0


def test_kill_sends_the_signal_and_can_leave_a_frozen_process(tmp_path: Path) -> None:
    lines: queue.Queue[tuple[str, str]] = queue.Queue()
    with Supervisor(on_line=lambda *x: lines.put(x)) as sup:
        sup.start(_spec("a", tmp_path / "out"))
        _wait_for_line(lines, "a")
        sup.kill("a", signal.SIGSTOP, wait=False)
        with pytest.raises(subprocess.TimeoutExpired):
            sup.procs["a"].wait(0.2)
        sup.kill("a", signal.SIGCONT, wait=False)
        sup.kill("a")
        assert sup.procs["a"].returncode == -signal.SIGKILL
