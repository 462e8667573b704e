"""Every NATS subject, queue group and KV bucket HECATE uses, built in one place.

Model and node ids are slugs (``^[a-z0-9][a-z0-9_-]{0,63}$``): one subject token each,
valid KV keys, no wildcard or separator characters. Anything else is refused at the
edge (:func:`model_from_infer_subject`).
"""

from __future__ import annotations

import re

from hecate.core.plan import SLUG_PATTERN

SLUG = re.compile(SLUG_PATTERN)

# -- inference (clients -> routers) ---------------------------------------------------
INFER_PREFIX = "hecate.infer"
INFER_ALL = f"{INFER_PREFIX}.>"  # ">" so that malformed ids still get a typed error reply
# The same requests, answered with each generated token before the reply. A subject of
# their own because a tenant's account imports it as a streamed service (the server
# keeps the way back open after each message) and hecate.infer as a singleton one (the
# way back closes with the one reply).
STREAM_PREFIX = "hecate.stream"
STREAM_ALL = f"{STREAM_PREFIX}.>"
ROUTER_QUEUE = "hecate-routers"


ROUTER_RETRIES = "hecate.router.retries"  # every replica listens (no queue group)
# A caller gave up on a request: every replica listens, the one running it acts.
ROUTER_CANCEL = "hecate.router.cancel"


def infer(model_id: str) -> str:
    return f"{INFER_PREFIX}.{model_id}"


def stream(model_id: str) -> str:
    """Where a request asks for its tokens streamed before its reply."""
    return f"{STREAM_PREFIX}.{model_id}"


def is_stream(subject: str) -> bool:
    return subject.startswith(STREAM_PREFIX + ".")


def model_from_infer_subject(subject: str) -> str | None:
    """The model id of an inference subject (streamed or not), or None when it is not a
    single slug."""
    prefix = STREAM_PREFIX if is_stream(subject) else INFER_PREFIX
    tail = subject[len(prefix) + 1 :] if subject.startswith(prefix + ".") else ""
    return tail if SLUG.fullmatch(tail) else None


# -- inboxes ---------------------------------------------------------------------------
INBOX_ROOT = "_INBOX"


NODE_USER_PREFIX = "node-"  # a node's NATS user is node-<its id>


def inbox_prefix(user: str) -> str:
    """Where a connection's reply inboxes live: ``_INBOX.<user>`` for a named NATS user
    (whose permissions let it subscribe there only), plain ``_INBOX`` for an anonymous one.
    A node's user (``node-<id>``) has them under ``_INBOX.node.<id>``: one grant,
    ``_INBOX.node.*.>``, then lets a node answer any other in a chain, and each node still
    hears its own only."""
    if user.startswith(NODE_USER_PREFIX):
        return f"{INBOX_ROOT}.node.{user.removeprefix(NODE_USER_PREFIX)}"
    return f"{INBOX_ROOT}.{user}" if user else INBOX_ROOT


# -- nodes -----------------------------------------------------------------------------
def node_run(node_id: str) -> str:
    """Stage execution requests for one node (routers pick the node; no queue group)."""
    return f"hecate.node.{node_id}.run"


def node_release(node_id: str) -> str:
    """Sessions a router is done with: the node drops their KV caches."""
    return f"hecate.node.{node_id}.release"


def node_fault(node_id: str) -> str:
    """Fault injection for chaos runs; a node listens only when started with
    ``--accept-faults`` (never in production)."""
    return f"hecate.node.{node_id}.fault"


# A node speaks for itself only: its join, leave and heartbeats carry its id in the
# subject, where the bus can hold it to its own (a node's user may publish there and
# nowhere else of the kind), and the receivers check the body names the same node.
def node_join(node_id: str) -> str:
    """A node announces itself (on start and on every roll-call)."""
    return f"hecate.node.{node_id}.join"


def node_leave(node_id: str) -> str:
    """A node leaves (drain on shutdown)."""
    return f"hecate.node.{node_id}.leave"


def node_kept(node_id: str) -> str:
    """What a node's first stages newly keep and dropped of prompt prefixes (its news,
    :mod:`hecate.wire.kept`), for every router replica."""
    return f"hecate.node.{node_id}.kept"


def node_kept_whole(node_id: str) -> str:
    """Request/reply: the whole of what a node's first stages keep, for a router that
    starts following it or missed a news."""
    return f"hecate.node.{node_id}.kept.whole"


NODE_KEPT_ALL = "hecate.node.*.kept"
NODE_JOIN_ALL = "hecate.node.*.join"
NODE_LEAVE_ALL = "hecate.node.*.leave"
NODE_ROLL_CALL = "hecate.node.roll-call"  # a (re)started planner asks nodes to re-join


def heartbeat(node_id: str) -> str:
    return f"hecate.telemetry.heartbeat.{node_id}"


HEARTBEAT_ALL = "hecate.telemetry.heartbeat.*"

# Heartbeat intake, spread over telemetry replicas. The server maps every heartbeat
# subject to one of INTAKE_PARTITIONS intake subjects by a hash of the node id (its
# ``partition`` mapping function), so a node's beats always reach the same partition,
# and so the same replica: failure detection stays per node with no replica hearing
# every beat. A replica takes the partitions ``p`` with ``p % shards == shard``.
# Sixteen partitions allow up to sixteen replicas; changing the number re-homes nodes.
INTAKE_PARTITIONS = 16
INTAKE_ALL = "hecate.telemetry.intake.*.*"


def intake(partition: int | str, node_id: str = "*") -> str:
    """The subject the server delivers ``node_id``'s heartbeats on, in ``partition``."""
    return f"hecate.telemetry.intake.{partition}.{node_id}"


# Subject mappings every HECATE server carries (nats-server's ``mappings`` block): the
# publisher's subject on the left, what subscribers see (and what the server checks the
# publisher's permissions against) on the right.
MAPPINGS = {
    HEARTBEAT_ALL: intake(f"{{{{partition({INTAKE_PARTITIONS},1)}}}}", "{{wildcard(1)}}"),
}


def render_mappings(indent: str = "") -> str:
    """:data:`MAPPINGS` as a nats-server configuration block."""
    inner = "".join(f'{indent}  "{src}": "{dst}"\n' for src, dst in MAPPINGS.items())
    return f"{indent}mappings {{\n{inner}{indent}}}\n"


def shard_partitions(shard: int, shards: int) -> tuple[int, ...]:
    """The intake partitions telemetry replica ``shard`` of ``shards`` takes."""
    if not 0 < shards <= INTAKE_PARTITIONS or not 0 <= shard < shards:
        raise ValueError(f"shard {shard} of {shards}: need 0 <= shard < shards <= 16")
    return tuple(p for p in range(INTAKE_PARTITIONS) if p % shards == shard)


def node_of(subject: str) -> str | None:
    """The node id a node's own subject names (a join, a leave, its news of the prefixes
    kept or a heartbeat), or None
    when it names none that is a slug."""
    tokens = subject.split(".")
    own = ("join", "leave", "kept")
    if len(tokens) == 4 and tokens[:2] == ["hecate", "node"] and tokens[3] in own:
        found = tokens[2]
    elif len(tokens) == 4 and tokens[:3] == ["hecate", "telemetry", "heartbeat"]:
        found = tokens[3]
    elif len(tokens) == 5 and tokens[:3] == ["hecate", "telemetry", "intake"]:
        found = tokens[4]
    else:
        return None
    return found if SLUG.fullmatch(found) else None


# -- circuit breakers -------------------------------------------------------------------
def breaker_report(target: str) -> str:
    """Outcomes of calls to ``target`` (a node id, or ``upstream-<name>``), from routers."""
    return f"hecate.breaker.report.{target}"


BREAKER_REPORT_ALL = "hecate.breaker.report.*"
# Request/reply: the single HALF_OPEN probe of a circuit, granted by the breaker service
# (the only writer of breaker state) to exactly one router.
BREAKER_PROBE = "hecate.breaker.probe"
QUOTA_ACQUIRE = "hecate.quota.acquire"  # request/reply: one shared budget per tenant

# -- events ----------------------------------------------------------------------------
EVENT_FAILOVER = "hecate.events.failover"
EVENT_PLAN = "hecate.events.plan"
EVENT_NODE_DOWN = "hecate.events.node.down"
EVENT_NODE_UP = "hecate.events.node.up"
EVENT_BREAKER = "hecate.events.breaker"
EVENT_RESTARTED = "hecate.events.restarted"  # a launcher started a service again
EVENTS_ALL = "hecate.events.>"

# -- KV buckets (one owner each: the planner writes the plan, telemetry the snapshot) ---
PLAN_BUCKET = "hecate-plan"
PLAN_KEY = "current"


def assignment_key(node_id: str) -> str:
    """The key, in the plan bucket, of what the plan gives ``node_id``."""
    return f"node.{node_id}"


TELEMETRY_BUCKET = "hecate-telemetry"


def telemetry_key(shard: int | str) -> str:
    """The key of telemetry replica ``shard``'s snapshot (its own nodes only)."""
    return f"snapshot.{shard}"


TELEMETRY_KEYS = telemetry_key("*")  # every shard's


def telemetry_lease_key(shard: int | str) -> str:
    """The key of the lease saying which replica speaks for telemetry shard ``shard``."""
    return f"lease.{shard}"


def telemetry_delta(shard: int | str) -> str:
    """Where telemetry replica ``shard`` publishes what changed between its snapshots."""
    return f"hecate.telemetry.delta.{shard}"


TELEMETRY_DELTAS = telemetry_delta("*")  # every shard's, as followers subscribe
BREAKER_BUCKET = "hecate-breakers"  # one key per target; owner: the breaker service
# History kept per bucket, whoever creates it first: ten plans for post-mortems, and
# only the latest telemetry snapshot (each replica's, rewritten every few seconds).
BUCKET_HISTORY = {PLAN_BUCKET: 10, TELEMETRY_BUCKET: 1, BREAKER_BUCKET: 5}

# -- service names on the NATS service API ($SRV.PING/INFO/STATS) -----------------------
SERVICE_NAMES = {
    "planner": "hecate-planner",
    "telemetry": "hecate-telemetry",
    "router": "hecate-router",
    "node": "hecate-node",
    "breaker": "hecate-breaker",
}
