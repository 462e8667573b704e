"""The gateway's Prometheus metrics, on a registry of its own (``GET /metrics``).

Request metrics are counted here as requests go through. The swarm's own gauges and
counters (nodes up and down, complete pipelines, the fewest live replicas of any layer,
failovers by kind from ``hecate.events.failover``, breaker trips) come from the swarm
watch, which registers its collector on the same registry
(:meth:`hecate_gateway.swarm.SwarmWatch.register_metrics`).

Model labels are only ever a model the swarm answered for, never any string a client
sent (a 404's model would let any caller grow the label set without bound).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Seconds. First tokens take tens of ms on the toy model and seconds behind a long
# prompt on a CPU model; tokens follow each other in ms to hundreds of ms.
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "hecate_gateway_requests",
            "HTTP inference requests answered, by endpoint, model and status",
            ["endpoint", "model", "status"],
            registry=r,
        )
        self.in_flight = Gauge(
            "hecate_gateway_requests_in_flight", "Inference requests being answered", registry=r
        )
        self.duration = Histogram(
            "hecate_gateway_request_duration_seconds",
            "From the request to the last byte of its answer",
            ["model"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "hecate_gateway_time_to_first_token_seconds",
            "Streamed answers: from the request to the first content sent",
            ["model"],
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "hecate_gateway_inter_token_latency_seconds",
            "Streamed answers: between consecutive tokens arriving",
            ["model"],
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.tokens = Counter(
            "hecate_gateway_generated_tokens",
            "Tokens generated for answered requests",
            ["model"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            "hecate_gateway_prompt_tokens", "Prompt tokens read", ["model"], registry=r
        )
        self.degraded = Counter(
            "hecate_gateway_degraded_answers",
            "Answers from a reserve model (x-hecate-degraded: true)",
            ["model"],
            registry=r,
        )
        self.prefix_routed = Counter(
            "hecate_gateway_prefix_routed",
            "Answered turns by where the router sent them as to a prefix it knew kept: "
            "toward a pipeline keeping some, none known, or elsewhere (full, or costlier)",
            ["model", "outcome"],
            registry=r,
        )
        self.rate_limited = Counter(
            "hecate_gateway_rate_limited",
            "429 answers (a tenant's quota or a busy swarm)",
            ["model"],
            registry=r,
        )
        self.cancelled = Counter(
            "hecate_gateway_cancelled",
            "Requests whose client hung up before the answer; the swarm was told to stop",
            registry=r,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)


METRICS = Metrics()
registry = METRICS.registry
