"""router: ``hecate.infer.<model>`` in, an answer or an explicit error out. Always.

The router process is an adaptor: what it hears on the bus becomes an event for its
:class:`~hecate_router.desk.RouterDesk` (pure: events in, actions out), and the desk's
actions become publishes. Nothing here decides.

Listens: ``hecate.infer.>`` and ``hecate.stream.>`` in queue group ``hecate-routers``
(any number of replicas), ``hecate.router.cancel`` and ``hecate.router.retries`` (every
replica), ``hecate.events.node.down``, the nodes' news of the prefixes they keep
(``hecate.node.*.kept``), and its own inbox for stage, quota and retry-claim replies.
Follows the plan, telemetry and the shared breakers into its :class:`SwarmView`.

Each request gets an integer (its call) as it arrives and is answered later through
its deferred :class:`Request` handle, kept here under that number. Replies come back
to the inbox named by integers: ``<flight>-<send>-<stage>`` for a stage,
``q<call>`` for the quota desk, ``r<claim>`` for a retry's owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import secrets
import time
import traceback
from collections import Counter
from collections.abc import Mapping

import msgspec
from nats.aio.msg import Msg
from opentelemetry.trace import TracerProvider

from hecate.bus import kv as kvs
from hecate.bus import telemetry
from hecate.bus.logs import event
from hecate.bus.service import NO_RESPONDERS, Request, Service
from hecate.bus.settle import settled
from hecate.core import SwarmPlan
from hecate.wire import subjects
from hecate.wire.kept import PrefixNews, PrefixState, PrefixStateAsk
from hecate.wire.messages import (
    ErrorReply,
    InferCancel,
    InferRequest,
    NodeEvent,
    QuotaReply,
    RetryClaim,
    RetryOwner,
)
from hecate.wire.stages import StageReply, reply_decoder
from hecate_router import desk_flow as d
from hecate_router.breakers import BreakerView
from hecate_router.config import RouterConfig
from hecate_router.desk import RouterDesk
from hecate_router.flow import Failure
from hecate_router.identity import Refused, tenant_of
from hecate_router.publisher import Publisher
from hecate_router.swarmview import SwarmView

__all__ = ["RouterConfig", "RouterService"]

PLAN_WAIT_S = 5.0  # how long a starting router waits for its first plan
SWEEP_S = 0.02  # how often stage deadlines, the line and probe leases are looked at

_stage_reply = reply_decoder()
_error_reply = msgspec.msgpack.Decoder(ErrorReply)  # the node shell's refusals, untagged
_quota_reply = msgspec.json.Decoder(QuotaReply)
_plan = msgspec.json.Decoder(SwarmPlan)
_kept_news = msgspec.msgpack.Decoder(PrefixNews)
_kept_state = msgspec.msgpack.Decoder(PrefixState)
_msgpack = msgspec.msgpack.Encoder()
_json = msgspec.json.Encoder()


class RouterService:
    def __init__(
        self,
        config: RouterConfig,
        *,
        log: logging.Logger,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        self.config = config
        self.instance_id = config.instance_id
        self.log = log
        self.service = svc = Service(
            kind="router",
            name=subjects.SERVICE_NAMES["router"],
            instance_id=config.instance_id,
            description="routes hecate.infer.<model> along the cheapest healthy pipeline",
            log=log,
            tracer_provider=tracer_provider,
            max_payload=config.max_request_bytes,
        )
        counters: Counter[str] = Counter()  # the router's, shown in its status
        self.breakers = BreakerView(
            lambda: svc.nc,
            counters=counters,
            router_id=config.instance_id,
            probe_timeout_s=config.breaker_probe_timeout_s,
            log=log,
            reconnect_grace_s=config.reconnect_grace_s,
        )
        self.view = SwarmView(
            failover=config.failover,
            suspect_s=config.suspect_s,
            stale_s=config.stale_s,
            log=log,
            breakers=self.breakers,
        )
        # The prefix names this router's flights (and so the nodes' sessions) apart from
        # every other replica's and from its own earlier runs, which count from 1 too.
        prefix = f"{config.instance_id}-{secrets.token_hex(6)}-"
        self.desk = RouterDesk(config, self.view, flight_prefix=prefix, counters=counters)
        self.publisher = Publisher(svc, self.breakers, counters)
        self._calls = 0
        self._back = 0.0  # the reconnect the desk was last told of
        self.telemetry = telemetry.Shards()  # what this router holds of every shard

    async def run(self, url: str, stop: asyncio.Event, grace: float = 10.0) -> None:
        svc = self.service
        await svc.start(url)
        # Under the connection's inbox prefix (``_INBOX.<user>`` with credentials), the
        # only inboxes the NATS permissions let nodes and the breaker service answer.
        inbox = self.publisher.inbox = f"{svc.nc.new_inbox()}.{self.instance_id}"
        await svc.nc.subscribe(f"{inbox}.*", cb=self._on_inbox)
        svc.spawn(self._follow_plan())
        svc.spawn(self._follow_telemetry())
        svc.spawn(self.breakers.follow(self.view.rebuild))
        svc.spawn(self._sweep())
        await svc.add_endpoint("retries", subjects.ROUTER_RETRIES, RetryClaim, self._on_claim)
        await svc.add_endpoint("node-down", subjects.EVENT_NODE_DOWN, NodeEvent, self._on_down)
        await svc.add_endpoint("cancel", subjects.ROUTER_CANCEL, InferCancel, self._on_cancel)
        await svc.nc.subscribe(subjects.NODE_KEPT_ALL, cb=self._on_kept)
        # Into the queue group with a plan (one already in KV comes at once): a router
        # without one can only answer no_plan, and its callers pause before retrying, so
        # a restarted replica cost them seconds. Never longer than PLAN_WAIT_S: a swarm
        # without a planner is still told so.
        deadline = time.monotonic() + PLAN_WAIT_S
        while self.view.plan is None and time.monotonic() < deadline:
            await asyncio.sleep(SWEEP_S)
        for name, subject in (("stream", subjects.STREAM_ALL), ("infer", subjects.INFER_ALL)):
            stats = await svc.add_endpoint(
                name,
                subject,
                InferRequest,
                self._on_infer,
                queue=subjects.ROUTER_QUEUE,
                deferred=True,
            )
        stats.status = self.status  # the router's, once: on the infer endpoint
        await svc.ready()
        await settled(svc.nc)
        event(self.log, "router ready", inbox=inbox)
        await stop.wait()
        # Drain: stop taking requests (inbound), let flights land, then close outbound.
        await svc.drain_inbound(grace)
        await self.feed(d.Drain(time.monotonic()))
        deadline = time.monotonic() + grace
        while self.desk.flights and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await self.feed(d.Stop(time.monotonic()))
        if self.breakers.backlog and svc.nc.is_connected:
            await self.breakers.deliver()  # a last try for reports kept meanwhile
        self.breakers.close()
        await svc.stop(grace)

    def status(self) -> dict[str, object]:
        return {
            **self.view.freshness(),
            **self.desk.status(),
            "breakers_open": sorted(
                t for t, (snap, _) in self.breakers.snapshots.items() if snap.state != "closed"
            ),
            "probe_leases_won": self.breakers.leases_won,
            "telemetry_followed": dataclasses.asdict(self.telemetry.stats),
            "kept_followed": self.desk.affinity.kept.status(),
        }

    # -- what the bus says, as events -----------------------------------------------------

    async def _on_infer(self, req: Request[InferRequest]) -> None:
        model_id = subjects.model_from_infer_subject(req.subject)
        if model_id is None:
            why = (
                f"invalid model id in subject {req.subject[:80]!r}: "
                "use hecate.infer.<slug> (hecate.stream.<slug> to stream)"
            )
            await req.error("bad_request", why)
            return
        # Whom the request acts for (identity.py) and whether its tokens are streamed
        # (the subject says): from here on its body says so, so quotas, retries,
        # cancels and the line all key on that tenant.
        body = req.body
        tenant = self._tenant(req.headers, body.tenant, req.subject)
        if isinstance(tenant, Refused):
            await req.error("forbidden", tenant.message)
            return
        stream = subjects.is_stream(req.subject)
        if tenant != body.tenant or stream != body.stream:
            body = req.body = msgspec.structs.replace(body, tenant=tenant, stream=stream)
        self._calls += 1
        call = self._calls
        self.publisher.calls[call] = req
        req.span.set_attribute("hecate.tenant", tenant)
        req.span.set_attribute("hecate.model", model_id)
        req.span.set_attribute("hecate.request_id", self.desk.request_id(call, body))
        await self.feed(d.Arrived(call, model_id, body, req.reply, time.monotonic()))

    def _tenant(self, headers: Mapping[str, str], named: str, subject: str) -> str | Refused:
        """Whom a request or a cancel acts for; a refusal is logged, with the account
        the server named, and counted."""
        tenant = tenant_of(self.config.tenant_from, headers, named)
        if isinstance(tenant, Refused):
            self.desk.counters["forbidden"] += 1
            event(
                self.log,
                "refused: tenant",
                logging.WARNING,
                vouched=tenant.vouched,
                named=named,
                subject=subject,
            )
        return tenant

    async def _on_inbox(self, msg: Msg) -> None:
        now = time.monotonic()
        token = msg.subject.rsplit(".", 1)[-1]
        kind, number = token[:1], token[1:]
        if kind == "q" and number.isdigit():
            reply = None
            if not (msg.headers and msg.headers.get("Status") == NO_RESPONDERS):
                with contextlib.suppress(msgspec.DecodeError):
                    reply = _quota_reply.decode(msg.data)
            await self.feed(d.QuotaAnswered(int(number), reply, now))
        elif kind == "r" and number.isdigit():
            await self.feed(d.HandedOver(int(number)))
        else:
            await self._on_stage(token, msg, now)

    async def _on_stage(self, token: str, msg: Msg, now: float) -> None:
        ids = _stage_ids(token)
        if ids is None:
            self.desk.counters["late_replies"] += 1
            return
        outcome: StageReply | ErrorReply | Failure
        if msg.headers and msg.headers.get("Status") == NO_RESPONDERS:
            outcome = Failure("no_responders", "no responders")
        else:
            outcome = _read_reply(msg.data)
        await self.feed(d.StageHeard(*ids, outcome, now))

    async def _on_down(self, down: NodeEvent, _headers: object) -> None:
        """Telemetry declared a node dead: its flights fail over now, not at a deadline."""
        await self.feed(d.NodeDown(down.node_id, down.reason, time.monotonic()))

    async def _on_cancel(self, cancel: InferCancel, headers: Mapping[str, str]) -> None:
        """A caller gave up. A tenant cancels only its own requests: the tenant is
        settled as for a request."""
        tenant = self._tenant(headers, cancel.tenant, subjects.ROUTER_CANCEL)
        if not isinstance(tenant, Refused):
            event(self.log, "cancel", request_id=cancel.request_id)
            await self.feed(d.Cancel(tenant, cancel.request_id, time.monotonic()))

    async def _on_claim(self, claim: RetryClaim, _headers: object) -> RetryOwner | None:
        """Another replica got a retry: if the original is (or was) ours, we answer it."""
        acts = await self.feed(d.Claimed(claim.tenant, claim.request_id, claim.reply_to))
        owned = any(isinstance(a, d.OwnRetry) for a in acts)
        return RetryOwner(router_id=self.instance_id) if owned else None

    async def _follow_plan(self) -> None:
        kv = await kvs.wait_bucket(self.service.nc, subjects.PLAN_BUCKET)
        bad = kvs.ignored(self.log, "plan")
        async for plan, revision in kvs.follow(kv, subjects.PLAN_KEY, _plan, bad):
            if plan is not None:  # deleted: routes go on along the last plan
                self.view.adopt_plan(plan, revision, time.time())
                for node_id in self.desk.affinity.kept.follow(self.view.first_nodes()):
                    self.service.spawn(self._ask_kept(node_id))

    async def _on_kept(self, msg: Msg) -> None:
        """A node's news of the prefixes its first stages keep: its own subject's node
        only (a body naming another is ignored and counted)."""
        kept = self.desk.affinity.kept
        try:
            news = _kept_news.decode(msg.data)
        except msgspec.DecodeError:
            kept.counters["ignored"] += 1
            return
        if subjects.node_of(msg.subject) != news.node_id:
            kept.counters["ignored"] += 1
        elif kept.heard(news):
            self.service.spawn(self._ask_kept(news.node_id))

    async def _ask_kept(self, node_id: str) -> None:
        """Ask ``node_id`` for the whole of what it keeps, until what it says follows on
        from the news heard meanwhile."""
        again = True
        while again:
            state = None
            with contextlib.suppress(Exception):  # none came: the node is unknown until news
                msg = await self.service.nc.request(
                    subjects.node_kept_whole(node_id), _msgpack.encode(PrefixStateAsk()), 2.0
                )
                state = _kept_state.decode(msg.data)
            again = self.desk.affinity.kept.told(node_id, state)

    async def _follow_telemetry(self) -> None:
        kv = await kvs.wait_bucket(self.service.nc, subjects.TELEMETRY_BUCKET)
        bad = kvs.ignored(self.log, "telemetry")
        async for snapshot, part in telemetry.follow(
            self.service.nc, kv, bad, shards=self.telemetry, log=self.log
        ):
            wall, now = time.time(), time.monotonic()
            if snapshot is not None:  # all deleted: routes go on along the last one
                self.view.adopt_telemetry(snapshot, wall, now, part)
            if part is not None:
                await self.feed(d.TelemetryHeard(part, now, wall))

    async def _sweep(self) -> None:
        """Stage deadlines, held quota waits, the line, probe leases due.

        Every flight's deadline rides this loop, so a round that raises (a bug met
        by one request's data) is logged and counted, and the next round goes on:
        ending it would end every request in flight."""
        while True:
            await asyncio.sleep(SWEEP_S)
            try:
                self.view.expire_suspicions()
                self.view.catch_up(time.monotonic())
                for target in self.breakers.due(time.time()):
                    self.service.spawn(self._lease(target))
                await self.feed(d.Tick(time.monotonic()))
                self.breakers.redeliver(self.service.spawn)
            except Exception as exc:
                self.desk.counters["sweep_failed"] += 1
                event(
                    self.log,
                    "sweep round failed",
                    logging.ERROR,
                    error=repr(exc),
                    exception="".join(traceback.format_exception(exc)),
                )

    async def _lease(self, target: str) -> None:
        if await self.breakers.try_lease(target):
            self.view.rebuild()

    async def feed(self, ev: d.Event) -> list[d.Action]:
        """Hand the desk ``ev`` and carry out what it answers, and what that brings
        back (a publish that failed); the desk's first answer, for callers that need
        one (a claim's owner)."""
        back = self.service.reconnected_at
        if back > self._back:  # the bus came back: "no responders" may mean "not yet"
            self._back = back
            self.desk.handle(d.Reconnected(back, time.monotonic(), time.time()))  # no actions
        acts = self.desk.handle(ev)
        if acts:
            more = await self.publisher.carry_out(acts)
            while more:
                more += await self.publisher.carry_out(self.desk.handle(more.pop(0)))
        return acts


def _stage_ids(token: str) -> tuple[int, int, int] | None:
    """``<flight>-<send>-<stage>``, the last token of a stage reply's subject."""
    parts = token.split("-")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        return None
    return int(parts[0]), int(parts[1]), int(parts[2])


def _read_reply(data: bytes) -> StageReply | ErrorReply | Failure:
    """A stage's answer or refusal, or why it could not be read."""
    try:
        return _stage_reply.decode(data)
    except msgspec.DecodeError as exc:
        try:
            return _error_reply.decode(data)
        except msgspec.DecodeError:
            return Failure("unreadable", f"unreadable reply: {exc}")
