"""The routing layer: the one policy that chooses routes and rescues, pure.

Above the core (whose cost, routing and failover pieces it composes) and the bus,
below the services: the router service feeds it what it hears on the bus, and
``hecate swarm-sim`` feeds it the in-memory swarm, so both run the same decisions.
"""

from hecate.routing.chooser import Chooser
from hecate.routing.fold import telemetry_nodes

__all__ = ["Chooser", "telemetry_nodes"]
