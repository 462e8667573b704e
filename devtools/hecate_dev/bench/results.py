"""The figures a suite produces, as typed structs: the suite returns one, ``hecate bench``
saves it as JSON (inside its provenance envelope) and the report reads it back with
:func:`load`, so a field renamed on one side and not the other fails at the first
decode, with its path, instead of as a ``KeyError`` deep in the prose.

Fields keep the names of the JSON the earlier, untyped results were saved with, so
saved results still load; fields the older files lack have defaults.

The breaker, core and herd suites' structs are here; the larger ones have modules of
their own: :mod:`hecate_dev.bench.results_bus`, :mod:`hecate_dev.bench.results_gateway`,
:mod:`hecate_dev.bench.results_llm` (many users at once included) and, for ``hecate
chaos``, :mod:`hecate_dev.chaos.results`.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec


class Result(msgspec.Struct, frozen=True, kw_only=True):
    """A suite's figures."""


R = TypeVar("R", bound=Result)


def load(report: Any, kind: type[R]) -> R:
    """A saved report (decoded JSON) as its struct; a shape that does not fit raises
    ``msgspec.ValidationError`` naming the field."""
    return msgspec.convert(report, kind)


class Percentiles(msgspec.Struct, frozen=True, kw_only=True):
    p50: float
    p99: float


# -- hecate bench breaker ----------------------------------------------------------------


class Spread(msgspec.Struct, frozen=True, kw_only=True):
    """Delays of one kind: percentiles, the worst (none when nothing was seen) and how
    many samples came of how many expected."""

    p50: float | None
    p99: float | None
    max: float | None
    samples: int
    expected: int


class BreakerMeta(msgspec.Struct, frozen=True, kw_only=True):
    watchers: int
    trips: int
    python: str = ""
    machine: str = ""
    date: str = ""


class BreakerResult(Result, frozen=True, kw_only=True):
    open_seen_ms: Spread  # last failure report -> every watcher sees OPEN
    open_reject_us: float  # CircuitBreaker.allow() on an open circuit
    meta: BreakerMeta


# -- hecate bench core -------------------------------------------------------------------


class CoreMeta(msgspec.Struct, frozen=True, kw_only=True):
    batch: int
    samples: int
    plan_repeats: int
    replicas_per_plan: str = ""
    python: str = ""
    machine: str = ""
    date: str = ""


class CoreResult(Result, frozen=True, kw_only=True):
    """Per shape (``"PIPELINESxSTAGES"``) and per node count (``"1000"``)."""

    route_us: dict[str, Percentiles]  # route_request on an idle swarm
    floor_us: dict[str, Percentiles]  # building the Route it returns, alone
    route_over_floor: dict[str, float]
    route_inflight_us: dict[str, Percentiles]  # with requests in flight everywhere
    recost_us: dict[str, Percentiles]  # a telemetry sample, then a route
    plan_ms: dict[str, float]  # greedy planner
    plan_ms_proportional: dict[str, float]
    meta: CoreMeta


# -- hecate bench herd -------------------------------------------------------------------


class HerdPolicy(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One retry policy, averaged over the seeds; a held-caller policy (``hecate-queue``)
    also names the callers' max wait and how many were refused past it."""

    attempts_per_success: float
    last_success_s: float
    successes: int | None = None  # results saved before it was counted: every client
    max_wait_ms: int | None = None
    refused: float | None = None


class HerdMeta(msgspec.Struct, frozen=True, kw_only=True):
    clients: int
    rate_per_s: float
    burst: float
    seeds: int
    retry_after: str = ""
    queue_max_wait_ms: dict[str, int] = {}


class HerdResult(Result, frozen=True, kw_only=True):
    policies: dict[str, HerdPolicy]  # by policy name, in the simulation's order
    ideal_last_success_s: float
    meta: HerdMeta
