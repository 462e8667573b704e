"""``hecate gateway``: the OpenAI-compatible HTTP front door, and the live swarm page.

It is a client of the swarm like any other: requests go out on ``hecate.infer.<model>``,
the plan, telemetry and breaker state are read from their KV buckets and events from
``hecate.events.>``; nothing reaches the services any other way.
"""
