"""What ``llm-overload`` must show beyond the acceptance every scenario has: under many
users at once, and a stage killed among them, no node but the killed one is declared
down, and once the killed node is back the swarm serves at full rate again within
:data:`BACK_WITHIN_S`. Pure functions over the run's record (token arrival times,
telemetry's node events, the fault marks); no processes, no bus.

*Full rate* is measured in the same run: the tokens/s streamed to all callers together
from the first token to the kill. The swarm is back at full rate at the first 1 s
window, starting no earlier than the killed node's first heartbeat after its restart,
that holds at least :data:`FULL_SHARE` of that rate; the time from the heartbeat to the
start of that window is reported. The heartbeat, not the process start, is the
reference: a fresh process spends seconds importing and loading weights before it can
say anything, and that is not what the swarm's recovery is about.

Full rate alone does not show the node back at work: the surviving pipeline may keep
that rate up by itself. So the killed node must also carry a generation again: one
started after its return and answered through it.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence

FULL_SHARE = 0.8  # of the tokens/s before the kill
WINDOW_S = 1.0
BACK_WITHIN_S = 2.0


def tokens_per_s(times: Sequence[float], start: float, end: float) -> float:
    """Tokens that arrived in [start, end) per second (``times`` sorted); 0 for an empty
    span."""
    if end <= start:
        return 0.0
    return (bisect_left(times, end) - bisect_left(times, start)) / (end - start)


def full_rate_after(
    times: Sequence[float], since: float, floor_per_s: float, window_s: float = WINDOW_S
) -> float | None:
    """The earliest delay d ≥ 0 such that the window (since + d, since + d + window_s]
    holds at least ``floor_per_s * window_s`` tokens (``times`` sorted); None when
    no window does before the last token."""
    need = floor_per_s * window_s
    # The count in a sliding window rises only when its end reaches a token: those ends,
    # and the window right at ``since``, are the only starts to try.
    starts = [since] + [t - window_s for t in times if t - window_s > since]
    for start in starts:
        count = bisect_right(times, start + window_s) - bisect_right(times, start)
        if count >= need:
            return start - since
    return None


def downs_by_node(events: Iterable[tuple[float, str, str]]) -> dict[str, int]:
    """How many times telemetry declared each node down (``events``: (when, node,
    "down" | "up"))."""
    out: dict[str, int] = {}
    for _, node, state in events:
        if state == "down":
            out[node] = out.get(node, 0) + 1
    return out


def carried_after(answers: Iterable[tuple[float, Sequence[str]]], node: str, since: float) -> int:
    """How many answers (``answers``: (started, the route's nodes) of each right one)
    started at ``since`` or later and went through ``node``."""
    return sum(1 for started, nodes in answers if started >= since and node in nodes)


def findings(
    times: Sequence[float],
    killed_at: float,
    back_at: float | None,
    victim: str,
    events: Iterable[tuple[float, str, str]],
    answers: Iterable[tuple[float, Sequence[str]]] = (),
) -> tuple[dict[str, bool], dict[str, float]]:
    """The scenario's own checks and the figures behind them. ``times``: every token's
    arrival; ``killed_at``: the SIGKILL; ``back_at``: the victim's first heartbeat after
    its restart (None: never heard again); ``events``: telemetry's node events;
    ``answers``: (started, route nodes) of every right answer."""
    times = sorted(times)
    before = tokens_per_s(times, times[0], killed_at) if times and times[0] < killed_at else 0.0
    downs = downs_by_node(events)
    notes: dict[str, float] = {"tokens_per_s_before_kill": round(before, 2)}
    notes |= {f"down_events_{node}": float(n) for node, n in sorted(downs.items())}
    recovered = None
    if back_at is not None and before > 0:
        recovered = full_rate_after(times, back_at, FULL_SHARE * before)
        if recovered is not None:
            notes["full_rate_s_after_heartbeat"] = round(recovered, 2)
    carried = carried_after(answers, victim, back_at) if back_at is not None else 0
    notes["answers_through_the_killed_node_after_its_return"] = float(carried)
    checks = {
        "no_node_down_but_the_killed": set(downs) <= {victim},
        "tokens_streamed_before_the_kill": before > 0,
        "killed_node_heartbeats_again": back_at is not None,
        "full_rate_within_2s_of_its_return": recovered is not None and recovered <= BACK_WITHIN_S,
        "killed_node_carries_generations_again": carried > 0,
    }
    return checks, notes
