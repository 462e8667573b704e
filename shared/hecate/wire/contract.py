"""The whole wire contract as one AsyncAPI 3.0.0 document (``hecate schema``).

Pure data and a builder, no I/O: a table of every message (payload struct, codec,
headers), every channel (address built by :mod:`hecate.wire.subjects` itself, so the two
cannot drift), and every operation seen from each service (``send``/``receive``, the
reply of a request/reply channel, the queue group). Payload schemas come from the
msgspec structs of :mod:`hecate.wire.messages` via ``msgspec.json.schema_components``:
each struct appears once under ``components.schemas``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Final, Literal

import msgspec

from hecate.core.plan import SLUG_PATTERN, Stage
from hecate.core.routing import Route
from hecate.wire import messages as m
from hecate.wire import subjects
from hecate.wire.errors import INFER_CODES, STAGE_CODES, STATUS, ErrorCode, error_headers

ASYNCAPI_VERSION: Final = "3.0.0"
JSON: Final = "application/json"
MSGPACK: Final = "application/msgpack"
LOCAL_URL: Final = "nats://127.0.0.1:4222"
SCHEMA_REF: Final = "#/components/schemas/{name}"

ContentType = Literal["application/json", "application/msgpack"]
Action = Literal["send", "receive"]
Role = Literal[
    "client", "router", "node", "planner", "telemetry", "breaker", "observer", "operator"
]

ERROR_STATUS: Final[Mapping[ErrorCode, int]] = STATUS  # any other code is sent as 500

ROLES: Final[Mapping[Role, str]] = {
    "client": "Anything that asks for inference or reads the swarm state (e.g. `hecate infer`, "
    "`hecate status`).",
    "router": "Routes `hecate.infer.<model>` along the cheapest healthy pipeline; any number "
    "of replicas share the queue group.",
    "node": "Hosts the layer ranges the plan gives it and executes them.",
    "planner": "Membership in, the plan out (one active planner).",
    "telemetry": "Heartbeats in, liveness events and the telemetry snapshot out.",
    "breaker": "Outcome reports in, one circuit breaker per target in KV, change events out.",
    "observer": "Any dashboard or log sink following the events (`hecate.events.>`).",
    "operator": "Chaos tooling (`hecate chaos`) that makes nodes sick on purpose, and a "
    "launcher (`hecate up`) that starts a service again when it exits.",
}


# -- the table ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Example:
    name: str
    payload: msgspec.Struct
    headers: Mapping[str, str] | None = None


@dataclass(frozen=True, slots=True)
class Message:
    """One kind of message. ``payload`` None is an empty JSON object (no struct).

    ``narrow`` pins properties of the payload struct for this message (e.g. ``ok`` true
    for an answer, false for an error) so that every reply matches exactly one message.
    """

    name: str
    payload: type[msgspec.Struct] | None
    content_type: ContentType
    summary: str
    description: str = ""
    narrow: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    headers: str | None = None  # a name in HEADER_SCHEMAS
    examples: tuple[Example, ...] = ()


@dataclass(frozen=True, slots=True)
class Channel:
    """A subject (or a KV key, or a reply inbox when ``address`` is None)."""

    id: str
    address: str | None
    title: str
    description: str
    messages: tuple[Message, ...]
    kv: tuple[str, str] | None = None  # (bucket, key) when the channel is a KV value


@dataclass(frozen=True, slots=True)
class Operation:
    """What one role does on one channel; ``reply`` is the channel of its answers."""

    id: str
    role: Role
    action: Action
    channel: Channel
    summary: str
    description: str = ""
    reply: Channel | None = None
    queue: str | None = None
    # The placeholder of the address that is the actor's own id (a node's ``node_id``):
    # each of the role's users may use its own id there and no other, so no node can
    # join, leave, heartbeat or serve stages as another.
    own: str | None = None


def _ref(name: str) -> str:
    return SCHEMA_REF.format(name=name)


_error_headers = error_headers


_STATUS_TABLE = "\n".join(f"| `{code}` | {status} |" for code, status in ERROR_STATUS.items())

HEADER_SCHEMAS: Final[Mapping[str, Mapping[str, Any]]] = {
    "ErrorHeaders": {
        "title": "ErrorHeaders",
        "description": "NATS headers on every error reply (ADR-32 service errors plus HECATE's "
        "own code). The body says the same: `ok` is false and `error` holds "
        "`{code, message}`.\n\n| Hecate-Error | Nats-Service-Error-Code |\n|---|---|\n"
        f"{_STATUS_TABLE}\n\nAny other code is sent with 500.",
        "type": "object",
        "properties": {
            "Nats-Service-Error": {
                "type": "string",
                "maxLength": 256,
                "description": "The error message, on one line (CR/LF replaced by spaces), "
                "cut to 256 characters.",
            },
            "Nats-Service-Error-Code": {
                "type": "string",
                "pattern": "^[0-9]{3}$",
                "description": "HTTP-like status of the error code (table above).",
            },
            "Hecate-Error": {
                "type": "string",
                "description": "The stable error code, equal to `error.code` in the body.",
            },
        },
        "required": ["Nats-Service-Error", "Nats-Service-Error-Code", "Hecate-Error"],
    },
    "TraceHeaders": {
        "title": "TraceHeaders",
        "description": "Optional W3C trace context: a request carrying it is traced as a "
        "child of the caller's span; a malformed value starts a fresh trace.",
        "type": "object",
        "properties": {
            "traceparent": {"type": "string", "description": "W3C `traceparent`."},
            "tracestate": {"type": "string", "description": "W3C `tracestate`."},
        },
    },
}

PARAMETERS: Final[Mapping[str, Mapping[str, Any]]] = {
    "model_id": {
        "description": f"A model id: one slug token, `{SLUG_PATTERN}`. A subject whose tail "
        "is not a single slug gets a `bad_request` error reply.",
        "examples": ["toy", "llama-8b"],
        "x-pattern": SLUG_PATTERN,
    },
    "node_id": {
        "description": f"A node id: one slug token, `{SLUG_PATTERN}`.",
        "examples": ["n1", "gpu-a"],
        "x-pattern": SLUG_PATTERN,
    },
    "target": {
        "description": f"A circuit-breaker target: a node id, or `upstream-<name>` for an "
        f"upstream provider; one slug token, `{SLUG_PATTERN}`.",
        "examples": ["gpu-a", "upstream-openai"],
        "x-pattern": SLUG_PATTERN,
    },
    "shard": {
        "description": f"A telemetry replica's shard, one slug token, `{SLUG_PATTERN}`: "
        f"0 to shards - 1 (shards is at most {subjects.INTAKE_PARTITIONS}, the heartbeat "
        "intake's partitions).",
        "examples": ["0", "3"],
        "x-pattern": SLUG_PATTERN,
    },
}

_EXAMPLE_ROUTE = Route(
    model_id="toy",
    pipeline_id="toy-p0",
    cost=3.5,
    stages=(
        Stage(node_id="n1", layer_start=0, layer_end=6),
        Stage(node_id="n2", layer_start=6, layer_end=12),
    ),
)

# -- messages ------------------------------------------------------------------------------

INFER_REQUEST = Message(
    "InferRequest",
    m.InferRequest,
    JSON,
    "Ask a model for an answer.",
    "Only `prompt` is required. Unknown fields are ignored (forward compatible). What a "
    "model can be asked depends on its executor's kind, which the plan names for each "
    "model (its nodes' `kind`): a model whose last stage samples each token (`steps`) "
    "takes `messages`, sampling, `output_format` (a JSON object, a JSON Schema, a Lark "
    "grammar) and `logprobs`, and reuses the cached prefix of a prompt the same tenant "
    "sent before; any other kind answers `output_format` or `logprobs` with "
    "`bad_request`, naming it.",
    headers="TraceHeaders",
    examples=(Example("hello", m.InferRequest(prompt="hello", max_tokens=8)),),
)
INFER_REPLY = Message(
    "InferReply",
    m.InferReply,
    JSON,
    "The answer (`ok` true).",
    "`degraded` is true when a reserve model answered; `attempts` counts dispatches. "
    "`prompt_tokens` and `completion_tokens` count what the model read and wrote, and "
    "`finish_reason` says why it stopped (`stop`: its end token or a stop string; "
    "`length`: `max_tokens`); older routers leave them out.",
    narrow={"ok": {"const": True}},
    examples=(
        Example(
            "answer",
            m.InferReply(
                ok=True,
                output="hello world",
                route=_EXAMPLE_ROUTE,
                attempts=1,
                request_id="router-1-7",
                model_id="toy",
                prompt_tokens=1,
                completion_tokens=2,
                finish_reason="length",
            ),
        ),
    ),
)
INFER_ERROR = Message(
    "InferError",
    m.InferReply,
    JSON,
    "An explicit error (`ok` false): an InferReply whose `error` holds the code.",
    "Codes a client should expect: "
    + "; ".join(f"`{code}` ({why})" for code, why in INFER_CODES.items())
    + ". `route`, `degraded` and `attempts` are filled when the request got as far as a "
    "pipeline.",
    narrow={"ok": {"const": False}, "error": {"$ref": _ref("ErrorBody")}},
    headers="ErrorHeaders",
    examples=(
        Example(
            "no such model",
            m.InferReply(
                ok=False,
                error=m.ErrorBody(code="no_such_model", message="model 'gpt' is not in the plan"),
                model_id="gpt",
            ),
            _error_headers("no_such_model", "model 'gpt' is not in the plan"),
        ),
    ),
)
_MSGPACK_BYTES = (
    "`bytes` fields (`activation`) are msgpack `bin` on the wire; JSON Schema can only "
    "show them as base64 strings."
)
_STAGE_KINDS = (
    " One of three variants, told apart by `kind` (a msgspec tagged union): what a stage "
    "carries is what the model's executor takes (`layers`, `step` or `whole`), and every "
    "variant shares the header (request, model, layer range, plan epoch, chain)."
)
STAGE_LAYERS = Message(
    "LayersStage",
    m.LayersStage,
    MSGPACK,
    "Run layers `[layer_start, layer_end)` of a layer network on one node (`kind` "
    "`layers`): the activation in (the prompt, on a first stage).",
    _MSGPACK_BYTES + _STAGE_KINDS,
    headers="TraceHeaders",
)
STAGE_STEP = Message(
    "StepStage",
    m.StepStage,
    MSGPACK,
    "One generation step of a session on a stage of a generative model (`kind` `step`).",
    _MSGPACK_BYTES
    + _STAGE_KINDS
    + " With `cache_scope` (the tenant), a new session may start from a cached prefix "
    "of its prompt: the first stage says in its ActivationReply how many positions it "
    "took (`reused`), and each later stage's first step takes as many from its own "
    "cache, or answers `prefix_lost`.",
    headers="TraceHeaders",
)
STAGE_WHOLE = Message(
    "WholeStage",
    m.WholeStage,
    MSGPACK,
    "A whole request to a model computed in one call, an upstream provider (`kind` `whole`).",
    _STAGE_KINDS.strip(),
    headers="TraceHeaders",
)
STAGE_ACTIVATION = Message(
    "ActivationReply",
    m.ActivationReply,
    MSGPACK,
    "The activation leaving a stage with stages after it (`kind` `activation`).",
    _MSGPACK_BYTES,
    narrow={"ok": {"const": True}},
)
STAGE_TOKEN = Message(
    "TokenReply",
    m.TokenReply,
    MSGPACK,
    "The token a generation's last stage sampled (`kind` `token`).",
    "A generative step says how many positions it ran (`positions`): a first stage "
    "runs at most a chunk of the tokens it is sent, so that no activation outgrows the "
    "bus; while `position + positions` is short of the sequence the sampled `token` is "
    "not the next one, and the caller sends `tokens` from the new position on.",
    narrow={"ok": {"const": True}},
)
STAGE_OUTPUT = Message(
    "OutputReply",
    m.OutputReply,
    MSGPACK,
    "Text decoded at a route's end (`kind` `output`).",
    narrow={"ok": {"const": True}},
)
STAGE_ERROR = Message(
    "StageError",
    m.ErrorReply,
    MSGPACK,
    "A refused or failed stage (`ok` false), msgpack like the request.",
    "The error reply of every subject, untagged (no `kind`: the service shell sends it "
    "before a handler knows what it was sent). Codes: "
    + "; ".join(f"`{code}` ({why})" for code, why in STAGE_CODES.items())
    + ". A node that is gone shows as NATS no-responders (status 503, empty body) instead.",
    narrow={"ok": {"const": False}},
    headers="ErrorHeaders",
)
NODE_JOIN = Message(
    "NodeJoin",
    m.NodeJoin,
    JSON,
    "A node announces itself and its capacity (on start and on every roll-call).",
)
NODE_LEAVE = Message("NodeLeave", m.NodeLeave, JSON, "A node leaves (drain on shutdown).")
ROLL_CALL = Message(
    "RollCall",
    None,
    JSON,
    "A (re)started planner asks every running node to publish its NodeJoin again.",
    "The body is `{}` and receivers ignore it.",
)
NODE_FAULT = Message(
    "NodeFault",
    m.NodeFault,
    JSON,
    "Make a node slow or failing on purpose (chaos runs); an empty fault heals it.",
    "Only nodes started with `--accept-faults` listen; the reply is a FaultAck.",
)
FAULT_ACK = Message("FaultAck", m.FaultAck, JSON, "The node applied the fault.")
PREFIX_NEWS = Message(
    "PrefixNews",
    m.PrefixNews,
    MSGPACK,
    "What a node's first stages newly keep (with the tokens of each) and dropped of "
    "prompt prefixes, named by their text prints.",
    "Numbered within the node's `boot` from 1; sent at most every 25 ms, only when "
    "something changed. A print names a prefix of a prompt within its tenant's scope: "
    "the first k messages of a chat, or whole blocks of 256 characters of a plain "
    "prompt, each `blake2b(previous || text)` (16 bytes), the first chained from the "
    "scope's own key (`hecate.model.prints`).",
)
PREFIX_STATE_ASK = Message(
    "PrefixStateAsk", m.PrefixStateAsk, MSGPACK, "Ask a node for the whole of what it keeps."
)
PREFIX_STATE = Message(
    "PrefixState",
    m.PrefixState,
    MSGPACK,
    "The whole of what a node's first stages keep, as of its news `seq` of `boot`.",
)
HEARTBEAT = Message(
    "Heartbeat",
    m.Heartbeat,
    JSON,
    "A node's periodic self-report (every `interval_ms`).",
    "A node is down once its silence is unlikely given its own beats' history (phi "
    "accrual; 3 intervals always allowed, never more than 5 s). A node loading its ranges "
    "beats at once saying `loading`, and is allowed 10 s of silence until a beat says it "
    "is done.",
)
FAILOVER = Message(
    "FailoverEvent",
    m.FailoverEvent,
    JSON,
    "A router lost a node mid-request and says how it recovered (or did not).",
)
PLAN_CHANGED = Message(
    "PlanChanged", m.PlanChanged, JSON, "The planner published a new plan (its epoch)."
)
NODE_DOWN = Message(
    "NodeDown",
    m.NodeEvent,
    JSON,
    "Telemetry declared a node down (silence, or it left).",
    narrow={"state": {"const": "down"}},
)
NODE_UP = Message(
    "NodeUp",
    m.NodeEvent,
    JSON,
    "Telemetry heard from a node that was unknown or down.",
    narrow={"state": {"const": "up"}},
)
SERVICE_RESTARTED = Message(
    "ServiceRestarted",
    m.ServiceRestarted,
    JSON,
    "A launcher started a service again after it exited (its exit code, the pause).",
)
PLAN = Message(
    "Plan",
    m.PlanValue,
    JSON,
    "The current SwarmPlan: who runs which layers of which model.",
    "The KV revision of the entry is the plan's epoch; readers use it and ignore the "
    "`epoch` field of the value.",
)
ASSIGNMENT = Message(
    "Assignment",
    m.Assignment,
    JSON,
    "What the plan gives one node: its ranges, and the epoch that last changed them.",
)
TELEMETRY = Message(
    "TelemetrySnapshot",
    m.TelemetrySnapshot,
    JSON,
    "Liveness and EWMA figures of every node, as telemetry sees them.",
)
TELEMETRY_LEASE = Message(
    "TelemetryLease",
    m.TelemetryLease,
    JSON,
    "Which telemetry replica speaks for a shard, until when, under which epoch.",
)
TELEMETRY_DELTA = Message(
    "TelemetryDelta",
    m.TelemetryDelta,
    JSON,
    "What changed among one telemetry replica's nodes since its message `base`.",
)
OUTCOME = Message(
    "OutcomeReport",
    m.OutcomeReport,
    JSON,
    "A router's account of one call to a target, for the shared circuit breaker.",
    "Failures (error replies, timeouts; not no-responders, which is liveness) are always "
    "reported; successes only for a target with a failure streak or for the probe.",
)
STREAM_TOKEN = Message(
    "StreamToken",
    m.StreamToken,
    JSON,
    "One generated token, published as it is produced; the final reply carries the whole text.",
)
QUOTA_REQUEST = Message(
    "QuotaRequest",
    m.QuotaRequest,
    JSON,
    "A router asks the shared quota desk to admit one request of a tenant.",
    "With `ticket`: a request coming back for the slot booked when it was refused.",
)
QUOTA_REPLY = Message(
    "QuotaReply",
    m.QuotaReply,
    JSON,
    "Admitted, or refused with the caller's own slot (`retry_after_s`) and its ticket.",
)
RETRY_CLAIM = Message(
    "RetryClaim",
    m.RetryClaim,
    JSON,
    "A router got a client retry (attempt > 1) it has no record of: is it yours?",
    "Every replica listens; the one running or having answered the request joins or "
    "repeats the answer to `reply_to` and answers this claim. Silence for 50 ms means "
    "the original is gone and the asking router runs the request.",
)
PROBE_REQUEST = Message(
    "ProbeRequest",
    m.ProbeRequest,
    JSON,
    "A router asks for the single probe of a circuit whose cooldown is over.",
)
PROBE_GRANT = Message(
    "ProbeGrant",
    m.ProbeGrant,
    JSON,
    "Granted to exactly one asker per cooldown (or per expired probe); the others keep "
    "the target out of their routes.",
)
INFER_CANCEL = Message(
    "InferCancel",
    m.InferCancel,
    JSON,
    "The caller gave up on a request (an HTTP client hung up): stop generating it.",
    "Fire-and-forget; every router replica hears it, the one running `(tenant, "
    "request_id)` answers the request `cancelled`, stops its token loop and has the "
    "route's nodes drop the session's KV cache.",
)
SESSION_RELEASE = Message(
    "SessionRelease",
    m.SessionRelease,
    JSON,
    "A router is done with a generation's session: drop its KV cache, refuse its later steps.",
    "Sent when a generation is answered, cancelled or moved to a rescue route.",
)
RETRY_OWNER = Message(
    "RetryOwner", m.RetryOwner, JSON, "The owner of a retried request has answered it."
)
BREAKER_CHANGED = Message("BreakerChanged", m.BreakerChanged, JSON, "A circuit changed state.")
BREAKER_STATE = Message(
    "BreakerState",
    m.BreakerValue,
    JSON,
    "One target's circuit: state, failure streak, `open_until` and `probe_started` "
    "(wall-clock seconds).",
    "Routers stop sending to a target whose circuit is not closed. After `open_until`, a "
    "router takes the single probe by writing `probe_started` with a compare-and-set on "
    "the revision it read; exactly one such write succeeds.",
)

# -- channels ------------------------------------------------------------------------------

INFER = Channel(
    "infer",
    subjects.infer("{model_id}"),
    "Inference requests",
    "Request/reply: a client sends an InferRequest and always gets exactly one reply, an "
    "InferReply (`ok` true) or an error (`ok` false, error headers). Routers subscribe to "
    f"`{subjects.INFER_ALL}` in queue group `{subjects.ROUTER_QUEUE}` (one router answers). "
    "With no router running the client gets NATS no-responders (status 503, empty body).",
    (INFER_REQUEST,),
)
INFER_REPLY_CHANNEL = Channel(
    "inferReply",
    None,
    "Inference replies",
    "The reply subject (NATS inbox) of the infer request.",
    (INFER_REPLY, INFER_ERROR),
)
INFER_STREAM = Channel(
    "inferStream",
    subjects.stream("{model_id}"),
    "Streamed inference requests",
    "As `infer`, but a generative request's tokens come back before its reply. A subject "
    "of its own: a tenant's account imports it as a streamed service, `infer` as a "
    "singleton one (whose way back closes with the one reply). Routers subscribe to "
    f"`{subjects.STREAM_ALL}` in queue group `{subjects.ROUTER_QUEUE}`.",
    (INFER_REQUEST,),
)
INFER_STREAM_REPLY_CHANNEL = Channel(
    "inferStreamReply",
    None,
    "Streamed inference replies",
    "The reply subject (NATS inbox) of the streamed request: one StreamToken per token, "
    "in order (index 0, 1, ...), each with the header `Hecate-Stream: token`; then, as "
    "every request, its one InferReply or error (without that header). Tokens go "
    "nowhere but the caller's own reply subject.",
    (STREAM_TOKEN, INFER_REPLY, INFER_ERROR),
)
NODE_RUN = Channel(
    "nodeRun",
    subjects.node_run("{node_id}"),
    "Stage execution on one node",
    "Request/reply, msgpack: the router chooses the node (no queue group) and calls each "
    "stage of the route in turn, keeping the activation between stages.",
    (STAGE_LAYERS, STAGE_STEP, STAGE_WHOLE),
)
STAGE_REPLY_CHANNEL = Channel(
    "stageReply",
    None,
    "Stage replies",
    "The reply subject of the stage request: the router's inbox, "
    "`<inbox prefix>.<nuid>.<router id>.<dispatch token>`, where the inbox prefix is "
    "`_INBOX.<user>` for a connection with credentials (`_INBOX` otherwise). In chained "
    "dispatch the last stage publishes its reply to `<reply_base>-<stage index>` under "
    "the same inbox.",
    (STAGE_ACTIVATION, STAGE_TOKEN, STAGE_OUTPUT, STAGE_ERROR),
)
FAULT = Channel(
    "nodeFault",
    subjects.node_fault("{node_id}"),
    "Fault injection on one node",
    "Request/reply, JSON: chaos runs only (`hecate chaos`), nodes started with "
    "`--accept-faults`. Deployments grant no one the right to publish here.",
    (NODE_FAULT,),
)
FAULT_REPLY_CHANNEL = Channel(
    "nodeFaultReply", None, "Fault acknowledgements", "The reply subject of a fault.", (FAULT_ACK,)
)
NODE_KEPT = Channel(
    "nodeKept",
    subjects.node_kept("{node_id}"),
    "Prefixes a node keeps",
    f"Fire-and-forget, msgpack; every router replica subscribes to "
    f"`{subjects.NODE_KEPT_ALL}` and follows the nodes its plan names (bounded: at most "
    "4,096 prints a model a node). A router that missed a news, or hears a new boot, "
    "asks the node for the whole and plays the news heard meanwhile on it. The node id "
    "of the subject is the sender's own; a body naming another node is ignored and "
    "counted.",
    (PREFIX_NEWS,),
)
NODE_KEPT_WHOLE = Channel(
    "nodeKeptWhole",
    subjects.node_kept_whole("{node_id}"),
    "The whole of what a node keeps",
    "Request/reply, msgpack: a router starting to follow a node, or that missed a news.",
    (PREFIX_STATE_ASK,),
)
KEPT_WHOLE_REPLY_CHANNEL = Channel(
    "nodeKeptWholeReply",
    None,
    "What a node keeps, whole",
    "The reply subject of the ask.",
    (PREFIX_STATE,),
)
_OWN_SUBJECT = (
    "The `node_id` of the subject is the sender's own: on a locked-down bus each node's "
    "user may publish only its own, and a body naming another node is refused "
    "(`forbidden`, to a message with a reply subject), logged and counted, and changes "
    "nothing."
)
HEARTBEATS = Channel(
    "heartbeat",
    subjects.heartbeat("{node_id}"),
    "Node heartbeats",
    "Fire-and-forget. The server maps each node's subject to one of "
    f"{subjects.INTAKE_PARTITIONS} partitions, `{subjects.intake('<partition>', '<node_id>')}` "
    "(by a hash of the node id: its `mappings`), and checks the publisher's permissions "
    "against that subject; each telemetry replica subscribes to its own partitions "
    f"(all of `{subjects.INTAKE_ALL}` when there is one), and to "
    f"`{subjects.HEARTBEAT_ALL}` for a server without the mapping. {_OWN_SUBJECT}",
    (HEARTBEAT,),
)
JOIN = Channel(
    "nodeJoin",
    subjects.node_join("{node_id}"),
    "Node joins",
    f"Fire-and-forget; the planner subscribes to `{subjects.NODE_JOIN_ALL}`. {_OWN_SUBJECT}",
    (NODE_JOIN,),
)
LEAVE = Channel(
    "nodeLeave",
    subjects.node_leave("{node_id}"),
    "Node leaves",
    f"Fire-and-forget; the planner and telemetry subscribe to `{subjects.NODE_LEAVE_ALL}`. "
    + _OWN_SUBJECT,
    (NODE_LEAVE,),
)
ROLL_CALL_CHANNEL = Channel(
    "nodeRollCall", subjects.NODE_ROLL_CALL, "Roll-call", "Fire-and-forget.", (ROLL_CALL,)
)
_EVENTS = f"An event (fire-and-forget); follow all of them with `{subjects.EVENTS_ALL}`."
EVENT_FAILOVER = Channel(
    "eventFailover", subjects.EVENT_FAILOVER, "Failover events", _EVENTS, (FAILOVER,)
)
EVENT_PLAN = Channel("eventPlan", subjects.EVENT_PLAN, "Plan events", _EVENTS, (PLAN_CHANGED,))
EVENT_NODE_DOWN = Channel(
    "eventNodeDown", subjects.EVENT_NODE_DOWN, "Node down events", _EVENTS, (NODE_DOWN,)
)
EVENT_NODE_UP = Channel(
    "eventNodeUp", subjects.EVENT_NODE_UP, "Node up events", _EVENTS, (NODE_UP,)
)
EVENT_RESTARTED = Channel(
    "eventRestarted",
    subjects.EVENT_RESTARTED,
    "Service restart events",
    _EVENTS,
    (SERVICE_RESTARTED,),
)
EVENT_BREAKER_CHANNEL = Channel(
    "eventBreaker",
    subjects.EVENT_BREAKER,
    "Circuit-breaker events",
    _EVENTS,
    (BREAKER_CHANGED,),
)
BREAKER_REPORTS = Channel(
    "breakerReport",
    subjects.breaker_report("{target}"),
    "Outcome reports",
    f"Fire-and-forget; the breaker service subscribes to `{subjects.BREAKER_REPORT_ALL}`.",
    (OUTCOME,),
)


def _kv_address(bucket: str, key: str) -> str:
    """The JetStream subject a KV value lives on."""
    return f"$KV.{bucket}.{key}"


KV_PLAN = Channel(
    "kvPlan",
    _kv_address(subjects.PLAN_BUCKET, subjects.PLAN_KEY),
    "The plan (KV)",
    f"JetStream KV bucket `{subjects.PLAN_BUCKET}`, key `{subjects.PLAN_KEY}`: read it with "
    "KV get/watch, not a plain subscription. The planner writes it with a compare-and-set "
    "on the revision it last saw; the entry revision is the plan epoch. A deleted or "
    "purged key means no plan (readers keep the last one).",
    (PLAN,),
    kv=(subjects.PLAN_BUCKET, subjects.PLAN_KEY),
)
KV_ASSIGNMENT = Channel(
    "kvAssignment",
    _kv_address(subjects.PLAN_BUCKET, subjects.assignment_key("{node_id}")),
    "A node's assignment (KV)",
    f"JetStream KV bucket `{subjects.PLAN_BUCKET}`, key `{subjects.assignment_key('<id>')}`: "
    "read it with KV get, at start and when a plan notice names the node (or names "
    "nobody, or follows one the node missed). The planner writes it after the plan, "
    "only when the plan changed it, so a node never reads the whole plan.",
    (ASSIGNMENT,),
    kv=(subjects.PLAN_BUCKET, subjects.assignment_key("{node_id}")),
)
KV_TELEMETRY = Channel(
    "kvTelemetry",
    _kv_address(subjects.TELEMETRY_BUCKET, subjects.telemetry_key("{shard}")),
    "The telemetry snapshot, one key per telemetry replica (KV)",
    f"JetStream KV bucket `{subjects.TELEMETRY_BUCKET}`, key "
    f"`{subjects.telemetry_key('<shard>')}`: the nodes of one replica's intake partitions, "
    "as of its delta numbered `seq`. Read every shard's with KV get when starting, and "
    "a shard's again when a delta names (`keyframe`) one at least as new as the first "
    "delta missed; merge them, keeping the shards whose `shards` is the freshest's. "
    "Each replica puts its own at most every second, less often as it grows (128 KiB "
    "a second on average by default), and at once when many nodes went up or down.",
    (TELEMETRY,),
    kv=(subjects.TELEMETRY_BUCKET, subjects.telemetry_key("{shard}")),
)

KV_TELEMETRY_LEASE = Channel(
    "kvTelemetryLease",
    _kv_address(subjects.TELEMETRY_BUCKET, subjects.telemetry_lease_key("{shard}")),
    "Which telemetry replica speaks for a shard (KV)",
    f"JetStream KV bucket `{subjects.TELEMETRY_BUCKET}`, key "
    f"`{subjects.telemetry_lease_key('<shard>')}`: written by the replica holding it, "
    "renewed every third of its term, taken over with a compare-and-set once the term "
    "passed unrenewed. The other replicas of the shard hear its nodes and stay silent.",
    (TELEMETRY_LEASE,),
    kv=(subjects.TELEMETRY_BUCKET, subjects.telemetry_lease_key("{shard}")),
)
TELEMETRY_DELTAS = Channel(
    "telemetryDelta",
    subjects.telemetry_delta("{shard}"),
    "What changed among one telemetry replica's nodes",
    "Core NATS, JSON, one subject per telemetry replica: the nodes whose figures moved "
    "past the replica's tolerance, every node that went up or down since its latest "
    "snapshot, and the others heard, by name. Numbered: a follower whose last is not "
    "`base` missed one, and reads the snapshot (KV) once one covers it. At once on a "
    "liveness change, otherwise at most every publish interval (100 ms by default).",
    (TELEMETRY_DELTA,),
)

QUOTA = Channel(
    "quotaAcquire",
    subjects.QUOTA_ACQUIRE,
    "The shared quota desk",
    "Request/reply, JSON, answered by the breaker service: one budget per tenant for "
    "every router replica.",
    (QUOTA_REQUEST,),
)
QUOTA_REPLY_CHANNEL = Channel(
    "quotaReply",
    None,
    "Quota answers",
    "The reply subject of the quota request.",
    (QUOTA_REPLY,),
)
RETRIES = Channel(
    "routerRetries",
    subjects.ROUTER_RETRIES,
    "Retried requests",
    "Request/reply among router replicas (no queue group: every replica hears it).",
    (RETRY_CLAIM,),
)
CANCEL = Channel(
    "routerCancel",
    subjects.ROUTER_CANCEL,
    "Cancelled requests",
    "Fire-and-forget, JSON (no queue group: every router replica hears it).",
    (INFER_CANCEL,),
)
NODE_RELEASE = Channel(
    "nodeRelease",
    subjects.node_release("{node_id}"),
    "Sessions a node may drop",
    "Fire-and-forget, JSON: the router sends it to every node of the session's route.",
    (SESSION_RELEASE,),
)
RETRY_OWNER_CHANNEL = Channel(
    "retryOwner", None, "Retry owners", "The reply subject of a retry claim.", (RETRY_OWNER,)
)
KV_BREAKERS = Channel(
    "kvBreaker",
    _kv_address(subjects.BREAKER_BUCKET, "{target}"),
    "A circuit breaker (KV)",
    f"JetStream KV bucket `{subjects.BREAKER_BUCKET}`, one key per target: follow them "
    "all with a KV watch. Written only by the breaker service, with compare-and-set.",
    (BREAKER_STATE,),
    kv=(subjects.BREAKER_BUCKET, "{target}"),
)
BREAKER_PROBE = Channel(
    "breakerProbe",
    subjects.BREAKER_PROBE,
    "The probe of an open circuit",
    "Request/reply, JSON, answered by the breaker service (queue of its replicas): it "
    "writes `probe_started` with compare-and-set and grants the one router whose request "
    "made the write.",
    (PROBE_REQUEST,),
)
PROBE_GRANT_CHANNEL = Channel(
    "probeGrant", None, "Probe grants", "The reply subject of the probe request.", (PROBE_GRANT,)
)

CHANNELS: Final[tuple[Channel, ...]] = (
    INFER,
    INFER_REPLY_CHANNEL,
    INFER_STREAM,
    INFER_STREAM_REPLY_CHANNEL,
    NODE_RUN,
    STAGE_REPLY_CHANNEL,
    FAULT,
    FAULT_REPLY_CHANNEL,
    NODE_KEPT,
    NODE_KEPT_WHOLE,
    KEPT_WHOLE_REPLY_CHANNEL,
    HEARTBEATS,
    JOIN,
    LEAVE,
    ROLL_CALL_CHANNEL,
    EVENT_FAILOVER,
    EVENT_PLAN,
    EVENT_NODE_DOWN,
    EVENT_NODE_UP,
    EVENT_RESTARTED,
    KV_PLAN,
    KV_ASSIGNMENT,
    KV_TELEMETRY,
    KV_TELEMETRY_LEASE,
    TELEMETRY_DELTAS,
    EVENT_BREAKER_CHANNEL,
    BREAKER_REPORTS,
    KV_BREAKERS,
    BREAKER_PROBE,
    PROBE_GRANT_CHANNEL,
    QUOTA,
    QUOTA_REPLY_CHANNEL,
    RETRIES,
    RETRY_OWNER_CHANNEL,
    CANCEL,
    NODE_RELEASE,
)

# -- operations ------------------------------------------------------------------------------

OPERATIONS: Final[tuple[Operation, ...]] = (
    Operation(
        "client.sendInfer",
        "client",
        "send",
        INFER,
        "Ask for inference and wait for the one reply.",
        "Set a timeout; on NATS no-responders no router is running.",
        reply=INFER_REPLY_CHANNEL,
    ),
    Operation(
        "router.receiveInfer",
        "router",
        "receive",
        INFER,
        "Route a request and answer it, or answer why not.",
        f"Subscribes to `{subjects.INFER_ALL}` so that a malformed model id still gets a "
        "typed `bad_request` reply.",
        reply=INFER_REPLY_CHANNEL,
        queue=subjects.ROUTER_QUEUE,
    ),
    Operation(
        "client.sendInferStream",
        "client",
        "send",
        INFER_STREAM,
        "Ask for a generation streamed token by token, then wait for the one reply.",
        "Messages with the header `Hecate-Stream: token` are tokens; the first without it "
        "is the reply.",
        reply=INFER_STREAM_REPLY_CHANNEL,
    ),
    Operation(
        "router.receiveInferStream",
        "router",
        "receive",
        INFER_STREAM,
        "Route a request, stream its tokens to the caller and answer it.",
        f"Subscribes to `{subjects.STREAM_ALL}`, as for `infer`.",
        reply=INFER_STREAM_REPLY_CHANNEL,
        queue=subjects.ROUTER_QUEUE,
    ),
    Operation(
        "router.sendStageRun",
        "router",
        "send",
        NODE_RUN,
        "Dispatch one stage of a route to its node.",
        "A stage with no reply within the stage timeout, an error reply or no-responders "
        "counts as the node lost: the router fails over and resumes from the last layer "
        "boundary whose activation it holds.",
        reply=STAGE_REPLY_CHANNEL,
    ),
    Operation(
        "client.sendCancel",
        "client",
        "send",
        CANCEL,
        "Give up on a request still running (an HTTP caller hung up).",
    ),
    Operation(
        "router.receiveCancel",
        "router",
        "receive",
        CANCEL,
        "Stop the request's token loop and answer it `cancelled`, if it runs here.",
    ),
    Operation(
        "router.sendRelease",
        "router",
        "send",
        NODE_RELEASE,
        "Tell a route's nodes a session is over.",
    ),
    Operation(
        "node.receiveRelease",
        "node",
        "receive",
        NODE_RELEASE,
        "Drop the session's KV cache between two batches; refuse later steps of it.",
        own="node_id",
    ),
    Operation(
        "node.receiveStageRun",
        "node",
        "receive",
        NODE_RUN,
        "Execute a stage of a layer range this node hosts in the current plan.",
        reply=STAGE_REPLY_CHANNEL,
        own="node_id",
    ),
    Operation(
        "node.forwardStage",
        "node",
        "send",
        NODE_RUN,
        "Chained dispatch: pass the activation on to the next stage's node.",
        "The forward's reply subject is this node's relay inbox; what comes back on it "
        "(errors, no-responders) is passed on to the router's inbox. The last stage "
        "publishes the answer itself to the router's inbox.",
        reply=STAGE_REPLY_CHANNEL,
    ),
    Operation(
        "node.sendKept",
        "node",
        "send",
        NODE_KEPT,
        "Tell routers what its first stages newly keep and dropped.",
        own="node_id",
    ),
    Operation(
        "router.receiveKept",
        "router",
        "receive",
        NODE_KEPT,
        "Follow where prompt prefixes are kept, to route a prompt where its prefix is.",
    ),
    Operation(
        "router.sendKeptAsk",
        "router",
        "send",
        NODE_KEPT_WHOLE,
        "Ask a node it starts following, or missed a news of, for the whole.",
        reply=KEPT_WHOLE_REPLY_CHANNEL,
    ),
    Operation(
        "node.receiveKeptAsk",
        "node",
        "receive",
        NODE_KEPT_WHOLE,
        "Answer the whole of what its first stages keep, as of its last news.",
        reply=KEPT_WHOLE_REPLY_CHANNEL,
        own="node_id",
    ),
    Operation(
        "operator.sendFault",
        "operator",
        "send",
        FAULT,
        "Make a node sick, or heal it.",
        reply=FAULT_REPLY_CHANNEL,
    ),
    Operation(
        "node.receiveFault",
        "node",
        "receive",
        FAULT,
        "Apply the fault to every stage from now.",
        reply=FAULT_REPLY_CHANNEL,
        own="node_id",
    ),
    Operation(
        "node.sendHeartbeat", "node", "send", HEARTBEATS, "Report every interval.", own="node_id"
    ),
    Operation(
        "telemetry.receiveHeartbeat",
        "telemetry",
        "receive",
        HEARTBEATS,
        "Fold heartbeats into liveness and EWMA state.",
    ),
    Operation(
        "node.sendJoin", "node", "send", JOIN, "Join on start and on roll-call.", own="node_id"
    ),
    Operation("planner.receiveJoin", "planner", "receive", JOIN, "Admit or re-admit a node."),
    Operation("node.sendLeave", "node", "send", LEAVE, "Leave when draining.", own="node_id"),
    Operation("planner.receiveLeave", "planner", "receive", LEAVE, "Retire the node's layers."),
    Operation(
        "telemetry.receiveLeave", "telemetry", "receive", LEAVE, "Mark the node down at once."
    ),
    Operation(
        "planner.sendRollCall", "planner", "send", ROLL_CALL_CHANNEL, "Ask nodes to re-join."
    ),
    Operation(
        "node.receiveRollCall",
        "node",
        "receive",
        ROLL_CALL_CHANNEL,
        "Re-join (unless draining).",
    ),
    Operation("router.sendFailover", "router", "send", EVENT_FAILOVER, "Report a failover."),
    Operation(
        "observer.receiveFailover", "observer", "receive", EVENT_FAILOVER, "Follow failovers."
    ),
    Operation("planner.sendPlanChanged", "planner", "send", EVENT_PLAN, "Announce a new plan."),
    Operation(
        "observer.receivePlanChanged", "observer", "receive", EVENT_PLAN, "Follow plan changes."
    ),
    Operation(
        "telemetry.sendNodeDown", "telemetry", "send", EVENT_NODE_DOWN, "Announce a node down."
    ),
    Operation("observer.receiveNodeDown", "observer", "receive", EVENT_NODE_DOWN, "Follow losses."),
    Operation(
        "router.receiveNodeDown",
        "router",
        "receive",
        EVENT_NODE_DOWN,
        "Stop routing through a node at once, before the next telemetry snapshot.",
    ),
    Operation(
        "planner.receiveNodeDown",
        "planner",
        "receive",
        EVENT_NODE_DOWN,
        "Take the node out of the plan (retirement: its copies repaired from the spare).",
    ),
    Operation("telemetry.sendNodeUp", "telemetry", "send", EVENT_NODE_UP, "Announce a node up."),
    Operation(
        "planner.receiveNodeUp",
        "planner",
        "receive",
        EVENT_NODE_UP,
        "Take a node it took out for silence back into the plan, as a joiner.",
    ),
    Operation("observer.receiveNodeUp", "observer", "receive", EVENT_NODE_UP, "Follow recoveries."),
    Operation(
        "operator.sendRestarted",
        "operator",
        "send",
        EVENT_RESTARTED,
        "Announce a service started again after it exited.",
    ),
    Operation(
        "observer.receiveRestarted",
        "observer",
        "receive",
        EVENT_RESTARTED,
        "Follow the services a launcher restarts.",
    ),
    Operation(
        "breaker.receiveNodeUp",
        "breaker",
        "receive",
        EVENT_NODE_UP,
        "A node heard again: a circuit its silence opened turns half-open, for one probe.",
    ),
    Operation(
        "planner.putPlan",
        "planner",
        "send",
        KV_PLAN,
        "Write a validated plan (KV update, compare-and-set on the last revision seen).",
    ),
    Operation("router.watchPlan", "router", "receive", KV_PLAN, "Follow the plan (KV watch)."),
    Operation(
        "planner.putAssignment",
        "planner",
        "send",
        KV_ASSIGNMENT,
        "Write each node's share of a published plan that changed it (KV put).",
    ),
    Operation(
        "node.getAssignment",
        "node",
        "receive",
        KV_ASSIGNMENT,
        "Read its own share (KV get): at start, on a plan notice that calls for it, and "
        "on a stage request naming a newer epoch for a range it does not hold.",
    ),
    Operation(
        "node.receivePlanChanged",
        "node",
        "receive",
        EVENT_PLAN,
        "Learn of each plan, the nodes it changed and the swarm's size.",
    ),
    Operation("client.getPlan", "client", "receive", KV_PLAN, "Read the plan (KV get)."),
    Operation(
        "telemetry.putSnapshot", "telemetry", "send", KV_TELEMETRY, "Write the snapshot (KV put)."
    ),
    Operation(
        "router.getSnapshot",
        "router",
        "receive",
        KV_TELEMETRY,
        "Read every shard's snapshot when starting, a shard's again when it missed a delta.",
    ),
    Operation(
        "client.getSnapshot", "client", "receive", KV_TELEMETRY, "Read the snapshot (KV get)."
    ),
    Operation(
        "telemetry.putLease",
        "telemetry",
        "send",
        KV_TELEMETRY_LEASE,
        "Take or renew its shard's lease (KV create, or update on the revision read).",
    ),
    Operation(
        "observer.getLease",
        "observer",
        "receive",
        KV_TELEMETRY_LEASE,
        "See which replica speaks for each shard (the replicas themselves read it as its "
        "writers, every third of the term).",
    ),
    Operation(
        "telemetry.sendDelta",
        "telemetry",
        "send",
        TELEMETRY_DELTAS,
        "Tell what changed among its nodes.",
    ),
    Operation(
        "router.receiveDelta",
        "router",
        "receive",
        TELEMETRY_DELTAS,
        "Follow every shard's nodes between snapshots.",
    ),
    Operation(
        "client.receiveDelta",
        "client",
        "receive",
        TELEMETRY_DELTAS,
        "Follow the nodes between snapshots (the gateway's swarm page, `hecate status`).",
    ),
    Operation(
        "router.sendOutcome",
        "router",
        "send",
        BREAKER_REPORTS,
        "Report a call's outcome to the breaker service.",
    ),
    Operation(
        "breaker.receiveOutcome",
        "breaker",
        "receive",
        BREAKER_REPORTS,
        "Fold outcomes into each target's circuit.",
    ),
    Operation(
        "breaker.putState",
        "breaker",
        "send",
        KV_BREAKERS,
        "Write a target's circuit (KV update, compare-and-set).",
    ),
    Operation(
        "router.watchBreakers",
        "router",
        "receive",
        KV_BREAKERS,
        "Follow every circuit (KV watch); skip targets that are not closed.",
    ),
    Operation(
        "observer.getBreakers",
        "observer",
        "receive",
        KV_BREAKERS,
        "Read every circuit (KV watch to the end of the latest values), as hecate status does.",
    ),
    Operation(
        "router.askProbe",
        "router",
        "send",
        BREAKER_PROBE,
        "Ask for the single probe of an open circuit whose cooldown is over.",
        reply=PROBE_GRANT_CHANNEL,
    ),
    Operation(
        "breaker.grantProbe",
        "breaker",
        "receive",
        BREAKER_PROBE,
        "Grant the probe to exactly one asker (compare-and-set of probe_started).",
        reply=PROBE_GRANT_CHANNEL,
    ),
    Operation(
        "breaker.publishChange",
        "breaker",
        "send",
        EVENT_BREAKER_CHANNEL,
        "Announce a state change.",
    ),
    Operation(
        "observer.receiveBreakerEvents",
        "observer",
        "receive",
        EVENT_BREAKER_CHANNEL,
        "Follow circuit changes.",
    ),
    Operation(
        "router.askRetryOwner",
        "router",
        "send",
        RETRIES,
        "Find the replica that owns a retried request before running it again.",
        reply=RETRY_OWNER_CHANNEL,
    ),
    Operation(
        "router.claimRetry",
        "router",
        "receive",
        RETRIES,
        "Join or repeat the answer of a request this replica owns, and say so.",
        reply=RETRY_OWNER_CHANNEL,
    ),
    Operation(
        "router.askQuota",
        "router",
        "send",
        QUOTA,
        "Admit a request of a tenant with a quota (routers run with --enforce-quotas).",
        reply=QUOTA_REPLY_CHANNEL,
    ),
    Operation(
        "breaker.answerQuota",
        "breaker",
        "receive",
        QUOTA,
        "Admit, or refuse with the caller's own booked slot and its ticket.",
        reply=QUOTA_REPLY_CHANNEL,
    ),
)

# -- the document ---------------------------------------------------------------------------

INFO_DESCRIPTION: Final = f"""\
HECATE serves large-model inference from a swarm of machines. Its services talk only over \
NATS; this document is the whole wire contract, enough to write a client, a node or a \
planner in another language.

**Codecs.** Client traffic, events, heartbeats, join/leave and KV values are JSON \
(`{JSON}`); stage traffic between routers and nodes, and what nodes tell routers they \
keep of prompt prefixes (raw 16-byte prints), is msgpack (`{MSGPACK}`), with the same \
field names.

**Evolution.** Fields are only ever added, with a default, and a default never changes \
meaning: decoders must ignore unknown fields and fill missing ones with their defaults. \
Encoders write every field, `null` included.

**Ids.** Model and node ids are slugs (`{SLUG_PATTERN}`): one subject token each, valid KV \
keys.

**Errors.** Every request gets a reply. An error reply has the body \
`{{"ok": false, "error": {{"code", "message"}}}}` (InferReply on `hecate.infer.*`, \
ErrorReply elsewhere) and the headers `Nats-Service-Error` (message), \
`Nats-Service-Error-Code` (HTTP-like status) and `Hecate-Error` (code); see \
`ErrorHeaders`. No service running on a subject shows as NATS no-responders (status \
503, empty body).

**Inboxes and permissions.** A process with a NATS user creates its reply inboxes \
under `_INBOX.<user>` (anonymous ones under `_INBOX`; a node's user, `node-<id>`, under \
`_INBOX.node.<id>`). On a locked-down server each user subscribes to its own inboxes \
only, and may publish and subscribe exactly where the operations below give its role \
(`hecate nats-config` renders those permissions). Each node is a user of its own: where \
an operation names `x-own-parameter`, that parameter is the node's own id and no other.

**Tracing.** Requests may carry W3C trace context headers (`traceparent`, `tracestate`).

**Discovery.** Every service answers the NATS service API (ADR-32: `$SRV.PING`, \
`$SRV.INFO`, `$SRV.STATS`, optionally followed by `.<name>` and `.<name>.<id>`) under the \
names {", ".join(f"`{n}`" for n in subjects.SERVICE_NAMES.values())}.
"""


def _version() -> str:
    try:
        return metadata.version("hecate")
    except metadata.PackageNotFoundError:  # running from a source tree
        return "0.0.0+unknown"


def _messages() -> tuple[Message, ...]:
    """Every message of every channel, once each."""
    seen: dict[str, Message] = {}
    for channel in CHANNELS:
        for msg in channel.messages:
            if seen.setdefault(msg.name, msg) is not msg:
                raise ValueError(f"two messages are named {msg.name!r}")
    return tuple(seen.values())


def _schemas(messages: Iterable[Message]) -> dict[str, Any]:
    types = {msg.payload for msg in messages if msg.payload is not None}
    _refs, components = msgspec.json.schema_components(
        sorted(types, key=lambda t: t.__name__), ref_template=SCHEMA_REF
    )
    clash = set(components) & set(HEADER_SCHEMAS)
    if clash:
        raise ValueError(f"header schemas named like structs: {sorted(clash)}")
    out: dict[str, Any] = dict(sorted(components.items()))
    out.update(HEADER_SCHEMAS)
    return out


def _payload(msg: Message) -> dict[str, Any]:
    if msg.payload is None:
        return {"type": "object", "description": "Always `{}`; receivers ignore the body."}
    ref = {"$ref": _ref(msg.payload.__name__)}
    if not msg.narrow:
        return ref
    return {
        "allOf": [
            ref,
            {"type": "object", "properties": dict(msg.narrow), "required": sorted(msg.narrow)},
        ]
    }


def _message(msg: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"name": msg.name, "title": msg.name, "summary": msg.summary}
    if msg.description:
        out["description"] = msg.description
    out["contentType"] = msg.content_type
    if msg.headers is not None:
        out["headers"] = {"$ref": _ref(msg.headers)}
    out["payload"] = _payload(msg)
    if msg.examples:
        out["examples"] = [_example(e) for e in msg.examples]
    return out


def _example(example: Example) -> dict[str, Any]:
    out: dict[str, Any] = {"name": example.name}
    if example.headers is not None:
        out["headers"] = dict(example.headers)
    out["payload"] = msgspec.to_builtins(example.payload)
    return out


_PLACEHOLDER = re.compile(r"\{([^{}]+)\}")


def _channel(channel: Channel) -> dict[str, Any]:
    out: dict[str, Any] = {"address": channel.address, "title": channel.title}
    out["description"] = channel.description
    out["messages"] = {
        msg.name: {"$ref": f"#/components/messages/{msg.name}"} for msg in channel.messages
    }
    names = _PLACEHOLDER.findall(channel.address or "")
    if names:
        out["parameters"] = {name: dict(PARAMETERS[name]) for name in names}
    if channel.kv is not None:
        out["x-kv"] = {"bucket": channel.kv[0], "key": channel.kv[1]}
    return out


def _message_refs(channel: Channel) -> list[dict[str, str]]:
    return [{"$ref": f"#/channels/{channel.id}/messages/{msg.name}"} for msg in channel.messages]


def _operation(op: Operation) -> dict[str, Any]:
    out: dict[str, Any] = {
        "action": op.action,
        "channel": {"$ref": f"#/channels/{op.channel.id}"},
        "summary": op.summary,
    }
    if op.description:
        out["description"] = op.description
    out["tags"] = [{"name": op.role}]
    out["messages"] = _message_refs(op.channel)
    if op.reply is not None:
        out["reply"] = {
            "channel": {"$ref": f"#/channels/{op.reply.id}"},
            "messages": _message_refs(op.reply),
        }
    if op.queue is not None:
        out["bindings"] = {"nats": {"queue": op.queue, "bindingVersion": "0.1.0"}}
    if op.own is not None:
        out["x-own-parameter"] = op.own
    return out


def asyncapi() -> dict[str, Any]:
    """The whole wire contract as an AsyncAPI 3.0.0 document (plain JSON-able data)."""
    messages = _messages()
    ids = [op.id for op in OPERATIONS]
    if len(set(ids)) != len(ids):
        raise ValueError("operation ids must be unique")
    return {
        "asyncapi": ASYNCAPI_VERSION,
        "info": {
            "title": "HECATE",
            "version": _version(),
            "description": INFO_DESCRIPTION,
            "license": {"name": "Apache-2.0"},
            "tags": [{"name": role, "description": text} for role, text in ROLES.items()],
        },
        "defaultContentType": JSON,
        "servers": {
            "local": {
                "host": LOCAL_URL.removeprefix("nats://"),
                "protocol": "nats",
                "description": f"A local nats-server with JetStream ({LOCAL_URL}), as "
                "`hecate up` starts it.",
            }
        },
        "channels": {c.id: _channel(c) for c in CHANNELS},
        "operations": {op.id: _operation(op) for op in OPERATIONS},
        "components": {
            "schemas": _schemas(messages),
            "messages": {msg.name: _message(msg) for msg in messages},
        },
    }
