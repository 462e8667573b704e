"""An executor that forwards a whole model to an OpenAI-compatible HTTP endpoint.

A node started with ``--executor upstream`` hosts a model it does not compute: each
request (a stage covering every layer) becomes one ``POST /v1/chat/completions``.
The provider's answers are read with the resilience core:

* **429** (and 503): the wait it asks for, from ``retry-after-ms``, ``retry-after``
  (seconds or an HTTP date) or ``x-ratelimit-reset-*``, via :func:`parse_retry_after`.
  The node refuses locally until then (no point sending what will be refused) and
  returns ``rate_limited`` with ``retry_after_s``; the router reports it to the shared
  breaker, which keeps the circuit open at least that long.
* **Pacing**: ``x-ratelimit-limit-requests`` (per minute) becomes a token bucket this
  executor checks before each call, and ``x-ratelimit-remaining-requests: 0`` pauses it
  until the reset, so one node does not learn the limit by hitting it.
* **5xx**: ``upstream_error`` (retryable); other 4xx: ``upstream_rejected`` (not).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Literal

import httpx

from hecate.model.executor import ExecutorError
from hecate.resilience.bucket import TokenBucket
from hecate.resilience.hints import parse_duration_seconds, parse_retry_after
from hecate.wire.errors import ErrorCode


class UpstreamRefused(ExecutorError):
    """The provider (or our pacing on its behalf) refused; ``retry_after_s`` says when."""


class UpstreamModel:
    """Whole-model executor over HTTP. One per node; safe for concurrent calls."""

    name = "upstream"
    kind: Literal["whole"] = "whole"

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.url = base_url.rstrip("/") + "/v1/chat/completions"
        self.model = model
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.clock = clock
        self.client = client or httpx.AsyncClient(timeout=timeout_s)
        self.bucket: TokenBucket | None = None
        self.limit_per_min: float | None = None
        self.paused_until = 0.0
        self.calls = 0

    async def complete(self, prompt: str, max_tokens: int) -> str:
        now = self.clock()
        if now < self.paused_until:
            wait = self.paused_until - now
            raise UpstreamRefused("rate_limited", f"provider asked to wait {wait:.3f} s more", wait)
        if self.bucket is not None:
            admission = self.bucket.try_acquire(now)
            if not admission.admitted:
                raise UpstreamRefused(
                    "rate_limited",
                    "pacing to the provider's published "
                    f"limit of {self.limit_per_min:g} requests/min",
                    admission.retry_after_s,
                )
        self.calls += 1
        try:
            response = await self.client.post(
                self.url,
                json={
                    "model": self.model,
                    "max_tokens": max_tokens,
                    "messages": [{"role": "user", "content": prompt}],
                },
                headers=self.headers,
            )
        except httpx.HTTPError as exc:
            raise UpstreamRefused("upstream_error", f"provider unreachable: {exc!r}") from None
        self._learn(response.headers, now)
        status = response.status_code
        if status == 429 or status == 503:
            hint = parse_retry_after(response.headers.multi_items(), now=time.time())
            self.paused_until = max(self.paused_until, now + (hint if hint is not None else 1.0))
            code: ErrorCode = "rate_limited" if status == 429 else "upstream_error"
            raise UpstreamRefused(code, f"provider answered {status}", hint)
        if status >= 500:
            raise UpstreamRefused("upstream_error", f"provider answered {status}")
        if status >= 400:
            raise UpstreamRefused(
                "upstream_rejected", f"provider answered {status}: {response.text[:200]}"
            )
        try:
            return str(response.json()["choices"][0]["message"]["content"])
        except (ValueError, KeyError, IndexError, TypeError):
            raise UpstreamRefused("upstream_error", "unreadable provider answer") from None

    def _learn(self, headers: Mapping[str, str], now: float) -> None:
        """Pace on what the provider publishes about its limits."""
        limit = _number(headers.get("x-ratelimit-limit-requests"))
        if limit is not None and limit > 0 and limit != self.limit_per_min:
            self.limit_per_min = limit
            self.bucket = TokenBucket(limit / 60.0, max(1.0, limit), book=False)
        if _number(headers.get("x-ratelimit-remaining-requests")) == 0.0:
            reset = parse_duration_seconds(headers.get("x-ratelimit-reset-requests", ""))
            if reset is not None:
                self.paused_until = max(self.paused_until, now + reset)

    async def close(self) -> None:
        await self.client.aclose()


def _number(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if value >= 0 else None
