"""What ``hecate chaos`` produces, as typed structs: one :class:`ScenarioResult` per
scenario run (the line it prints, the figures it saves), and the saved run,
:class:`ChaosResult`, which ``hecate bench report`` reads back with :func:`load`.

Fields keep the names of the JSON the earlier, untyped results were saved with, so
saved runs still load; fields older files lack have defaults.
"""

from __future__ import annotations

from typing import Any

import msgspec

from hecate_dev.bench.results import Result


class ExpectDoc(msgspec.Struct, frozen=True, kw_only=True):
    """What the scenario had to show, as it was when the run was made."""

    evidence: list[str] = []
    because: str = ""
    allowed_errors: dict[str, str] = {}
    allowed_send_failures: dict[str, str] = {}


class TimingDoc(msgspec.Struct, frozen=True, kw_only=True):
    warm: float
    fault: float
    settle: float


class Timeline(msgspec.Struct, frozen=True, kw_only=True):
    """Every request (start, latency, outcome) and every fault, times in seconds from
    the first fault: enough to draw the timeline later."""

    faults: list[tuple[float, str]]
    started_s: list[float]
    latency_ms: list[float]
    status: list[str]


class ScenarioResult(msgspec.Struct, frozen=True, kw_only=True):
    """One scenario's figures (see :func:`hecate_dev.chaos.load.summarize`), what it had
    to show and every criterion of its acceptance, judged."""

    scenario: str
    sent: int
    ok: int
    errors: int
    lost: int
    wrong: int
    degraded: int = 0
    degraded_while_intact: int = 0
    p99_ms: float
    max_ms: float
    recover_s: float
    baseline_p99_ms: float = 0.0
    error_codes: dict[str, int] = {}
    lost_codes: dict[str, int] = {}
    # Every send that failed, retried or not, by code (older results: none recorded).
    send_failures: dict[str, int] = {}
    evidence: dict[str, float] = {}
    faults: list[str] = []
    checks: dict[str, bool] = {}
    notes: dict[str, float] = {}
    expect: ExpectDoc = msgspec.field(default_factory=ExpectDoc)
    acceptance: dict[str, bool] = {}
    timing: TimingDoc | None = None  # where the scenario's timing is not the run's
    timeline: Timeline | None = None
    # Runs before this one whose fault hit no live traffic (their one shortfall was the
    # evidence); each was run again, and the report says so.
    missed: int = 0

    def seen(self) -> dict[str, float]:
        """The evidence figures (older results kept the failover count among their
        notes, and no recover_s among their evidence)."""
        seen = dict(self.evidence)
        if "failover_events" not in seen and "failover_events" in self.notes:
            seen["failover_events"] = self.notes["failover_events"]
        seen.setdefault("recover_s", self.recover_s)
        return seen

    @property
    def accepted(self) -> bool:
        return all(self.acceptance.values())

    @property
    def missed_its_traffic(self) -> bool:
        """Failed on its evidence alone: nothing lost, wrong or refused without reason,
        but its fault hit no live traffic, so the run proves nothing either way."""
        failed = [name for name, ok in self.acceptance.items() if not ok]
        return bool(failed) and all(name.startswith("shows_") for name in failed)

    def figures(self) -> dict[str, Any]:
        """The figures as the JSON ``--json`` prints (no timeline)."""
        doc: dict[str, Any] = msgspec.to_builtins(self)
        doc.pop("timeline", None)
        if doc["timing"] is None:
            del doc["timing"]
        return doc


class Skipped(msgspec.Struct, frozen=True, kw_only=True):
    """A scenario that did not run, and why."""

    scenario: str
    skipped: str


class ChaosResult(Result, frozen=True, kw_only=True):
    """A run of ``hecate chaos``, in the order the scenarios ran (decode it with
    :func:`load`: its list mixes two untagged shapes, as it was always saved)."""

    short: bool = False
    timing: TimingDoc | None = None
    scenarios: list[ScenarioResult | Skipped] = msgspec.field(default_factory=list)

    @property
    def ran(self) -> list[ScenarioResult]:
        return [s for s in self.scenarios if isinstance(s, ScenarioResult)]

    @property
    def skipped(self) -> list[Skipped]:
        return [s for s in self.scenarios if isinstance(s, Skipped)]


def load(report: Any) -> ChaosResult:
    """A saved ``chaos.json`` report as its struct (a skipped scenario is told apart by
    its ``skipped`` field, as it was saved)."""
    scenarios: list[ScenarioResult | Skipped] = [
        msgspec.convert(s, Skipped) if "skipped" in s else msgspec.convert(s, ScenarioResult)
        for s in report.get("scenarios", [])
    ]
    timing = report.get("timing")
    return ChaosResult(
        short=msgspec.convert(report.get("short", False), bool),
        timing=msgspec.convert(timing, TimingDoc) if timing else None,
        scenarios=scenarios,
    )
