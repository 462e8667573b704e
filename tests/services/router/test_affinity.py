"""Prefix reuse's routing term: a prompt starting as a tenant's earlier one is costed
lower where that one was answered, by what not computing its cached tokens saves there
(the prefill time they would take at the pipeline's measured rate; the seed's token
term until one is measured), shared with the router's work in flight there: an idle
pipeline keeping it wins though the nodes' load still carries its last answer, a
burst spreads, and another tenant's prompts are never matched."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from hecate.core import Router, RoutingRequest
from hecate.core.cost import inflight_cost, token_cost
from hecate.model.prints import text_prints
from hecate.wire.common import ChatMessage
from hecate.wire.messages import InferRequest
from hecate_router.affinity import CHARS, PrefixIndex, fingerprints, outcome, routed
from tests.support.builders import measured, pipeline, plan

SYSTEM = ChatMessage(role="system", content="You answer questions about the catalogue. " * 20)


def chat(tenant: str, *turns: str) -> InferRequest:
    messages = [SYSTEM, *(ChatMessage(role="user", content=t) for t in turns)]
    return InferRequest(prompt="", messages=messages, tenant=tenant)


def replicas(n: int) -> Router:
    p = plan([pipeline(f"m-r{i}", "m", (f"a{i}", 0, 4), (f"b{i}", 4, 8)) for i in range(n)])
    return Router(measured(p))


def test_the_next_turn_of_a_chat_is_matched_where_the_last_was_answered() -> None:
    index = PrefixIndex()
    index.served(fingerprints(chat("alice", "first question")), "m-r1", 600)
    cached = index.cached(fingerprints(chat("alice", "first question", "second question")))
    assert set(cached) == {"m-r1"}
    assert 500 < cached["m-r1"] <= 600  # the system prompt and the first turn
    # The same words from another tenant match nothing.
    assert index.cached(fingerprints(chat("bob", "first question", "second question"))) == {}


@given(st.text(min_size=0, max_size=3 * CHARS), st.text(min_size=0, max_size=CHARS))
def test_a_plain_prompt_matches_only_on_whole_blocks_it_shares(head: str, tail: str) -> None:
    index = PrefixIndex()
    first = InferRequest(prompt=head, tenant="t")
    index.served(fingerprints(first), "m-r0", 100)
    again = index.cached(fingerprints(InferRequest(prompt=head + tail, tenant="t")))
    assert bool(again) == (len(head) >= CHARS)


def test_the_index_forgets_the_least_recently_served_past_its_bound() -> None:
    index = PrefixIndex(remember=4)
    for i in range(3):  # two prefixes each: the system prompt, then with the question
        index.served(fingerprints(chat(f"t{i}", "question")), f"m-r{i}", 100)
    assert len(index) == 4
    assert index.cached(fingerprints(chat("t0", "question"))) == {}
    assert index.cached(fingerprints(chat("t2", "question"))) == {"m-r2": 100}


def test_a_cached_prefix_wins_a_tie_and_loses_to_load() -> None:
    router = replicas(2)
    plain = router.route("m", RoutingRequest())
    other = "m-r1" if plain.pipeline_id == "m-r0" else "m-r0"
    tokens = 1000
    request = RoutingRequest(cached={other: tokens})
    assert router.route("m", request).pipeline_id == other
    # Work in flight on it costs more than the prefix saves: the request goes elsewhere.
    busy = 0
    while inflight_cost(2 * busy) <= token_cost(tokens):
        router.begin(router.route("m", RoutingRequest(cached={other: tokens})))
        busy += 1
    assert busy < 8
    assert router.route("m", request).pipeline_id == plain.pipeline_id


def test_a_full_pipeline_is_passed_over_whatever_it_keeps() -> None:
    router = replicas(2)
    assert (
        router.route("m", RoutingRequest(cached={"m-r1": 10_000}), full={"m-r1"}).pipeline_id
        == "m-r0"
    )


def test_where_a_prompt_went_as_to_its_kept_prefix_is_said_and_counted() -> None:
    kept = {"m-r0": 500}
    assert outcome({}, "m-r0", ()) == ("none", None)
    assert outcome(kept, "m-r0", ()) == ("toward", None)
    assert outcome(kept, "m-r1", {"m-r0"}) == ("elsewhere", "full")
    assert outcome(kept, "m-r1", ()) == ("elsewhere", "cost")
    # Elsewhere for being full only when every pipeline keeping it was.
    assert outcome({**kept, "m-r2": 300}, "m-r1", {"m-r0"}) == ("elsewhere", "cost")
    counters: Counter[str] = Counter()
    for cached, chosen, full in [({}, "a", ()), (kept, "m-r0", ()), (kept, "m-r1", {"m-r0"})]:
        routed(counters, cached, chosen, full)
    assert counters == Counter(
        prefix_none=1, prefix_toward=1, prefix_elsewhere=1, prefix_elsewhere_full=1
    )


def test_a_rate_is_what_a_position_took_to_the_first_token_and_prices_what_is_kept() -> None:
    index = PrefixIndex()
    assert index.saves({"m-r0": 500}) == {}  # nothing measured: the token term stands in
    index.prefilled("m-r0", 500, 1.0)  # 2 ms a position
    index.prefilled("m-r1", 10, 5.0)  # too short to say anything of positions
    assert index.rates == {"m-r0": 2.0}
    index.prefilled("m-r0", 500, 2.0)  # 4 ms a position: the average moves toward it
    assert 2.0 < index.rates["m-r0"] < 4.0
    saves = index.saves({"m-r0": 100, "m-r1": 100})
    # A pipeline never measured is priced at the slowest rate measured.
    assert saves == {"m-r0": 100 * index.rates["m-r0"], "m-r1": 100 * index.rates["m-r0"]}


def test_an_idle_pipeline_keeping_the_prefix_wins_though_its_nodes_still_look_busy() -> None:
    p = plan([pipeline(f"m-r{i}", "m", (f"a{i}", 0, 4), (f"b{i}", 4, 8)) for i in range(2)])
    # m-r0 answered the last turn: its nodes' load figures still carry it.
    router = Router(measured(p, {"a0": (10.0, 0.4, 1.0), "b0": (10.0, 0.4, 1.0)}))
    kept = {"m-r0": 509}
    assert router.route("m", RoutingRequest(cached=kept)).pipeline_id == "m-r1"  # token term
    saves = {"m-r0": 509 * 2.0}  # a second of prefill at 2 ms a position
    assert router.route("m", RoutingRequest(cached=kept, saves=saves)).pipeline_id == "m-r0"


def test_a_burst_sharing_a_kept_prefix_spreads() -> None:
    router = replicas(2)
    kept = {"m-r0": 500}
    saves = {"m-r0": 500 * 2.0}
    went = []
    for _ in range(8):
        route = router.route("m", RoutingRequest(cached=kept, saves=saves))
        router.begin(route)
        went.append(route.pipeline_id)
    assert went[:2] == ["m-r0", "m-r0"]  # the first take the prefix where it is kept
    assert went.count("m-r1") >= 3  # the saving, shared with the work there, soon is not


@given(
    st.lists(st.tuples(st.sampled_from(["system", "user", "assistant"]), st.text()), max_size=6),
    st.text(max_size=900),
    st.sampled_from(["alice", "bob"]),
)
def test_a_router_names_a_prompt_as_its_first_stage_does(
    messages: list[tuple[str, str]], prompt: str, tenant: str
) -> None:
    """The router's prints of a request are the ones the first stage learns from the
    step it is sent (its messages as (role, content) pairs, its scope the tenant):
    what the node says it keeps is found under the names the router asks for."""
    chat = [ChatMessage(role=r, content=c) for r, c in messages] or None
    request = InferRequest(prompt=prompt, messages=chat, tenant=tenant)
    step = tuple(messages) or None  # as hecate_node.convert.step_input makes it
    assert fingerprints(request) == text_prints(tenant, step, prompt)


def test_the_saving_is_estimated_from_what_the_first_node_says_until_measured() -> None:
    index = PrefixIndex()
    assert index.saves({"m-r0": 100}) == {}  # nothing known: the token term stands in
    assert index.saves({"m-r0": 100}, {"m-r0": 1.5}) == {"m-r0": 150.0}
    index.prefilled("m-r0", 100, 0.2)  # 2 ms a position, as this router timed it
    assert index.saves({"m-r0": 100}, {"m-r0": 1.5}) == {"m-r0": 200.0}
