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

Two layouts render these users. :func:`render_authorization`: one account for everyone
(an ``authorization`` block), where a tenant is only what a request's body says.
:func:`render_accounts`: an ``accounts`` block with the services in one account and one
account per tenant, importing the channels tenants send on as services, so the server
names the requesting tenant on every request (``Nats-Request-Info``) and no client can
forge it; routers run with ``--tenant-from bus`` there.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from hecate.wire import contract, subjects
from hecate.wire.common import MAX_WAIT_MS
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
# Channels that are the swarm's state as the buckets are, read with them: granted only
# where the buckets are (not in a tenant's own account), and to whoever reads what
# clients read (the operator) as to the clients.
READ_WITH_BUCKETS: frozenset[str] = frozenset({contract.TELEMETRY_DELTAS.id})
# Where a receiver subscribes wider than the channel: routers take every
# ``hecate.infer.>`` so that a malformed model id still gets a typed error reply.
SUBSCRIBED_AS: dict[str, str] = {
    subjects.infer("{model_id}"): subjects.INFER_ALL,
    subjects.stream("{model_id}"): subjects.STREAM_ALL,
}
# Channels the server maps to other subjects (:data:`subjects.MAPPINGS`): it checks a
# publisher's permissions against the subject it maps to, so a sender needs both, and a
# receiver hears the mapped one (and the unmapped one, on a server without the mapping).
MAPPED_AS: dict[str, str] = {
    subjects.heartbeat("{node_id}"): subjects.intake("*", "{node_id}"),
}
_PLACEHOLDER = re.compile(r"\{[a-z_]+\}")
# Where nats-server maps the reply subject of a request crossing a service import: the
# responder publishes there, and the server passes it on to the requester's inbox.
REPLY_MAPPING = "_R_"
# The account every service, the gateway, the operator and the nodes share (upper case:
# no tenant, a slug, can take its name).
SERVICES_ACCOUNT = "HECATE"
# How long nats-server keeps the way back to a tenant open with no answer on it (after
# the request, or after a streamed token): the longest a request may be held for its
# quota slot, plus nats-server's own default (two minutes) for the generation itself.
# Past it an answer would be lost on its way, so it must outlast any router's wait.
RESPONSE_THRESHOLD_S = MAX_WAIT_MS // 1000 + 120


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


def _requester_inboxes(channel: contract.Channel, *, accounts: bool) -> list[str]:
    """The inboxes that requests on ``channel`` come from (its senders'). With
    ``accounts``, a tenant's request crosses a service import and is answered on the
    reply subject the server mapped for it (``_R_.…``), never on the tenant's inbox; only
    the clients inside the services' account (the gateway) are answered on their own."""
    out = []
    for op in contract.OPERATIONS:
        if op.channel is channel and op.action == "send":
            if op.role != "client":
                out.append(_inboxes_of(op.role))
            elif accounts:
                out += [_inboxes_of(op.role), f"{REPLY_MAPPING}.>"]
            else:
                out.append(f"{INBOX_ROOT}.>")
    return out


def _inboxes_of(role: str) -> str:
    if role == NODE:  # every node's, and no other user's
        return f"{inbox_prefix(node_user('*'))}.>"
    for user, roles in ACTS_AS.items():
        if role in roles:
            return f"{inbox_prefix(user)}.>"
    raise ValueError(f"role {role!r} has no user")


def _from_contract(
    roles: Iterable[str],
    *,
    kv_reads_of: Iterable[str] = (),
    own: str = "*",
    accounts: bool = False,
    jetstream: bool = True,
) -> Permissions:
    """``own``: the actor's own id, put where an operation names its ``own`` placeholder.
    ``accounts``: for the layout with an account per tenant, where tokens stream on the
    request's reply path only; ``jetstream`` False: in an account without the buckets."""
    roles = set(roles)
    publish: list[str] = []
    subscribe: list[str] = []
    for op in contract.OPERATIONS:
        channel = op.channel
        if channel.id in NOT_DEPLOYED:
            continue
        if channel.kv is not None:
            if not jetstream:
                continue
            bucket = channel.kv[0]
            if op.role in roles:
                publish += kv_owner(bucket) if op.action == "send" else kv_reader(bucket)
            elif op.role in kv_reads_of and op.action == "receive":
                publish += kv_reader(bucket)
            continue
        reader = False
        if channel.id in READ_WITH_BUCKETS:
            if not jetstream:
                continue
            reader = op.role in kv_reads_of and op.action == "receive"
        if (op.role not in roles and not reader) or channel.address is None:
            continue
        address = channel.address
        mapped = MAPPED_AS.get(address)
        if op.own is not None:
            address = address.replace(f"{{{op.own}}}", own)
            mapped = mapped and mapped.replace(f"{{{op.own}}}", own)
        if op.action == "send":
            publish += [_subject(a) for a in (address, mapped) if a]
        else:
            subscribe.append(_subject(SUBSCRIBED_AS.get(address, address)))
            if mapped:
                subscribe.append(_subject(mapped))
            if op.reply is not None:
                publish += _requester_inboxes(channel, accounts=accounts)
    return Permissions(tuple(_unique(publish)), tuple(_unique(subscribe)))


def _unique(items: Iterable[str]) -> list[str]:
    """Sorted, without duplicates, and without subjects a ``>`` pattern already covers."""
    seen = sorted(set(items))
    wide = [s[:-1] for s in seen if s.endswith(".>")]
    return [s for s in seen if not any(s != w + ">" and s.startswith(w) for w in wide)]


def acts_as(user: str, *, accounts: bool = False) -> tuple[str, ...]:
    """The contract roles ``user`` acts as. In the layout with an account per tenant the
    gateway is an observer only: a request published inside the services' account
    crosses no import, so the server stamps no ``Nats-Request-Info`` on it and a header
    its publisher wrote would reach the routers untouched. Nobody in that account may
    send what tenants send; the gateway asks through each tenant's own identity
    (``--tenant-identities``)."""
    roles = ACTS_AS[user]
    if accounts and user == GATEWAY:
        return tuple(r for r in roles if r != "client")
    return roles


def user_permissions(user: str, *, accounts: bool = False) -> Permissions:
    """A service role's (or the operator's) permissions; ``accounts``: in the services'
    account of the layout with an account per tenant."""
    if user not in ACTS_AS:
        raise ValueError(
            f"no such role user {user!r}; nodes use node_permissions(), "
            "tenants tenant_permissions()"
        )
    # The operator, and the gateway where it sends nothing as a client, still read
    # what clients read (the plan, the telemetry snapshot).
    reads_as_client = user == OPERATOR or (user == GATEWAY and accounts)
    derived = _from_contract(
        acts_as(user, accounts=accounts),
        kv_reads_of=("client",) if reads_as_client else (),
        accounts=accounts,
    )
    publish = list(derived.publish)
    subscribe = [*derived.subscribe, f"{inbox_prefix(user)}.>"]
    if user == OPERATOR:
        publish.append("$SRV.>")  # discovery: hecate status
    elif user == GATEWAY:
        # Readiness: a router answers a ping (routers answer the gateway's inboxes:
        # it asks them as a client).
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


def tenant_permissions(tenant: str, *, accounts: bool = False) -> Permissions:
    """A tenant (the contract's client role): ask for inference, read the plan and the
    telemetry snapshot (not in its own account, ``accounts``: the buckets live in the
    services' account), and hear its own inboxes only."""
    derived = _from_contract(("client",), accounts=accounts, jetstream=not accounts)
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
        if is_node_user(tenant):  # its inboxes would be a node's
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
        "# The server's configuration also carries the subject mappings (heartbeat",
        "# partitions, hecate.wire.subjects.MAPPINGS), as `hecate up` writes them.",
        "authorization {",
        "  users: [",
    ]
    for user, perms in users(tenants, nodes).items():
        lines += _user_block(user, perms, "    ")
    lines += ["  ]", "}", ""]
    return "\n".join(lines)


def _user_block(user: str, perms: Permissions, indent: str) -> list[str]:
    inner, lists = indent + "  ", indent + "    "
    return [
        f"{indent}{{",
        f"{inner}user: {user}",
        f"{inner}password: ${password_variable(user)}",
        f"{inner}permissions: {{",
        f"{lists}publish: {{ allow: {_list(perms.publish, lists)} }}",
        f"{lists}subscribe: {{ allow: {_list(perms.subscribe, lists)} }}",
        f"{inner}}}",
        f"{indent}}}",
    ]


# -- one account per tenant --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Export:
    """A subject tenants send on, served from the services' account."""

    subject: str
    streamed: bool  # answered with many messages (tokens, then the reply), not one
    answered: bool = True  # False: fire-and-forget


@dataclass(frozen=True, slots=True)
class Account:
    users: Mapping[str, Permissions]
    exports: tuple[Export, ...] = ()
    imports: tuple[str, ...] = ()  # subjects the services' account exports
    jetstream: bool = False


def service_exports() -> tuple[Export, ...]:
    """Every channel the contract's client sends on, as its receivers subscribe to it
    (routers take all of ``hecate.infer.>``). One whose answer carries tokens before the
    reply is a streamed service (a singleton one would let the first message through
    only, and close the way back); one with a single answer is a singleton service (the
    server forgets the way back once answered); one without is fire-and-forget."""
    out: list[Export] = []
    for op in contract.OPERATIONS:
        channel = op.channel
        if op.role != "client" or op.action != "send" or channel.id in NOT_DEPLOYED:
            continue
        if channel.kv is not None or channel.address is None:
            continue
        subject = _subject(SUBSCRIBED_AS.get(channel.address, channel.address))
        answers = op.reply.messages if op.reply is not None else ()
        streamed = contract.STREAM_TOKEN in answers
        out.append(Export(subject, streamed=streamed, answered=op.reply is not None))
    return tuple(out)


def accounts(
    tenants: Sequence[str] = DEFAULT_TENANTS, nodes: Sequence[str] = DEFAULT_NODES
) -> dict[str, Account]:
    """The services' account (:data:`SERVICES_ACCOUNT`, with JetStream) holding every
    role's user, the gateway's, the operator's and one per node, exporting
    :func:`service_exports`; then one account per tenant, named as the tenant (the
    router reads the tenant from the account the server names), holding the tenant's
    user and importing every export.

    A tenant's user may send what the contract's client sends, less the KV reads: its
    account holds no JetStream, so in this layout a tenant cannot read the plan or the
    telemetry snapshot (``hecate status`` runs as the operator). Everyone keeps the
    permissions of the single-account layout (:func:`users`), except that a responder
    to a tenant's request answers on the reply subject the server mapped (``_R_.>``)
    instead of any inbox (no service may publish into a tenant's account otherwise),
    and that the gateway sends nothing tenants send (:func:`acts_as`): inside the
    services' account nobody can be taken for a tenant."""
    everyone = users(tenants, nodes)  # names checked as in the single-account layout
    services: dict[str, Permissions] = {
        user: user_permissions(user, accounts=True) for user in (*SERVICE_USERS, GATEWAY, OPERATOR)
    }
    services.update({node_user(n): everyone[node_user(n)] for n in nodes})
    exports = service_exports()
    out = {SERVICES_ACCOUNT: Account(services, exports=exports, jetstream=True)}
    for tenant in tenants:
        out[tenant] = Account(
            {tenant: tenant_permissions(tenant, accounts=True)},
            imports=tuple(e.subject for e in exports),
        )
    return out


def render_accounts(
    tenants: Sequence[str] = DEFAULT_TENANTS, nodes: Sequence[str] = DEFAULT_NODES
) -> str:
    """The ``accounts`` block of a nats-server configuration (:func:`accounts`),
    passwords read from the environment as in :func:`render_authorization`."""
    lines = [
        f"# The services in one account ({SERVICES_ACCOUNT}: JetStream, one NATS user per",
        "# role, the gateway, the operator and one per node) and one account per tenant,",
        "# importing what tenants send on as services: the server names the tenant of",
        "# every request (Nats-Request-Info), and routers run with --tenant-from bus.",
        "# Tenants cannot read the plan or telemetry buckets (JetStream stays in the",
        "# services' account). Generated from the wire contract by",
        "# `hecate nats-config --accounts`; regenerate, do not edit (a test checks this",
        "# file against the contract). Passwords come from the environment of",
        "# nats-server: one HECATE_<USER>_PASSWORD variable per user.",
        "accounts {",
    ]
    for name, account in accounts(tenants, nodes).items():
        lines.append(f'  "{name}": {{')
        if account.jetstream:
            lines.append("    jetstream: enabled")
            lines += subjects.render_mappings("    ").splitlines()
        lines.append("    users: [")
        for user, perms in account.users.items():
            lines += _user_block(user, perms, "      ")
        lines.append("    ]")
        if account.exports:
            lines.append("    exports: [")
            for export in account.exports:
                kind = ", response_type: stream" if export.streamed else ""
                if export.answered:
                    kind += f', response_threshold: "{RESPONSE_THRESHOLD_S}s"'
                lines.append(f'      {{ service: "{export.subject}"{kind} }}')
            lines.append("    ]")
        if account.imports:
            lines.append("    imports: [")
            for subject in account.imports:
                source = f'account: "{SERVICES_ACCOUNT}", subject: "{subject}"'
                lines.append(f"      {{ service: {{ {source} }} }}")
            lines.append("    ]")
        lines.append("  }")
    lines += ["}", ""]
    return "\n".join(lines)
