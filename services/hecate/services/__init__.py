"""The service shells: planner, telemetry, router, node (and the breaker's slot).

Each reads like a table of contents: what it listens to, what snapshot it holds, which
pure function it calls, what it publishes.
"""
