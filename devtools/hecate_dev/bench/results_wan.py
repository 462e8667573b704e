"""``hecate bench wan``'s figures as typed structs (see :mod:`hecate_dev.bench.results`
for how results are saved and read back). A run that skipped itself (the model not
pulled) carries only why."""

from __future__ import annotations

import msgspec

from hecate_dev.bench.results import Result


class WanRun(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One dispatch at one round-trip time: the median round's figures, every round's
    tokens/s, and whether every round streamed the single-process greedy text (a wrong
    text is kept, to be read)."""

    rtt_ms: float  # added to every node's link, round trip
    dispatch: str  # "hop" or "chain"
    tokens_per_s: float
    rounds_tokens_per_s: list[float]
    ttft_ms: float
    gap_ms: float
    text_ok: bool
    text: str | None = None


class WanPreference(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Two pipelines, one's nodes ``rtt_ms`` further away: where ``requests`` sequential
    generations went after ``warmup`` uncounted ones (by the pipeline the reply names)."""

    rtt_ms: float
    slow_pipeline: str
    fast_pipeline: str
    requests: int
    warmup: int
    on_fast: int
    on_slow: int
    tokens: int
    text_ok: bool
    target_share: float
    # As the suite judged them; the report judges the counts again.
    share_fast: float | None = None
    met: bool | None = None


class WanMeta(msgspec.Struct, frozen=True, kw_only=True):
    tokens: int
    rounds: int
    node_blas_threads: int
    prompt: str = ""
    python: str = ""
    machine: str = ""
    date: str = ""
    text: str = ""  # the single-process greedy text every run is checked against


class WanResult(Result, frozen=True, kw_only=True, omit_defaults=True):
    skipped: str | None = None  # the model is not pulled
    runs: list[WanRun] = msgspec.field(default_factory=list)
    preference: WanPreference | None = None
    failed_checks: list[str] = msgspec.field(default_factory=list)
    meta: WanMeta | None = None
