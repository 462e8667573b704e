"""In-memory simulation of the swarm lifecycle (``hecate swarm-sim``)."""

from hecate.sim.simulate import SimReport, simulate
from hecate.sim.topology import Topology, TopologyError, parse_topology

__all__ = ["SimReport", "Topology", "TopologyError", "parse_topology", "simulate"]
