"""``hecate bench herd``: a thundering herd against a rate limit, policy by policy.

A discrete-event simulation (no sleeping, no network, deterministic per seed): 1,000
clients send at t = 0 to an upstream admitting 100 requests/s with a burst of 100, so
900 must wait. A refused client is told when to come back and retries by its policy:

* ``exact``: at exactly the (integer, as HTTP delay-seconds are) Retry-After;
* ``seed``: Retry-After + U(0.1, 0.5) s, the seed's prescription;
* ``full`` / ``decorrelated``: Retry-After + Brooker's full / decorrelated jitter;
* ``hecate``: the quota books each refused caller its own future slot and tells it the
  exact wait (fractional, as ``retry-after-ms`` carries it) with a ticket; the caller
  comes back then and is admitted;
* ``hecate-queue``: the tenant prefers holding. The router asks the quota desk; a
  caller whose booked slot lies within its ``max_wait_ms`` is held until that slot (the
  router wakes it on its 20 ms sweep and asks again with the ticket), so it sends once.
  A caller whose slot lies beyond ``max_wait_ms`` is refused with its ticket, pauses as
  the SDK does (Retry-After + U(0.1, 0.5) s) and sends again: a late slot costs a second
  send, and a caller that runs out of the SDK's attempts is not served. Simulated with
  the callers' deadline at 10 s (the SDK's default timeout, longer than this herd's
  wait) and at 5 s (``hecate-queue-5s``: about half the herd is refused once).

Reported per policy: attempts per success (1.0 is one send per request; with refusal
the floor is 1.9 here, every waiting caller refused exactly once) and the time of the
last success, beside the ideal (the last of 1,000 at 100/s after a burst of 100: 9 s).
"""

from __future__ import annotations

import heapq
import math

from hecate.client.sdk import MAX_ATTEMPTS
from hecate.resilience.backoff import DecorrelatedJitter, FullJitter, SeedPolicy, WaitPolicy
from hecate.resilience.bucket import Quota, TokenBucket
from hecate_dev.bench.results import HerdMeta, HerdPolicy, HerdResult
from hecate_router.quota import holds
from hecate_router.service import SWEEP_S

CLIENTS = 1000
RATE = 100.0
BURST = 100.0
HORIZON_S = 10_000.0
QUEUE_WAITS_MS = {"hecate-queue": 10_000, "hecate-queue-5s": 5_000}  # callers' max_wait_ms


class Exact:
    name = "exact"

    def wait(self, attempt: int, hint: float | None) -> float:
        del attempt
        return hint if hint is not None else 1.0


def simulate(
    policy: str, *, clients: int = CLIENTS, rate: float = RATE, burst: float = BURST, seed: int = 7
) -> dict[str, float]:
    if policy in QUEUE_WAITS_MS:
        return simulate_held(
            clients=clients, rate=rate, burst=burst, seed=seed, max_wait_ms=QUEUE_WAITS_MS[policy]
        )
    booking = policy == "hecate"
    bucket = TokenBucket(rate, burst, book=booking)
    policies: dict[int, WaitPolicy] = {}
    queue: list[tuple[float, int, int, int | None]] = [(0.0, c, 1, None) for c in range(clients)]
    heapq.heapify(queue)
    attempts = successes = 0
    last = 0.0
    while queue and successes < clients:
        now, client, attempt, ticket = heapq.heappop(queue)
        if now > HORIZON_S:
            break
        attempts += 1
        admission = bucket.try_acquire(now, ticket=ticket)
        if admission.admitted:
            successes += 1
            last = max(last, now)
            continue
        if booking:
            heapq.heappush(
                queue, (now + admission.retry_after_s, client, attempt + 1, admission.ticket)
            )
            continue
        hint = float(max(1, math.ceil(admission.retry_after_s - 1e-9)))  # delay-seconds
        chosen = policies.get(client)
        if chosen is None:
            chosen = policies[client] = _policy(policy, seed * 100_003 + client)
        heapq.heappush(queue, (now + chosen.wait(attempt, hint), client, attempt + 1, None))
    return {
        "attempts_per_success": round(attempts / max(successes, 1), 3),
        "last_success_s": round(last, 3),
        "successes": successes,
    }


def simulate_held(
    *,
    clients: int = CLIENTS,
    rate: float = RATE,
    burst: float = BURST,
    seed: int = 7,
    max_wait_ms: int = 10_000,
    attempts_allowed: int = MAX_ATTEMPTS,
) -> dict[str, float]:
    """A herd of callers whose tenant prefers holding, each sending with ``max_wait_ms``.

    The quota is the desk's own :class:`Quota` on a simulated clock; the hold rule is the
    router's (``QuotaGate.on_reply``): held when the booked slot is at most
    ``max_wait_ms`` away, refused with its ticket otherwise. Only the callers' sends count
    as attempts; the router asking the desk again at the slot is not a send."""
    quota = Quota(rate * 60.0, burst=burst)
    # (time, order, kind, client, attempt, ticket): kind "send" is a caller's request
    # reaching the router, "wake" the router's sweep asking again for a held one.
    events: list[tuple[float, int, str, int, int, int | None]] = [
        (0.0, c, "send", c, 1, None) for c in range(clients)
    ]
    heapq.heapify(events)
    order = clients
    pauses: dict[int, WaitPolicy] = {}
    attempts = successes = refused = held = gave_up = 0
    last = 0.0
    while events:
        now, _, kind, client, attempt, ticket = heapq.heappop(events)
        if now > HORIZON_S:
            break
        if kind == "send":
            attempts += 1
        admission = quota.try_acquire(now, 0, ticket)
        if admission.admitted:
            successes += 1
            last = max(last, now)
            continue
        wait = admission.retry_after_s
        order += 1
        if holds(wait, max_wait_ms):  # the router's own rule
            held += kind == "send"
            # The sweep notices a due hold on its next tick, never before the slot.
            wake = math.ceil((now + wait) / SWEEP_S - 1e-9) * SWEEP_S
            heapq.heappush(events, (wake, order, "wake", client, attempt, admission.ticket))
            continue
        refused += 1
        if attempt >= attempts_allowed:
            gave_up += 1
            continue
        chosen = pauses.get(client)
        if chosen is None:
            chosen = pauses[client] = SeedPolicy(seed * 100_003 + client)
        back = now + chosen.wait(attempt, wait)
        heapq.heappush(events, (back, order, "send", client, attempt + 1, admission.ticket))
    return {
        "attempts_per_success": round(attempts / max(successes, 1), 3),
        "last_success_s": round(last, 3),
        "successes": successes,
        "held": held,
        "refused": refused,
        "gave_up": gave_up,
        "max_wait_ms": max_wait_ms,
    }


def _policy(name: str, seed: int) -> WaitPolicy:
    if name == "exact":
        return Exact()
    if name == "seed":
        return SeedPolicy(seed)
    if name == "full":
        return FullJitter(seed)
    if name == "decorrelated":
        return DecorrelatedJitter(seed)
    raise ValueError(f"unknown policy {name!r}")


POLICY_NAMES = (
    "exact",
    "seed",
    "full",
    "decorrelated",
    "hecate",
    "hecate-queue",
    "hecate-queue-5s",
)


def run_herd_bench(*, seeds: int = 5) -> HerdResult:
    """Every policy, averaged over ``seeds`` runs of the jittered ones."""
    out: dict[str, HerdPolicy] = {}
    for name in POLICY_NAMES:
        runs = [simulate(name, seed=s) for s in range(1, seeds + 1)]
        held = name in QUEUE_WAITS_MS
        out[name] = HerdPolicy(
            attempts_per_success=round(sum(r["attempts_per_success"] for r in runs) / seeds, 3),
            last_success_s=round(sum(r["last_success_s"] for r in runs) / seeds, 3),
            successes=min(int(r.get("successes", CLIENTS)) for r in runs),
            max_wait_ms=QUEUE_WAITS_MS[name] if held else None,
            refused=round(sum(r["refused"] for r in runs) / seeds, 1) if held else None,
        )
    return HerdResult(
        policies=out,
        ideal_last_success_s=round((CLIENTS - BURST) / RATE, 3),
        meta=HerdMeta(
            clients=CLIENTS,
            rate_per_s=RATE,
            burst=BURST,
            seeds=seeds,
            retry_after="integer delay-seconds (ceil), except hecate: exact",
            queue_max_wait_ms=dict(QUEUE_WAITS_MS),
        ),
    )
