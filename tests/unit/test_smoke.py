from hecate.core import NodeProfile, Swarm, SwarmConfig


def test_a_single_node_swarm_routes_through_its_only_node() -> None:
    swarm = Swarm(
        [NodeProfile(node_id="solo", capacity_layers=4)], SwarmConfig(layers=4, pipelines=1)
    )
    assert swarm.route().node_ids == ("solo",)
    assert swarm.status() == "healthy"
