"""The router service: requests in on ``hecate.infer.<model>``, routed along the plan's
pipelines to the nodes and back, with failover, quotas, admission and retries.

Its pure policy (``flow``, ``lifecycle``, ``rescue``, ``reconnect``, ``hearing``,
``quota``, ``retrybook``, ``limits``) has no I/O; ``service`` and the modules it drives
(``intake``, ``flightdeck``, ``swarmview``, ``breakers``) are its shell. The route
choice itself is :class:`hecate.core.chooser.Chooser`, shared with ``hecate swarm-sim``
so that both run the same decisions.
"""
