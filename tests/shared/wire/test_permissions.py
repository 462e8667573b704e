"""The NATS permissions derived from the wire contract, checked without a server (the
server's own enforcement is in tests/system/test_permissions.py)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hecate.bus.credentials import Credentials
from hecate.wire import contract, subjects
from hecate.wire.permissions import (
    DEFAULT_NODES,
    DEFAULT_TENANTS,
    NOT_DEPLOYED,
    OPERATOR,
    SERVICE_USERS,
    allows,
    node_permissions,
    node_user,
    password_variable,
    render_authorization,
    tenant_permissions,
    user_permissions,
    users,
)

slugs = st.from_regex(subjects.SLUG, fullmatch=True)
ALL = users()


def _user_of(role: str) -> list[str]:
    if role == "client":
        return list(DEFAULT_TENANTS)
    if role == "node":
        return [node_user(n) for n in DEFAULT_NODES]
    return [role]


@given(slug=slugs)
def test_every_operation_of_the_contract_is_granted_to_its_role(slug: str) -> None:
    for op in contract.OPERATIONS:
        channel = op.channel
        if channel.id in NOT_DEPLOYED or channel.address is None:
            continue
        who = [OPERATOR] if op.role in {"observer", "operator"} else _user_of(op.role)
        for user in who:
            # A node's own id goes where the operation says it acts as itself.
            own = user.removeprefix("node-") if op.own is not None else slug
            subject = re.sub(r"\{[a-z_]+\}", own, channel.address)
            perms = ALL[user]
            if channel.kv is not None:
                bucket = channel.kv[0]
                info = f"$JS.API.STREAM.INFO.KV_{bucket}"
                assert allows(perms.publish, info), (user, op.id)
                assert allows(perms.publish, subject) == (op.action == "send"), (user, op.id)
            elif op.action == "send":
                assert allows(perms.publish, subject), (user, op.id, subject)
            else:
                assert allows(perms.subscribe, subject), (user, op.id, subject)


@pytest.mark.parametrize(
    ("bucket", "owner"),
    [
        (subjects.PLAN_BUCKET, "planner"),
        (subjects.TELEMETRY_BUCKET, "telemetry"),
        (subjects.BREAKER_BUCKET, "breaker"),
    ],
)
def test_each_bucket_has_one_writer_and_one_creator(bucket: str, owner: str) -> None:
    writers = [u for u, p in ALL.items() if allows(p.publish, f"$KV.{bucket}.anything")]
    creators = [
        u for u, p in ALL.items() if allows(p.publish, f"$JS.API.STREAM.CREATE.KV_{bucket}")
    ]
    assert writers == [owner]
    assert creators == [owner]


def test_no_user_holds_the_whole_jetstream_api_or_every_subject() -> None:
    for user, perms in ALL.items():
        for pattern in (*perms.publish, *perms.subscribe):
            assert pattern not in {">", "$JS.>", "$JS.API.>", "$KV.>", "hecate.>"}, user
        assert not allows(perms.publish, "$JS.API.STREAM.DELETE.KV_hecate-plan"), user
        assert not allows(perms.publish, "$JS.API.STREAM.PURGE.KV_hecate-plan"), user


@given(tenant=slugs.filter(lambda t: t not in (*SERVICE_USERS, OPERATOR, "node")), other=slugs)
def test_a_tenant_hears_its_own_inboxes_only(tenant: str, other: str) -> None:
    perms = tenant_permissions(tenant)
    assert allows(perms.subscribe, f"_INBOX.{tenant}.abc.1")
    if other != tenant:
        assert not allows(perms.subscribe, f"_INBOX.{other}.abc.1")
    assert not allows(perms.subscribe, subjects.infer("ncm-base"))
    assert not allows(perms.publish, subjects.heartbeat(other))
    assert not allows(perms.publish, subjects.EVENT_FAILOVER)
    assert not allows(perms.publish, subjects.node_run(other))
    assert allows(perms.publish, subjects.infer(other))


def test_only_the_router_publishes_to_any_inbox_and_nobody_injects_faults() -> None:
    anywhere = [u for u, p in ALL.items() if allows(p.publish, "_INBOX.tenant-a.x.1")]
    assert anywhere == ["router"]
    assert not [u for u, p in ALL.items() if allows(p.publish, subjects.node_fault("gpu"))]
    # Nodes answer the routers (and each other, chained) only.
    node = node_permissions("gpu")
    assert allows(node.publish, "_INBOX.router.x.router-1.7-2")
    assert allows(node.publish, "_INBOX.node.laptop.relay.x")
    assert not allows(node.publish, "_INBOX.tenant-a.x")
    assert not allows(node.publish, "_INBOX.node-laptop.x")


@given(me=slugs, other=slugs)
def test_a_node_joins_leaves_heartbeats_and_serves_as_itself_only(me: str, other: str) -> None:
    perms = node_permissions(me)
    mine = [subjects.node_join(me), subjects.node_leave(me), subjects.heartbeat(me)]
    assert all(allows(perms.publish, s) for s in mine)
    assert allows(perms.subscribe, subjects.node_run(me))
    assert allows(perms.subscribe, subjects.node_release(me))
    assert allows(perms.subscribe, f"{subjects.inbox_prefix(node_user(me))}.abc.1")
    assert allows(perms.publish, subjects.node_run(other))  # a chained stage goes anywhere
    assert allows(perms.publish, f"{subjects.inbox_prefix(node_user(other))}.relay.1")
    if other == me:
        return
    for theirs in (subjects.node_join(other), subjects.node_leave(other)):
        assert not allows(perms.publish, theirs), theirs
    assert not allows(perms.publish, subjects.heartbeat(other))
    assert not allows(perms.subscribe, subjects.node_run(other))
    assert not allows(perms.subscribe, subjects.node_release(other))
    assert not allows(perms.subscribe, f"{subjects.inbox_prefix(node_user(other))}.abc.1")
    assert not allows(perms.subscribe, subjects.NODE_JOIN_ALL)


def test_only_the_node_itself_may_speak_as_it() -> None:
    for node_id in DEFAULT_NODES:
        for subject in (
            subjects.node_join(node_id),
            subjects.node_leave(node_id),
            subjects.heartbeat(node_id),
        ):
            speakers = [u for u, p in ALL.items() if allows(p.publish, subject)]
            assert speakers == [node_user(node_id)], (subject, speakers)
    assert "node" not in ALL  # no user speaks for every node


@given(node_id=slugs)
def test_every_node_id_makes_a_user_with_inboxes_of_its_own(node_id: str) -> None:
    creds = Credentials(user=node_user(node_id), password="p")
    assert creds.inbox_prefix == f"_INBOX.node.{node_id}"
    assert subjects.node_of(subjects.node_join(node_id)) == node_id
    assert subjects.node_of(subjects.node_leave(node_id)) == node_id
    assert subjects.node_of(subjects.heartbeat(node_id)) == node_id
    assert subjects.node_of(subjects.node_run(node_id)) is None


def test_node_of_names_no_node_for_other_subjects() -> None:
    for subject in (subjects.NODE_ROLL_CALL, "hecate.node.Bad.join", "hecate.node.join", ""):
        assert subjects.node_of(subject) is None


def test_a_tenant_cannot_take_a_node_user_s_name_and_a_node_is_listed_once() -> None:
    with pytest.raises(ValueError, match="names node users"):
        users(("node-gpu",), ())
    with pytest.raises(ValueError, match="name of a role"):
        users(("node",), ())
    with pytest.raises(ValueError, match="listed twice"):
        users((), ("gpu", "gpu"))
    with pytest.raises(ValueError, match="must match"):
        node_permissions("Bad Id")
    with pytest.raises(ValueError, match="share a password variable"):
        users((), ("edge-1", "edge_1"))
    with pytest.raises(ValueError, match="node_permissions"):
        user_permissions("node")


@pytest.mark.parametrize(
    ("patterns", "subject", "expected"),
    [
        (["a.b"], "a.b", True),
        (["a.b"], "a.b.c", False),
        (["a.*"], "a.b", True),
        (["a.*"], "a.b.c", False),
        (["a.>"], "a", False),
        (["a.>"], "a.b.c", True),
        (["a.*.c"], "a.b.c", True),
        (["a.*.c"], "a.b.d", False),
        ([], "a", False),
    ],
)
def test_subject_matching(patterns: list[str], subject: str, expected: bool) -> None:
    assert allows(patterns, subject) is expected


def test_the_rendered_block_names_every_user_once_with_its_password_variable() -> None:
    text = render_authorization(("acme",), ("gpu", "edge-1"))
    for user in (*SERVICE_USERS, OPERATOR, "acme", "node-gpu", "node-edge-1"):
        assert text.count(f"user: {user}\n") == 1
        assert f"password: ${password_variable(user)}" in text
    assert password_variable("tenant-a") == "HECATE_TENANT_A_PASSWORD"
    assert password_variable("node-edge-1") == "HECATE_NODE_EDGE_1_PASSWORD"
    assert "user: node\n" not in text


def test_a_tenant_named_like_a_role_or_not_a_slug_is_refused() -> None:
    with pytest.raises(ValueError, match="name of a role"):
        users(("router",))
    with pytest.raises(ValueError, match="must match"):
        users(("Bad Name",))
