"""The bus section: routed against raw NATS, closed loop and offered load (``hecate bench bus``)."""

# Prose for people: its dashes and multiplication signs are meant.
# ruff: noqa: RUF001

from __future__ import annotations

from collections.abc import Sequence

from hecate.bench.report.markdown import Doc, Target, num, provenance, table, verdict

BUS_TARGET_RATIO = 0.4  # routed 1-stage throughput / raw request-reply

BUS_ROWS = (
    ("raw", "raw NATS request/reply (echo)", None),
    ("routed_1", "routed, 1 stage (router calls the stage)", "ratio_1"),
    ("routed_3", "routed, 3 stages, router calls each stage (`hop`)", "ratio_3"),
    ("routed_3_chain", "routed, 3 stages, nodes forward (`chain`)", "ratio_3_chain"),
    (
        "routed_1_secure",
        "routed, 1 stage, locked-down bus (TLS, a NATS user per role)",
        "ratio_1_secure",
    ),
)
SWEEP_NAMES = {
    "raw": "raw NATS (echo)",
    "routed_1": "routed, 1 stage",
    "routed_3_chain": "routed, 3 stages, chained",
}


def sustained(points: Sequence[Doc]) -> Doc | None:
    """The highest offered rate served in full: at least 95 % of it achieved, nothing
    failed or timed out."""
    full = [
        p
        for p in points
        if p["achieved_rps"] >= 0.95 * p["offered_rps"] and not p["failed"] and not p["timed_out"]
    ]
    return max(full, key=lambda p: p["offered_rps"], default=None)


def _sweep(r: Doc, img: str) -> str:
    meta = r["meta"]
    sweep: dict[str, list[Doc]] = r.get("sweep") or {}
    if not sweep:
        return "The open-loop sweep did not run in this report.\n"
    fractions = ", ".join(f"{f:.0%}" for f in meta["sweep_fractions"])
    blocks = []
    verdicts = []
    for label, points in sweep.items():
        rows = [
            [
                num(p["offered_rps"], 0),
                num(p["achieved_rps"], 0),
                num(p["p50_us"] / 1000, 2),
                ("≥ " if p["p99_capped"] else "") + num(p["p99_us"] / 1000, 2),
                f"{p['failed']:,}",
                f"{p['timed_out']:,}",
                num(p["send_lag_p99_us"] / 1000, 2),
            ]
            for p in points
        ]
        header = [
            "offered req/s",
            "achieved req/s",
            "p50 ms",
            "p99 ms",
            "failed",
            "timed out",
            "send lag p99 ms",
        ]
        blocks.append(f"{SWEEP_NAMES.get(label, label)}:\n\n{table(header, rows)}")
        best = sustained(points)
        name = SWEEP_NAMES.get(label, label)
        if best is None:
            verdicts.append(f"{name}: no offered rate was served in full")
        else:
            verdicts.append(
                f"{name}: up to {num(best['offered_rps'], 0)} req/s "
                f"(p99 {num(best['p99_us'] / 1000, 2)} ms there)"
            )
    tables = "\n\n".join(blocks)
    served = "; ".join(verdicts)
    return f"""### Offered load: throughput and p99 latency, open loop

The closed loop above slows down whenever replies do, so it measures capacity but
flatters latency. Here, for raw NATS and the routed 1-stage and 3-stage (chained)
configurations, requests are *offered* at a fixed rate for {meta["sweep_seconds"]} s per
rate, whatever the replies do, at {fractions} of that configuration's closed-loop
throughput (`services/hecate/bench/openloop.py`). A request's latency is counted from
its **scheduled** send time, so a generator that falls behind charges its own lag to
the figures instead of hiding it (no coordinated omission). Achieved throughput counts
correct replies that arrived within the offered window. A request that fails or gets
no reply within {num(meta["sweep_timeout_s"], 1)} s counts as that timeout in the
percentiles (≥ in the table: p99 is at that bound, the real figure is higher).
The send lag column is how late the generator itself sent (the precision of the run:
it shares the cores with the server and the services).

{tables}

Highest offered rate served in full (≥ 95 % achieved, nothing failed or timed out):
{served}.

![throughput and p99 latency against offered load, raw NATS beside routed]({img}/bench-bus-load.png)
"""


def section_bus(env: Doc, img: str) -> tuple[str, list[Target]]:
    r = env["report"]
    meta = r["meta"]
    raw = r.get("raw", {}).get("rps")
    rows = []
    for key, label, ratio in BUS_ROWS:
        if key not in r:
            continue
        c = r[key]
        shown = "1" if ratio is None else num(r.get(ratio, 0.0), 2)
        if ratio == "ratio_1":
            shown = f"**{shown}**"
        spread = r.get(f"{ratio}_rounds") or []
        if len(spread) > 1:
            shown += f" ({num(min(spread), 2)}–{num(max(spread), 2)})"
        rows.append([label, num(c["rps"], 0), num(c["p50_us"], 0), num(c["p99_us"], 0), shown])
    closed = table(["configuration", "req/s", "p50 µs", "p99 µs", "÷ raw"], rows)
    failures = sum(r[k]["failures"] for k, _, _ in BUS_ROWS if k in r)
    ratio_1 = r.get("ratio_1")
    met = None if ratio_1 is None else ratio_1 >= BUS_TARGET_RATIO
    figure = "–" if ratio_1 is None else f"{num(ratio_1, 3)}× raw"
    chain = ""
    if "routed_3" in r and "routed_3_chain" in r and r["routed_3"]["rps"]:
        gain = r["routed_3_chain"]["rps"] / r["routed_3"]["rps"] - 1
        chain = (
            f"Chained dispatch {'gains' if gain >= 0 else 'loses'} {abs(gain):.0%} against "
            "the router calling each stage at 3 stages here; on this machine every process "
            "competes for the same cores, so saving router hops saves less than it would "
            "with nodes on their own machines."
        )
    secure = ""
    if r.get("secure_over_open"):
        secure = (
            "On the locked-down bus (`hecate up --secure`: TLS between every process and "
            "the server, each process logged in as its role's NATS user, the server "
            "checking every publish and subscription against the permissions of "
            f"`deploy/nats/auth.conf`), routed 1-stage throughput is "
            f"{num(r['secure_over_open'], 2)}× the same configuration on the open bus."
        )
    raw_note = "" if raw is None else f"; raw {num(raw, 0)} req/s"
    cores = env.get("cores", "the")
    text = f"""## The bus: routed requests against raw NATS, same run

{provenance(env)}
Closed loop: every configuration stands at once, and they take turns for
{meta.get("rounds", 1)} round(s) of {meta["seconds"]} s each after a 0.5 s warm-up, so
that a ratio compares figures taken seconds apart (this shared machine's speed drifts
between runs). Each figure is the configuration's median round; each ratio is the median
of the rounds' ratios, with their range in brackets. `--quick` shortens every phase;
`--executor toy` includes the built-in model's compute. Nodes here run the
`{meta["executor"]}` executor.

What runs, each in its own process, on one embedded nats-server per configuration:
the load generator (this process, {meta["inflight"]} requests in flight, 256-byte
payload for raw, a short JSON `InferRequest` for routed), and either an echo responder
(**raw**) or one router plus the nodes of a 1-stage or 3-stage pipeline
({meta["layers"]} layers in all). The plan is written to KV directly; no telemetry
service runs. Every process uses uvloop, the echo included. With the `null` executor
(no arithmetic) the ratio prices the routing path: decoding, choosing, dispatching,
correlating, replying, with failure detection (no-responders, error replies, timeout
sweep), failover and in-flight accounting all live.

{closed}

Failed requests in the closed loop: {failures:,}.

Against the issue's target (routed 1-stage throughput ≥ {BUS_TARGET_RATIO}× raw with
failure handling intact): {verdict(met)} ({figure}{raw_note}).
Latency at p50 in the closed loop is dominated by queueing: {meta["inflight"]} requests
in flight on {cores} cores shared by every process and the server. {chain}

{secure}

Changes that moved these figures, each measured with this command at the time (the
history of this file has the figures): skipping span creation and trace-context
extraction when nothing exports, together with a cheaper toy embedding; uvloop in every
service; the router's status computed only when `$SRV.STATS` asks; and the `null`
executor for this benchmark.

{_sweep(r, img)}"""
    return text, [Target("routed 1-stage throughput ≥ 0.4× raw NATS", figure, met)]
