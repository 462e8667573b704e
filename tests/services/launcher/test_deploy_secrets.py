"""What `hecate nats-config --secrets` writes runs a real server: its accounts and its
certificate, for the deployment's name `nats`, with a user's env file to log in."""

from __future__ import annotations

import ssl
from pathlib import Path

import nats
import pytest

from hecate.bus.server import NatsServer
from hecate.bus.settle import settled
from hecate.wire import permissions
from hecate_gateway.identities import read_env_file
from hecate_launcher import natsconfig


async def test_a_role_logs_in_over_tls_by_the_deployment_name(tmp_path: Path) -> None:
    out = natsconfig.write_deployment(
        tmp_path / "d",
        permissions.DEFAULT_TENANTS,
        permissions.DEFAULT_NODES,
        hosts=natsconfig.deployment_hosts(),
    )
    tls = (
        f'tls {{\n  cert_file: "{out}/nats/server.pem"\n'
        f'  key_file: "{out}/nats/server-key.pem"\n}}\n'
    )
    env = read_env_file(out / "nats-server.env")
    accounts = (out / "nats" / "accounts.conf").read_text()
    with NatsServer(tmp_path / "srv", extra_config=accounts + tls, env=env).start() as server:
        user = read_env_file(out / "users" / "node-gpu.env")
        context = ssl.create_default_context(cafile=str(out / "ca" / "ca.pem"))
        nc = await nats.connect(
            server.url,
            user=user["HECATE_NATS_USER"],
            password=user["HECATE_NATS_PASSWORD"],
            tls=context,
            tls_hostname="nats",
        )
        await nc.publish("hecate.telemetry.heartbeat.gpu", b"")
        await settled(nc)
        await nc.close()
        with pytest.raises(Exception):  # noqa: B017, PT011 -- any refusal will do
            await nats.connect(
                server.url,
                tls=context,
                tls_hostname="nats",
                allow_reconnect=False,
                max_reconnect_attempts=0,
            )
