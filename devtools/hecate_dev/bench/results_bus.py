"""The bus suite's figures as typed structs (``hecate bench bus``; see
:mod:`hecate_dev.bench.results` for how results are saved and read back).

Each configuration's closed-loop figures and each capacity ratio sit at the top level,
under their names, as they always were saved; :meth:`BusResult.closed` and
:meth:`BusResult.ratio` read them by name."""

from __future__ import annotations

import msgspec

from hecate_dev.bench.results import Result

LABELS = ("raw", "routed_1", "routed_3", "routed_3_chain", "routed_1_secure")
RATIO_NAMES = ("ratio_1", "ratio_3", "ratio_3_chain", "ratio_1_secure", "secure_over_open")


class ClosedLoop(msgspec.Struct, frozen=True, kw_only=True):
    """A configuration's median round at a fixed number of requests in flight."""

    rps: float
    p50_us: float
    p99_us: float
    requests: float
    failures: int
    rounds_rps: list[float] = []
    # CPU per correct reply by role (server, router, nodes, generator, total), in µs:
    # each role's median over the rounds (hecate_dev.bench.bus_setup.cpu_per_reply).
    cpu_us: dict[str, float] = {}


class SweepPoint(msgspec.Struct, frozen=True, kw_only=True):
    """One offered rate (see :func:`hecate_dev.bench.openloop.summarize`)."""

    offered_rps: float
    sent: int
    ok: int
    failed: int
    timed_out: int
    achieved_rps: float
    p50_us: float
    p99_us: float
    p99_capped: bool
    send_lag_p99_us: float
    generators: int = 1
    served_in_full: bool = False


class Capacity(msgspec.Struct, frozen=True, kw_only=True):
    """See :func:`hecate_dev.bench.bus.capacity`."""

    rps: float | None
    exact: bool
    failed_at_rps: float | None
    send_lag_p99_us_at_failure: float | None


class SweepSettings(msgspec.Struct, frozen=True, kw_only=True):
    low: list[float]
    start: float
    step: float
    misses: int
    refine: int
    resolution: float = 1.0
    ceiling: float


class ServedRule(msgspec.Struct, frozen=True, kw_only=True):
    ok_share: float
    p99_bound_ms: float


class BusMeta(msgspec.Struct, frozen=True, kw_only=True):
    inflight: int
    seconds: float
    rounds: int = 1
    layers: int
    executor: str
    ratio_basis: str
    sweep: SweepSettings | None
    sweep_seconds: float
    sweep_timeout_s: float
    generators: int
    served_in_full: ServedRule
    lagging_us: float
    dispatch: str = ""
    python: str = ""
    machine: str = ""
    date: str = ""


class BusResult(Result, frozen=True, kw_only=True, omit_defaults=True):
    raw: ClosedLoop | None = None
    routed_1: ClosedLoop | None = None
    routed_3: ClosedLoop | None = None
    routed_3_chain: ClosedLoop | None = None
    routed_1_secure: ClosedLoop | None = None
    sweep: dict[str, list[SweepPoint]] | None = None  # by configuration, by offered rate
    capacity: dict[str, Capacity] = msgspec.field(default_factory=dict)
    # Ratios of capacities, each with what the figure is (exact, at_most, at_least, unknown).
    ratio_1: float | None = None
    ratio_1_is: str | None = None
    ratio_3: float | None = None
    ratio_3_is: str | None = None
    ratio_3_chain: float | None = None
    ratio_3_chain_is: str | None = None
    ratio_1_secure: float | None = None
    ratio_1_secure_is: str | None = None
    secure_over_open: float | None = None
    secure_over_open_is: str | None = None
    # The locked-down bus against its target, as the suite judged it (the report judges
    # the ratio again): met, not met, or None when the ratio does not decide it.
    secure_over_open_met: bool | None = None
    # The open bus's CPU per routed reply ÷ the locked-down bus's (hecate_dev.bench.bus.COSTS):
    # the router's alone, judged against the same target, and every process's together.
    router_cost_secure_over_open: float | None = None
    router_cost_secure_over_open_met: bool | None = None
    path_cost_secure_over_open: float | None = None
    meta: BusMeta

    def closed(self, label: str) -> ClosedLoop | None:
        """A configuration's closed-loop figures, by its label (one of :data:`LABELS`)."""
        if label not in LABELS:
            raise KeyError(label)
        figures: ClosedLoop | None = getattr(self, label)
        return figures

    def ratio(self, name: str) -> tuple[float | None, str]:
        """A ratio (one of :data:`RATIO_NAMES`) and what it is; unknown if not taken."""
        if name not in RATIO_NAMES:
            raise KeyError(name)
        value: float | None = getattr(self, name)
        kind: str | None = getattr(self, f"{name}_is")
        return value, kind or ("exact" if value is not None else "unknown")
