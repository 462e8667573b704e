"""The gateway section: what the HTTP gateway adds over a direct NATS request
(``hecate bench gateway``), and the targets it is judged by (the suite prints the same
verdicts from the same function)."""

# Prose for people: its dashes and multiplication signs are meant.
# ruff: noqa: RUF001

from __future__ import annotations

from hecate_dev.bench.report.markdown import Doc, Target, num, provenance, table, verdict
from hecate_dev.bench.results import load
from hecate_dev.bench.results_gateway import Capacity, GatewayResult, Latency, Stream

# Issue 13's targets on this machine; LiteLLM publishes 2-12 ms at p50 for its proxy.
TARGETS_US = {"added_p50": 1000.0, "added_p99": 5000.0, "stream_added_p50": 500.0}
ANCHOR = "LiteLLM's published proxy overhead is 2–12 ms at p50"
ROLES = ("gateway", "routers", "nodes", "nats-server", "other services", "load generators")


def wrong_answers(r: GatewayResult) -> int:
    """Answers whose text was not the direct answer's, over every part of the run."""
    n = sum(r.toy.latency.wrong.values())
    n += r.toy.capacity.wrong if r.toy.capacity else 0
    return n + r.stream.wrong


def judge(r: GatewayResult) -> dict[str, bool | None]:
    """Each target met (True), not met (False) or not measured (None), from the figures
    alone. A figure from a run with a wrong answer meets nothing."""
    right = wrong_answers(r) == 0
    latency = r.toy.latency
    streamed = r.stream.added_us

    def within(figure: float | None, bound: float) -> bool | None:
        return None if figure is None else right and figure <= bound

    return {
        "added_p50": within(latency.added_p50_us, TARGETS_US["added_p50"]),
        "added_p99": within(latency.added_p99_us, TARGETS_US["added_p99"]),
        "stream_added_p50": within(
            streamed.p50 if streamed else None, TARGETS_US["stream_added_p50"]
        ),
        "answers_right": right,
    }


def said(met: bool | None) -> str:
    """A verdict as the suite prints it."""
    return {True: "met", False: "not met", None: "not measured"}[met]


def ms(us: float, digits: int = 2) -> str:
    return num(us / 1000, digits)


def signed_ms(us: float) -> str:
    return ("+" if us >= 0 else "−") + ms(abs(us))


def _latency(lat: Latency) -> str:
    rows = [
        ("direct NATS request (nats-py)", lat.direct_us, None),
        (
            "through the gateway, minimal HTTP/1.1 client",
            lat.gateway_us,
            (lat.added_p50_us, lat.added_p99_us),
        ),
        (
            "through the gateway, httpx (the `openai` SDK's client)",
            lat.gateway_httpx_us,
            (lat.added_p50_us_httpx, lat.added_p99_us_httpx),
        ),
    ]
    out = []
    for label, f, added in rows:
        plus = ["–", "–"] if added is None else [signed_ms(added[0]), signed_ms(added[1])]
        out.append([label, ms(f.p50), ms(f.p99), *plus, f"{f.samples:,}"])
    return table(["path", "p50 ms", "p99 ms", "added p50", "added p99", "answers timed"], out)


def _capacity(cap: Capacity | None) -> str:
    if not cap:
        return "The capacity part did not run in this report.\n"
    paths = (("direct NATS", cap.direct), ("through the gateway", cap.gateway))
    rows = []
    for label, path in paths:
        for level in path.levels:
            rounds = ", ".join(num(x, 0) for x in level.rounds_rps)
            used = [num(level.cores.get(r, 0.0), 2) for r in ROLES]
            rows.append([label, str(level.clients), num(level.rps, 0), rounds, *used])
    header = ["path", "clients", "req/s (median round)", "rounds", *[f"{r} (cores)" for r in ROLES]]

    def best(key: str) -> str:
        c = cap.direct if key == "direct" else cap.gateway
        floor = ", still growing: a floor" if c.growing else ""
        return f"{num(c.rps, 0)} req/s (at {c.clients} clients{floor})"

    ratios = ", ".join(num(x, 3) for x in cap.ratio_rounds)
    # A floor under the divisor makes the ratio an upper bound, under the dividend a lower.
    bound = {(False, False): "", (True, False): "≤ ", (False, True): "≥ ", (True, True): "? "}
    shown = bound[(cap.direct.growing, cap.gateway.growing)]
    return f"""{table(header, rows)}

Capacity, each path's best level: direct {best("direct")}, through the gateway
{best("gateway")}. Gateway ÷ direct: **{shown}{num(cap.ratio, 3)}×** (the median of the
rounds' ratios of best levels: {ratios}). Requests that got no answer or an error:
{cap.failed:,}; a wrong answer: {cap.wrong:,}.
"""


def _stream(s: Stream) -> tuple[str, str]:
    """The streaming paragraph and the headline figure."""
    a, h = s.added_us, s.added_us_httpx
    if s.skipped is not None or a is None or h is None:
        return f"Not measured in this run: {s.skipped or 'no figures'}.\n", "not run"
    rows = [
        ["added per token, p50 (ms)", ms(a.p50, 3), ms(h.p50, 3)],
        ["added per token, p99 (ms)", ms(a.p99, 3), ms(h.p99, 3)],
        ["added per token, max (ms)", ms(a.max, 3), ms(h.max, 3)],
        ["tokens timed", f"{a.samples:,}", f"{h.samples:,}"],
        [
            "tokens/s of one stream (median round)",
            num(s.gateway_tokens_per_s, 1),
            num(s.gateway_httpx_tokens_per_s, 1),
        ],
    ]
    header = ["figure", "minimal HTTP/1.1 client", "httpx"]
    text = f"""SmolLM2-135M on `make run`'s swarm (two 3-stage pipelines, two routers), the
gateway beside it; {s.rounds} round(s), each one stream direct (NATS, on its own
request's inbox) and one through the gateway with each client (streaming
`/v1/completions`), one at a time, the order rotated, prompt "{s.prompt}",
{s.tokens} tokens. Each token is timed twice, in the bench process on one clock:
when the router publishes it to the gateway's request inbox (an observer subscribed
to `_INBOX.>` sees the same message the gateway does) and when its SSE chunk reaches the
client; the difference is what the gateway adds to that token, plus what the client
spends reading it: the target judges the minimal client's. Chunks and tokens are paired
in order and by text; unmatched in this run: {s.unmatched:,}. Direct, one stream
gives {num(s.direct_tokens_per_s, 1)} tokens/s (median round); every text was the
direct reply's: {s.wrong:,} wrong.

{table(header, rows)}
"""
    return text, f"p50 {ms(a.p50, 3)} ms per token"


def section_gateway(env: Doc, img: str) -> tuple[str, list[Target]]:
    del img  # no picture for this suite
    r = load(env["report"], GatewayResult)
    toy, lat = r.toy, r.toy.latency
    cap = toy.capacity
    met = judge(r)
    wrong = wrong_answers(r)
    stream, stream_figure = _stream(r.stream)
    loaded = ""
    if cap:
        *more, last = [str(n) for n in cap.clients]
        levels = f"{', '.join(more)} and {last}" if more else last
        loaded = (
            f"Clients in a closed loop, {levels} of them in {cap.processes} worker "
            f"processes (`devtools/hecate_dev/bench/gateway_load.py`, uvloop; over HTTP each "
            f"client keeps a keep-alive connection of the minimal HTTP/1.1 client), "
            f"{num(cap.seconds, 1)} s per path and level, the paths and levels taking "
            f"turns for {cap.rounds} round(s). Only right answers count."
        )
    added50, added99 = lat.added_p50_us, lat.added_p99_us
    text = f"""## The HTTP gateway: what it adds over a direct NATS request

{provenance(env)}
The swarm is `hecate up`'s for `{toy.topology}` (`make run-toy`: telemetry, planner,
breaker, two routers, four toy nodes) with `hecate gateway --open` beside it as its own
process, as in production, on one embedded nats-server; nothing is tuned for the
benchmark. The same `/v1/completions` ({toy.prompts} prompts in turn, model
`{toy.model}`, {toy.tokens} tokens) is asked directly on `hecate.infer.<model>`
(the very request the gateway sends) and through the gateway. Every answer is checked
against the direct answer for its prompt: {wrong:,} wrong in this run
({verdict(met["answers_right"])}).

### Latency added, one request at a time

The paths take turns request by request, their order rotated. The targets judge the
minimal client's figures: what the gateway adds. httpx, which the `openai` SDK is built
on, costs its own time on every request whatever the server; the gap between the two
HTTP rows is that time, on the very same requests and answers.

{_latency(lat)}

Targets (issue 13, on this machine; {ANCHOR}): added p50 ≤
{ms(TARGETS_US["added_p50"], 0)} ms: {verdict(met["added_p50"])} ({signed_ms(added50)} ms);
added p99 ≤ {ms(TARGETS_US["added_p99"], 0)} ms: {verdict(met["added_p99"])}
({signed_ms(added99)} ms).

### Throughput: capacity through the gateway against direct

{loaded} Each process's CPU over each window is read from `/proc` (cores used: 1.00 is
one core busy all the window), the load generators' included; on
{env.get("cores", "the")} cores shared by every process, the table shows where the time
went.

{_capacity(cap)}
### Streaming: inter-token latency added

{stream}
Target: added per token ≤ {ms(TARGETS_US["stream_added_p50"], 1)} ms at p50:
{verdict(met["stream_added_p50"])}.
"""
    return text, [
        Target(
            "gateway adds ≤ 1 ms at p50 over a direct NATS request (toy model)",
            f"{signed_ms(added50)} ms",
            met["added_p50"],
        ),
        Target(
            "gateway adds ≤ 5 ms at p99 over a direct NATS request (toy model)",
            f"{signed_ms(added99)} ms",
            met["added_p99"],
        ),
        Target(
            "streaming through the gateway adds ≤ 0.5 ms per token (p50, SmolLM2)",
            stream_figure,
            met["stream_added_p50"],
        ),
    ]
