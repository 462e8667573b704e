"""Running one service in this process: its logs, its tracer, its loop, its signals."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, Protocol

from opentelemetry.trace import TracerProvider

from hecate.bus import logs, tracing
from hecate.cli.orphans import orphaned, parent_watch
from hecate.core.errors import HecateError

DEFAULT_URL = "nats://127.0.0.1:4222"
PARENT_CHECK_S = 1.0  # how soon a service notices its supervisor is gone


class ServiceAborted(Exception):
    """The service was cancelled from within: one of its background loops failed."""


class Runnable(Protocol):
    def run(self, url: str, stop: asyncio.Event) -> Coroutine[Any, Any, None]: ...


def default_url() -> str:
    """``$HECATE_NATS``, else the server ``hecate up`` started here, else localhost:4222."""
    if os.environ.get("HECATE_NATS"):
        return os.environ["HECATE_NATS"]
    state = Path(os.environ.get("HECATE_STATE", ".hecate")) / "nats.url"
    if state.exists():
        return state.read_text().strip()
    return DEFAULT_URL


def run_service(
    kind: str, instance: str, url: str, build: Callable[[Any, TracerProvider], Runnable]
) -> int:
    log = logs.setup(kind, instance, os.environ.get("HECATE_LOG_LEVEL", "INFO"))
    provider = tracing.provider_from_env(f"hecate-{kind}")
    service = build(log, provider)

    parent = parent_watch()

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        watch = asyncio.create_task(watch_parent(parent, stop, log)) if parent else None
        try:
            await service.run(url, stop)
        except asyncio.CancelledError as exc:
            # The signals and the parent watch set ``stop``; nothing here cancels the
            # service but the shell, when a background loop of it failed (logged there,
            # with the loop's name). An exception, not a cancel, makes it exit 1.
            raise ServiceAborted(str(exc) or "cancelled") from exc
        finally:
            if watch is not None:
                watch.cancel()

    try:
        run_loop(main())
    except HecateError as exc:  # a cause it can name (a port taken, a bad file): no trace
        log.error("service failed", extra={"fields": {"error": str(exc)}})
        return 1
    except Exception:
        log.exception("service crashed")  # one structured record, exit code 1
        return 1
    finally:
        tracing.shutdown(provider)
    return 0


async def watch_parent(parent: int, stop: asyncio.Event, log: logging.Logger) -> None:
    """Stop as on SIGTERM once the supervisor that started this process is gone: the
    kernel says so on Linux, this says so everywhere (and for a supervisor that died
    in the instant before the kernel was asked)."""
    while not stop.is_set():
        if orphaned(parent):
            log.warning("supervisor gone; stopping", extra={"fields": {"parent": parent}})
            stop.set()
            return
        await asyncio.sleep(PARENT_CHECK_S)


def run_loop(coro: Coroutine[Any, Any, None]) -> None:
    """Run ``coro`` on uvloop where it is installed, else on asyncio's default loop."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(coro)
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(coro)


def instance_name(default: str) -> str:
    """A default instance id: unique per host and process."""
    return f"{default}-{socket.gethostname().split('.')[0][:20]}-{os.getpid()}".lower()


def service_parser(sub: Any, name: str, help_: str) -> Any:
    """The subcommand that runs service ``name``, with the one flag every service takes."""
    p = sub.add_parser(name, help=help_)
    p.add_argument(
        "--nats", default=default_url(), help="NATS server URL (comma-separated: a cluster)"
    )
    return p
