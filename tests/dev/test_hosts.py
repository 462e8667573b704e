"""The hosts-apart harness itself (:mod:`hecate_dev.hosts`): hosts reach each other by
address, a pulled cable stops everything and a put-back one restores it, and a token
bucket slows a host's traffic to its rate. Skipped, naming why, without namespaces."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from hecate_dev.hosts import Host, Hosts, unavailable

WHY_NOT = unavailable()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"no namespaces: {WHY_NOT}")

# A server that reads everything sent to it and answers how many bytes it got.
SINK = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 9000)); s.listen(); print("ready", flush=True)
while True:
    c, _ = s.accept(); n = 0
    while (b := c.recv(65536)): n += len(b)
    print(n, flush=True); c.close()
"""
# A client that sends ``size`` bytes to ``ip`` and prints the seconds it took.
SEND = """
import socket, sys, time
ip, size = sys.argv[1], int(sys.argv[2])
c = socket.create_connection((ip, 9000), timeout=5); t = time.monotonic()
c.sendall(b"x" * size); c.shutdown(socket.SHUT_WR); c.recv(1)
print(time.monotonic() - t)
"""


@pytest.fixture
def two() -> Iterator[tuple[Host, Host, subprocess.Popen[bytes]]]:
    with Hosts() as hosts:
        a, b = hosts.add("a"), hosts.add("b")
        sink = a.popen([sys.executable, "-c", SINK], stdout=subprocess.PIPE)
        assert sink.stdout is not None
        assert sink.stdout.readline().strip() == b"ready"
        try:
            yield a, b, sink
        finally:
            sink.kill()
            sink.wait()


def send(frm: Host, to: Host, size: int) -> subprocess.CompletedProcess[bytes]:
    argv = ["ip", "netns", "exec", frm.ns, sys.executable, "-c", SEND, to.ip, str(size)]
    return subprocess.run(argv, capture_output=True, timeout=30, check=False)


def test_hosts_reach_each_other_until_a_cable_is_pulled(
    two: tuple[Host, Host, subprocess.Popen[bytes]],
) -> None:
    a, b, _sink = two
    assert send(b, a, 1000).returncode == 0
    a.cut()
    assert send(b, a, 1000).returncode != 0  # times out: nothing reaches a
    a.heal()
    assert send(b, a, 1000).returncode == 0


def test_a_token_bucket_holds_a_host_to_its_rate(
    two: tuple[Host, Host, subprocess.Popen[bytes]],
) -> None:
    a, b, _sink = two
    size = 256 * 1024  # 2 Mbit: 2 s at 1 Mbit/s, milliseconds on a bare veth
    free = float(send(b, a, size).stdout)
    b.limit("1mbit")
    started = time.monotonic()
    limited = float(send(b, a, size).stdout)
    assert limited >= 1.0, (free, limited)
    assert free < limited / 4, (free, limited)
    assert time.monotonic() - started < 10
