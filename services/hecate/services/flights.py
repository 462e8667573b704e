"""A router's flights and the one rule for acting on them. No I/O here.

A :class:`Flight` is a request on its way through the pipeline. At any moment it has at
most one *send* outstanding: the stage request last published for it, named by a token
that is never reused (``<flight key>-<send number>``) and carried in the reply subject.
Everything that can happen to a send is an *outcome*: the stage's reply, an error reply,
NATS' no-responders status, the sweep's timeout, telemetry's node-down event, a publish
that failed. Outcomes race: the reply and the node-down event for the same send arrive
on different subscriptions, and the sweep and the node-down handler decide on a list
taken before they await anything.

The rule: **an outcome acts on a flight only through :func:`claim`**, which succeeds
once per send, for a flight still in the table, and clears the send so that every
other outcome of it finds nothing to act on. Whoever holds the claim decides what comes
next (the next stage, a failover, an answer). And a flight is answered only by whoever
takes it out of the table (:func:`land`), so it is answered once, whatever else was
still on its way.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Literal, TypedDict

from opentelemetry.trace import Span

from hecate.core import Route
from hecate.wire.messages import InferRequest


class Usage(TypedDict, total=False):
    """The token accounting fields of an InferReply."""

    prompt_tokens: int
    completion_tokens: int
    finish_reason: Literal["stop", "length"] | None


@dataclass(slots=True, eq=False)
class Flight:
    """One inference request on its way through the pipeline."""

    key: int
    request_id: str
    model_id: str
    reply_to: str
    request: InferRequest
    route: Route
    span: Span
    started: float
    stage: int = 0
    attempts: int = 1
    deadline: float = 0.0
    degraded: bool = False
    dispatch: str = ""  # the send awaiting its outcome ("": none; see claim)
    sends: int = 0  # stage requests published so far: numbers each send's token
    acts: dict[int, bytes] = field(default_factory=dict)  # activation entering layer L
    stage_span: Span | None = None
    also_reply_to: list[str] = field(default_factory=list)  # retries of the same request
    # Generation (a model whose last stage samples tokens): the per-attempt session, how
    # many positions the route's caches hold, the prompt's ids and what was generated.
    session: str = ""
    position: int = 0
    step_tokens: list[int] | None = None  # what the first stage gets this step
    prompt_tokens: list[int] | None = None
    generated: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    replays: int = 0  # migrations of this generation's state onto a rescue route
    step_at: float = 0.0  # when the current step's first stage was sent (monotonic)
    idempotency: tuple[str, str] | None = None  # (tenant, client request_id)
    # Half-open targets whose single probe this flight carries, until their outcome is
    # reported: a probe the flight never delivers must be given back, not kept forever.
    probes: set[str] = field(default_factory=set)
    finish_reason: Literal["stop", "length"] | None = None  # why the generation ended
    eos: bool = False  # the model's end token is the last of ``generated``

    def usage(self) -> Usage:
        """What the answer cost, for its reply: tokens read and written (a generation's
        end token is not text and not counted) and why it ended. Empty for a model that
        does not generate token by token."""
        if self.prompt_tokens is None:
            return {}
        written = len(self.generated) - (1 if self.eos else 0)
        return {
            "prompt_tokens": len(self.prompt_tokens),
            "completion_tokens": written,
            "finish_reason": self.finish_reason,
        }

    def next_send(self) -> str:
        """A fresh token for the stage request about to be published."""
        self.sends += 1
        self.dispatch = f"{self.key}-{self.sends}"
        return self.dispatch


def live(flights: Mapping[int, Flight], flight: Flight) -> bool:
    """Still in the air: in the table, not yet answered."""
    return flights.get(flight.key) is flight


def claim(flights: Mapping[int, Flight], flight: Flight, send: str) -> bool:
    """Take the outcome of ``send``: True once, for the outcome that got there first.

    False when the flight has landed, when ``send`` is no longer its outstanding send
    (a later stage, a rescue route or a resend replaced it) or when another outcome of
    the same send already claimed it."""
    if not send or not live(flights, flight) or flight.dispatch != send:
        return False
    flight.dispatch = ""
    return True


def land(flights: MutableMapping[int, Flight], flight: Flight) -> bool:
    """Take the flight out of the table: True for the one caller that answers it."""
    if not live(flights, flight):
        return False
    del flights[flight.key]
    flight.dispatch = ""
    return True


def expired(flights: Mapping[int, Flight], now: float) -> list[tuple[Flight, str]]:
    """The sends whose stage outlived its deadline, as (flight, send) to claim."""
    return [(f, f.dispatch) for f in flights.values() if f.dispatch and f.deadline < now]


def waiting_on(
    flights: Mapping[int, Flight], node_id: str, *, chained: bool
) -> list[tuple[Flight, str]]:
    """The sends that ``node_id`` still has to serve (in a chain, any stage from the
    current one on), as (flight, send) to claim."""
    out: list[tuple[Flight, str]] = []
    for f in flights.values():
        if not f.dispatch:
            continue
        pending = f.route.stages[f.stage :] if chained else (f.route.stages[f.stage],)
        if any(s.node_id == node_id for s in pending):
            out.append((f, f.dispatch))
    return out
