"""``hecate up``'s watch over its services: a service that exits is started again as
:class:`~hecate_launcher.keeper.Keeper` says (the pause doubling with each exit in a
row), with :data:`~hecate.bus.discovery.RESTARTS_ENV` set so that its $SRV answers say
it was (``hecate status``), each exit and start said on the launcher's output and each
start published as a :class:`~hecate.wire.messages.ServiceRestarted` event (the swarm
page's feed)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable, Collection

from hecate.bus.discovery import RESTARTS_ENV
from hecate.wire.messages import ServiceRestarted
from hecate_launcher.keeper import Keeper
from hecate_launcher.supervisor import Supervisor

__all__ = ["keep"]

Tell = Callable[[ServiceRestarted], Awaitable[None]]
Say = Callable[[str], None]


async def keep(
    supervisor: Supervisor,
    labels: Collection[str],
    *,
    tell: Tell,
    say: Say,
    keeper: Keeper | None = None,
    poll_s: float = 0.5,
) -> None:
    """Watch ``labels`` (started already) until cancelled."""
    keeper = keeper or Keeper()
    now = time.monotonic()
    for label in labels:
        keeper.started(label, now)
    while True:
        await asyncio.sleep(poll_s)
        now = time.monotonic()
        for label in labels:
            code = supervisor.procs[label].poll()
            if code is None or keeper.waiting(label):
                continue
            ex = keeper.exited(label, code, now)
            say(
                f"{label} exited ({code}); starting it again in {ex.delay_s:g} s "
                f"(restart {ex.restarts})"
            )
        for ex in keeper.due(now):
            spec = supervisor.specs[ex.label]
            env = {**spec.env, RESTARTS_ENV: str(ex.restarts)}
            proc = supervisor.start(dataclasses.replace(spec, env=env))
            keeper.started(ex.label, now)
            say(f"{ex.label} started again, pid {proc.pid}")
            restarted = ServiceRestarted(
                label=ex.label,
                exit_code=ex.code,
                restarts=ex.restarts,
                delay_s=ex.delay_s,
                at=time.time(),
            )
            try:
                await tell(restarted)
            except Exception as exc:  # the bus away: the output has said it
                say(f"could not publish the restart of {ex.label}: {exc!r}")
