"""llama.cpp beside HECATE's nodes: its own binaries run on a GGUF, each process held
to a memory limit (:mod:`hecate_dev.cgroups`).

* :func:`rpc_standing`: llama.cpp's own split of a file over N ``ggml-rpc-server``
  processes, each in a cgroup of a given limit, behind one ``llama-server`` that offloads
  every layer to them (``--rpc ... -ngl 99``): its load time, tokens/s at 1 and 4 users
  (greedy, a fixed number of tokens each), and each server's memory and whether the OOM
  killer took it. The servers' memory says where the weights went.
* :func:`resident`: ``llama-server`` on the whole file with ``--load-mode none`` (the
  weights read into its own memory, not mapped) and ``-nr`` (no repacked second copy):
  the resident memory it takes.

The binaries: ``$HECATE_LLAMA_CPP_BIN`` (a folder), else ``PATH``, else the build of the
llama-cpp-python source in ``/opt/llamacpp`` (:func:`binary`).
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from shutil import which
from typing import IO, Any

import msgspec

from hecate_dev.cgroups import MemoryCgroup, available

MIB = 2**20
#: where ``make``'s llama-cpp-python source build leaves llama.cpp's own binaries
BUILDS = "/opt/llamacpp/*/vendor/llama.cpp/build/bin"
PROMPTS = (
    "Once upon a time, in a small village,",
    "The capital of France is",
    "def fibonacci(n):",
    "The three laws of thermodynamics are",
)


def binary(name: str) -> Path | None:
    """llama.cpp's ``name`` (``llama-server``, ``ggml-rpc-server``, ...), or None."""
    folder = os.environ.get("HECATE_LLAMA_CPP_BIN")
    if folder and (Path(folder) / name).is_file():
        return Path(folder) / name
    if found := which(name):
        return Path(found)
    return next(iter(sorted(Path("/").glob(BUILDS.lstrip("/") + "/" + name))), None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def vm(pid: int) -> dict[str, float]:
    """``VmRSS`` and ``VmHWM`` of ``pid`` in MiB (empty once it is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    fields = (line.split(":", 1) for line in text.splitlines() if ":" in line)
    return {k: int(v.split()[0]) / 1024 for k, v in fields if k in ("VmRSS", "VmHWM")}


def _post(url: str, body: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        out: dict[str, Any] = json.loads(response.read())
        return out


class Server:
    """A started ``llama-server``: its process, URL and log."""

    def __init__(self, process: subprocess.Popen[bytes], port: int, log: IO[bytes]) -> None:
        self.process, self.port, self.log = process, port, log
        self.url = f"http://127.0.0.1:{port}"

    def tail(self, lines: int = 8) -> str:
        self.log.flush()
        text = Path(self.log.name).read_text(errors="replace").strip().splitlines()
        return " | ".join(text[-lines:])

    def wait_ready(self, timeout_s: float) -> float:
        """Seconds until ``/health`` answers 200; raises with the log's tail if the
        server exits or the time runs out."""
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            if self.process.poll() is not None:
                raise RuntimeError(f"llama-server exited {self.process.returncode}: {self.tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                    if response.status == 200:
                        return time.monotonic() - started
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        raise TimeoutError(f"llama-server not ready in {timeout_s:.0f}s: {self.tail()}")

    def complete(self, prompt: str, tokens: int, timeout_s: float = 600) -> int:
        """Greedy generation of exactly ``tokens`` tokens (the end token ignored);
        returns how many came."""
        body = {"prompt": prompt, "n_predict": tokens, "temperature": 0, "ignore_eos": True}
        out = _post(f"{self.url}/completion", body, timeout_s)
        return int(out.get("tokens_predicted", 0))

    def rate(self, users: int, tokens: int) -> float:
        """Tokens/s of ``users`` generations at once: their tokens over the wall time
        from the first request to the last answer."""
        counts = [0] * users
        errors: list[BaseException] = []

        def one(i: int) -> None:
            try:
                counts[i] = self.complete(PROMPTS[i % len(PROMPTS)], tokens)
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(users)]
        started = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - started
        if errors:
            raise RuntimeError(f"{users} users: {errors[0]!r}")
        return sum(counts) / elapsed


@contextmanager
def llama_server(
    file: Path, args: Sequence[str], group: MemoryCgroup | None = None
) -> Iterator[Server]:
    """``llama-server -m file ARGS`` on a free port of 127.0.0.1 (inside ``group`` when
    given), its output to a temporary log; stopped (SIGTERM, then SIGKILL) on leaving."""
    exe = binary("llama-server")
    if exe is None:
        raise FileNotFoundError("llama-server is not built (set HECATE_LLAMA_CPP_BIN)")
    port = free_port()
    cmd = [str(exe), "-m", str(file), "--host", "127.0.0.1", "--port", str(port), *args]
    with tempfile.NamedTemporaryFile(prefix="llama-server-", suffix=".log") as log:
        out = subprocess.DEVNULL
        kw: dict[str, Any] = {"stdout": log, "stderr": subprocess.STDOUT, "stdin": out}
        process = group.popen(cmd, **kw) if group else subprocess.Popen(cmd, **kw)
        try:
            yield Server(process, port, log)
        finally:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


# -- llama.cpp's resident memory for a whole file ----------------------------------------


class Resident(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """llama-server on a whole file (``--load-mode none``): resident MiB once ready, its
    peak, the group's peak (page cache included) and the seconds until ready."""

    args: str = ""
    resident_mib: float | None = None
    peak_mib: float | None = None
    cgroup_max_mib: float | None = None
    load_s: float | None = None
    skipped: str | None = None
    failed: str | None = None


def resident(file: Path, *, context: int = 4096, threads: int = 2, name: str = "") -> Resident:
    # -nr: no repacking of the weights for this processor's kernels (the AMX repack
    # kills llama-server here: SIGILL / SIGSEGV on this machine's build)
    args = ["-c", str(context), "-np", "4", "-t", str(threads), "--load-mode", "none", "-nr"]
    shown = " ".join(args)
    if binary("llama-server") is None:
        return Resident(args=shown, skipped="llama-server is not built")
    limit = 2 * file.stat().st_size + 2 * 2**30
    ok = available()
    with ExitStack() as stack:
        label = f"llama-{name or file.stem}-{os.getpid()}"
        group = stack.enter_context(MemoryCgroup(label, limit)) if ok else None
        try:
            server = stack.enter_context(llama_server(file, args, group))
            load_s = server.wait_ready(timeout_s=600)
            mem = vm(server.process.pid)
        except (RuntimeError, TimeoutError, OSError) as exc:
            return Resident(args=shown, failed=str(exc)[:500])
        top = group.max_usage_bytes / MIB if group else None
        return Resident(
            args=shown,
            resident_mib=round(mem.get("VmRSS", 0.0)),
            peak_mib=round(mem.get("VmHWM", 0.0)),
            cgroup_max_mib=round(top) if top is not None else None,
            load_s=round(load_s, 1),
        )
    raise AssertionError("unreachable")


# -- llama.cpp's RPC split ----------------------------------------------------------------


class RpcServerUse(msgspec.Struct, frozen=True, kw_only=True):
    """One ``ggml-rpc-server``: its group's limit and peak (MiB), its resident memory
    after the runs, and whether the OOM killer took it."""

    port: int
    limit_mib: float
    cgroup_max_mib: float
    resident_mib: float | None
    oom_killed: bool
    exit_code: int | None


class RpcSplit(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """llama.cpp's RPC split of ``file`` over ``servers`` servers of ``limit_mib`` each."""

    file: str
    file_mib: float
    servers: int
    limit_mib: float
    max_tokens: int
    load_s: float | None = None
    #: by users at once: the median of the rounds, and each round's
    tokens_per_s: dict[str, float] = {}
    per_round: dict[str, list[float]] = {}
    rpc: list[RpcServerUse] = []
    #: the servers together hold at least 80% of the file, each at least a tenth of it
    weights_in_servers: bool | None = None
    llama_server_resident_mib: float | None = None
    llama_server_peak_mib: float | None = None
    skipped: str | None = None
    failed: str | None = None

    def summary(self) -> str:
        """One line: each server's peak, the load time, tokens/s by users."""
        name = Path(self.file).stem
        if self.skipped:
            return f"rpc split {name}: skipped: {self.skipped}"
        held = ", ".join(
            f"{u.cgroup_max_mib:.0f}" + (" OOM-killed" if u.oom_killed else "") for u in self.rpc
        )
        rates = ", ".join(f"{v:.1f} at {k}" for k, v in self.tokens_per_s.items())
        load = "-" if self.load_s is None else f"{self.load_s:.1f}"
        return (
            f"rpc split {name}: {self.servers} servers of {self.limit_mib:.0f} MiB: peaks "
            f"{held} MiB; loaded in {load} s; tokens/s {rates or '-'} users; weights in "
            f"the servers: {self.weights_in_servers}"
            + (f"; FAILED {self.failed}" if self.failed else "")
        )


class RpcArm:
    """llama.cpp's RPC split standing (:func:`rpc_standing`): generations timed on it
    (:meth:`rate`), its figures once they are (:meth:`result`)."""

    def __init__(self, base: RpcSplit, limit_bytes: int, size: int) -> None:
        self.base, self.limit_bytes, self.size = base, limit_bytes, size
        self.server: Server | None = None
        self.groups: list[MemoryCgroup] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        self.ports: list[int] = []
        self.load_s: float | None = None
        self.failed: str | None = None

    def rate(self, users: int, tokens: int) -> float:
        """Tokens/s of ``users`` greedy generations of ``tokens`` at once."""
        if self.server is None:
            raise RuntimeError(f"not serving: {self.failed}")
        try:
            return self.server.rate(users, tokens)
        except (RuntimeError, OSError) as exc:
            self.failed = str(exc)[:500]
            raise

    def result(self, per_round: dict[str, list[float]]) -> RpcSplit:
        """The split's figures now: each server's memory, and tokens/s by users (the
        median of ``per_round``)."""
        server_vm = vm(self.server.process.pid) if self.server is not None else {}
        rss = [vm(p.pid).get("VmRSS") for p in self.procs]
        uses = [g.use() for g in self.groups]
        codes = [p.poll() for p in self.procs]
        rpc = [
            RpcServerUse(
                port=port,
                limit_mib=round(self.limit_bytes / MIB),
                cgroup_max_mib=round(use.max_usage / MIB),
                resident_mib=round(r) if r is not None else None,
                oom_killed=use.oom_killed,
                exit_code=code,
            )
            for port, use, r, code in zip(self.ports, uses, rss, codes, strict=True)
        ]
        held = [use.max_usage for use in uses]
        return msgspec.structs.replace(
            self.base,
            load_s=round(self.load_s, 1) if self.load_s is not None else None,
            tokens_per_s={k: round(statistics.median(v), 2) for k, v in per_round.items() if v},
            per_round={k: [round(x, 2) for x in v] for k, v in per_round.items()},
            rpc=rpc,
            weights_in_servers=bool(held)
            and sum(held) >= 0.8 * self.size
            and min(held) >= self.size / 10,
            llama_server_resident_mib=round(server_vm["VmRSS"]) if server_vm else None,
            llama_server_peak_mib=round(server_vm["VmHWM"]) if server_vm else None,
            failed=self.failed,
        )


@contextmanager
def rpc_standing(
    file: Path,
    servers: int = 3,
    limit_bytes: int = 3 * 2**29,
    *,
    max_tokens: int = 64,
    context: int = 4096,
) -> Iterator[RpcArm]:
    """llama.cpp's RPC split of ``file`` over ``servers`` ``ggml-rpc-server`` processes,
    each in a cgroup of ``limit_bytes``, behind ``llama-server --rpc ... -ngl 99 -t 1
    -np 4 -c CONTEXT``, standing until the block ends. The arm's ``base`` says why it
    was skipped (the binaries or cgroups missing), its ``failed`` why it could not
    serve (a server OOM-killed during the load): the block runs either way, and
    :meth:`RpcArm.result` has the figures of every server."""
    size = file.stat().st_size
    arm = RpcArm(
        RpcSplit(
            file=str(file),
            file_mib=round(size / MIB),
            servers=servers,
            limit_mib=round(limit_bytes / MIB),
            max_tokens=max_tokens,
        ),
        limit_bytes,
        size,
    )
    rpc_exe = binary("ggml-rpc-server")
    if rpc_exe is None or binary("llama-server") is None:
        arm.base = msgspec.structs.replace(
            arm.base, skipped="ggml-rpc-server or llama-server not built"
        )
    elif not (ok := available()):
        arm.base = msgspec.structs.replace(arm.base, skipped=ok.reason)
    if arm.base.skipped:
        yield arm
        return
    arm.ports = [free_port() for _ in range(servers)]
    arm.groups = [MemoryCgroup(f"rpc-{os.getpid()}-{i}", limit_bytes) for i in range(servers)]
    with ExitStack() as stack:
        for group, port in zip(arm.groups, arm.ports, strict=True):
            stack.enter_context(group)
            cmd = [str(rpc_exe), "-H", "127.0.0.1", "-p", str(port), "-t", "1"]
            out = subprocess.DEVNULL
            arm.procs.append(group.popen(cmd, stdout=out, stderr=out))
        for port in arm.ports:
            _wait_port(port, 30)
        endpoints = ",".join(f"127.0.0.1:{p}" for p in arm.ports)
        args = ["--rpc", endpoints, "-ngl", "99", "-t", "1", "-np", "4", "-c", str(context)]
        try:
            with llama_server(file, args) as server:
                try:
                    arm.load_s = server.wait_ready(timeout_s=900)
                    server.complete(PROMPTS[0], 4)  # warm up
                    arm.server = server
                except (RuntimeError, TimeoutError, OSError) as exc:
                    arm.failed = str(exc)[:500]
                yield arm
        finally:
            for p in arm.procs:
                p.kill()
                p.wait()


def _wait_port(port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"no rpc server on port {port} after {timeout_s:.0f}s")
