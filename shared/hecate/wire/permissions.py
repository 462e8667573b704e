"""Who may do what on the bus: NATS user permissions derived from the wire contract.

Every operation in :mod:`hecate.wire.contract` names a role, an action (send or
receive) and a channel; this module turns them into one NATS user per service role
(planner, telemetry, router, breaker, operator), one per node (``node-<id>``: the
contract's ``node`` role, held to its own id) and one per tenant (the contract's
``client`` role), and renders the ``authorization`` block of a nats-server
configuration. Deriving them, rather than writing them by hand, keeps the permissions
and the contract from drifting apart: a new operation without its permission fails on
the bus at once, and a permission without an operation cannot exist.

The rules:

* **send** on a subject: publish to it (``{placeholders}`` become ``*``); **receive**:
  subscribe to it.
* **Own ids**: where an operation names its ``own`` placeholder, a node's user gets its
  own id there instead of ``*``: it joins, leaves, heartbeats and serves stages as
  itself only, while it may still forward a stage to any node.
* **Replies**: every user subscribes to its own inboxes only (``_INBOX.<user>.>``, a
  node's ``_INBOX.node.<id>.>``, see :mod:`hecate.bus.credentials`). A role that
  receives a request publishes to the inboxes of the roles that send it (a node answers
  ``_INBOX.router.>`` and, chained, ``_INBOX.node.*.>``); only the router, which answers
  tenants and streams their tokens, may publish to every inbox.
* **KV**: the role that sends to a KV channel owns its bucket (creates it, writes it);
  one that receives from it may look the bucket up, read keys and watch them, nothing
  more. JetStream's API subjects are granted per bucket, never ``$JS.API.>``.
* **Discovery**: services answer the NATS service API (``$SRV.>``) to the operator.

So a node cannot write the plan nor speak for another node, a tenant cannot publish
telemetry or failover events, and nobody but the breaker service writes breaker state.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from hecate.wire import contract, subjects
from hecate.wire.subjects import INBOX_ROOT, inbox_prefix

# One user per role, shared by the role's replicas; nodes are users of their own.
SERVICE_USERS: tuple[str, ...] = ("planner", "telemetry", "router", "breaker")
NODE = "node"  # the contract role every node user acts as; no user has this name
OPERATOR = "operator"
# The HTTP gateway: a client of the swarm (it asks for inference and cancels) that also
# observes it (events, circuits) for its page, /v1/models and readiness.
GATEWAY = "gateway"
# The contract roles each user acts as (the operator also observes events and reads
# what clients read).
ACTS_AS: dict[str, tuple[str, ...]] = {
    **{user: (user,) for user in SERVICE_USERS},
    OPERATOR: ("operator", "observer"),
    GATEWAY: ("client", "observer"),
}
DEFAULT_TENANTS: tuple[str, ...] = ("tenant-a", "tenant-b")
# The nodes of examples/swarm.json, which docker-compose.yml runs: a deployment with
# other nodes renders its own (``hecate nats-config --topology FILE``).
DEFAULT_NODES: tuple[str, ...] = ("gpu", "laptop", "desktop", "pi")
# Channels no deployment grants: fault injection exists for chaos runs only.
NOT_DEPLOYED: frozenset[str] = frozenset({contract.FAULT.id, contract.FAULT_REPLY_CHANNEL.id})
# Where a receiver subscribes wider than the channel: routers take every
# ``hecate.infer.>`` so that a malformed model id still gets a typed error reply.
SUBSCRIBED_AS: dict[str, str] = {subjects.infer("{model_id}"): subjects.INFER_ALL}
_PLACEHOLDER = re.compile(r"\{[a-z_]+\}")
_STREAM_TO = subjects.token_stream("{stream_to}")


@dataclass(frozen=True, slots=True)
class Permissions:
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]


def _subject(address: str) -> str:
    return _PLACEHOLDER.sub("*", address)


def kv_reader(bucket: str) -> list[str]:
    """Publish rights to look up, read and watch a KV bucket (its stream is KV_<bucket>)."""
    stream = f"KV_{bucket}"
    return [
        f"$JS.API.STREAM.INFO.{stream}",
        f"$JS.API.CONSUMER.CREATE.{stream}",
        f"$JS.API.CONSUMER.CREATE.{stream}.>",
        f"$JS.API.CONSUMER.INFO.{stream}.>",
        f"$JS.API.DIRECT.GET.{stream}",
        f"$JS.API.DIRECT.GET.{stream}.>",
        f"$JS.API.STREAM.MSG.GET.{stream}",
        f"$JS.FC.{stream}.>",  # flow control of a watch
    ]


def kv_owner(bucket: str) -> list[str]:
    """A reader's rights plus creating the bucket and writing its keys."""
    return [*kv_reader(bucket), f"$JS.API.STREAM.CREATE.KV_{bucket}", f"$KV.{bucket}.>"]


def _requester_inboxes(channel: contract.Channel) -> list[str]:
    """The inboxes that requests on ``channel`` come from (its senders')."""
    out = []
    for op in contract.OPERATIONS:
        if op.channel is channel and op.action == "send":
            out.append(f"{INBOX_ROOT}.>" if op.role == "client" else _inboxes_of(op.role))
    return out


def _inboxes_of(role: str) -> str:
    if role == NODE:  # every node's, and no other user's
        return f"{inbox_prefix(node_user('*'))}.>"
    for user, roles in ACTS_AS.items():
        if role in roles:
            return f"{inbox_prefix(user)}.>"
    raise ValueError(f"role {role!r} has no user")


def _from_contract(
    roles: Iterable[str], *, kv_reads_of: Iterable[str] = (), own: str = "*"
) -> Permissions:
    """``own``: the actor's own id, put where an operation names its ``own`` placeholder."""
    roles = set(roles)
    publish: list[str] = []
    subscribe: list[str] = []
    for op in contract.OPERATIONS:
        channel = op.channel
        if channel.id in NOT_DEPLOYED:
            continue
        if channel.kv is not None:
            bucket = channel.kv[0]
            if op.role in roles:
                publish += kv_owner(bucket) if op.action == "send" else kv_reader(bucket)
            elif op.role in kv_reads_of and op.action == "receive":
                publish += kv_reader(bucket)
            continue
        if op.role not in roles or channel.address is None:
            continue
        if channel.address == _STREAM_TO:  # the router streams to a tenant's inbox
            if op.action == "send":
                publish.append(f"{INBOX_ROOT}.>")
            continue  # receiving: the tenant's own inbox, granted below
        address = channel.address
        if op.own is not None:
            address = address.replace(f"{{{op.own}}}", own)
        if op.action == "send":
            publish.append(_subject(address))
        else:
            subscribe.append(_subject(SUBSCRIBED_AS.get(address, address)))
            if op.reply is not None:
                publish += _requester_inboxes(channel)
    return Permissions(tuple(_unique(publish)), tuple(_unique(subscribe)))


def _unique(items: Iterable[str]) -> list[str]:
    """Sorted, without duplicates, and without subjects a ``>`` pattern already covers."""
    seen = sorted(set(items))
    wide = [s[:-1] for s in seen if s.endswith(".>")]
    return [s for s in seen if not any(s != w + ">" and s.startswith(w) for w in wide)]


def user_permissions(user: str) -> Permissions:
    """A service role's (or the operator's) permissions."""
    if user not in ACTS_AS:
        raise ValueError(
            f"no such role user {user!r}; nodes use node_permissions(), "
            "tenants tenant_permissions()"
        )
    derived = _from_contract(ACTS_AS[user], kv_reads_of=("client",) if user == OPERATOR else ())
    publish = list(derived.publish)
    subscribe = [*derived.subscribe, f"{inbox_prefix(user)}.>"]
    if user == OPERATOR:
        publish.append("$SRV.>")  # discovery: hecate status
    elif user == GATEWAY:
        # Readiness: a router answers a ping (routers may answer any inbox: they
        # stream to callers).
        publish.append(f"$SRV.PING.{subjects.SERVICE_NAMES['router']}")
    else:
        subscribe.append("$SRV.>")
        publish.append(f"{inbox_prefix(OPERATOR)}.>")
    return Permissions(tuple(_unique(publish)), tuple(_unique(subscribe)))


def node_user(node_id: str) -> str:
    """The NATS user of one node."""
    return f"{subjects.NODE_USER_PREFIX}{node_id}"


def node_permissions(node_id: str) -> Permissions:
    """One node's permissions: join, leave and heartbeat as itself, serve its own stages
    and releases, forward a stage to any node and answer routers, other nodes (chained)
    and the operator's discovery; read the plan; hear the roll-call and its own inboxes."""
    if not subjects.SLUG.fullmatch(node_id):
        raise ValueError(f"node id {node_id!r} must match {subjects.SLUG.pattern}")
    derived = _from_contract((NODE,), own=node_id)
    user = node_user(node_id)
    publish = [*derived.publish, f"{inbox_prefix(OPERATOR)}.>"]
    subscribe = [*derived.subscribe, f"{inbox_prefix(user)}.>", "$SRV.>"]
    return Permissions(tuple(_unique(publish)), tuple(_unique(subscribe)))


def tenant_permissions(tenant: str) -> Permissions:
    """A tenant (the contract's client role): ask for inference, read the plan and the
    telemetry snapshot, and hear its own inboxes only."""
    derived = _from_contract(("client",))
    return Permissions(
        derived.publish, tuple(_unique([*derived.subscribe, f"{inbox_prefix(tenant)}.>"]))
    )


def allows(patterns: Iterable[str], subject: str) -> bool:
    """Whether NATS would let ``subject`` through ``patterns`` (``*`` one token, ``>``
    one or more trailing tokens)."""
    tokens = subject.split(".")
    for pattern in patterns:
        parts = pattern.split(".")
        for i, part in enumerate(parts):
            if part == ">":
                if len(tokens) > i:
                    return True
                break
            if i >= len(tokens) or (part != "*" and part != tokens[i]):
                break
        else:
            if len(parts) == len(tokens):
                return True
    return False


def password_variable(user: str) -> str:
    """The environment variable the server configuration reads a user's password from."""
    return f"HECATE_{user.upper().replace('-', '_')}_PASSWORD"


def users(
    tenants: Sequence[str] = DEFAULT_TENANTS, nodes: Sequence[str] = DEFAULT_NODES
) -> dict[str, Permissions]:
    """Every user, in configuration order: the roles, the operator, the nodes
    (``node-<id>`` each), then the tenants."""
    out = {user: user_permissions(user) for user in (*SERVICE_USERS, GATEWAY, OPERATOR)}
    for node_id in nodes:
        user = node_user(node_id)
        if user in out:
            raise ValueError(f"node {node_id!r} is listed twice")
        out[user] = node_permissions(node_id)
    for tenant in tenants:
        if not subjects.SLUG.fullmatch(tenant):
            raise ValueError(f"tenant {tenant!r} must match {subjects.SLUG.pattern}")
        if tenant in out or tenant == NODE:
            raise ValueError(f"tenant {tenant!r} has the name of a role")
        if tenant.startswith(subjects.NODE_USER_PREFIX):  # its inboxes would be a node's
            raise ValueError(
                f"tenant {tenant!r} starts with {subjects.NODE_USER_PREFIX!r}, "
                "which names node users"
            )
        out[tenant] = tenant_permissions(tenant)
    variables: dict[str, str] = {}
    for user in out:  # "-" and "_" read alike there: edge-1 and edge_1 would share one
        other = variables.setdefault(password_variable(user), user)
        if other != user:
            raise ValueError(f"users {other!r} and {user!r} would share a password variable")
    return out


def is_node_user(user: str) -> bool:
    return user.startswith(subjects.NODE_USER_PREFIX)


def _list(items: Sequence[str], indent: str) -> str:
    inner = "".join(f'{indent}  "{item}"\n' for item in items)
    return f"[\n{inner}{indent}]"


def render_authorization(
    tenants: Sequence[str] = DEFAULT_TENANTS, nodes: Sequence[str] = DEFAULT_NODES
) -> str:
    """The ``authorization`` block of a nats-server configuration, passwords read from
    the environment (:func:`password_variable`); the server refuses to start when one
    is missing."""
    lines = [
        "# One NATS user per HECATE service role, the operator, one per node (each may",
        "# join, leave, heartbeat and serve as itself only) and one per tenant.",
        "# Generated from the wire contract by `hecate nats-config`; regenerate, do not",
        "# edit (a test checks this file against the contract). Passwords come from the",
        "# environment of nats-server: one HECATE_<USER>_PASSWORD variable per user.",
        "authorization {",
        "  users: [",
    ]
    for user, perms in users(tenants, nodes).items():
        lines += [
            "    {",
            f"      user: {user}",
            f"      password: ${password_variable(user)}",
            "      permissions: {",
            f"        publish: {{ allow: {_list(perms.publish, '        ')} }}",
            f"        subscribe: {{ allow: {_list(perms.subscribe, '        ')} }}",
            "      }",
            "    }",
        ]
    lines += ["  ]", "}", ""]
    return "\n".join(lines)
