"""The quota desk: one shared budget per tenant, whichever router a request reaches.

It lives in the breaker service (the resilience owner) and answers
``hecate.quota.acquire``. Each tenant has a :class:`hecate.resilience.Quota` (requests
and tokens per minute). A refused request gets its **own** future slot and a ticket:
rejected callers coming back at their Retry-After with their ticket do not collide
again. A tenant may prefer being held until its slot to being refused (``hold``); the
router does the holding, bounded by the caller's ``max_wait_ms``.

Budgets live in this process's memory: run one breaker service (as with the planner);
a restart starts every tenant with a full bucket.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

import msgspec

from hecate.resilience.bucket import Quota
from hecate.wire.messages import QuotaReply, QuotaRequest


class TenantQuota(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    requests_per_min: Annotated[float, msgspec.Meta(gt=0)]
    tokens_per_min: Annotated[float, msgspec.Meta(gt=0)] | None = None
    burst: Annotated[float, msgspec.Meta(ge=1)] | None = None  # default: a minute's requests
    hold: bool = False


class QuotaConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    tenants: dict[str, TenantQuota] = {}
    default: TenantQuota | None = None  # for tenants not listed; None: unlimited


def load_quotas(path: str | None) -> QuotaConfig:
    if not path:
        return QuotaConfig()
    return msgspec.json.decode(Path(path).read_bytes(), type=QuotaConfig)


class QuotaDesk:
    def __init__(self, config: QuotaConfig) -> None:
        self.config = config
        self.quotas: dict[str, Quota] = {}
        self.refused = 0

    def _quota(self, tenant: str) -> tuple[Quota, TenantQuota] | None:
        spec = self.config.tenants.get(tenant, self.config.default)
        if spec is None:
            return None
        quota = self.quotas.get(tenant)
        if quota is None:
            quota = self.quotas[tenant] = Quota(
                spec.requests_per_min, spec.tokens_per_min, burst=spec.burst
            )
        return quota, spec

    async def acquire(self, req: QuotaRequest, _headers: Mapping[str, str]) -> QuotaReply:
        found = self._quota(req.tenant)
        if found is None:
            return QuotaReply(admitted=True)
        quota, spec = found
        admission = quota.try_acquire(time.monotonic(), req.tokens, req.ticket)
        if admission.admitted:
            return QuotaReply(admitted=True)
        self.refused += 1
        return QuotaReply(
            admitted=False,
            retry_after_s=admission.retry_after_s,
            ticket=admission.ticket,
            hold=spec.hold,
        )
