"""The locked-down bus against the open one, 3 stages each (``hecate bench llm``)."""

# Prose for people: its dashes and multiplication signs are meant.
# ruff: noqa: RUF001

from __future__ import annotations

from hecate_dev.bench.report.markdown import Met, num, verdict
from hecate_dev.bench.report.paired import WRONG, judged, wrong
from hecate_dev.bench.results_llm import Generation, LlmResult, Round, SecurePair

LLM_TARGET_SECURE = 0.95  # 3 stages on the locked-down bus / on the open bus, tokens/s
SECURE_TARGET = "locked-down bus ≥ 0.95× open bus, 3-stage tokens/s"


def _secure_runs(r: LlmResult) -> list[Generation | None]:
    """Every timed generation the locked-down bus was compared on, both buses'."""
    if r.secure_runs is not None:
        pairs = r.secure_runs.pairs
    else:  # older results: the pairs sat in the rounds, the round's own first
        rounds = r.rounds or [Round(stages_3=r.stages_3, stages_3_secure=r.stages_3_secure)]
        pairs = [
            p
            for rnd in rounds
            for p in (
                SecurePair(stages_3=rnd.stages_3, stages_3_secure=rnd.stages_3_secure)
                if rnd.stages_3 is not None and rnd.stages_3_secure is not None
                else None,
                *rnd.secure_pairs,
            )
            if p is not None
        ]
    return [g for p in pairs for g in (p.stages_3, p.stages_3_secure)]


def judge_secure(r: LlmResult) -> tuple[Met, str]:
    """The 3-stage swarm on the locked-down bus against the same on the open bus
    (:data:`LLM_TARGET_SECURE`), judged on the per-pair ratios' median and its
    interval, and the figure; not measured in results saved before the secure runs. A
    pair whose text was wrong on either bus fails it."""
    ratios = r.secure_over_open_rounds
    if not ratios:
        return None, "not measured"
    if any(wrong(x) for x in _secure_runs(r)):
        return False, WRONG
    met, figure = judged(ratios, LLM_TARGET_SECURE)
    return met, f"{figure} open"


_LOCKED_DOWN = """the bus as `hecate up --secure` and `deploy/` run it: TLS between every
  process and the server; the services in one NATS account and each tenant in an
  account of its own that imports the service; the router, telemetry and each node
  logged in as users of their own, the server checking every publish and subscription
  against the permissions the wire contract derives; and the generation asked by a
  tenant's user from its own account, so the server stamps the request with that
  account and the router takes the tenant from it (`--tenant-from bus`)."""


def secure_prose(r: LlmResult, met: Met, figure: str) -> str:
    ratios = r.secure_over_open_rounds
    if not ratios:
        return (
            "* **3 stages on the locked-down bus ≥ "
            f"{LLM_TARGET_SECURE}× the open bus (tokens/s)**: not measured in this run."
        )
    pairs = ", ".join(num(x, 3) for x in ratios)
    head = f"""* **3 stages on the locked-down bus ≥ {LLM_TARGET_SECURE}× the open bus
  (tokens/s)**: {verdict(met)} ({figure}; per pair {pairs}). Met or not only when
  the interval lies on one side of the target."""
    runs = r.secure_runs
    if runs is None:  # older results: a swarm started for every generation
        return f"""{head}
  In every round the same 3-stage swarm also runs on {_LOCKED_DOWN} The two swarms
  take turns, which goes first alternating pair by pair; one generation's tokens/s
  spreads by more than the bus costs, so each round times several pairs and the
  figure is the median pair."""
    pooled = r.secure_over_open_pooled
    if pooled is None:
        pooled = runs.pooled_secure_tokens_per_s / runs.pooled_open_tokens_per_s
    return f"""{head}
  The same 3-stage swarm stands twice at once, each with its own nats-server,
  telemetry, router and 3 nodes: once on the open bus and once on {_LOCKED_DOWN}
  Each is warmed up with {runs.warmup} untimed generations, then {len(runs.pairs)}
  pairs are timed, one generation on each swarm, which goes first alternating pair by
  pair; one generation's tokens/s spreads by more than the bus costs, so the figure
  is the median of the pairs' ratios. Pooled over every pair (all tokens after the
  first over all the time between first and last tokens), the locked-down swarm made
  {num(runs.pooled_secure_tokens_per_s, 2)} tokens/s against
  {num(runs.pooled_open_tokens_per_s, 2)} on the open one: {num(pooled, 3)}×."""
