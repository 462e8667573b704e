"""The planner's view of who is in the swarm: the members (each node's profile with the
executor it runs), those heard leaving, those telemetry called down and since when, and
the core :class:`Swarm` planned over them.

No I/O and no clock of its own: the service hands it what it heard and the time, and
each method says whether the plan changed, so that the service publishes it. A member
telemetry calls down leaves the plan once it has stayed down the retirement wait (with
the members that went down beside it), unless the last copy of a model goes through it;
heard again, it comes back through growth as a joiner would.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from typing import Any

from hecate.bus.logs import event
from hecate.core import NodeProfile, Planner, Swarm, SwarmConfig, SwarmPlan
from hecate.core.growth import retire
from hecate.core.planners import unexecutable
from hecate.wire.messages import NodeEvent

__all__ = ["Membership"]


class Membership:
    def __init__(
        self,
        config: SwarmConfig,
        planner: Planner,
        log: logging.Logger,
        profile_pace_s: float = 30.0,
    ) -> None:
        self.config = config
        self.planner = planner
        self.log = log
        # A member's changed profile is planned at most once in this long; later ones
        # wait for the next turn, the latest winning (:meth:`changes_due`): a node that
        # re-joined with a new profile again and again re-planned the swarm each time.
        self.profile_pace_s = profile_pace_s
        self._changed_at: dict[str, float] = {}  # when each member's profile last changed
        self.pending: dict[str, NodeProfile] = {}  # changes waiting for their turn
        self.members: dict[str, NodeProfile] = {}
        self.gone: set[str] = set()  # heard leaving (until they join again)
        # Members telemetry called down, and when (monotonic): each leaves the plan once
        # it has been down the retirement wait, and comes back when heard again.
        self.silent: dict[str, tuple[NodeProfile, float]] = {}
        self.swarm: Swarm | None = None
        self.last_join = -math.inf  # monotonic
        self._heard_at: dict[str, float] = {}  # telemetry's time of its latest word on each
        self._why_down: dict[str, str] = {}  # telemetry's reason, for the log
        self._held: dict[str, int] = {}  # down, kept: the plan epoch that could not lose it
        self._unexecutable: set[str] = set()  # models logged as having no executor here

    def _in_plan(self, node_id: str) -> bool:
        return self.swarm is not None and node_id in self.swarm.state.nodes

    # -- what nodes and telemetry say ----------------------------------------------------

    def admit(self, profile: NodeProfile, now: float, why: str = "node joined") -> bool:
        """``profile`` is a member: new, changed, or back. Whether the plan changed
        (a joiner that only joins the spare counts: the plan says which nodes are
        spare)."""
        node_id = profile.node_id
        self.gone.discard(node_id)
        was_down = self.silent.pop(node_id, None) is not None
        self._why_down.pop(node_id, None)
        self._held.pop(node_id, None)
        known = self.members.get(node_id)
        if known == profile:
            # A re-join (roll-call, or a restart before it left the plan): nothing new.
            self.pending.pop(node_id, None)
            if was_down and self.swarm is not None and self._in_plan(node_id):
                self.swarm.mark_alive(node_id)
            return False
        if (
            known is not None
            and now - self._changed_at.get(node_id, -math.inf) < self.profile_pace_s
        ):
            if node_id not in self.pending:
                event(self.log, "profile change held", logging.WARNING, node_id=node_id)
            self.pending[node_id] = profile
            if was_down and self.swarm is not None and self._in_plan(node_id):
                self.swarm.mark_alive(node_id)
            return False
        self.pending.pop(node_id, None)
        if known is not None:  # a first join is no change: a restart's new profile is not held
            self._changed_at[node_id] = now
        self.members[node_id] = profile
        self.last_join = now
        if self.swarm is not None:
            if self._in_plan(node_id):
                self.swarm.remove_node(node_id)  # a changed profile: re-admit it
            growth = self.swarm.add_node(profile)
            event(
                self.log,
                why,
                node_id=node_id,
                growth=growth.kind,
                pipelines=list(growth.pipelines),
            )
        return True

    def changes_due(self, now: float) -> bool:
        """The held profile changes whose turn has come, planned; whether the plan
        changed."""
        due = [
            p
            for n, p in self.pending.items()
            if now - self._changed_at.get(n, -math.inf) >= self.profile_pace_s
        ]
        changed = False
        for profile in due:
            changed |= self.admit(profile, now, "node changed its profile")
        return changed

    def leave(self, node_id: str) -> bool:
        self.pending.pop(node_id, None)
        self.gone.add(node_id)
        self.silent.pop(node_id, None)
        return self.retire(node_id, "node left")

    def newest(self, news: NodeEvent) -> bool:
        """Whether ``news`` is the latest word on its node: downs and ups come on two
        subjects, each read by a task of its own, so a node called down and heard again
        a moment later may be read up first; the older word is then left out."""
        if news.at < self._heard_at.get(news.node_id, -math.inf):
            return False
        self._heard_at[news.node_id] = news.at
        return True

    def down(self, news: NodeEvent, now: float) -> None:
        """Telemetry called a member down: it leaves the plan once it has stayed down
        the retirement wait (:meth:`retire_due`)."""
        if not self.newest(news):
            return
        profile = self.members.get(news.node_id)
        if profile is not None and news.node_id not in self.silent:
            self.silent[news.node_id] = (profile, now)
            self._why_down[news.node_id] = news.reason
            if self.swarm is not None and self._in_plan(news.node_id):
                # Down in the planner's own view too: no copy is rebuilt onto it, and
                # the copies through it count as broken.
                self.swarm.mark_down(news.node_id)

    def up(self, news: NodeEvent, now: float) -> bool:
        """A member called down is heard again: if it already left the plan it comes
        back as a joiner would (the plan changed); if not, nothing changed."""
        if not self.newest(news):
            return False
        entry = self.silent.pop(news.node_id, None)
        self._why_down.pop(news.node_id, None)
        self._held.pop(news.node_id, None)
        if entry is None:
            return False
        if news.node_id not in self.members:
            return self.admit(entry[0], now, "node up: back in the plan")
        if self.swarm is not None and self._in_plan(news.node_id):
            self.swarm.mark_alive(news.node_id)
        return False

    # -- retirement ----------------------------------------------------------------------

    def retire_due(self, now: float, wait_s: float) -> bool:
        """Members down ``wait_s`` leave the plan, as leavers do (their copies repaired
        from the spare, or dropped and rebuilt from what is left), so routers stop
        splicing around them and a node gone for good holds no layers for ever. Members
        that went down together leave together, in one plan: once one is due, every
        member down at least half as long goes with it (a rack cut off is called down
        over a second or so, one node at a time). Whether the plan changed."""
        down = {n: now - since for n, (_p, since) in self.silent.items() if n in self.members}
        if not any(s >= wait_s for s in down.values()):
            return False
        changed = False
        for node_id, silent_s in down.items():
            if silent_s >= wait_s / 2 and self.retirable(node_id):
                reason = self._why_down.pop(node_id, "")
                changed |= self.retire(node_id, "node down: out of the plan", reason=reason)
        return changed

    def retirable(self, node_id: str) -> bool:
        """Whether the plan can go on without ``node_id`` and still hold a copy of every
        model it holds one of now. The last copy of a model, broken, is kept: the
        routers splice it or degrade to the reserve while it is there, and a model
        with no copy at all would be answered as one never served. Judged again only
        when the plan changes."""
        swarm = self.swarm
        if swarm is None or node_id not in swarm.state.nodes:
            return True
        pipelines = swarm.plan.pipelines
        through = {p.model_id for p in pipelines if node_id in p.node_ids}
        if through <= {p.model_id for p in pipelines if node_id not in p.node_ids}:
            return True  # retirement drops only copies through it: each model keeps one
        epoch = swarm.plan.epoch
        if self._held.get(node_id) == epoch:
            return False
        after = retire(swarm.state, node_id, self.planner).pipelines
        lost = {p.model_id for p in swarm.plan.pipelines} - {p.model_id for p in after}
        if not lost:
            return True
        if node_id not in self._held:
            event(
                self.log,
                "node down: kept in the plan",
                logging.WARNING,
                node_id=node_id,
                why=f"the last copy of {', '.join(sorted(lost))} goes through it",
            )
        self._held[node_id] = epoch
        return False

    def retire(self, node_id: str, why: str, **fields: Any) -> bool:
        """``node_id`` leaves the members and the plan; whether the plan changed."""
        self._held.pop(node_id, None)
        if self.members.pop(node_id, None) is None:
            return False
        if self.swarm is None or not self._in_plan(node_id):
            return False
        removal = self.swarm.remove_node(node_id)
        event(
            self.log,
            why,
            node_id=node_id,
            relocated=len(removal.relocated),
            dropped=list(removal.dropped),
            **fields,
        )
        return True

    # -- the plan over them --------------------------------------------------------------

    def report_unexecutable(self) -> None:
        """Log each model no member can execute, once until that changes."""
        missing = unexecutable(self.config.all_models(), self.members.values())
        for model, present in missing:
            if model.model_id not in self._unexecutable:
                event(
                    self.log,
                    "model not planned: no node runs its executor",
                    logging.WARNING,
                    model_id=model.model_id,
                    executor=model.executor,
                    executors_present=list(present),
                )
        self._unexecutable = {m.model_id for m, _ in missing}

    def form(self) -> Swarm:
        """The first plan, over every member (raises the core's InsufficientCapacity)."""
        self.swarm = Swarm(self.members.values(), self.config, planner=self.planner)
        return self.swarm

    def resume(self, theirs: SwarmPlan) -> bool:
        """Carry on from ``theirs`` (another planner's), then apply what this planner
        knows of the membership through growth and retirement. Whether that changed
        it (this planner then publishes its own)."""
        swarm = Swarm.resume(theirs, self.config, planner=self.planner)
        for profile in theirs.nodes:
            known = self.members.get(profile.node_id)
            if known is None and (profile.node_id in self.gone or profile.node_id in self.silent):
                swarm.remove_node(profile.node_id)
            elif known is None:
                self.members[profile.node_id] = profile  # joined while we were not listening
            elif known != profile:
                swarm.remove_node(profile.node_id)
                swarm.add_node(known)
        self._add_unplanned(swarm, self.members.values())
        self.swarm = swarm
        return swarm.plan.pipelines != theirs.pipelines

    @staticmethod
    def _add_unplanned(swarm: Swarm, members: Iterable[NodeProfile]) -> None:
        planned = {n.node_id for n in swarm.plan.nodes}
        for profile in members:
            if profile.node_id not in planned:
                swarm.add_node(profile)
