"""Nodes speak for themselves: a join, a leave or a heartbeat counts only when the node
its subject names is the node its body names.

On a locked-down bus each node's user may publish only on its own subjects
(``hecate.node.<id>.join`` and ``.leave``, ``hecate.telemetry.heartbeat.<id>``), so the
subject's id is one the bus vouches for and the body's is whatever the sender wrote. A
message whose ids differ is refused (a ``forbidden`` reply when it has a reply
subject), counted, and logged the first time each pair of ids is seen, with both; it
never reaches the plan or liveness. On an open bus the check still catches a node
publishing as another by mistake.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from hecate.bus.endpoint import DeferredHandler, Request
from hecate.bus.logs import event
from hecate.wire import subjects

T = TypeVar("T")
REMEMBER_PAIRS = 1024


class NodeIdentity:
    """The check one service makes on every node message it takes."""

    def __init__(self, log: logging.Logger, remember: int = REMEMBER_PAIRS) -> None:
        self.log = log
        self.refused = 0
        # The pairs (subject's node id, body's node id) already logged, the latest kept:
        # a sender inventing ids cannot grow this without bound.
        self._logged: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._remember = remember

    async def vouch(self, req: Request[Any], claimed: str) -> bool:
        """Whether ``req``'s subject names the node ``claimed``; if not, it is refused."""
        named = subjects.node_of(req.subject)
        if named == claimed:
            return True
        pair = (named or "", claimed)
        self.refused += 1
        if pair in self._logged:
            self._logged.move_to_end(pair)
        else:
            self._logged[pair] = None
            if len(self._logged) > self._remember:
                self._logged.popitem(last=False)
            event(
                self.log,
                "refused: node identity",
                logging.WARNING,
                subject_node=named,
                body_node=claimed,
                subject=req.subject,
            )
        await req.error(
            "forbidden",
            f"{req.subject} may speak for node {named!r} only; the body names {claimed!r}",
        )
        return False

    def guard(
        self, handler: Callable[[T], Awaitable[None]], node_id: Callable[[T], str]
    ) -> DeferredHandler:
        """A deferred endpoint handler that calls ``handler(body)`` only when the body's
        node (``node_id(body)``) is the subject's. Nothing answers a message that passes:
        these subjects are fire-and-forget."""

        async def serve(req: Request[T]) -> None:
            if not await self.vouch(req, node_id(req.body)):
                return
            try:
                await handler(req.body)
            finally:
                req.close()

        return serve
