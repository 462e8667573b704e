"""The numbers a request sets, each held to OpenAI's documented range before anything
else reads it, each refusal a 400 naming the field (see :mod:`hecate_gateway.openai`)."""

from __future__ import annotations

from collections.abc import Mapping

from hecate.wire.messages import MAX_STOP_CHARS, MAX_TOKENS
from hecate_gateway.apierrors import Kind, bad

__all__ = [
    "COMPLETION_MAX_TOKENS",
    "DEFAULT_MAX_TOKENS",
    "MAX_SEED",
    "MAX_STOPS",
    "MIN_SEED",
    "RANGES",
    "in_range",
    "max_tokens",
    "number",
    "seed",
    "stops",
    "top_p",
]

DEFAULT_MAX_TOKENS = 256  # chat without max_tokens
COMPLETION_MAX_TOKENS = 16  # OpenAI's own default for /v1/completions
MAX_STOPS = 4  # as OpenAI
# A seed is an int64, as OpenAI takes it (and what the wire and a node's sampler carry).
MIN_SEED, MAX_SEED = -(2**63), 2**63 - 1
# The documented ranges of the tolerated fields that are numbers: (low, high, integer). A
# value out of its range is refused as such, before "not supported" is even asked.
RANGES: Mapping[str, tuple[float, float, bool]] = {
    "n": (1, 128, True),
    "best_of": (1, 20, True),
    "presence_penalty": (-2.0, 2.0, False),
    "frequency_penalty": (-2.0, 2.0, False),
}


def stops(stop: str | list[str] | None) -> tuple[str, ...]:
    """The stop strings, at most :data:`MAX_STOPS` of at most ``MAX_STOP_CHARS`` each."""
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if len(stops) > MAX_STOPS:
        raise bad(f"stop: at most {MAX_STOPS} sequences", param="stop")
    for i, s in enumerate(stops):
        if len(s) > MAX_STOP_CHARS:
            raise bad(
                f"stop: each sequence at most {MAX_STOP_CHARS} characters long, "
                f"stop[{i}] has {len(s)}",
                param="stop",
            )
    return tuple(s for s in stops if s)


def seed(value: int | None) -> int | None:
    if value is not None and not MIN_SEED <= value <= MAX_SEED:
        # The value itself is left out: it may have hundreds of digits.
        raise bad(f"seed must be an integer between {MIN_SEED} and {MAX_SEED}", param="seed")
    return value


def in_range(name: str, value: object, low: float, high: float, integer: bool) -> None:
    """A tolerated number, held to its documented range (None: the default)."""
    if value is None:
        return
    kind = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        raise bad(f"{name} must be {kind}, got {value!r}", param=name)
    if not low <= value <= high:
        raise bad(f"{name} must be between {low:g} and {high:g}, got {value}", param=name)


def max_tokens(kind: Kind, value: int | None, completion: int | None = None) -> int:
    """``max_tokens``, or chat's ``max_completion_tokens`` where given; the default."""
    name = "max_tokens"
    if completion is not None:
        name, value = "max_completion_tokens", completion
    if value is None:
        return DEFAULT_MAX_TOKENS if kind == "chat" else COMPLETION_MAX_TOKENS
    if not 1 <= value <= MAX_TOKENS:
        raise bad(f"{name} must be between 1 and {MAX_TOKENS}, got {value}", param=name)
    return value


def number(name: str, value: float | None, default: float, low: float, high: float) -> float:
    if value is None:
        return default
    if not low <= value <= high:
        raise bad(f"{name} must be between {low:g} and {high:g}, got {value}", param=name)
    return float(value)


def top_p(value: float | None) -> float:
    top_p = number("top_p", value, 1.0, 0.0, 1.0)
    if top_p == 0.0:
        raise bad("top_p must be greater than 0", param="top_p")
    return top_p
