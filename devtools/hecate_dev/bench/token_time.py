"""Where a token's time goes in the swarm: compute, waiting, the nodes' own work, the bus
and the router, at 1 and at 16 users, from the spans every process exports.

``hecate bench tokens`` (or ``python -m hecate_dev.bench.token_time``) stands the
3-stage chained swarm of ``hecate bench llm``
(:func:`hecate_dev.bench.llm_swarm.standing`: a router, telemetry and three SmolLM2
nodes of 10 blocks, one engine thread each) with every process exporting its spans
over OTLP/HTTP to a collector in this process, runs greedy generations of ``--tokens``
tokens for 1 user and for ``--users`` at once, checks every text against
the single-process greedy text, and splits each decode step (prefill steps left out)
along its spans:

* **compute**: the step's batch in the engine (``hecate.compute_ms`` on each node's
  span), summed over the stages;
* **queue**: waiting for the node's compute thread (``hecate.queue_ms``): another
  batch running, or the gather of a burst;
* **node**: the rest of each node's span: decoding the request, the session's
  bookkeeping, encoding the activation and forwarding it;
* **bus**: the router's stage span less its nodes' spans: NATS between router and
  first node, node and node, last node and router, each process's event loop getting
  to the message;
* **router**: from one step's end to the next one's start at the router: streaming
  the token, choosing and sending the next step.

Per user, the five add up to the time between two of its tokens. Spans cost about
15 µs each where they are exported, so the swarm runs a little slower than untraced.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import http.server
import itertools
import json
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from hecate_dev.bench.llm_single import PROMPT
from hecate_dev.bench.llm_swarm import _generate, standing

STAGES = [[("a", 0, 10), ("b", 10, 20), ("c", 20, 30)]]
PARTS = ("compute", "queue", "node", "bus", "router")


@dataclass(frozen=True)
class Span:
    service: str
    name: str
    trace: str
    id: str
    parent: str
    start: int
    end: int
    attrs: dict[str, Any]

    @property
    def ms(self) -> float:
        return (self.end - self.start) / 1e6


def decode_spans(body: bytes) -> list[Span]:
    """The spans of one OTLP/HTTP export request (protobuf)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    out = []
    for rs in ExportTraceServiceRequest.FromString(body).resource_spans:
        names = (a.value.string_value for a in rs.resource.attributes if a.key == "service.name")
        service = next(names, "?")
        for s in (s for scope in rs.scope_spans for s in scope.spans):
            attrs = {a.key: a.value.double_value or a.value.int_value for a in s.attributes}
            ids = (s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex())
            out.append(
                Span(service, s.name, *ids, s.start_time_unix_nano, s.end_time_unix_nano, attrs)
            )
    return out


@dataclass
class Collector:
    """An OTLP/HTTP trace receiver on a free local port; spans as they arrive."""

    spans: list[Span] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        collector = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                spans = decode_spans(self.rfile.read(int(self.headers["Content-Length"])))
                with collector.lock:
                    collector.spans += spans
                self.send_response(200)
                self.end_headers()

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def take(self) -> list[Span]:
        """The spans received so far, and none kept."""
        with self.lock:
            out, self.spans = self.spans, []
        return out


def breakdown(spans: list[Span]) -> dict[str, float]:
    """Each part's mean milliseconds per decode step per user (see the module's list),
    and the steps counted."""
    children = collections.defaultdict(list)
    for s in spans:
        children[s.parent].append(s)
    steps = sorted((s for s in spans if s.name.startswith("stage ")), key=lambda s: s.start)
    by_trace = collections.defaultdict(list)
    for s in steps:
        by_trace[s.trace].append(s)
    parts: dict[str, list[float]] = {p: [] for p in PARTS}
    for trace_steps in by_trace.values():
        # Every step after the prompt's (the first): decode steps.
        for prev, step in itertools.pairwise(trace_steps):
            nodes, frontier = [], children[step.id]
            while frontier:  # the chain: each node's span is the next one's parent
                node = next((c for c in frontier if c.name == "node run"), None)
                if node is None:
                    break
                nodes.append(node)
                frontier = children[node.id]
            if len(nodes) != len(STAGES[0]):
                continue  # a step whose spans did not all arrive
            compute = sum(float(n.attrs.get("hecate.compute_ms", 0.0)) for n in nodes)
            queue = sum(float(n.attrs.get("hecate.queue_ms", 0.0)) for n in nodes)
            parts["compute"].append(compute)
            parts["queue"].append(queue)
            parts["node"].append(sum(n.ms for n in nodes) - compute - queue)
            parts["bus"].append(step.ms - sum(n.ms for n in nodes))
            parts["router"].append((step.start - prev.end) / 1e6)
    out = {p: round(statistics.fmean(v), 3) if v else 0.0 for p, v in parts.items()}
    out["token_ms"] = round(sum(out[p] for p in PARTS), 3)
    out["steps"] = len(parts["compute"])
    return out


async def _users(url: str, users: int, tokens: int) -> list[Any]:
    return await asyncio.gather(*(_generate(url, tokens) for _ in range(users)))


def run(tokens: int = 48, users: int = 16, rounds: int = 3) -> dict[str, Any]:
    """The breakdown at 1 and at ``users`` users, ``rounds`` generations each (all the
    users' at once), every text checked."""
    from hecate.llm.reference import greedy_text
    from hecate.llm.store import pull

    want = greedy_text(pull("smollm2-135m", progress=lambda _l: None), PROMPT, tokens)
    collector = Collector()
    results: dict[str, Any] = {"tokens": tokens, "rounds": rounds, "levels": {}}
    with standing(STAGES, dispatch="chain", otlp=collector.url) as swarm:
        for level in (1, users):
            spans: list[Span] = []
            rates, wrong = [], 0
            for _ in range(rounds):
                asyncio.run(_users(swarm.url, 1, 4))  # settle: every path warm
                time.sleep(0.5)
                collector.take()
                began = time.perf_counter()
                done = asyncio.run(_users(swarm.url, level, tokens))
                elapsed = time.perf_counter() - began
                rates.append(sum(len(g[2]) for g in done) / elapsed)
                wrong += sum(g[4].output != want for g in done)
                time.sleep(1.0)  # the processes export every 200 ms
                spans += collector.take()
            rate = statistics.median(rates)
            results["levels"][str(level)] = {
                **breakdown(spans),
                "tokens_per_s": round(rate, 1),
                # what the users saw, the prompt's steps and first token included
                "ms_per_token_per_user": round(1000 * level / rate, 1),
                "wrong_texts": wrong,
            }
    if any(v["wrong_texts"] for v in results["levels"].values()):
        results["failed_checks"] = ["a generation's text differs from the single process's"]
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--users", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    print(json.dumps(run(args.tokens, args.users, args.rounds), indent=1))


if __name__ == "__main__":
    main()
