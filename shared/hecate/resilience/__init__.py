"""Resilience against upstreams that say "slow down": hints, jitter, breakers, quotas.

Pure and clock-injected, like the core (only :mod:`hecate.resilience.aio` touches the
event loop, to sleep).
"""

from hecate.resilience.backoff import POLICIES, DecorrelatedJitter, FullJitter, SeedPolicy
from hecate.resilience.breaker import TRANSITIONS, BreakerSnapshot, CircuitBreaker
from hecate.resilience.bucket import Admission, Quota, TokenBucket
from hecate.resilience.hints import parse_duration_seconds, parse_retry_after

__all__ = [
    "POLICIES",
    "TRANSITIONS",
    "Admission",
    "BreakerSnapshot",
    "CircuitBreaker",
    "DecorrelatedJitter",
    "FullJitter",
    "Quota",
    "SeedPolicy",
    "TokenBucket",
    "parse_duration_seconds",
    "parse_retry_after",
]
