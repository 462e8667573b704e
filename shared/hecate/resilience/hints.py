"""Reading an upstream's "slow down" hints: ``Retry-After`` and friends, to seconds.

Every function here is total: garbage, negative, NaN, infinite, absurd or unparseable
input gives ``None`` (no usable hint), never an exception and never a negative or
non-finite wait. Stricter than the seed's parser, whose regex accepted trailing
garbage (``"5s; drop table"``) and which ignored HTTP dates.

Precedence (first usable wins): ``retry-after-ms`` > ``retry-after`` (seconds, possibly
fractional, or an HTTP date in any RFC 9110 form, measured against the response's own
``Date`` header when present, so clock skew between us and the provider cancels out) >
``x-ratelimit-reset-requests`` / ``x-ratelimit-reset-tokens`` (duration strings such as
``6m0s``; when ``x-ratelimit-remaining-*`` says which budget is exhausted, that one's
reset, else the longer of the two).

A hint longer than ``cap_s`` is honoured up to the cap, never replaced by a shorter
guess (the SDKs fall back to a short backoff above their cap and retry *sooner* than
asked).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC
from email.utils import parsedate_to_datetime

DEFAULT_CAP_S = 300.0

_SECONDS = re.compile(r"[0-9]+(?:\.[0-9]+)?")  # ASCII digits: no sign, exponent, _, inf, nan
LARGEST = 1e300  # a digits-only value too big for a float is "very long", not garbage
_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
# Go-style durations ("1h2m3.5s", "6m0s", "500ms"): units in descending order, each at
# most once; "m" must not swallow the "m" of "ms".
_NUM = r"[0-9]+(?:\.[0-9]+)?"
_DURATION = re.compile(
    rf"(?:(?P<h>{_NUM})h)?"
    rf"(?:(?P<m>{_NUM})m(?!s))?"
    rf"(?:(?P<s>{_NUM})s)?"
    rf"(?:(?P<ms>{_NUM})ms)?"
    rf"(?:(?P<us>{_NUM})(?:us|µs))?"
    rf"(?:(?P<ns>{_NUM})ns)?"
)


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) and value >= 0 else None


def _number(text: str) -> float:
    """A validated digits string as a float; overflow is a very long wait, capped later."""
    return min(float(text), LARGEST)


def parse_duration_seconds(text: str) -> float | None:
    """``"30"``, ``"1.5"``, ``"500ms"``, ``"1m30s"``, ``"6m0s"``, ``"1h2m3.5s"`` → seconds.

    The whole string must match (surrounding whitespace aside); anything else is None.
    """
    if not isinstance(text, str):
        return None
    value = text.strip().lower()
    if not value or len(value) > 64:
        return None
    if _SECONDS.fullmatch(value):
        return _finite(_number(value))
    match = _DURATION.fullmatch(value)
    if match is None or not any(match.groupdict().values()):
        return None
    total = 0.0
    for unit, amount in match.groupdict().items():
        if amount is not None:
            total += _number(amount) * _UNITS[unit]
    return _finite(min(total, LARGEST))


def _http_date(text: str) -> float | None:
    """An RFC 9110 HTTP date (IMF-fixdate, RFC 850 or asctime) as a POSIX time."""
    try:
        moment = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if moment.tzinfo is None:  # asctime carries no zone; HTTP dates are always GMT
        moment = moment.replace(tzinfo=UTC)
    try:
        return _finite(moment.timestamp())
    except (OverflowError, OSError, ValueError):
        return None


def _lower(headers: Mapping[str, str] | Iterable[tuple[str, str]]) -> dict[str, str]:
    """Case-insensitive view; repeated headers are joined with ", " as HTTP allows."""
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    out: dict[str, str] = {}
    for key, value in pairs:
        if not isinstance(key, str) or not isinstance(value, str):
            continue
        k = key.strip().lower()
        out[k] = f"{out[k]}, {value}" if k in out else value
    return out


def _seconds_list(value: str, parse: Callable[[str], float | None]) -> float | None:
    """A single value, or the longest of a comma-joined list (duplicated headers)."""
    one = parse(value)
    if one is not None:
        return float(one)
    parts = [parse(p) for p in value.split(",")]
    found = [float(p) for p in parts if p is not None]
    return max(found) if found else None


def _plain_seconds(value: str) -> float | None:
    v = value.strip()
    return _finite(_number(v)) if _SECONDS.fullmatch(v) else None


def parse_retry_after(
    headers: Mapping[str, str] | Iterable[tuple[str, str]],
    *,
    now: float | None = None,
    cap_s: float = DEFAULT_CAP_S,
) -> float | None:
    """Seconds to wait before retrying, from response ``headers``; None when no hint.

    ``now`` (POSIX seconds) is used for HTTP dates only when the response carries no
    ``Date`` header; it defaults to the current time.
    """
    try:
        h = _lower(headers)
        wait = _retry_after_ms(h)
        if wait is None:
            wait = _retry_after(h, now)
        if wait is None:
            wait = _reset(h)
    except Exception:  # defence in depth: a hint is never worth a crash
        return None
    if wait is None or not math.isfinite(wait) or wait < 0:
        return None
    return min(wait, max(cap_s, 0.0))


def _retry_after_ms(h: dict[str, str]) -> float | None:
    raw = h.get("retry-after-ms")
    if raw is None:
        return None
    ms = _seconds_list(raw, _plain_seconds)
    return None if ms is None else ms / 1000.0


def _retry_after(h: dict[str, str], now: float | None) -> float | None:
    raw = h.get("retry-after")
    if raw is None:
        return None
    seconds = _seconds_list(raw, _plain_seconds)
    if seconds is not None:
        return seconds
    when = _http_date(raw.strip())
    if when is None:
        return None
    reference = _http_date(h["date"]) if "date" in h else None
    if reference is None:
        reference = time.time() if now is None else now
    return max(0.0, when - reference)  # a date in the past means: now


def _reset(h: dict[str, str]) -> float | None:
    resets = {
        kind: _seconds_list(h[f"x-ratelimit-reset-{kind}"], parse_duration_seconds)
        for kind in ("requests", "tokens")
        if f"x-ratelimit-reset-{kind}" in h
    }
    known = {k: v for k, v in resets.items() if v is not None}
    if not known:
        return None
    exhausted = [
        k for k in known if _plain_seconds(h.get(f"x-ratelimit-remaining-{k}", "x")) == 0.0
    ]
    chosen = exhausted or list(known)
    return max(known[k] for k in chosen)
