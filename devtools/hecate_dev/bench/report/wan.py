"""The wide-area section: SmolLM2 across the swarm with every node behind a slow link
(``hecate bench wan``): hop against chain dispatch, and which pipeline the router
prefers when one is further away."""

# Prose for people: its dashes and multiplication signs are meant.
# ruff: noqa: RUF001

from __future__ import annotations

from hecate_dev.bench.report.markdown import Doc, Target, num, provenance, table, verdict
from hecate_dev.bench.results import load
from hecate_dev.bench.results_wan import WanPreference, WanResult, WanRun

#: The share of sequential requests, after the warm-up, the router should send to the
#: pipeline whose nodes are nearer.
PREFERENCE_TARGET = 0.8
WRONG = "a wrong text"


def judge_preference(p: WanPreference) -> tuple[bool | None, float | None]:
    """Whether the router sent at least ``p.target_share`` of the counted requests to
    the nearer pipeline, and that share; a wrong text fails it, no request counted
    leaves it unmeasured."""
    if p.requests <= 0:
        return None, None
    share = round(p.on_fast / p.requests, 3)
    return p.text_ok and share >= p.target_share, share


def _run(r: WanResult, dispatch: str, rtt: float) -> WanRun | None:
    return next((x for x in r.runs if x.dispatch == dispatch and x.rtt_ms == rtt), None)


def _tps(run: WanRun | None) -> str:
    if run is None:
        return "–"
    figure = num(run.tokens_per_s, 1)
    return figure if run.text_ok else f"{figure} ({WRONG})"


def _added(r: WanResult, run: WanRun | None) -> str:
    """The median gap between two tokens, and what the links added to it (the same
    dispatch's gap at 0 ms taken away)."""
    if run is None:
        return "–"
    base = _run(r, run.dispatch, 0.0)
    if base is None or run.rtt_ms == 0:
        return num(run.gap_ms, 0)
    return f"{num(run.gap_ms, 0)} (+{num(run.gap_ms - base.gap_ms, 0)})"


def _ratio(hop: WanRun | None, chain: WanRun | None) -> str:
    if hop is None or chain is None or not hop.tokens_per_s:
        return "–"
    return f"{num(chain.tokens_per_s / hop.tokens_per_s, 2)}×"


def section_wan(env: Doc, img: str) -> tuple[str, list[Target]]:
    del img  # no picture for this suite
    r = load(env["report"], WanResult)
    title = "## Wide-area links: SmolLM2 with every node 0 to 40 ms away"
    if r.skipped is not None:
        return f"{title}\n\n{provenance(env)}\nSkipped: {r.skipped}.\n", []
    assert r.meta is not None
    meta = r.meta
    rtts = sorted({x.rtt_ms for x in r.runs})
    rows = []
    for rtt in rtts:
        hop, chain = _run(r, "hop", rtt), _run(r, "chain", rtt)
        rows.append(
            [
                num(rtt, 0),
                _tps(hop),
                _tps(chain),
                _ratio(hop, chain),
                _added(r, hop),
                _added(r, chain),
            ]
        )
    figures = table(
        [
            "RTT added per node (ms)",
            "hop (tokens/s)",
            "chain (tokens/s)",
            "chain ÷ hop",
            "hop: gap per token (ms, +links)",
            "chain: gap per token (ms, +links)",
        ],
        rows,
    )
    per_round = "; ".join(
        f"{x.dispatch} at {num(x.rtt_ms, 0)} ms: "
        + ", ".join(num(t, 1) for t in x.rounds_tokens_per_s)
        for x in r.runs
    )
    targets: list[Target] = []
    wrong = [x for x in r.runs if not x.text_ok]
    targets.append(
        Target(
            "wan: every generation streams the greedy text",
            "wrong: " + ", ".join(f"{x.dispatch} {num(x.rtt_ms, 0)} ms" for x in wrong)
            if wrong
            else "all right",
            not wrong,
        )
    )
    text = f"""{title}

{provenance(env)}
Every node process is given a fault proxy's URL (`hecate_dev.chaos.proxy`) instead of
the nats-server's; the proxy holds each byte half the added round-trip time (RTT) in
each direction. The router, telemetry and the client sit next to the server, as a
router does in a data centre serving nodes on other people's machines. The swarm is
`hecate bench llm`'s 3-stage pipeline ({meta.node_blas_threads} BLAS threads per
node), started once with `--dispatch hop` and once with `--dispatch chain`; per round
(of {meta.rounds}, the RTTs interleaved) one streamed greedy generation of
{meta.tokens} tokens, checked against the single-process greedy text. The median
round's tokens/s (after the first token) and median gap between two tokens, with
what the links added to it over the same dispatch at 0 ms:

{figures}

Per round: {per_round}.

What the links cost: with **hop** the router sends each stage its step and waits for
the answer, so a token costs three node round trips, 3 × RTT. With **chain** the
router sends the first stage its step and each node forwards to the next, but every
forward crosses two proxied links (the sender's out, the receiver's in), so a token
costs ½ RTT (router → first node) + 2 × 1 RTT (two forwards) + ½ RTT (last node →
router) = 3 × RTT as well, so the two should add about the same to each token, and neither
less than 3 × RTT (the proxy's delays are lower bounds). When every node is far from
the bus, chaining saves nothing on the wire; it saves the router's work and the bus's
messages (one publish per stage instead of a request and a reply). It pays when nodes
are near each other and far from the caller, a case this bench does not build: here
each node's only way to another is through the server.
"""
    p = r.preference
    if p is not None:
        met, share = judge_preference(p)
        figure = "–" if share is None else f"{num(share * 100, 0)} % on the nearer"
        if not p.text_ok:
            figure += f" ({WRONG})"
        targets.append(
            Target(
                f"wan: ≥ {num(p.target_share * 100, 0)} % of requests on the pipeline "
                f"{num(p.rtt_ms, 0)} ms RTT nearer",
                figure,
                met,
            )
        )
        text += f"""
**The router's preference.** Two 3-stage pipelines: every node of `{p.slow_pipeline}`
{num(p.rtt_ms, 0)} ms RTT further away, `{p.fast_pipeline}`'s not (the far one is the
one a tie goes to, by its id). After {p.warmup} uncounted generations,
{p.requests} sequential ones of {p.tokens} tokens (`--dispatch chain`): {p.on_fast} went
to the nearer pipeline, {p.on_slow} to the farther. Target: at least
{num(p.target_share * 100, 0)} % on the nearer one: {verdict(met)}. A node's
latency as telemetry reports it is what its stages take to compute, timed inside the
node; the time its link adds is not in it, so the chooser can prefer a nearer pipeline
only if something measures the link.
"""
    return text, targets
