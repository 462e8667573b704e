"""Verdicts on paired ratios, and the word for a timed run whose text was wrong."""

# Prose for people: its dashes and multiplication signs are meant.
# ruff: noqa: RUF001

from __future__ import annotations

import statistics

from hecate_dev.bench.interval import median_interval
from hecate_dev.bench.report.markdown import Met, num
from hecate_dev.bench.results_llm import Generation

WRONG = "failed: wrong text"


def wrong(run: Generation | None) -> bool:
    """Whether a timed generation produced other than the single-process text (results
    saved before the check carry no verdict on their text)."""
    return run is not None and run.wrong


def median_ratio(values: list[float]) -> float:
    """The median of per-pair ratios (between the two middle ones, for an even count),
    to 3 decimals as the ratios are."""
    return round(statistics.median(values), 3)


def judged(
    ratios: list[float], target: float, *, unit: str = "×", digits: int = 3
) -> tuple[Met, str]:
    """Paired ratios (or per-round figures in ``unit``) against ``target`` (at least):
    met or not only when their median's interval lies on one side of it
    (:mod:`hecate_dev.bench.interval`), else undecided; and the figure: the median and
    its interval."""
    interval = median_interval(ratios)
    figure = (
        f"{num(round(statistics.median(ratios), digits), digits)}{unit} (median of "
        f"{len(ratios)}; "
        f"{num(interval.low, digits)}–{num(interval.high, digits)} holds it at "
        f"{interval.confidence:.0%})"
    )
    return interval.verdict_at_least(target), figure
