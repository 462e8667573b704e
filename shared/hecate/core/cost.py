"""The cost model. It exists once, here; everything that ranks pipelines calls it.

    cost(P) = Σ_{n∈P} cost(n) + w_h·15·hops + w_p·10·tokens/1024 + w_l·link_P
    cost(n) = w_l·latency_n + w_c·load_n·120 + w_k·100/max(score_n, 0.01)
    link_P  = rtt_P - Σ_{n∈P} latency_n          (measured; link_ms when not)

``hops`` is stages - 1, latency is in milliseconds, load in [0, 1]. ``rtt_P`` is the
least step the router itself measured on ``P`` lately, from its first send to its last
reply (:mod:`hecate.core.roundtrips`). A measured pipeline's latency term is therefore
what its steps take, not what its nodes report: ``latency_n`` is timed inside a node
and knows nothing of its link to the bus (a node 40 ms away costs 40 ms a stage,
whatever it computes), and it averages everything the node ran (prefills, warm-up
passes), so it is a noisy stand-in for a step. An unmeasured one's is the nodes' sum
plus ``link_ms`` for the links nobody has timed. ``link_P`` is this router's own
knowledge, added at decision time like its in-flight work
(:class:`~hecate.core.router.Router`); the snapshot's costs (failover, a splice, which
is no plan pipeline and has no measurement) are telemetry's alone. Three additions:

* **Unmeasured is penalised, never ignored.** Ignoring a node without telemetry would
  make the worst-measured pipeline look best and send load blindly to the nodes we know
  least about. Each missing field takes a pessimistic value that is never better than
  what the node declared (see :class:`ColdPenalty`), so an unmeasured node can never make
  its pipeline cheaper than the same pipeline measured at its nominal values.
* **In-flight work is load.** ``load_n`` is the effective load: the EWMA load plus
  ``inflight_load`` per request outstanding on the node. A burst therefore raises a
  copy's cost at decision time instead of after telemetry catches up.
* **An unmeasured pipeline pays ``link_ms``** (:class:`ColdPenalty`, 30 ms) over its
  nodes' latencies: neither nothing, which would make the links we know least about
  look free, nor the worst step seen, which would keep a better pipeline from ever
  being tried. A pipeline whose steps take longer than its nodes' latencies plus the
  allowance loses to a like one never tried, so the router finds the better one by
  sending it the next request; one measured within it keeps the traffic. A measurement
  is forgotten when its pipeline has had no step for a window or two, and it then
  counts as unmeasured again. A pipeline the allowance keeps out (one within it was
  measured, or its own figure was forgotten while it was down) would then never be
  sent a step to measure it: the router sends it one now and then instead, a bounded
  share (:meth:`hecate.core.router.Router.explore`), which is not the cost model's
  business and leaves every figure here as it is.
"""

from __future__ import annotations

import msgspec

from hecate.core.plan import NodeProfile
from hecate.core.telemetry import NodeState

HOP_COST = 15.0
TOKEN_COST_PER_1K = 10.0
LOAD_COST = 120.0
SCORE_COST = 100.0
SCORE_FLOOR = 0.01


class RouteWeights(msgspec.Struct, frozen=True, kw_only=True):
    """The weights of the cost formula (all 1.0 by default, as the seed prescribes).

    ``inflight_load`` is how much one outstanding request adds to a node's load: 0.1
    means ten concurrent requests weigh as much as a fully loaded node.
    """

    w_l: float = 1.0
    w_c: float = 1.0
    w_k: float = 1.0
    w_h: float = 1.0
    w_p: float = 1.0
    inflight_load: float = 0.1


class ColdPenalty(msgspec.Struct, frozen=True, kw_only=True):
    """Values assumed for fields a node has never reported.

    * latency: the slower of its declared latency and ``latency_ms`` (250 ms: slower than
      any stage we expect to serve from, yet finite, so the only copy still serves);
    * load: ``load`` (1.0, the top of the range: assume busy until shown otherwise);
    * score: the lower of its declared score and ``score``;
    * what the links add to a step of a pipeline the router has not measured lately:
      ``link_ms`` (30 ms: a few WAN hops' worth, more than a bus on a LAN adds to a
      step; must not be negative).
    """

    latency_ms: float = 250.0
    load: float = 1.0
    score: float = 0.5
    link_ms: float = 30.0


DEFAULT_WEIGHTS = RouteWeights()
DEFAULT_PENALTY = ColdPenalty()


def stage_cost(
    node: NodeState,
    profile: NodeProfile | None = None,
    weights: RouteWeights = DEFAULT_WEIGHTS,
    penalty: ColdPenalty = DEFAULT_PENALTY,
    extra_in_flight: int = 0,
) -> float:
    """``cost(n)`` for one node, with the cold penalty for whatever was never measured."""
    latency = stage_latency_ms(node, profile, penalty)
    load = penalty.load if node.load is None else node.load
    load += (node.in_flight + extra_in_flight) * weights.inflight_load
    score = node.score
    if score is None:
        score = min(profile.score, penalty.score) if profile is not None else penalty.score
    return (
        weights.w_l * latency
        + weights.w_c * load * LOAD_COST
        + weights.w_k * SCORE_COST / max(score, SCORE_FLOOR)
    )


def stage_latency_ms(
    node: NodeState, profile: NodeProfile | None = None, penalty: ColdPenalty = DEFAULT_PENALTY
) -> float:
    """``latency_n`` as costed: as measured, else the cold penalty's."""
    if node.latency_ms is not None:
        return node.latency_ms
    declared = profile.latency_ms if profile is not None else 0.0
    return max(declared, penalty.latency_ms)


def link_cost(
    round_trip_ms: float | None,
    compute_ms: float,
    weights: RouteWeights = DEFAULT_WEIGHTS,
    penalty: ColdPenalty = DEFAULT_PENALTY,
) -> float:
    """``w_l·link_P`` for a pipeline whose nodes report ``compute_ms`` in all
    (Σ :func:`stage_latency_ms`) and whose step was measured at ``round_trip_ms``
    (None: not measured lately): the measured step in place of the nodes' figures, or
    the allowance on top of them. Never less for a slower step; negative when the
    step is quicker than the nodes' figures say."""
    if round_trip_ms is None:
        return weights.w_l * penalty.link_ms
    return weights.w_l * (round_trip_ms - compute_ms)


def hop_cost(stages: int, weights: RouteWeights = DEFAULT_WEIGHTS) -> float:
    return weights.w_h * HOP_COST * max(stages - 1, 0)


def token_cost(tokens: int, weights: RouteWeights = DEFAULT_WEIGHTS) -> float:
    return weights.w_p * TOKEN_COST_PER_1K * tokens / 1024


def inflight_cost(requests: int, weights: RouteWeights = DEFAULT_WEIGHTS) -> float:
    """What ``requests`` outstanding requests, summed over a pipeline's stages, add to it."""
    return weights.w_c * LOAD_COST * weights.inflight_load * requests
