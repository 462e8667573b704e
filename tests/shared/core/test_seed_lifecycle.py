"""The lifecycle exactly as the seed writes it (§6), end to end on one swarm."""

from __future__ import annotations

from hecate.core import NodeProfile, Recovered, RoutingRequest, Swarm, SwarmConfig


def test_the_seed_lifecycle_runs_as_written() -> None:
    profiles = [
        NodeProfile(node_id="gpu", capacity_layers=12, latency_ms=3.5, score=4.0),
        NodeProfile(node_id="laptop", capacity_layers=8, latency_ms=12.0, score=1.5),
        NodeProfile(node_id="desktop", capacity_layers=6, latency_ms=8.0, score=2.0),
    ]
    swarm = Swarm(profiles, SwarmConfig(12, 2))

    assert swarm.route(RoutingRequest()).node_ids == ("gpu",)  # plan + telemetry -> route
    rescue = swarm.mark_down("gpu")  # death -> rescue route
    assert isinstance(rescue, Recovered)
    assert rescue.kind == "replica"
    assert "gpu" not in rescue.route.node_ids
    assert swarm.status() == "degraded"
    swarm.mark_alive("gpu")  # back -> healthy
    assert swarm.status() == "healthy"
    growth = swarm.add_node(
        NodeProfile(node_id="newcomer", capacity_layers=6, latency_ms=6.0, score=2.0)
    )  # growth without restart
    assert growth.kind == "capacity"
    removal = swarm.remove_node("laptop")  # retire + relocate
    assert removal.dropped == ()
    assert "laptop" not in {s.node_id for p in swarm.plan.pipelines for s in p.stages}
    assert swarm.plan.validate() == []
    assert swarm.status() == "healthy"
    swarm.stop()
    assert swarm.status() == "stopped"
