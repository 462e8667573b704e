"""Where the plan lives: KV ``hecate-plan/current``, its revision the plan's epoch.

Reads, compare-and-set writes and the watch, with the plan decoded. A read of an
undecodable or deleted plan is ``None`` at its revision (a tombstone's revision is still
the one to compare-and-set on); the watch yields a deleted plan as ``None`` and hands
an undecodable one to the planner's ``on_bad`` (:func:`hecate.bus.kv.follow`). What to
do about a write lost to another planner is the planner's business, not the store's.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Callable

import msgspec
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from hecate.bus import kv as kvs
from hecate.bus.service import encode
from hecate.core import SwarmPlan
from hecate.wire import subjects

_plan = msgspec.json.Decoder(SwarmPlan)


def plan_digest(plan: SwarmPlan) -> str:
    """What a plan assigns, whatever its epoch: equal digests, the same plan."""
    return hashlib.sha256(encode(msgspec.structs.replace(plan, epoch=0))).hexdigest()[:16]


def same_plan(a: SwarmPlan, b: SwarmPlan | None) -> bool:
    return b is not None and msgspec.structs.replace(a, epoch=0) == msgspec.structs.replace(
        b, epoch=0
    )


def _decode(value: bytes | None) -> SwarmPlan | None:
    try:
        return _plan.decode(value) if value else None
    except msgspec.DecodeError:
        return None


class PlanStore:
    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv

    async def read(self) -> tuple[SwarmPlan | None, int]:
        """The stored plan and its revision (``None`` when there is none, or it is
        deleted or unreadable)."""
        try:
            entry = await self._kv.get(subjects.PLAN_KEY)
        except KeyNotFoundError as exc:
            return None, int(getattr(exc.entry, "revision", 0) or 0)
        return _decode(entry.value), int(entry.revision or 0)

    async def write(self, plan: SwarmPlan, last: int) -> int | None:
        """Compare-and-set ``plan`` on revision ``last``: its new revision, or None when
        someone wrote since."""
        try:
            return int(await self._kv.update(subjects.PLAN_KEY, encode(plan), last=last))
        except KeyWrongLastSequenceError:
            return None

    async def follow(
        self, on_bad: Callable[[int, msgspec.DecodeError], None]
    ) -> AsyncIterator[tuple[SwarmPlan | None, int]]:
        """The stored plan now and after every write, with its revision."""
        async for plan, revision in kvs.follow(self._kv, subjects.PLAN_KEY, _plan, on_bad):
            yield plan, revision
