"""A router follows where the nodes say prefixes are kept (pure): news played in order,
the whole asked for when one is missed or the node restarted, news heard meanwhile
played on it; only the plan's nodes, bounded; and whatever is lost, repeated or
reordered on the way, once asked it holds what the node keeps."""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from hecate.model.prints import KeptPrint, ModelNews
from hecate.wire.kept import PrefixNews, PrefixState
from hecate_router.affinity import PrefixIndex, kept_at
from hecate_router.kept import KeptFollower

MODEL = "smollm2-135m"


def p(i: int) -> bytes:
    return i.to_bytes(16, "big")


def news(seq: int, kept: dict[int, int] | None = None, dropped: tuple[int, ...] = (), *,
         boot: str = "b1", node: str = "n0") -> PrefixNews:  # fmt: skip
    model = ModelNews(
        model_id=MODEL,
        kept=[KeptPrint(p(i), t) for i, t in (kept or {}).items()],
        dropped=[p(i) for i in dropped],
    )
    return PrefixNews(node_id=node, boot=boot, seq=seq, models=[model], prefill_ms=0.5)


def state(seq: int, kept: dict[int, int], *, boot: str = "b1", node: str = "n0") -> PrefixState:
    model = ModelNews(model_id=MODEL, kept=[KeptPrint(p(i), t) for i, t in kept.items()])
    return PrefixState(node_id=node, boot=boot, seq=seq, models=[model], prefill_ms=0.25)


def prints(*ids: int) -> list[tuple[bytes, float]]:
    return [(p(i), 1.0) for i in ids]


def test_a_starting_router_asks_each_node_once_then_follows_its_news() -> None:
    kept = KeptFollower()
    assert kept.follow(["n0", "n1"]) == ["n0", "n1"]
    assert kept.tokens("n0", MODEL, prints(1)) is None  # not followed yet: guess
    assert not kept.told("n0", state(3, {1: 64}))
    assert kept.tokens("n0", MODEL, prints(1)) == 64
    assert kept.prefill_ms("n0") == 0.25
    assert not kept.heard(news(4, {2: 96}))
    assert kept.tokens("n0", MODEL, prints(1, 2)) == 96  # the longest print kept
    assert not kept.heard(news(5, dropped=(2,)))
    assert kept.tokens("n0", MODEL, prints(1, 2)) == 64
    assert kept.tokens("n0", "other-model", prints(1)) == 0
    assert kept.follow(["n0", "n1"]) == []  # asked once


def test_a_missed_news_or_a_new_boot_asks_for_the_whole_and_plays_what_came_meanwhile() -> None:
    kept = KeptFollower()
    kept.follow(["n0"])
    kept.told("n0", state(1, {1: 32}))
    assert kept.heard(news(3, {3: 32}))  # 2 missed: ask
    assert not kept.heard(news(4, {4: 32}))  # held while asking
    assert not kept.told("n0", state(3, {1: 32, 3: 32}))  # 4 follows on from it
    assert kept.tokens("n0", MODEL, prints(4)) == 32
    assert not kept.heard(news(1, {9: 64}, boot="b2"))  # restarted: its first is all
    assert kept.tokens("n0", MODEL, prints(1)) == 0
    assert kept.tokens("n0", MODEL, prints(9)) == 64
    assert kept.heard(news(2, {7: 64}, boot="b3"))  # restarted, its first missed: ask
    assert not kept.told("n0", state(2, {7: 64}, boot="b3"))
    assert kept.tokens("n0", MODEL, prints(9, 7)) == 64
    assert kept.status()["kept_gaps"] == 1


def test_a_node_s_first_news_needs_no_asking_and_an_answer_that_does_not_follow_on_asks_again() -> (
    None
):
    kept = KeptFollower()
    kept.follow(["n0"])
    kept.told("n0", None)  # no answer: unknown until it says something
    assert not kept.heard(news(1, {1: 32}))  # its first since it started: all there is
    assert kept.tokens("n0", MODEL, prints(1)) == 32
    kept.heard(news(3))
    kept.heard(news(6))  # held, but 4 and 5 were missed too
    assert kept.told("n0", state(4, {1: 32}))


def test_only_the_plan_s_nodes_are_followed_and_each_is_bounded() -> None:
    kept = KeptFollower()
    kept.follow(["n0"])
    assert not kept.heard(news(1, {1: 32}, node="stranger"))
    assert kept.status()["kept_ignored"] == 1
    kept.told("n0", state(0, {}))
    assert not kept.heard(news(1, dict.fromkeys(range(5000), 32)))
    assert kept.status()["kept_prints"] == 4096
    kept.follow([])
    assert kept.tokens("n0", MODEL, prints(1)) is None
    assert len(kept) == 0


def test_a_pipeline_is_costed_by_its_first_node_s_word_else_by_the_guess() -> None:
    kept, guess = KeptFollower(), PrefixIndex()
    guess.served(prints(1), "p0", 100)
    guess.served(prints(1), "p1", 100)
    kept.follow(["n0"])
    kept.told("n0", state(0, {}))
    firsts = {"p0": "n0", "p1": "n1"}
    # n0 says it keeps nothing of it (evicted): the guess for p0 is not believed.
    assert kept_at(prints(1), MODEL, firsts, kept, guess) == {"p1": 100}
    kept.heard(news(1, {1: 64}))
    assert kept_at(prints(1), MODEL, firsts, kept, guess) == {"p0": 64, "p1": 100}


@settings(max_examples=150)
@given(
    st.lists(st.tuples(st.integers(0, 7), st.booleans()), max_size=30),
    st.lists(st.sampled_from(["drop", "twice", "swap", "ok"]), max_size=30),
)
def test_whatever_the_way_loses_repeats_or_reorders_the_router_ends_as_the_node_is(
    changes: list[tuple[int, bool]], fates: list[str]
) -> None:
    """A node keeps and drops prints, numbering a news for each change; the way loses,
    repeats or swaps some. Each time the router asks, it is answered the node's whole
    as of then. Once the node is quiet and the router has asked for all it wanted, it
    holds exactly what the node keeps."""
    node: dict[int, int] = {}
    sent: list[PrefixNews] = []
    for i, (print_id, keep) in enumerate(changes, start=1):
        if keep:
            node[print_id] = 32 * (i % 3 + 1)
            sent.append(news(i, {print_id: node[print_id]}))
        else:
            node.pop(print_id, None)
            sent.append(news(i, dropped=(print_id,)))
    way: list[PrefixNews] = []
    for i, n in enumerate(sent):
        fate = fates[i] if i < len(fates) else "ok"
        if fate == "twice":
            way += [n, n]
        elif fate == "swap" and way:
            way.insert(len(way) - 1, n)
        elif fate != "drop":
            way.append(n)
    if sent:  # the node, quiet, says its last number again
        way.append(msgspec.structs.replace(sent[-1], models=[], again=True))
    kept = KeptFollower()
    kept.follow(["n0"])
    assert kept.told("n0", state(0, {})) is False
    asking = False
    for n in way:
        asking = kept.heard(n) or asking
    while asking:  # answered with the whole as it is now
        asking = kept.told("n0", state(len(sent), node))
    for print_id in range(8):
        want = node.get(print_id, 0)
        assert kept.tokens("n0", MODEL, prints(print_id)) == want
