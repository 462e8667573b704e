"""The token-time section: where a token's time goes across 3 chained stages, at 1 user
and at 16 (``hecate bench tokens``, :mod:`hecate_dev.bench.token_time`)."""

from __future__ import annotations

from hecate_dev.bench.report.markdown import Doc, Target, num, provenance, skipped, table

PARTS = {
    "compute": "compute: the step's batch in the engine, 3 stages",
    "queue": "waiting for a node's compute thread (another batch, a burst's gather)",
    "node": "the nodes' own work: decoding, session bookkeeping, encoding, forwarding",
    "bus": "the bus: router → node → node → node → router, each event loop included",
    "router": "the router between two steps: the token out, the next step in",
}


def section_tokens(env: Doc, img: str) -> tuple[str, list[Target]]:
    del img  # no picture
    r = env["report"]
    title = "## Where a token's time goes: 3 chained stages, 1 and 16 users\n\n"
    if (absent := skipped(env, title)) is not None:
        return absent, []
    levels = r["levels"]
    users = sorted(levels, key=int)
    rows = []
    for part, label in PARTS.items():
        cells = []
        for u in users:
            v = levels[u]
            share = 100 * v[part] / v["token_ms"] if v["token_ms"] else 0.0
            cells.append(f"{num(v[part], 2)} ({num(share, 0)} %)")
        rows.append([label, *cells])
    rows.append(
        ["**sum: a user's decode step**", *(f"**{num(levels[u]['token_ms'], 2)}**" for u in users)]
    )
    rows.append(
        [
            "as the users saw it, prompt included (ms a token a user)",
            *(num(levels[u]["ms_per_token_per_user"], 1) for u in users),
        ]
    )
    rows.append(
        ["tokens/s, all users (median round)", *(num(levels[u]["tokens_per_s"], 1) for u in users)]
    )
    rows.append(["decode steps measured", *(str(levels[u]["steps"]) for u in users)])
    wrong = sum(levels[u]["wrong_texts"] for u in users)
    one, many = levels[users[0]], levels[users[-1]]
    rest = one["token_ms"] - one["compute"]
    reading = (
        f"Compute is {num(100 * one['compute'] / one['token_ms'], 0)} % of a user's decode "
        f"step at 1 user and {num(100 * many['compute'] / many['token_ms'], 0)} % at "
        f"{users[-1]}; the rest, at 1 user {num(rest, 2)} ms a step (the bus "
        f"{num(one['bus'], 2)}, the nodes' own work {num(one['node'], 2)}), is what a "
        "single process does not pay. At many users a step waits for the compute thread "
        "too: another batch is running.\n\n"
    )
    body = table(
        ["ms per decode step per user", *(f"{u} user{'s' if u != '1' else ''}" for u in users)],
        rows,
    )
    text = (
        f"{title}{provenance(env)}\n"
        "The 3-stage swarm of the section above (router, telemetry, three SmolLM2 nodes "
        "of 10 blocks on one engine thread each, chained dispatch), every process "
        "exporting its spans over OTLP to a collector in the bench; greedy generations of "
        f"{r['tokens']} tokens, {r['rounds']} rounds for one user and for 16 at once. Each "
        "decode step is split along its spans: the router's span of the step, each node's "
        "span inside it (with the compute and the wait the node records on it), and the "
        "router's time between two steps. Spans cost about 15 µs each, so the swarm runs "
        "slightly slower than untraced.\n\n"
        f"{body}\n\n"
        f"{reading}"
        f"Every generation's text equals the single-process greedy text: "
        f"{'yes' if wrong == 0 else f'**no, {wrong} differ**'}.\n"
    )
    targets = [
        Target(
            "every timed generation gives the single-process text (token time)",
            "all equal" if wrong == 0 else f"{wrong} differ",
            wrong == 0,
        )
    ]
    return text, targets
