"""The swarm gauges and event counters on the gateway's ``/metrics``, read from a
:class:`~hecate_gateway.swarm.SwarmWatch` at each scrape."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from hecate_gateway.swarm import SwarmWatch


class SwarmCollector(Collector):
    """The swarm gauges and event counters, read from a :class:`SwarmWatch` at each
    scrape (nothing to keep in step between scrapes)."""

    def __init__(self, watch: SwarmWatch) -> None:
        self.watch = watch

    def describe(self) -> Iterable[Metric]:
        return self._families().values()

    def collect(self) -> Iterable[Metric]:
        r, tally = self.watch.report(), self.watch.tally
        families = self._families()
        nodes = families["hecate_swarm_nodes"]
        for health, count in (
            ("up", r.nodes_up),
            ("down", r.nodes_down),
            ("draining", r.nodes_draining),
        ):
            nodes.add_metric([health], count)
        families["hecate_swarm_plan_epoch"].add_metric([], r.epoch)
        for m in r.models:
            families["hecate_swarm_pipelines_planned"].add_metric([m.model_id], len(m.pipelines))
            families["hecate_swarm_pipelines_complete"].add_metric(
                [m.model_id], m.complete_pipelines
            )
            families["hecate_swarm_pipelines_servable"].add_metric(
                [m.model_id], m.servable_pipelines
            )
            families["hecate_swarm_layer_min_live_replicas"].add_metric(
                [m.model_id], m.min_live_replicas
            )
            families["hecate_swarm_model_servable"].add_metric([m.model_id], float(m.servable))
        for kind, count in sorted(tally.failovers.items()):
            families["hecate_failovers"].add_metric([kind], count)
        families["hecate_breaker_trips"].add_metric([], tally.breaker_trips)
        return families.values()

    @staticmethod
    def _families() -> dict[str, GaugeMetricFamily | CounterMetricFamily]:
        model = ["model"]
        families: list[GaugeMetricFamily | CounterMetricFamily] = [
            GaugeMetricFamily(
                "hecate_swarm_nodes", "Nodes of the swarm by health (telemetry)", labels=["health"]
            ),
            GaugeMetricFamily("hecate_swarm_plan_epoch", "The current plan's epoch (0: none)"),
            GaugeMetricFamily(
                "hecate_swarm_pipelines_planned", "Pipelines the plan has per model", labels=model
            ),
            GaugeMetricFamily(
                "hecate_swarm_pipelines_complete",
                "Pipelines per model whose every node telemetry hears",
                labels=model,
            ),
            GaugeMetricFamily(
                "hecate_swarm_pipelines_servable",
                "Pipelines per model a router would send to (every node up, circuits closed)",
                labels=model,
            ),
            GaugeMetricFamily(
                "hecate_swarm_layer_min_live_replicas",
                "The fewest up nodes hosting any one layer of the model",
                labels=model,
            ),
            GaugeMetricFamily(
                "hecate_swarm_model_servable",
                "1 when the model can be served (its own pipeline, or a reserve)",
                labels=model,
            ),
            CounterMetricFamily(
                "hecate_failovers",
                "Failovers the routers announced since this gateway started, by kind",
                labels=["kind"],
            ),
            CounterMetricFamily(
                "hecate_breaker_trips",
                "Circuits tripped open (from closed) since this gateway started",
            ),
        ]
        return {f.name: f for f in families}
