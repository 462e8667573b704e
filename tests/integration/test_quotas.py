"""Tenant quotas: one shared budget across router replicas, each refused caller its own
slot, and holding instead of refusing when the tenant and the caller's deadline allow."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import msgspec
from nats.aio.client import Client

from hecate.wire import subjects
from hecate.wire.messages import InferReply, InferRequest

from .conftest import EXAMPLES, SWARM_NODES, Processes, start_swarm, wait_until_serving


async def ask(client: Client, request: InferRequest) -> tuple[InferReply, dict[str, str]]:
    msg = await client.request(subjects.infer("ncm-base"), msgspec.json.encode(request), timeout=10)
    return msgspec.json.decode(msg.data, type=InferReply), dict(msg.headers or {})


def quotas(tmp_path: Path) -> Path:
    path = tmp_path / "quotas.json"
    path.write_text(
        json.dumps(
            {
                "tenants": {
                    "acme": {"requests_per_min": 60, "burst": 3},
                    "patient": {"requests_per_min": 120, "burst": 2, "hold": True},
                }
            }
        )
    )
    return path


async def start(processes: Processes, client: Client, tmp_path: Path) -> None:
    processes.start("breaker", "breaker", "--id", "breaker", "--quotas", str(quotas(tmp_path)))
    start_swarm(processes, EXAMPLES / "swarm.json", SWARM_NODES, routers=0)
    for i in (1, 2):
        processes.start(f"router-{i}", "router", "--id", f"router-{i}", "--enforce-quotas")
    await wait_until_serving(client, "ncm-base")  # tenant "default": no quota


async def test_one_budget_across_replicas_and_each_refused_caller_gets_its_own_slot(
    processes: Processes, client: Client, tmp_path: Path
) -> None:
    await start(processes, client, tmp_path)
    replies = await asyncio.gather(
        *(
            ask(client, InferRequest(prompt=f"acme {i}", max_tokens=2, tenant="acme"))
            for i in range(7)
        )
    )
    admitted = [r for r, _ in replies if r.ok]
    refused = [(r, h) for r, h in replies if not r.ok]
    assert len(admitted) == 3, "two routers share one burst of 3, not 3 each"
    assert len(refused) == 4
    waits = sorted(r.retry_after_s or 0.0 for r, _ in refused)
    assert all(r.error is not None and r.error.code == "rate_limited" for r, _ in refused)
    # Each refused caller has its own slot, one second apart at 60 requests/min.
    assert [round(w) for w in waits] == [1, 2, 3, 4], waits
    for reply, headers in refused:
        assert headers["Hecate-Error"] == "rate_limited"
        assert headers["Nats-Service-Error-Code"] == "429"
        assert int(headers["Retry-After"]) >= 1
        assert abs(int(headers["Retry-After-Ms"]) / 1000 - (reply.retry_after_s or 0)) < 0.01
        assert reply.quota_ticket is not None
    # Coming back at its Retry-After with its ticket, the first refused caller is served.
    first = min(refused, key=lambda rh: rh[0].retry_after_s or 0.0)[0]
    await asyncio.sleep((first.retry_after_s or 0) + 0.05)
    back, _ = await ask(
        client,
        InferRequest(
            prompt="acme back", max_tokens=2, tenant="acme", quota_ticket=first.quota_ticket
        ),
    )
    assert back.ok, back.error


async def test_a_patient_tenant_is_held_until_its_slot_instead_of_refused(
    processes: Processes, client: Client, tmp_path: Path
) -> None:
    await start(processes, client, tmp_path)
    started = time.monotonic()
    replies = await asyncio.gather(
        *(
            ask(
                client,
                InferRequest(
                    prompt=f"patient {i}", max_tokens=2, tenant="patient", max_wait_ms=5000
                ),
            )
            for i in range(4)
        )
    )
    elapsed = time.monotonic() - started
    assert all(r.ok for r, _ in replies), [r.error for r, _ in replies]
    assert 0.9 <= elapsed < 4.0, elapsed  # 2 at once, then one every 0.5 s
    # Without a deadline that allows it, the same tenant is refused, not held.
    refused, _ = await ask(client, InferRequest(prompt="no patience", tenant="patient"))
    assert refused.ok is False
    assert refused.error is not None
    assert refused.error.code == "rate_limited"
