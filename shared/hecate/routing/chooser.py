"""The router's policy: which nodes may take work, which route a request takes, how a
request in flight is rescued.

The policy itself is :class:`hecate.core.chooser.Chooser`, pure and made only of core
pieces, so that the core's :class:`~hecate.core.swarm.Swarm` (and with it ``hecate
swarm-sim`` and the planner) can decide through it too. The router service takes it
from here, beside the telemetry fold that feeds it.
"""

from hecate.core.chooser import Chooser

__all__ = ["Chooser"]
