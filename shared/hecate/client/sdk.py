"""``HecateClient``: inference over NATS with retries that do not make things worse.

* **Bounded retries** (``max_attempts``) on what is worth retrying: no reply in time,
  nobody listening yet, and the explicit ``rate_limited``/``no_plan``/``draining``/
  ``timeout`` errors. Never on a bad request or an unknown model.
* **The upstream's hint first**: a refusal's Retry-After (the reply's
  ``retry_after_s``, else the ``Retry-After-Ms``/``Retry-After`` headers, read with
  :func:`hecate.resilience.parse_retry_after`) plus jitter from the wait policy; and
  the refusal's ``quota_ticket`` goes back with the retry to claim the caller's slot.
* **Idempotency**: every attempt of one call carries the same ``request_id``; a router
  that already runs or answered it joins or repeats instead of running it again.
* **Hedged sends** (:mod:`hecate.client.hedge`): a send that has heard nothing (no
  reply, no token) for a few times the client's usual latency is sent again with the
  next attempt number, the first kept outstanding, and the first answer wins. A live
  router joins the hedge to the running request; a frozen or dead one lets another
  router run it after the claim window, so a router's death costs its callers a fraction
  of a second instead of their whole timeout.
* **A client-side breaker** per model: after repeated failures the client fails fast
  (``client_breaker_open``) instead of queueing more work on a struggling swarm.

Every call returns an :class:`InferReply`; errors the client itself decides carry
codes starting with ``client_``. Those codes say why the client stopped, not what the
swarm did: a call refused by the client's breaker after its sends went unanswered was
never answered. ``on_attempt`` reports every send as it happened on the wire, for a
caller that must tell the two apart (the chaos load counts such a call as lost).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import msgspec
import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from hecate.bus.credentials import Credentials
from hecate.bus.streamed import request_streamed
from hecate.client.hedge import MAX_OUTSTANDING, Hedge, LatencyEstimate, cap_of
from hecate.resilience.aio import pause
from hecate.resilience.backoff import SeedPolicy, WaitPolicy
from hecate.resilience.breaker import CircuitBreaker
from hecate.resilience.hints import parse_retry_after
from hecate.wire import subjects
from hecate.wire.messages import ErrorBody, InferReply, InferRequest, StreamToken

MAX_ATTEMPTS = 3  # sends per call unless the caller says otherwise
RETRYABLE = frozenset({"rate_limited", "no_plan", "draining", "timeout", "internal"})
_reply = msgspec.json.Decoder(InferReply)
_token = msgspec.json.Decoder(StreamToken)


@dataclass(frozen=True)
class Attempt:
    """One send of a call. ``replied``: the swarm answered it (with an answer or an
    explicit error); ``code``: that error's code, or the client's own
    (``client_timeout``, ``client_no_router``) when nothing came back, and
    ``client_superseded`` for a send another send of the same call was answered
    before; "" for an answer. ``hedge``: sent while an earlier send was still
    outstanding (see :mod:`hecate.client.hedge`)."""

    number: int
    replied: bool
    code: str = ""
    hedge: bool = False


class _Unanswered(Exception):
    """Every send of one round went unanswered: ``code`` says how the last one ended."""

    def __init__(self, code: str, sends: list[int]) -> None:
        super().__init__(code)
        self.code = code
        self.sends = sends


def _error(code: str, message: str, request_id: str, model_id: str, attempts: int) -> InferReply:
    return InferReply(
        ok=False,
        error=ErrorBody(code=code, message=message),
        request_id=request_id,
        model_id=model_id,
        attempts=attempts,
    )


def _ignore(_attempt: Attempt) -> None:
    pass


class HecateClient:
    def __init__(
        self,
        nc: Client,
        *,
        timeout_s: float = 10.0,
        max_attempts: int = MAX_ATTEMPTS,
        policy: WaitPolicy | None = None,
        breaker_threshold: int = 5,
        breaker_cooldown_s: float = 5.0,
        max_outstanding: int = MAX_OUTSTANDING,
        owns_connection: bool = False,
    ) -> None:
        self.nc = nc
        self.timeout_s = timeout_s
        self.max_attempts = max(1, max_attempts)
        self.policy = policy or SeedPolicy()
        self.breaker_threshold = breaker_threshold
        self.breaker_cooldown_s = breaker_cooldown_s
        self.breakers: dict[str, CircuitBreaker] = {}
        # 1 turns hedging off: each send then waits its whole timeout, as before.
        self.max_outstanding = max(1, max_outstanding)
        self.latency = LatencyEstimate()  # time to a call's first word, answered calls
        self._owns = owns_connection

    @classmethod
    async def connect(cls, url: str, **options: float | int | WaitPolicy) -> HecateClient:
        nc = await nats.connect(url, name="hecate-client", **Credentials.from_env().options())
        return cls(nc, owns_connection=True, **options)  # type: ignore[arg-type]

    async def close(self) -> None:
        if self._owns:
            await self.nc.close()

    async def __aenter__(self) -> HecateClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _breaker(self, model: str) -> CircuitBreaker:
        b = self.breakers.get(model)
        if b is None:
            b = self.breakers[model] = CircuitBreaker(
                self.breaker_threshold,
                window_s=60.0,
                cooldown_s=self.breaker_cooldown_s,
                probe_timeout_s=self.timeout_s,
            )
        return b

    async def infer(
        self,
        model: str,
        prompt: str,
        *,
        max_tokens: int = 16,
        tenant: str = "default",
        request_id: str | None = None,
        max_wait_ms: int = 0,
        temperature: float = 0.0,
        on_token: Callable[[StreamToken], None] | None = None,
        on_attempt: Callable[[Attempt], None] | None = None,
    ) -> InferReply:
        """One answer or one explicit error, after at most ``max_attempts`` sends.

        With ``on_token``, a generative model's tokens are delivered as they are produced
        (each index once, even across retries). ``on_attempt`` is called once per send,
        when its reply (or its absence) is known; never for a send the client's breaker
        refused, since nothing went out."""
        request_id = request_id or uuid.uuid4().hex
        deliver: Callable[[Msg], Awaitable[None]] | None = None
        if on_token is not None:
            seen: set[int] = set()
            callback = on_token

            async def deliver(msg: Msg) -> None:
                try:
                    token = _token.decode(msg.data)
                except msgspec.DecodeError:  # not a token this client can read
                    return
                if token.index not in seen:  # each index once, across retries too
                    seen.add(token.index)
                    callback(token)

        return await self._infer(
            model,
            prompt,
            max_tokens,
            tenant,
            request_id,
            max_wait_ms,
            temperature,
            deliver,
            on_attempt or _ignore,
        )

    async def _infer(
        self,
        model: str,
        prompt: str,
        max_tokens: int,
        tenant: str,
        request_id: str,
        max_wait_ms: int,
        temperature: float,
        deliver: Callable[[Msg], Awaitable[None]] | None,
        on_attempt: Callable[[Attempt], None],
    ) -> InferReply:
        breaker = self._breaker(model)
        ticket: int | None = None
        last: InferReply | None = None
        number = 0  # the attempt number of the latest send, hedges included
        for attempt in range(1, self.max_attempts + 1):
            if not breaker.allow():
                return _error(
                    "client_breaker_open",
                    f"{model}: too many recent failures; retry in {breaker.retry_in():.1f} s",
                    request_id,
                    model,
                    number,
                )

            def body(n: int, ticket: int | None = ticket) -> bytes:
                return msgspec.json.encode(
                    InferRequest(
                        prompt=prompt,
                        max_tokens=max_tokens,
                        tenant=tenant,
                        request_id=request_id,
                        quota_ticket=ticket,
                        max_wait_ms=max_wait_ms,
                        attempt=n,
                        temperature=temperature,
                    )
                )

            first = number + 1
            hint: float | None = None
            timeout = self.timeout_s + max_wait_ms / 1000
            try:
                won, msg, sends = await self._round(model, body, first, timeout, deliver)
            except _Unanswered as silent:
                number = max(silent.sends)
                for n in silent.sends:
                    on_attempt(Attempt(n, replied=False, code=silent.code, hedge=n > first))
                breaker.record_failure()
                why = (
                    "no router is serving hecate.infer.*"
                    if silent.code == "client_no_router"
                    else f"no reply within {self.timeout_s} s"
                )
                last = _error(silent.code, why, request_id, model, number)
            else:
                number = max(sends)
                for n in sends:  # the sends the answer made moot, before the one that won
                    if n != won:
                        on_attempt(Attempt(n, False, "client_superseded", hedge=n > first))
                reply = _reply.decode(msg.data)
                code = "" if reply.ok else reply.error.code if reply.error else "internal"
                on_attempt(Attempt(won, replied=True, code=code, hedge=won > first))
                if reply.ok:
                    breaker.record_success()
                    return reply
                if code not in RETRYABLE:
                    breaker.record_success()  # the swarm answered; the request was wrong
                    return reply
                hint = reply.retry_after_s
                if hint is None and msg.headers:
                    hint = parse_retry_after(msg.headers, now=time.time())
                if code == "rate_limited":
                    ticket = reply.quota_ticket  # claim the slot booked for this caller
                else:
                    breaker.record_failure(hint)
                last = reply
            if attempt < self.max_attempts:
                await pause(self.policy, attempt, hint)
        assert last is not None
        return last

    async def _round(
        self,
        model: str,
        body: Callable[[int], bytes],
        first: int,
        timeout: float,
        deliver: Callable[[Msg], Awaitable[None]] | None,
    ) -> tuple[int, Msg, list[int]]:
        """Send attempt ``first`` and hedge it (attempts ``first + 1``, ...) while it
        stays silent; returns the attempt answered first, its reply and every attempt
        sent. Raises :class:`_Unanswered` when no send was answered within ``timeout``
        (or every one met no responders). The sends still out are abandoned: their
        answers, if any, are the same one."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        deadline = start + timeout
        hedge = Hedge(self.latency.mean_s, cap_of(timeout), max_outstanding=self.max_outstanding)
        heard: list[float] = []  # when the round first heard anything
        tasks: dict[asyncio.Task[Msg], int] = {}
        sends: list[int] = []

        async def on_token(msg: Msg) -> None:
            now = loop.time()
            heard.append(now)
            hedge.heard(now)
            if deliver is not None:
                await deliver(msg)

        def send(n: int) -> None:
            left = max(0.001, deadline - loop.time())
            if deliver is None:
                call = self.nc.request(subjects.infer(model), body(n), timeout=left)
            else:
                call = request_streamed(
                    self.nc, subjects.stream(model), body(n), timeout=left, on_token=on_token
                )
            tasks[asyncio.ensure_future(call)] = n
            sends.append(n)

        send(first)
        hedge.sent(start)
        code = "client_timeout"
        try:
            while tasks:
                now = loop.time()
                if now >= deadline:
                    break
                due = hedge.due_at()
                until = deadline if due is None else min(deadline, due)
                done, _ = await asyncio.wait(
                    tasks, timeout=max(0.0, until - now), return_when=asyncio.FIRST_COMPLETED
                )
                for task in done:
                    n = tasks.pop(task)
                    try:
                        msg = task.result()
                    except NoRespondersError:
                        hedge.gone()
                        code = "client_no_router"
                        continue
                    except NatsTimeout:
                        hedge.gone()
                        code = "client_timeout"
                        continue
                    self.latency.observe((heard[0] if heard else loop.time()) - start)
                    return n, msg, sends
                now = loop.time()
                if tasks and hedge.should_hedge(now):
                    send(sends[-1] + 1)
                    hedge.hedged(now)
            raise _Unanswered(code if not tasks else "client_timeout", sends)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
