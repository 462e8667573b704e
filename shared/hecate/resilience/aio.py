"""The one place resilience touches the event loop: sleeping without blocking it."""

from __future__ import annotations

import anyio

from hecate.resilience.backoff import WaitPolicy


async def pause(policy: WaitPolicy, attempt: int, hint: float | None) -> float:
    """Sleep as long as ``policy`` says (other tasks keep running); return the seconds."""
    seconds = max(0.0, policy.wait(attempt, hint))
    await anyio.sleep(seconds)
    return seconds
