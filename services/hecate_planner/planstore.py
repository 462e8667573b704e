"""Where the plan lives: KV ``hecate-plan/current``, its revision the plan's epoch, and
each node's share of it under ``hecate-plan/node.<id>``.

Reads, compare-and-set writes and the watch, with the plan decoded. A read of an
undecodable or deleted plan is ``None`` at its revision (a tombstone's revision is still
the one to compare-and-set on); the watch yields a deleted plan as ``None`` and hands
an undecodable one to the planner's ``on_bad`` (:func:`hecate.bus.kv.follow`). What to
do about a write lost to another planner is the planner's business, not the store's.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import AsyncIterator, Callable

import msgspec
from nats.aio.client import Client
from nats.js.errors import KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from hecate.bus import kv as kvs
from hecate.bus.service import encode
from hecate.core import SwarmPlan
from hecate.wire import subjects
from hecate.wire.messages import Assignment, Held, PlanChanged
from hecate_planner import assignments

_plan = msgspec.json.Decoder(SwarmPlan)


def plan_digest(plan: SwarmPlan) -> str:
    """What a plan assigns, whatever its epoch: equal digests, the same plan."""
    return hashlib.sha256(encode(msgspec.structs.replace(plan, epoch=0))).hexdigest()[:16]


def same_plan(a: SwarmPlan, b: SwarmPlan | None) -> bool:
    return b is not None and msgspec.structs.replace(a, epoch=0) == msgspec.structs.replace(
        b, epoch=0
    )


async def publish_by_hand(nc: Client, plan: SwarmPlan, *, reason: str = "by hand") -> int:
    """Publish ``plan`` as a planner does (the plan, every node's share, the notice),
    for tools and tests that write a plan themselves with no planner running: nodes
    read their shares, never the plan. Its epoch (the plan's revision)."""
    kv = await kvs.bucket(nc, subjects.PLAN_BUCKET)
    store = PlanStore(kv, "by-hand")
    epoch = await kvs.put(kv, subjects.PLAN_KEY, encode(plan), writer="by-hand")
    for node_id, held in assignments.shares(plan).items():
        await store.put_share(node_id, held, epoch=epoch, nodes=len(plan.nodes))
    notice = PlanChanged(
        epoch=epoch,
        strategy="by-hand",
        planner_id="by-hand",
        pipelines=len(plan.pipelines),
        reason=reason,
        at=time.time(),
        nodes=len(plan.nodes),
    )
    await nc.publish(subjects.EVENT_PLAN, encode(notice))
    await nc.flush()
    return epoch


def _decode(value: bytes | None) -> SwarmPlan | None:
    try:
        return _plan.decode(value) if value else None
    except msgspec.DecodeError:
        return None


class PlanStore:
    def __init__(self, kv: KeyValue, writer: str) -> None:
        self._kv = kv
        self._writer = writer  # names this planner's part keys, for a plan stored in parts

    async def read(self) -> tuple[SwarmPlan | None, int]:
        """The stored plan and its revision (``None`` when there is none, or it is
        deleted or unreadable)."""
        value, revision = await kvs.get(self._kv, subjects.PLAN_KEY)
        return _decode(value), revision

    async def write(self, plan: SwarmPlan, last: int) -> int | None:
        """Compare-and-set ``plan`` on revision ``last``: its new revision, or None when
        someone wrote since."""
        try:
            return await kvs.put(
                self._kv, subjects.PLAN_KEY, encode(plan), writer=self._writer, last=last
            )
        except KeyWrongLastSequenceError:
            return None

    async def put_share(
        self, node_id: str, held: tuple[Held, ...], *, epoch: int, nodes: int
    ) -> None:
        """Write what the plan of ``epoch`` (of ``nodes`` nodes) gives ``node_id``."""
        share = Assignment(node_id=node_id, epoch=epoch, holdings=held, nodes=nodes)
        await self._kv.put(subjects.assignment_key(node_id), encode(share))

    async def follow(
        self, on_bad: Callable[[int, msgspec.DecodeError], None]
    ) -> AsyncIterator[tuple[SwarmPlan | None, int]]:
        """The stored plan now and after every write, with its revision."""
        async for plan, revision in kvs.follow(self._kv, subjects.PLAN_KEY, _plan, on_bad):
            yield plan, revision
