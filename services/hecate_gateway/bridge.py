"""The NATS side of one HTTP request: one request on ``hecate.infer.<model>``, its
tokens and then its one reply on the request's own inbox; a cancel when the HTTP client
hangs up.

No retries here: the official clients retry 429 and 5xx themselves, and a retry the
client does not know about would spend its time budget twice. What makes their retry
of a 429 work is :class:`TicketMemory`: the quota desk booked the refused caller a slot
and a ticket; the client comes back with the very same body at ``retry-after-ms``, and
the gateway presents that ticket for it, so the retry claims its slot instead of
queueing behind everyone again.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import Callable

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from hecate.bus.streamed import request_streamed
from hecate.wire import subjects
from hecate.wire.errors import ErrorCode
from hecate.wire.messages import ErrorBody, InferCancel, InferReply, InferRequest, StreamToken
from hecate_gateway.identities import NoIdentity, TenantLinks

_reply = msgspec.json.Decoder(InferReply)
_token = msgspec.json.Decoder(StreamToken)
_encode = msgspec.json.Encoder().encode
ROUTER_PING = f"$SRV.PING.{subjects.SERVICE_NAMES['router']}"


class TicketMemory:
    """Tickets of refused requests, by tenant and body, until their slot has passed.

    Pure (the caller passes ``now``). Two identical requests refused together each get a
    ticket; their retries take them oldest first. Bounded: past ``limit`` entries the
    oldest are forgotten (their callers are simply refused again)."""

    def __init__(self, limit: int = 10_000, grace_s: float = 30.0) -> None:
        self.limit = limit
        self.grace_s = grace_s  # how late after its slot a retry may still claim it
        self._slots: OrderedDict[tuple[str, str], deque[tuple[int, float]]] = OrderedDict()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def remember(
        self, tenant: str, body_hash: str, ticket: int, retry_after_s: float, now: float
    ) -> None:
        key = (tenant, body_hash)
        line = self._slots.setdefault(key, deque())
        self._slots.move_to_end(key)
        line.append((ticket, now + max(0.0, retry_after_s) + self.grace_s))
        self._size += 1
        while self._size > self.limit:
            _, oldest = next(iter(self._slots.items()))
            oldest.popleft()
            self._size -= 1
            if not oldest:
                self._slots.popitem(last=False)

    def take(self, tenant: str, body_hash: str, now: float) -> int | None:
        """The ticket for a retry of this body, if one is still good."""
        key = (tenant, body_hash)
        line = self._slots.get(key)
        found = None
        while line and found is None:
            ticket, expires = line.popleft()
            self._size -= 1
            if expires >= now:
                found = ticket
        if line is not None and not line:
            del self._slots[key]
        return found


def _failed(code: ErrorCode, message: str, request: InferRequest) -> InferReply:
    return InferReply(
        ok=False, error=ErrorBody(code=code, message=message), request_id=request.request_id
    )


class Call:
    """One request in the swarm. :meth:`next` yields its tokens (each index once, in
    order), then its reply; :meth:`cancel` tells the swarm the caller is gone."""

    def __init__(self, bridge: Bridge, model: str, request: InferRequest, body_hash: str):
        self.bridge = bridge
        self.model = model
        self.request = request
        self.body_hash = body_hash
        self.tokens = 0
        self.answered = False
        # Tokens, then the reply; None when the client hung up first.
        self._events: asyncio.Queue[StreamToken | InferReply | None] = asyncio.Queue()
        self._next_index = 0
        self._early: dict[int, StreamToken] = {}
        self._task: asyncio.Task[None] | None = None
        self._cancelled = False

    async def start(self, headers: dict[str, str] | None) -> None:
        self._task = asyncio.create_task(self._ask(headers))

    async def _on_token(self, msg: Msg) -> None:
        if self.answered:
            return
        try:
            token = _token.decode(msg.data)
        except msgspec.DecodeError:
            return
        if token.index < self._next_index or token.index in self._early:
            return  # a repeat (a router's replay after a failover)
        self._early[token.index] = token
        while self._next_index in self._early:
            self._events.put_nowait(self._early.pop(self._next_index))
            self._next_index += 1
            self.tokens += 1

    async def _ask(self, headers: dict[str, str] | None) -> None:
        request = self.request
        try:
            msg = await self._send(headers)
            reply = _reply.decode(msg.data)
        except NoIdentity as exc:
            reply = _failed("forbidden", str(exc), request)
        except NoRespondersError:
            reply = _failed("no_responders", "no router is serving hecate.infer.*", request)
        except NatsTimeout:
            await self._tell_cancel()  # the swarm need not finish what nobody will read
            reply = _failed("timeout", f"no answer within {self.bridge.timeout_s:g} s", request)
        except msgspec.DecodeError:
            reply = _failed("internal", "the router's reply could not be read", request)
        except Exception as exc:  # the connection closed or broke: nobody can answer
            reply = _failed("no_responders", f"the gateway's bus connection: {exc}", request)
        if reply.error is not None and reply.error.code == "rate_limited" and reply.quota_ticket:
            retry = reply.retry_after_s or 0.0
            self.bridge.tickets.remember(
                request.tenant, self.body_hash, reply.quota_ticket, retry, self.bridge.clock()
            )
        self.answered = True
        self._events.put_nowait(reply)

    async def _send(self, headers: dict[str, str] | None) -> Msg:
        nc = await self.bridge.links.client(self.request.tenant)
        body, timeout = _encode(self.request), self.bridge.timeout_s
        if not self.request.stream:
            subject = subjects.infer(self.model)
            return await nc.request(subject, body, timeout=timeout, headers=headers)
        return await request_streamed(
            nc,
            subjects.stream(self.model),
            body,
            timeout=timeout,
            on_token=self._on_token,
            headers=headers,
        )

    async def next(self) -> StreamToken | InferReply | None:
        """The next token, else the reply; None once the caller hung up."""
        return await self._events.get()

    async def reply(self) -> InferReply | None:
        """The reply (tokens, if any, skipped); None once the caller hung up."""
        while True:
            event = await self._events.get()
            if not isinstance(event, StreamToken):
                return event

    async def hang_up(self) -> None:
        """The caller is gone: tell the swarm to stop (once, if it has not answered) and
        wake whoever waits on :meth:`next`."""
        if not self.answered:
            await self._tell_cancel()
        self._events.put_nowait(None)

    async def _tell_cancel(self) -> None:
        if self._cancelled:
            return
        self._cancelled = True
        cancel = InferCancel(request_id=self.request.request_id, tenant=self.request.tenant)
        try:
            nc = await self.bridge.links.client(self.request.tenant)
            await nc.publish(subjects.ROUTER_CANCEL, _encode(cancel))
        except Exception:  # no connection: the router's own timeout ends the request
            return

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()  # a streamed request's inbox goes with it


class Bridge:
    """The gateway's NATS side, as the HTTP side uses it: its own connection (the swarm
    watch, readiness) and, through ``links``, the one each tenant's requests and cancels
    go on (its own too, unless the gateway holds per-tenant identities)."""

    def __init__(
        self,
        nc: Client,
        *,
        links: TenantLinks | None = None,
        timeout_s: float = 300.0,
        tickets: TicketMemory | None = None,
        ping_ttl_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.nc = nc
        self.links = links if links is not None else TenantLinks(nc)
        self.timeout_s = timeout_s
        self.tickets = tickets if tickets is not None else TicketMemory()
        self.ping_ttl_s = ping_ttl_s
        self.clock = clock
        self._pinged: tuple[float, bool] | None = None

    async def call(
        self,
        model: str,
        request: InferRequest,
        *,
        body_hash: str,
        stream: bool,
        headers: dict[str, str] | None = None,
    ) -> Call:
        """Send ``request`` (its tenant and request id set) and return the call. A retry
        of a refused body claims the slot booked for it."""
        ticket = self.tickets.take(request.tenant, body_hash, self.clock())
        if ticket is not None or stream:
            request = msgspec.structs.replace(request, quota_ticket=ticket, stream=stream)
        call = Call(self, model, request, body_hash)
        await call.start(headers)
        return call

    @property
    def connected(self) -> bool:
        return bool(self.nc.is_connected)

    async def router_answers(self) -> bool:
        """Whether some router answers ``$SRV.PING`` (remembered ``ping_ttl_s``, so a
        probe every few ms costs one ping a second)."""
        now = self.clock()
        if self._pinged is not None and now - self._pinged[0] < self.ping_ttl_s:
            return self._pinged[1]
        try:
            await self.nc.request(ROUTER_PING, b"", timeout=0.5)
            ok = True
        except Exception:  # no responders, a timeout, no connection: not ready
            ok = False
        self._pinged = (self.clock(), ok)
        return ok
