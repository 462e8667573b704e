"""The gateway's per-tenant identities, without a bus: reading an identity file and
keeping the gateway's own URL credentials out of a tenant's connection."""

from __future__ import annotations

from pathlib import Path

import pytest

from hecate_gateway.identities import NoIdentity, TenantLinks, read_env_file, without_userinfo


def test_an_identity_file_is_read_as_hecate_up_writes_it(tmp_path: Path) -> None:
    path = tmp_path / "tenant-a.env"
    path.write_text(
        "# tenant-a\nexport HECATE_NATS_USER=tenant-a\n\nHECATE_NATS_PASSWORD=p=q\nnoise\n"
    )
    assert read_env_file(path) == {"HECATE_NATS_USER": "tenant-a", "HECATE_NATS_PASSWORD": "p=q"}


def test_the_gateways_own_url_credentials_never_reach_a_tenants_connection() -> None:
    url = "nats://gw:secret@10.0.0.1:4222, tls://gw:secret@nats-2:4222,nats://nats-3:4222"
    assert without_userinfo(url) == "nats://10.0.0.1:4222,tls://nats-2:4222,nats://nats-3:4222"


async def test_a_tenant_without_an_identity_file_or_with_anothers_is_refused(
    tmp_path: Path,
) -> None:
    (tmp_path / "tenant-b.env").write_text("export HECATE_NATS_USER=tenant-a\n")
    links = TenantLinks(own=None, directory=tmp_path)  # type: ignore[arg-type]
    for tenant, why in (
        ("tenant-a", "no bus identity for tenant 'tenant-a'"),
        ("tenant-b", "the identity of 'tenant-a', not of tenant 'tenant-b'"),
        ("../etc", "not a name an identity file can have"),
    ):
        with pytest.raises(NoIdentity, match=why):
            await links.client(tenant)
