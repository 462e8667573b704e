"""The gateway suite's figures as typed structs (``hecate bench gateway``; see
:mod:`hecate_dev.bench.results` for how results are saved and read back)."""

from __future__ import annotations

import msgspec

from hecate_dev.bench.results import Result


class Timed(msgspec.Struct, frozen=True, kw_only=True):
    """One path's latency (µs) over the answers it timed."""

    p50: float
    p99: float
    samples: int


class Added(msgspec.Struct, frozen=True, kw_only=True):
    """What the gateway adds to each streamed token (µs)."""

    p50: float
    p99: float
    max: float
    samples: int


class Latency(msgspec.Struct, frozen=True, kw_only=True):
    direct_us: Timed
    gateway_us: Timed  # the minimal HTTP/1.1 client
    gateway_httpx_us: Timed
    added_p50_us: float
    added_p99_us: float
    added_p50_us_httpx: float
    added_p99_us_httpx: float
    wrong: dict[str, int]  # by path
    failed: dict[str, int]


class Level(msgspec.Struct, frozen=True, kw_only=True):
    """One number of clients on one path: its median round, and every round's rate."""

    clients: int
    rps: float
    ok: int
    wrong: int
    failed: int
    cores: dict[str, float]  # by role, over the window
    rounds_rps: list[float] = []


class PathCapacity(msgspec.Struct, frozen=True, kw_only=True):
    rps: float  # the best level's median round
    clients: int
    growing: bool  # the most clients still gave more: only a floor
    levels: list[Level]


class Capacity(msgspec.Struct, frozen=True, kw_only=True):
    direct: PathCapacity
    gateway: PathCapacity
    ratio_rounds: list[float]
    ratio: float
    wrong: int
    failed: int
    clients: list[int]
    processes: int
    seconds: float
    rounds: int


class Toy(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    topology: str
    tokens: int
    prompts: int
    latency: Latency
    capacity: Capacity | None = None


class Stream(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """SmolLM2 streaming, or why it was not measured (``skipped``)."""

    skipped: str | None = None
    model: str = ""
    prompt: str = ""
    tokens: int = 0
    rounds: int = 0
    added_us: Added | None = None
    added_us_httpx: Added | None = None
    unmatched: int = 0
    direct_tokens_per_s: float = 0.0
    gateway_tokens_per_s: float = 0.0
    gateway_httpx_tokens_per_s: float = 0.0
    direct_tokens_per_s_rounds: list[float] = []
    gateway_tokens_per_s_rounds: list[float] = []
    gateway_httpx_tokens_per_s_rounds: list[float] = []
    wrong: int = 0
    text: str = ""


class GatewayResult(Result, frozen=True, kw_only=True):
    toy: Toy
    stream: Stream = msgspec.field(default_factory=lambda: Stream(skipped="not in this result"))
    failed_checks: list[str] = msgspec.field(default_factory=list)
    verdicts: dict[str, str] = msgspec.field(default_factory=dict)  # as the suite printed them
    targets_us: dict[str, float] = msgspec.field(default_factory=dict)
