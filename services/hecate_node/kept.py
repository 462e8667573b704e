"""A node tells every router what its first stages keep of prompt prefixes.

At most every ``pace_s`` the node asks its executor what its first stages' prefix
stores newly keep and dropped (:meth:`hecate.llm.executor.LlmExecutor.prefix_news`, on
the compute thread, between two batches, where the stores change) and, when anything
did, publishes it as its next :class:`~hecate.wire.kept.PrefixNews` on
``hecate.node.<id>.kept``; quiet for :data:`REMIND_S`, it says its last number again
(``again``), so that a router that missed the last news asks for the whole. A router
that asks (``hecate.node.<id>.kept.whole``) is answered the whole of it as of the last
news numbered (:class:`PrefixState`): both are made on the compute thread, one after
the other, so a state is exactly the news up to its number. Each also says what a
prompt position costs a layer here, as the node measured its prefill batches
(:attr:`StageMeter.prefill_ms <hecate_node.meter.StageMeter.prefill_ms>`). Only an
executor that keeps prefixes tells anything.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from hecate.bus.logs import event
from hecate.bus.service import Service
from hecate.wire import subjects
from hecate.wire.kept import ModelNews, PrefixNews, PrefixState, PrefixStateAsk
from hecate_node.executor import Runner, StepRunner
from hecate_node.meter import StageMeter

#: The most often a node tells what changed (what a router misses meanwhile: a next
#: turn sent within it goes where the router guesses).
PACE_S = 0.025

#: With nothing new for this long, the node says its last number again.
REMIND_S = 2.0

_msgpack = msgspec.msgpack.Encoder()


class Teller:
    def __init__(
        self,
        node_id: str,
        offload: Callable[..., Any],
        news: Callable[[], list[ModelNews]],
        state: Callable[[], list[ModelNews]],
        meter: StageMeter,
        *,
        log: logging.Logger,
        pace_s: float = PACE_S,
    ) -> None:
        self.node_id = node_id
        self.boot = secrets.token_hex(8)  # a restarted node's news start over
        self.seq = 0
        self.told = 0  # news published
        self._offload = offload
        self._news = news
        self._state = state
        self.meter = meter
        self.log = log
        self.pace_s = pace_s

    @classmethod
    def of(
        cls, node_id: str, runner: Runner, meter: StageMeter, log: logging.Logger, pace_s: float
    ) -> Teller | None:
        """The teller of ``runner``'s executor, None when it keeps no prefixes."""
        if not isinstance(runner, StepRunner):
            return None
        news = getattr(runner.executor, "prefix_news", None)
        state = getattr(runner.executor, "prefix_state", None)
        if not callable(news) or not callable(state):
            return None
        offload = runner.compute.offload
        return cls(node_id, offload, news, state, meter, log=log, pace_s=pace_s)

    async def start(self, service: Service) -> None:
        await service.add_endpoint(
            "kept",
            subjects.node_kept_whole(self.node_id),
            PrefixStateAsk,
            self._whole,
            codec="msgpack",
            traced=False,
        )
        service.spawn(self._tell(service))

    async def _tell(self, service: Service) -> None:
        quiet = 0.0
        while True:
            await asyncio.sleep(self.pace_s)
            news: PrefixNews | None = await self._offload(self._next)
            quiet += self.pace_s
            if news is None and self.seq and quiet >= REMIND_S:
                news = PrefixNews(node_id=self.node_id, boot=self.boot, seq=self.seq, again=True)
            if news is None:
                continue
            quiet = 0.0
            try:
                await service.nc.publish(subjects.node_kept(self.node_id), _msgpack.encode(news))
                self.told += 1
            except Exception as exc:  # reconnecting: routers that miss it will ask
                event(self.log, "kept news not sent", logging.DEBUG, error=repr(exc))

    def _next(self) -> PrefixNews | None:
        """On the compute thread: the next news, numbered, if anything changed."""
        models = self._news()
        if not models:
            return None
        self.seq += 1
        return PrefixNews(
            node_id=self.node_id,
            boot=self.boot,
            seq=self.seq,
            models=models,
            prefill_ms=self.meter.prefill_ms,
        )

    def _now(self) -> PrefixState:
        """On the compute thread: the whole, as of the last news numbered."""
        return PrefixState(
            node_id=self.node_id,
            boot=self.boot,
            seq=self.seq,
            models=self._state(),
            prefill_ms=self.meter.prefill_ms,
        )

    async def _whole(self, _ask: PrefixStateAsk, _headers: Mapping[str, str]) -> PrefixState:
        state: PrefixState = await self._offload(self._now)
        return state

    def status(self) -> dict[str, int]:
        return {"kept_news": self.told, "kept_seq": self.seq}
