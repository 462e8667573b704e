"""breaker: the slot for the shared circuit-breaker service.

Today it only announces itself on the service API, so that ``hecate up``, the
deployment files and NATS tooling already know where it lives; the breaker state
machine and its KV bucket arrive with the resilience work.
"""

from __future__ import annotations

import asyncio
import logging

from opentelemetry.trace import TracerProvider

from hecate.bus.logs import event
from hecate.bus.service import Service
from hecate.wire import subjects


class BreakerService:
    def __init__(
        self, *, instance_id: str, log: logging.Logger, tracer_provider: TracerProvider | None
    ) -> None:
        self.log = log
        self.service = Service(
            kind="breaker",
            name=subjects.SERVICE_NAMES["breaker"],
            instance_id=instance_id,
            description="shared circuit breakers (slot: not active yet)",
            log=log,
            tracer_provider=tracer_provider,
            metadata={"active": "false"},
        )

    async def run(self, url: str, stop: asyncio.Event) -> None:
        await self.service.start(url)
        await self.service.ready()
        event(self.log, "breaker slot ready (no breakers yet)")
        await stop.wait()
        await self.service.stop()
