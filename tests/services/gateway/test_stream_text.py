"""What a stream holds back for its stop strings: exactly what rebuilding every prefix of
every stop string at each token held back, at a cost in each token's length rather than
in the stop strings' (which, 55,000 characters long, stalled the event loop)."""

from __future__ import annotations

import time

from hypothesis import given
from hypothesis import strategies as st

from hecate.wire.messages import MAX_STOP_CHARS
from hecate_gateway import shapes
from hecate_gateway.openai import MAX_STOPS


def naive_held(text: str, stop: tuple[str, ...]) -> int:
    """The held-back length as first written: the longest k below each stop string's
    length with ``text`` ending in its first k characters, tried from the longest."""
    held = 0
    for s in stop:
        for k in range(min(len(s) - 1, len(text)), held, -1):
            if text.endswith(s[:k]):
                held = k
                break
    return held


class NaiveStreamText:
    def __init__(self, stop: tuple[str, ...]) -> None:
        self.stop, self.text, self.sent = stop, "", 0

    def add(self, piece: str) -> str:
        self.text += piece
        end = len(self.text) - naive_held(self.text, self.stop)
        out = self.text[self.sent : end] if end > self.sent else ""
        self.sent = max(self.sent, end)
        return out


# Few letters: stop strings that overlap themselves and the text, often.
letters = "ab~"
pieces = st.lists(st.text(letters, max_size=6), max_size=16)
stops = st.lists(st.text(letters, max_size=7), max_size=MAX_STOPS).map(tuple)


@given(text=pieces, stop=st.text(letters, max_size=9))
def test_a_stop_tail_holds_what_the_naive_search_held_after_every_piece(
    text: list[str], stop: str
) -> None:
    tail = shapes.StopTail(stop)
    so_far = ""
    for piece in text:
        so_far += piece
        assert tail.feed(piece) == naive_held(so_far, (stop,)), (so_far, stop)


@given(text=pieces, stop=stops, rest=st.text(letters, max_size=12), more=pieces)
def test_a_stream_sends_what_the_naive_search_let_it_send(
    text: list[str], stop: tuple[str, ...], rest: str, more: list[str]
) -> None:
    """Every piece lets out the same text, whatever the pieces and stop strings (a stop
    string inside the text included, which a router never streams); and a stream that
    finished holds back from where its final output left it."""
    fast, naive = shapes.StreamText(stop), NaiveStreamText(stop)
    for piece in text:
        assert fast.add(piece) == naive.add(piece)
    assert fast.sent == naive.sent
    output = fast.text + rest
    assert fast.finish(output) == output[naive.sent :]
    after = NaiveAfter(output, stop)
    for piece in more:
        assert fast.add(piece) == after.add(piece)


class NaiveAfter(NaiveStreamText):
    """The naive stream as ``finish(output)`` leaves a stream: all of it sent."""

    def __init__(self, output: str, stop: tuple[str, ...]) -> None:
        super().__init__(stop)
        self.text, self.sent = output, len(output)


def test_four_stop_strings_at_the_longest_over_2000_tokens_cost_each_token_its_length() -> None:
    """Work counted, not timed: each token walks its own characters and at most as many
    fall-backs, however long the stop strings. (Rebuilding each prefix, the same stream
    took about a second here, each token half a millisecond of the event loop's time.)"""
    for stop in (
        tuple(c * MAX_STOP_CHARS for c in "wxyz"),  # nothing ever begins one
        tuple("~" * (MAX_STOP_CHARS - 1) + c for c in "wxyz"),  # each token a long start
        ("~" * MAX_STOP_CHARS,) * MAX_STOPS,  # the text ends in a whole one at once
    ):
        assert len(stop) == MAX_STOPS
        for token in (" ab ", "~~~", "~"):
            text = shapes.StreamText(stop)
            started = time.perf_counter()
            for _ in range(2000):
                text.add(token)
            took = time.perf_counter() - started
            fed = 2000 * len(token)
            for tail in text.tails:
                assert tail.steps <= 2 * fed, (stop[0][:3], token, tail.steps)
            assert took < 0.25, f"{took:.3f} s for 2000 tokens (about 0.005 s expected)"


def test_a_piece_longer_than_a_stop_string_costs_the_stop_strings_length() -> None:
    """A model that answers in one piece: only the piece's last characters can begin a
    stop string, so only they are walked."""
    tail = shapes.StopTail("~" * 16)
    assert tail.feed("x" * 100_000 + "~" * 5) == 5
    assert tail.steps <= 2 * 16
