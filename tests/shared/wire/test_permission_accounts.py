"""The layout with one account per tenant, rendered from the wire contract and read back
as nats-server reads it (the server's own enforcement is in
tests/system/test_accounts_layout.py)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hecate.cli.main import main
from hecate.wire import contract, subjects
from hecate.wire.common import MAX_WAIT_MS
from hecate.wire.permissions import (
    GATEWAY,
    OPERATOR,
    SERVICE_USERS,
    SERVICES_ACCOUNT,
    accounts,
    allows,
    node_user,
    password_variable,
    render_accounts,
    users,
)

slugs = st.from_regex(subjects.SLUG, fullmatch=True)
tenant_names = slugs.filter(
    lambda t: t not in (*SERVICE_USERS, GATEWAY, OPERATOR, "node") and not t.startswith("node-")
)
TENANTS, NODES = ("acme", "globex"), ("gpu", "edge-1")
INFER, STREAM, CANCEL = subjects.INFER_ALL, subjects.STREAM_ALL, subjects.ROUTER_CANCEL

# -- reading the block back: the part of nats-server's configuration syntax it uses ------

_TOKEN = re.compile(r'\s+|#[^\n]*|(?P<p>[{}\[\]:,])|"(?P<s>[^"]*)"|(?P<w>[^\s{}\[\]:,"#]+)')


def _tokens(text: str) -> list[tuple[str, str]]:
    out, at = [], 0
    while at < len(text):
        found = _TOKEN.match(text, at)
        assert found is not None, text[at : at + 40]
        at = found.end()
        if found["p"] is not None:
            out.append(("p", found["p"]))
        elif found["s"] is not None:
            out.append(("v", found["s"]))
        elif found["w"] is not None:
            out.append(("v", found["w"]))
    return out


def _parse(text: str) -> dict[str, Any]:
    tokens = [*_tokens(text), ("p", "}")]  # the top level ends like a block
    at = 0

    def value() -> Any:
        nonlocal at
        kind, tok = tokens[at]
        at += 1
        if (kind, tok) == ("p", "{"):
            return mapping()
        if (kind, tok) == ("p", "["):
            items = []
            while tokens[at] != ("p", "]"):
                items.append(value())
                if tokens[at] == ("p", ","):
                    at += 1
            at += 1
            return items
        assert kind == "v", tok
        return tok

    def mapping() -> dict[str, Any]:
        nonlocal at
        out: dict[str, Any] = {}
        while tokens[at] != ("p", "}"):
            kind, key = tokens[at]
            assert kind == "v", tokens[at]
            at += 1
            if tokens[at] == ("p", ":"):  # optional before a block: `accounts {`
                at += 1
            else:
                assert tokens[at] == ("p", "{"), tokens[at]
            assert key not in out, f"{key} twice"
            out[key] = value()
            if tokens[at] == ("p", ","):
                at += 1
        at += 1
        return out

    return mapping()


LAYOUT = _parse(render_accounts(TENANTS, NODES))["accounts"]
SERVICES = LAYOUT[SERVICES_ACCOUNT]


def _users(account: dict[str, Any]) -> dict[str, dict[str, list[str]]]:
    return {
        u["user"]: {k: v["allow"] for k, v in u["permissions"].items()} for u in account["users"]
    }


def test_the_services_share_one_account_with_jetstream_and_export_what_tenants_send() -> None:
    assert list(LAYOUT) == [SERVICES_ACCOUNT, *TENANTS]
    assert SERVICES["jetstream"] == "enabled"
    assert list(_users(SERVICES)) == [
        *SERVICE_USERS,
        GATEWAY,
        OPERATOR,
        *(node_user(n) for n in NODES),
    ]
    # One answer to infer (the way back closes with it), tokens then the answer to
    # stream (the way back stays open after each), and a cancel is fire-and-forget. The
    # way back outlasts the longest quota hold.
    threshold = f"{MAX_WAIT_MS // 1000 + 120}s"
    assert SERVICES["exports"] == [
        {"service": INFER, "response_threshold": threshold},
        {"service": STREAM, "response_type": "stream", "response_threshold": threshold},
        {"service": CANCEL},
    ]
    assert "imports" not in SERVICES


def test_every_tenant_account_imports_both_services_and_may_send_only_on_them() -> None:
    for tenant in TENANTS:
        account = LAYOUT[tenant]
        assert "jetstream" not in account  # the buckets stay in the services' account
        assert "exports" not in account
        assert account["imports"] == [
            {"service": {"account": SERVICES_ACCOUNT, "subject": INFER}},
            {"service": {"account": SERVICES_ACCOUNT, "subject": STREAM}},
            {"service": {"account": SERVICES_ACCOUNT, "subject": CANCEL}},
        ]
        assert _users(account) == {
            tenant: {
                "publish": [subjects.infer("*"), CANCEL, subjects.stream("*")],
                "subscribe": [f"{subjects.inbox_prefix(tenant)}.>"],
            }
        }


def test_the_router_answers_tenants_through_the_import_and_nobody_reaches_their_inboxes() -> None:
    perms = _users(SERVICES)
    for user, p in perms.items():
        assert allows(p["publish"], "_R_.abc.1") == (user == "router"), user
        for tenant in TENANTS:
            inbox = f"{subjects.inbox_prefix(tenant)}.x.1"
            assert not allows(p["publish"], inbox), user
            assert not allows(p["subscribe"], inbox), user
    # Among themselves the roles keep what they need: the router answers the gateway
    # (inside the services' account), other routers (retries) and the operator.
    for inbox in ("_INBOX.gateway.x", "_INBOX.router.x", "_INBOX.operator.x"):
        assert allows(perms["router"]["publish"], inbox), inbox


def test_nobody_in_the_services_account_may_send_what_tenants_send() -> None:
    """A message published inside the services' account crosses no import: the server
    stamps no Nats-Request-Info on it, and a header its publisher wrote reaches the
    routers as it was written. So no user there may publish a subject tenants import,
    or it could ask, read remembered answers and cancel as any tenant."""
    layout = accounts(TENANTS, NODES)
    exported = [e.subject.replace(">", "m") for e in layout[SERVICES_ACCOUNT].exports]
    assert exported == [subjects.infer("m"), subjects.stream("m"), CANCEL]
    for user, perms in layout[SERVICES_ACCOUNT].users.items():
        for subject in exported:
            assert not allows(perms.publish, subject), (user, subject)
    # Each tenant, in its own account, may: the server stamps its account on the way.
    for tenant in TENANTS:
        for subject in exported:
            assert allows(layout[tenant].users[tenant].publish, subject), (tenant, subject)


def test_everyone_keeps_the_single_account_permissions_but_the_router_and_gateway() -> None:
    single = users(TENANTS, NODES)
    layout = accounts(TENANTS, NODES)
    services = layout[SERVICES_ACCOUNT].users
    for user, perms in services.items():
        if user not in ("router", GATEWAY):
            assert perms == single[user], user
    # The gateway sends nothing a tenant sends (it asks through the tenants' own
    # identities) and keeps everything else, its reads of the plan and telemetry too.
    gateway, was = services[GATEWAY], single[GATEWAY]
    assert gateway.subscribe == was.subscribe
    assert set(was.publish) - set(gateway.publish) == {
        subjects.infer("*"),
        CANCEL,
        subjects.stream("*"),
    }
    assert set(gateway.publish) <= set(was.publish)
    router, before = services["router"], single["router"]
    assert router.subscribe == before.subscribe
    # Every inbox becomes the inboxes of those inside the services' account it answers.
    assert set(before.publish) - set(router.publish) == {"_INBOX.>"}
    gained = set(router.publish) - set(before.publish)
    assert gained == {"_R_.>", "_INBOX.gateway.>", "_INBOX.operator.>", "_INBOX.router.>"}
    # A tenant loses only the buckets it cannot reach from its own account, and the
    # telemetry deltas read with them.
    for tenant in TENANTS:
        kept = layout[tenant].users[tenant]
        lost = set(single[tenant].subscribe) - set(kept.subscribe)
        assert lost == {subjects.TELEMETRY_DELTAS}
        assert set(kept.subscribe) <= set(single[tenant].subscribe)
        assert [s for s in single[tenant].publish if not s.startswith("$")] == list(kept.publish)


def test_each_user_appears_once_with_its_password_variable() -> None:
    text = render_accounts(TENANTS, NODES)
    for user in users(TENANTS, NODES):
        assert text.count(f"user: {user}\n") == 1, user
        assert f"password: ${password_variable(user)}\n" in text


@given(tenant=tenant_names, model=slugs)
def test_any_tenant_gets_an_account_of_its_name_whose_sends_all_cross_the_import(
    tenant: str, model: str
) -> None:
    layout = accounts((tenant,), ())
    account = layout[tenant]
    assert list(account.users) == [tenant]
    perms = account.users[tenant]
    for subject in (subjects.infer(model), CANCEL):
        assert allows(perms.publish, subject)
        assert allows(account.imports, subject)
    assert not allows(perms.publish, subjects.heartbeat(model))
    assert not allows(perms.subscribe, subjects.infer(model))


def test_the_exports_are_every_channel_the_contract_s_client_sends_on() -> None:
    exported = [e.subject for e in accounts((), ())[SERVICES_ACCOUNT].exports]
    for op in contract.OPERATIONS:
        if op.role == "client" and op.action == "send" and op.channel.kv is None:
            address = op.channel.address
            assert address is not None
            assert allows(exported, re.sub(r"\{[a-z_]+\}", "x", address)), op.id


def test_nats_config_prints_the_accounts_layout(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["nats-config", "--accounts", "--tenant", "acme", "--node", "gpu"]
    assert main(argv) == 0
    assert capsys.readouterr().out == render_accounts(("acme",), ("gpu",))
    assert main(["nats-config", "--tenant", "acme", "--node", "gpu"]) == 0
    assert "authorization {" in capsys.readouterr().out
