"""What a first stage tells routers it keeps (pure): a prompt's prints become kept once
its positions are computed, dropped when their cache goes, bounded; and whatever a
stage's store goes through, the news told in order add up to exactly what it keeps."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hecate.llm.prefix_news import Announcer
from hecate.llm.prefixes import Prefixes, block_keys
from hecate.model.prints import ModelNews, text_prints

MODEL = "smollm2-135m"
BLOCK = 4


class Cache:
    def __init__(self, length: int) -> None:
        self.length = length

    def nbytes(self) -> int:
        return self.length


def chat(*contents: str) -> tuple[tuple[str, str], ...]:
    return tuple(("user", c) for c in contents)


def play(told: dict[bytes, int], news: list[ModelNews]) -> None:
    for m in news:
        assert m.model_id == MODEL
        for p in m.dropped:
            del told[p]  # only what was told is ever dropped
        for k in m.kept:
            told[k.print] = k.tokens


def test_a_prompt_is_told_once_computed_with_its_whole_blocks_and_dropped_when_its_cache_goes() -> (
    None
):
    store, announcer = Prefixes(block=BLOCK), Announcer()
    tokens = list(range(20))
    keys = block_keys("alice", tokens, block=BLOCK)
    prints = text_prints("alice", chat("a" * 30, "b" * 10), "")  # shares 0.75 and 1.0
    announcer.learn(MODEL, store, "alice", prints, keys, len(tokens))
    assert announcer.news([store]) == []  # not computed yet: nothing kept
    cache = Cache(20)
    store.name("alice", keys, cache, 8)  # a first chunk: 2 blocks
    assert announcer.news([store]) == []  # the prints need blocks 3 and 5
    store.name("alice", keys, cache, 20)
    (news,) = announcer.news([store])
    assert {(k.print, k.tokens) for k in news.kept} == {(prints[0][0], 12), (prints[1][0], 20)}
    assert announcer.news([store]) == []  # nothing changed since
    assert store.ended(cache)
    store.give_up_one()  # the stage needed the room
    (gone,) = announcer.news([store])
    assert set(gone.dropped) == {prints[0][0], prints[1][0]}
    assert not gone.kept
    assert announcer.state() == []


def test_a_print_learnt_on_a_stage_let_go_is_dropped() -> None:
    store, announcer = Prefixes(block=BLOCK), Announcer()
    keys = block_keys("t", list(range(8)), block=BLOCK)
    prints = text_prints("t", None, "x" * 300)  # one block of 256 characters: share 0.85
    announcer.learn(MODEL, store, "t", prints, keys, 8)
    store.name("t", keys, Cache(8), 8)
    assert announcer.news([store])[0].kept[0].tokens == 4
    (gone,) = announcer.news([])
    assert gone.dropped == [prints[0][0]]


def test_what_is_learnt_is_bounded_least_recent_out_first() -> None:
    store, announcer = Prefixes(block=BLOCK), Announcer(most=3)
    for i in range(5):
        keys = block_keys("t", [i] * 8, block=BLOCK)
        announcer.learn(MODEL, store, "t", text_prints("t", chat(f"q{i}"), ""), keys, 8)
        store.name("t", keys, Cache(8), 8)
    (news,) = announcer.news([store])
    assert len(news.kept) == 3
    (state,) = announcer.state()
    assert {k.print for k in state.kept} == {
        text_prints("t", chat(f"q{i}"), "")[0][0] for i in (2, 3, 4)
    }


ops = st.lists(
    st.one_of(
        st.tuples(st.just("learn"), st.integers(0, 5), st.integers(1, 24)),
        st.tuples(st.just("end"), st.integers(0, 5), st.just(0)),
        st.tuples(st.just("give_up"), st.just(0), st.just(0)),
        st.tuples(st.just("news"), st.just(0), st.just(0)),
    ),
    max_size=40,
)


@settings(max_examples=200)
@given(ops)
def test_the_news_told_in_order_add_up_to_what_the_store_keeps(
    steps: list[tuple[str, int, int]],
) -> None:
    """Prompts learnt, computed (in part or whole), ended, evicted, asked in any order:
    a follower playing every news in order holds what :meth:`Announcer.state` says, and
    each print it holds names a block the store still keeps."""
    store, announcer = Prefixes(block=BLOCK, max_kept=2), Announcer(most=8)
    told: dict[bytes, int] = {}
    live: dict[int, Cache] = {}
    truth: dict[bytes, set[tuple[str, bytes]]] = {}  # the blocks each print has named
    for op, n, length in steps:
        if op == "learn":
            tokens = [n] * 16 + list(range(length))
            keys = block_keys(f"t{n % 2}", tokens, block=BLOCK)
            prints = text_prints(f"t{n % 2}", chat(f"q{n}", "r" * length), "")
            announcer.learn(MODEL, store, f"t{n % 2}", prints, keys, len(tokens))
            for p, share in prints:
                j = int(len(tokens) * share) // BLOCK - 1
                if 0 <= j < len(keys):
                    truth.setdefault(p, set()).add((f"t{n % 2}", keys[j]))
            cache = live.setdefault(n, Cache(0))
            cache.length = len(tokens)
            store.name(f"t{n % 2}", keys, cache, min(len(tokens), 8 + length))
        elif op == "end" and n in live:
            store.ended(live.pop(n))
        elif op == "give_up":
            store.give_up_one()
        elif op == "news":
            play(told, announcer.news([store]))
        store.overflow()
    play(told, announcer.news([store]))
    state = {k.print: k.tokens for m in announcer.state() for k in m.kept}
    assert told == state
    for p in told:
        assert any(store.holds(scope, key) for scope, key in truth[p])
