"""What a chaos scenario is: one object that names itself, says the swarm and load it
runs on, injects its fault into the running harness, adds its own checks to the record,
says what its run must show, judges a result, and explains one.

A scenario is a subclass of :class:`Scenario` that sets its class attributes and writes
:meth:`Scenario.inject` and :meth:`Scenario.meaning` (and :meth:`Scenario.findings` if
it checks more than every scenario does); :mod:`hecate_dev.chaos.scenarios` lists them.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import msgspec
from nats.aio.client import Client

from hecate_dev.chaos.acceptance import Expect, judge
from hecate_dev.chaos.faults import Timing
from hecate_dev.chaos.harness import Swarm
from hecate_dev.chaos.load import Record, summarize
from hecate_dev.chaos.results import ScenarioResult
from hecate_dev.chaos.setup import Setup

# How each evidence figure reads in a sentence.
EVIDENCE = {
    "failover_events": "{:,.0f} failovers",
    "client_retries": "{:,.0f} retries",
    "recover_s": "recovered in {:.2f} s",
    "answered_during_outages": "≥ {:,.0f} answered inside each outage",
    "slowed_answers": "{:,.0f} answers slowed by the link",
}


def num(x: float, digits: int = 1) -> str:
    """As the report writes a figure (importing the report from here would close a
    cycle): 24837.0 -> '24,837', 5.481 -> '5.48'."""
    return f"{x:,.0f}" if x >= 1000 else f"{x:,.{digits}f}"


class Scenario:
    """A fault, the swarm it runs on, what its run must show, and what its figures
    mean. Subclasses set ``name``, ``expect`` (and ``setup``, ``timings`` where the
    defaults do not fit) and write :meth:`inject` and :meth:`meaning`."""

    name: ClassVar[str]
    expect: ClassVar[Expect]
    setup: ClassVar[Setup] = Setup()
    # (short, long) timings where the default ones do not fit the load.
    timings: ClassVar[tuple[Timing, Timing] | None] = None

    async def inject(self, swarm: Swarm, nc: Client, record: Record, t: Timing) -> None:
        """Hurt the running swarm and heal it, marking every fault and heal in
        ``record``; returns once the last one is healed."""
        raise NotImplementedError

    def findings(self, record: Record) -> None:
        """The scenario's own checks and notes, into the record once the load is over."""

    def meaning(self, r: ScenarioResult) -> str:
        """What this run's figures say about the swarm, with its numbers."""
        return worst(r) + "."

    def timing_of(self, short: bool) -> Timing:
        if self.timings is None:
            return Timing.of(short)
        return self.timings[0] if short else self.timings[1]

    def accept(self, r: ScenarioResult) -> dict[str, bool]:
        """Every criterion of acceptance by name, judged from the figures by the rule
        of :mod:`hecate_dev.chaos.acceptance` and what this scenario expects today."""
        return judge(msgspec.to_builtins(r), self.expect)

    def result(self, record: Record, short: bool = False) -> ScenarioResult:
        """The scenario's figures from its record, judged."""
        figures = summarize(self.name, record)
        figures["expect"] = self.expect.doc()
        figures["acceptance"] = judge(figures, self.expect)
        if self.timings is not None:  # the run's saved timing is the default one
            figures["timing"] = dataclasses.asdict(self.timing_of(short))
        return msgspec.convert(figures, ScenarioResult)

    def verdict(self, r: ScenarioResult) -> str:
        """Why the run passed or failed, in a sentence."""
        failed = [name.replace("_", " ") for name, ok in self.accept(r).items() if not ok]
        if failed:
            return f"Failed, criteria not met: {'; '.join(failed)}."
        seen = r.seen()
        shown = [EVIDENCE[e].format(seen.get(e, 0)) for e in self.expect.evidence]
        hit = f" and the fault hit live traffic ({'; '.join(shown)})" if shown else ""
        held = f", its {len(r.checks)} own checks held" if r.checks else ""
        return f"Accepted: nothing lost or wrong, no unexplained error{held}{hit}."

    def explain(self, r: ScenarioResult) -> str:
        """What the figures mean and why the run passed or failed."""
        return f"{self.meaning(r)} {self.verdict(r)}"


class Unknown(Scenario):
    """A scenario a saved run names that this hecate no longer has: it must show
    nothing more than no loss and no error."""

    expect = Expect((), "")

    def __init__(self, name: str) -> None:
        self.name = name  # type: ignore[misc]


def failovers(r: ScenarioResult) -> int:
    return int(r.seen().get("failover_events", 0))


def retries(r: ScenarioResult) -> str:
    n = int(r.seen().get("client_retries", 0))
    return f"{n:,} time{'' if n == 1 else 's'}"


def seconds(ms: float) -> str:
    return f"{num(ms / 1000, 2)} s"


def worst(r: ScenarioResult) -> str:
    recovered = (
        f"recovered in {num(r.recover_s, 2)} s"
        if r.recover_s
        else "no request failed or took 3x the pre-fault p99"
    )
    return f"max {num(r.max_ms, 1)} ms, {recovered}"
