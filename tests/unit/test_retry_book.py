"""What a router knows of retries (routing/retrybook.py), driven in memory."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hecate.routing.retrybook import Answered, RetryBook, Running

A = ("t", "a")


def test_a_running_request_is_joined_then_its_answer_repeated() -> None:
    book: RetryBook[str] = RetryBook()
    assert book.lookup(A) is None
    book.started(A, 7)
    assert book.lookup(A) == Running(7)
    book.finished(A, (b"answer", None))
    assert book.lookup(A) == Answered((b"answer", None))


def test_only_the_newest_answers_are_remembered() -> None:
    book: RetryBook[str] = RetryBook(remember=2)
    for i in range(3):
        book.finished(("t", str(i)), (str(i).encode(), None))
    assert book.lookup(("t", "0")) is None
    assert book.lookup(("t", "2")) == Answered((b"2", None))


def test_tenants_do_not_share_request_ids() -> None:
    book: RetryBook[str] = RetryBook()
    book.finished(("t1", "x"), (b"one", None))
    assert book.lookup(("t2", "x")) is None


@given(st.lists(st.sampled_from(["owned", "tick"]), max_size=10), st.integers(1, 5))
def test_a_claimed_retry_is_run_here_or_handed_over_never_both(ops: list[str], n: int) -> None:
    book: RetryBook[str] = RetryBook(claim_s=0.05)
    claims = {book.claim(f"retry-{i}", 0.0): f"retry-{i}" for i in range(n)}
    outcomes: list[str] = []
    now = 0.0
    for op in ops:
        if op == "owned":
            got = book.owned(min(claims))
            outcomes += [got] if got is not None else []
        else:
            now += 0.03
            outcomes += book.unclaimed(now)
    outcomes += book.unclaimed(now + 1.0)
    assert sorted(outcomes) == sorted(claims.values())
    assert book.pending == {}
