"""Whom a request acts for (routing/identity.py), without a bus."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from hecate_router.identity import REQUEST_INFO, UNNAMED, Refused, tenant_of, vouched_account

names = st.sampled_from(["tenant-a", "tenant-b", "default", "", "acme"])


def stamped(account: str) -> dict[str, str]:
    return {REQUEST_INFO: json.dumps({"acc": account, "rtt": 1000})}


@given(named=names, vouched=st.none() | names.filter(bool))
def test_the_body_names_the_tenant_only_on_the_open_bus(named: str, vouched: str | None) -> None:
    headers = stamped(vouched) if vouched else {}
    assert tenant_of("body", headers, named) == named
    got = tenant_of("bus", headers, named)
    if vouched is None:
        assert isinstance(got, Refused)
        assert got.vouched is None
    elif named in UNNAMED or named == vouched:
        assert got == vouched
    else:
        assert isinstance(got, Refused)
        assert got.vouched == vouched
        assert repr(named) in got.message
        assert repr(vouched) in got.message


@given(st.text(max_size=40))
def test_a_header_not_as_the_server_writes_it_vouches_for_nobody(raw: str) -> None:
    try:
        info = json.loads(raw)
    except ValueError:
        info = None
    got = vouched_account({REQUEST_INFO: raw})
    if not (isinstance(info, dict) and isinstance(info.get("acc"), str) and info["acc"]):
        assert got is None


def test_the_server_header_names_the_account() -> None:
    assert vouched_account(stamped("tenant-a")) == "tenant-a"
    assert vouched_account({}) is None
    assert vouched_account({REQUEST_INFO: '{"acc": ""}'}) is None
    assert vouched_account({REQUEST_INFO: "[1]"}) is None
    assert vouched_account({REQUEST_INFO: '{"acc": 7}'}) is None
    # As nats-server 2.15 writes it: a dozen fields, the account among them.
    server = (
        '{"start":"2026-12-01T03:57:54.1Z","host":"127.0.0.1","id":12,"acc":"tenant-b",'
        '"user":"tenant-b","lang":"python3","ver":"2.9.0","rtt":195000,'
        '"server":"NB7","kind":"Client","client_type":"nats"}'
    )
    assert vouched_account({REQUEST_INFO: server}) == "tenant-b"
