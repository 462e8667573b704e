"""The router service: requests in on ``hecate.infer.<model>``, routed along the plan's
pipelines to the nodes and back, with failover, quotas, admission and retries.

Its pure core has no I/O: the ``desk`` owns every request the router holds (events and
actions in ``desk_flow``; retries and cancels in ``retries``), each flight a
``lifecycle`` (its table in ``states``, events and actions in ``flow``, failures in
``losses`` and ``rescue``), with ``admission``, ``limits``, ``quota``, ``retrybook``,
``reconnect`` and ``hearing`` beside them. ``service`` (bus messages to events) and
``publisher`` (actions to publishes) are the process around it, ``swarmview`` and
``breakers`` what it follows of the swarm. The route
choice itself is :class:`hecate.core.chooser.Chooser`, shared with ``hecate swarm-sim``
so that both run the same decisions.
"""
