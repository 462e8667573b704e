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
* ``hecate-queue``: the router holds the request until its slot instead of refusing
  it (for callers whose deadline allows), so each request is sent once.

Reported per policy: attempts per success (1.0 is one send per request; with refusal
the floor is 1.9 here, every waiting caller refused exactly once) and the time of the
last success, beside the ideal (the last of 1,000 at 100/s after a burst of 100: 9 s).
"""

from __future__ import annotations

import heapq
import math
from typing import Any

from hecate.resilience.backoff import DecorrelatedJitter, FullJitter, SeedPolicy, WaitPolicy
from hecate.resilience.bucket import TokenBucket

CLIENTS = 1000
RATE = 100.0
BURST = 100.0
HORIZON_S = 10_000.0


class Exact:
    name = "exact"

    def wait(self, attempt: int, hint: float | None) -> float:
        del attempt
        return hint if hint is not None else 1.0


def simulate(
    policy: str, *, clients: int = CLIENTS, rate: float = RATE, burst: float = BURST, seed: int = 7
) -> dict[str, float]:
    if policy == "hecate-queue":
        bucket = TokenBucket(rate, burst, book=True)
        last = 0.0
        for _ in range(clients):  # held, not refused: admitted at its slot, sent once
            admission = bucket.try_acquire(0.0)
            last = max(last, admission.retry_after_s)
        return {"attempts_per_success": 1.0, "last_success_s": round(last, 3)}

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


POLICY_NAMES = ("exact", "seed", "full", "decorrelated", "hecate", "hecate-queue")


def run_herd_bench(*, seeds: int = 5) -> dict[str, Any]:
    """Every policy, averaged over ``seeds`` runs of the jittered ones."""
    out: dict[str, Any] = {}
    for name in POLICY_NAMES:
        runs = [simulate(name, seed=s) for s in range(1, seeds + 1)]
        out[name] = {
            "attempts_per_success": round(sum(r["attempts_per_success"] for r in runs) / seeds, 3),
            "last_success_s": round(sum(r["last_success_s"] for r in runs) / seeds, 3),
        }
    return {
        "policies": out,
        "ideal_last_success_s": round((CLIENTS - BURST) / RATE, 3),
        "meta": {
            "clients": CLIENTS,
            "rate_per_s": RATE,
            "burst": BURST,
            "seeds": seeds,
            "retry_after": "integer delay-seconds (ceil), except hecate: exact",
        },
    }
