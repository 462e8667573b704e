"""The gateway's socket takes connections from the moment it says where it listens."""

from __future__ import annotations

import socket

import pytest

from hecate.core.errors import HecateError
from hecate_gateway.service import listen


def test_a_client_that_reads_the_port_can_connect_before_the_server_runs() -> None:
    """The "listening" line is logged once :func:`listen` returns, before uvicorn has
    started; a client connecting then must wait in the backlog, not be refused (a bound
    socket that was not yet listening refused the test swarm's first probe on a loaded
    machine, and every test of the module errored)."""
    sock = listen("127.0.0.1", 0)
    try:
        port = sock.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            pass
    finally:
        sock.close()


def test_a_port_in_use_is_named() -> None:
    taken = listen("127.0.0.1", 0)
    try:
        port = taken.getsockname()[1]
        with pytest.raises(HecateError, match=f"cannot listen on 127.0.0.1:{port}"):
            listen("127.0.0.1", port)
    finally:
        taken.close()
