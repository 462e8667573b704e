"""The wire contract: every message on the bus, as msgspec structs.

Rules that keep it evolvable: structs are frozen and keyword-only; fields are added only
with defaults and a default never changes meaning; unknown fields are ignored on decode
(forward compatible). Client-facing messages, events and KV values are JSON (readable
with standard NATS tooling); stage traffic between routers and nodes is msgpack (it
carries raw activations) and lives in :mod:`hecate.wire.stages`; the shapes both use
(errors, chat messages) in :mod:`hecate.wire.common`; the events in
:mod:`hecate.wire.events`; what nodes tell routers they keep in :mod:`hecate.wire.kept`.
Everything is importable from here.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from hecate.core.plan import MOST_MEMORY, NodeProfile, Slug, SwarmPlan
from hecate.core.routing import Route
from hecate.resilience.breaker import BreakerSnapshot

# Re-exported: the shared shapes, and the stage messages (routers <-> nodes, msgpack,
# tagged unions), which live in modules of their own.
from hecate.wire.common import MAX_PROMPT_CHARS as MAX_PROMPT_CHARS
from hecate.wire.common import MAX_SCHEMA_CHARS as MAX_SCHEMA_CHARS
from hecate.wire.common import MAX_STOP_CHARS as MAX_STOP_CHARS
from hecate.wire.common import MAX_TOKENS as MAX_TOKENS
from hecate.wire.common import MAX_TOP_LOGPROBS as MAX_TOP_LOGPROBS
from hecate.wire.common import MAX_WAIT_MS as MAX_WAIT_MS
from hecate.wire.common import Candidate as Candidate
from hecate.wire.common import ChatMessage as ChatMessage
from hecate.wire.common import ErrorBody as ErrorBody
from hecate.wire.common import ErrorReply as ErrorReply
from hecate.wire.common import OutputFormat as OutputFormat
from hecate.wire.common import Seed, StopString, Temperature, TopP
from hecate.wire.common import TokenLogprob as TokenLogprob
from hecate.wire.events import BreakerChanged as BreakerChanged
from hecate.wire.events import Failover as Failover
from hecate.wire.events import FailoverEvent as FailoverEvent
from hecate.wire.events import NodeEvent as NodeEvent
from hecate.wire.events import PlanChanged as PlanChanged
from hecate.wire.events import ServiceRestarted as ServiceRestarted
from hecate.wire.kept import KeptPrint as KeptPrint
from hecate.wire.kept import ModelNews as ModelNews
from hecate.wire.kept import PrefixNews as PrefixNews
from hecate.wire.kept import PrefixState as PrefixState
from hecate.wire.kept import PrefixStateAsk as PrefixStateAsk
from hecate.wire.stages import ActivationReply as ActivationReply
from hecate.wire.stages import LayersStage as LayersStage
from hecate.wire.stages import OutputReply as OutputReply
from hecate.wire.stages import StageReply as StageReply
from hecate.wire.stages import StageRequest as StageRequest
from hecate.wire.stages import StepStage as StepStage
from hecate.wire.stages import TokenReply as TokenReply
from hecate.wire.stages import WholeStage as WholeStage
from hecate.wire.tools import tools_problem


# -- clients <-> routers (JSON) --------------------------------------------------------
class InferRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Body of a request on ``hecate.infer.<model_id>``.

    A chat model also accepts ``messages`` (then ``prompt`` may be empty): the first
    stage renders them with the model's chat template."""

    prompt: Annotated[str, msgspec.Meta(max_length=MAX_PROMPT_CHARS)]
    max_tokens: Annotated[int, msgspec.Meta(ge=0, le=MAX_TOKENS)] = 16
    tenant: Annotated[str, msgspec.Meta(max_length=128)] = "default"
    request_id: Annotated[str, msgspec.Meta(max_length=128)] = ""
    # Coming back after a rate_limited reply: present its ticket to claim the booked slot.
    quota_ticket: int | None = None
    # How long the caller accepts to be held for its quota slot instead of refused.
    max_wait_ms: Annotated[int, msgspec.Meta(ge=0, le=MAX_WAIT_MS)] = 0
    # 2, 3, ...: a client retry of the same request_id (routers look for the original).
    attempt: Annotated[int, msgspec.Meta(ge=1, le=100)] = 1
    # Generative models: sampling (greedy at temperature 0) and whether to stream tokens.
    temperature: Temperature = 0.0
    top_p: TopP = 1.0
    seed: Seed | None = None
    # Whether the tokens come back on the request's own reply subject, each a StreamToken
    # with the header STREAM_HEADER: token, before the one InferReply (which has no such
    # header). Set by the router from the subject the request came on (a caller asks on
    # hecate.stream.<model>); what a caller writes here is ignored.
    stream: bool = False
    messages: Annotated[list[ChatMessage], msgspec.Meta(max_length=256)] | None = None
    # Generation ends before any of these strings (which are not part of the output).
    stop: Annotated[list[StopString], msgspec.Meta(max_length=8)] = []
    # The text's required shape (any JSON object, or JSON valid against a schema),
    # enforced while each token is sampled.
    output_format: OutputFormat | None = None
    # Each generated token's log-probability (the model's own distribution, at
    # temperature 1) with this many of the most likely tokens beside it; None: none.
    logprobs: Annotated[int, msgspec.Meta(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    # The functions the model may call, as OpenAI's ``tools`` array in JSON: the first
    # stage gives them to the model as its chat template does, or as a system block in
    # Hermes' form where the template takes none (hecate.llm.template).
    tools: Annotated[str, msgspec.Meta(max_length=MAX_SCHEMA_CHARS)] = ""

    def __post_init__(self) -> None:
        # Raised here, msgspec refuses the message as it decodes it (ValidationError).
        if (problem := tools_problem(self.tools)) is not None:
            raise ValueError(problem)


# Marks a streamed token on a request's reply subject (``InferRequest.stream``).
STREAM_HEADER = "Hecate-Stream"
STREAM_TOKEN_HEADERS: dict[str, str] = {STREAM_HEADER: "token"}


class InferReply(msgspec.Struct, frozen=True, kw_only=True):
    """The one reply every inference request gets: an answer or an explicit error.

    ``degraded`` is true when the answer came from a reserve model; ``attempts`` counts
    dispatches (1 = first try succeeded).
    """

    ok: bool
    output: str | None = None
    route: Route | None = None
    degraded: bool = False
    attempts: int = 0
    error: ErrorBody | None = None
    request_id: str = ""
    model_id: str = ""
    # On a rate_limited error: when this caller's own slot comes, and the ticket for it.
    retry_after_s: float | None = None
    quota_ticket: int | None = None
    # What the answer cost and why it ended, as an OpenAI-style caller accounts for it:
    # tokens read (the prompt, rendered with the chat template) and written; "stop" when
    # the model ended (its end token or a stop string), "length" when max_tokens did.
    # None from a model that does not count tokens.
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: Literal["stop", "length"] | None = None
    # Asked for (InferRequest.logprobs): each generated token's, in order.
    logprobs: list[TokenLogprob] | None = None
    # A prompt whose prefix the router knew kept somewhere: sent toward a pipeline
    # keeping some of it, to none known to (``none``), or ``elsewhere`` (those keeping
    # it were full, or cost more than the saving made up for). None: no prefix reuse.
    prefix: Literal["toward", "none", "elsewhere"] | None = None


class InferCancel(msgspec.Struct, frozen=True, kw_only=True):
    """The caller of ``request_id`` gave up (an HTTP client hung up): whichever router
    runs it stops its token loop, answers ``cancelled`` and has the nodes drop the
    session's caches. Sent to every router replica (``hecate.router.cancel``)."""

    request_id: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    tenant: Annotated[str, msgspec.Meta(max_length=128)] = "default"


class SessionRelease(msgspec.Struct, frozen=True, kw_only=True):
    """A router is done with a generation's session (answered, failed over or
    cancelled): the node drops its KV cache now rather than when it idles out, and
    refuses later steps of it."""

    session: Annotated[str, msgspec.Meta(min_length=1, max_length=300)]


# -- nodes -> planner / telemetry (JSON) -----------------------------------------------
class NodeJoin(msgspec.Struct, frozen=True, kw_only=True):
    profile: NodeProfile
    executor: str = "toy"


class NodeLeave(msgspec.Struct, frozen=True, kw_only=True):
    node_id: Slug
    reason: str = "shutdown"


class NodeFault(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Make a node sick on purpose (chaos runs, ``--accept-faults`` only): delay every
    stage by ``delay_ms`` and/or refuse it with ``error`` (an error code, with
    ``retry_after_s`` for ``rate_limited``). An empty fault heals the node."""

    delay_ms: Annotated[float, msgspec.Meta(ge=0, le=60_000)] = 0.0
    error: str | None = None
    retry_after_s: Annotated[float, msgspec.Meta(ge=0, le=3600)] | None = None


class FaultAck(msgspec.Struct, frozen=True, kw_only=True):
    ok: bool = True
    node_id: str = ""


class Heartbeat(msgspec.Struct, frozen=True, kw_only=True):
    """A node's periodic self-report. ``latency_ms`` is its measured stage time.
    ``loading``: the node is loading the ranges its plan gave it (weights, tokenizer,
    first warm-up pass), when native code may hold its interpreter and delay its beats;
    telemetry gives it a load's allowance of silence, not its pace's."""

    node_id: Slug
    seq: int
    sent_at: float
    interval_ms: float
    latency_ms: float | None = None
    load: float = 0.0
    in_flight: int = 0
    score: float | None = None
    draining: bool = False
    loading: bool = False
    #: the memory the node uses now (its cgroup's, else its own resident set), bytes
    memory_used: Annotated[int, msgspec.Meta(ge=0, le=MOST_MEMORY)] = 0


# -- telemetry snapshot (KV) -----------------------------------------------------------
class NodeTelemetry(msgspec.Struct, frozen=True, kw_only=True):
    alive: bool
    latency_ms: float | None = None
    load: float | None = None
    score: float | None = None
    in_flight: int = 0
    last_seen: float | None = None  # wall clock of the telemetry service
    draining: bool = False
    memory_used: Annotated[int, msgspec.Meta(ge=0, le=MOST_MEMORY)] = 0  # as last beaten


class TelemetrySnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """What one telemetry replica knows of the nodes of its intake partitions (shard
    ``shard`` of ``shards``); followers merge the shards (:mod:`hecate.bus.telemetry`)."""

    written_at: float
    nodes: dict[str, NodeTelemetry]
    seq: int = 0
    shard: int = 0
    shards: int = 1
    # The replica's start (its wall clock): its ``seq`` counts from there, so a
    # restarted replica's messages are told from its predecessor's.
    epoch: float = 0.0


class TelemetryLease(msgspec.Struct, frozen=True, kw_only=True):
    """Which telemetry replica speaks for a shard (KV ``lease.<shard>``), until when
    (its wall clock), and the epoch its messages carry meanwhile."""

    holder: Slug
    until: float
    epoch: float


class TelemetryDelta(msgspec.Struct, frozen=True, kw_only=True):
    """What changed among one telemetry replica's nodes since its message ``base``
    (a snapshot or a delta, numbered in one sequence ``seq`` per ``epoch``).

    ``nodes``: whole entries of the nodes whose figures moved past the replica's
    tolerance since it last told them, and of every node that went up or down (or
    started or stopped draining) since its latest snapshot ``keyframe``, however
    long ago it was told: a follower that missed a delta has every node's liveness
    right again at the next one. ``heard``: the nodes heard since ``base`` whose
    figures held, with the wall time they were heard. A follower whose ``seq`` is
    not ``base`` missed something and reads the snapshot ``keyframe`` (or a later
    one) from KV once it is at least as new as what it missed."""

    written_at: float
    epoch: float
    seq: int
    base: int
    keyframe: int
    nodes: dict[str, NodeTelemetry]
    heard: dict[str, float] = {}
    shard: int = 0
    shards: int = 1


# -- plan (KV): the core's SwarmPlan; the KV revision is its epoch ---------------------
PlanValue = SwarmPlan

# -- breaker state (KV hecate-breakers/<target>): the resilience core's snapshot, with
# wall-clock times so that every router reads the same deadlines ------------------------
BreakerValue = BreakerSnapshot


class Held(msgspec.Struct, frozen=True, kw_only=True):
    """One range a node is given: layers ``[layer_start, layer_end)`` of ``model_id``,
    a model its ``executor`` computes."""

    model_id: str
    layer_start: int
    layer_end: int
    executor: str


class Assignment(msgspec.Struct, frozen=True, kw_only=True):
    """What the plan gives one node (KV ``hecate-plan/node.<node_id>``): rewritten by
    the planner after each plan that changes it, so that a node reads its own share,
    never the whole plan. ``epoch``: the plan that last changed it; ``nodes``: that
    plan's nodes (what a node paces its heartbeats by until a notice says more)."""

    node_id: str
    epoch: int
    holdings: tuple[Held, ...] = ()
    nodes: int = 0


class RetryClaim(msgspec.Struct, frozen=True, kw_only=True):
    """A router asks the other replicas: is this retried request yours? The owner (the
    replica running or having answered it) answers the client itself and says so."""

    tenant: str
    request_id: str
    reply_to: str


class RetryOwner(msgspec.Struct, frozen=True, kw_only=True):
    """The owner's answer to a :class:`RetryClaim`: it has answered the client itself."""

    router_id: str


class StreamToken(msgspec.Struct, frozen=True, kw_only=True):
    """One generated token, sent on the request's reply subject as it is produced
    (``InferRequest.stream``), marked with :data:`STREAM_TOKEN_HEADERS`."""

    request_id: str
    index: int
    token: int
    text: str
    logprob: TokenLogprob | None = None  # asked for (InferRequest.logprobs)


class QuotaRequest(msgspec.Struct, frozen=True, kw_only=True):
    """A router asks the shared quota desk to admit one request of ``tenant``."""

    tenant: str
    tokens: int = 0
    ticket: int | None = None


class QuotaReply(msgspec.Struct, frozen=True, kw_only=True):
    admitted: bool
    retry_after_s: float = 0.0
    ticket: int | None = None
    hold: bool = False  # the tenant prefers being held to being refused


class OutcomeReport(msgspec.Struct, frozen=True, kw_only=True):
    """A router's account of one call to a target, for the shared circuit breaker."""

    target: Slug
    ok: bool
    code: str = ""
    retry_after_s: float | None = None
    router_id: str = ""
    at: float = 0.0


class ProbeRequest(msgspec.Struct, frozen=True, kw_only=True):
    """A router asks the breaker service for the single probe of an open circuit whose
    cooldown is over."""

    target: Slug
    router_id: str = ""


class ProbeGrant(msgspec.Struct, frozen=True, kw_only=True):
    """``granted`` for exactly one asker per cooldown: it sends the next request to the
    target as the probe, and its outcome decides the circuit."""

    target: str
    granted: bool
    state: Literal["closed", "open", "half_open"] = "closed"
