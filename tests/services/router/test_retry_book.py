"""What a router knows of retries (routing/retrybook.py), driven in memory."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hecate_router.retrybook import Answered, RetryBook, Running

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


MiB = 1024 * 1024


def held(book: RetryBook[str]) -> int:
    """What the remembered answers weigh: their encoded bodies and their headers."""
    return sum(
        len(body) + sum(len(k.encode()) + len(v.encode()) for k, v in (headers or {}).items())
        for body, headers in book.answered.values()
    )


def test_the_default_budget_keeps_answers_to_64_mib_however_many_there_are() -> None:
    # 5,000 long generations of 16 KiB each: 80 MiB, under the count bound of 10,000.
    book: RetryBook[str] = RetryBook()
    long_answer = b"x" * (16 * 1024)
    for i in range(5_000):
        book.finished(("t", str(i)), (long_answer, None))
    assert held(book) <= 64 * MiB, f"{held(book) / MiB:.1f} MiB remembered"
    assert book.lookup(("t", "4999")) == Answered((long_answer, None))
    assert book.lookup(("t", "0")) is None  # the oldest made room


def test_many_large_answers_keep_to_the_budget_and_the_newest_are_kept() -> None:
    book: RetryBook[str] = RetryBook(remember=1_000, remember_bytes=10_000)
    headers = {"Hecate-Error": "timeout"}  # 19 bytes, counted too
    for i in range(100):
        book.finished(("t", str(i)), (bytes(981), headers))  # 1,000 bytes each
    assert book.bytes_held == held(book) == 10_000
    kept = [i for i in range(100) if book.lookup(("t", str(i))) is not None]
    assert kept == list(range(90, 100))


def test_an_answer_larger_than_the_whole_budget_is_not_remembered() -> None:
    book: RetryBook[str] = RetryBook(remember_bytes=1_000)
    book.finished(("t", "small"), (bytes(500), None))
    book.finished(("t", "huge"), (bytes(1_001), None))
    assert book.lookup(("t", "huge")) is None
    assert book.lookup(("t", "small")) == Answered((bytes(500), None))  # not evicted for it
    assert book.bytes_held == 500


@given(
    st.lists(
        st.tuples(
            st.sampled_from("abcdefgh"),  # a few request ids, so some answers replace others
            st.integers(0, 400),  # body bytes
            st.booleans(),  # with error headers
        ),
        max_size=60,
    ),
    st.integers(1, 6),
    st.integers(1, 1_000),
)
def test_after_any_answers_the_book_keeps_to_its_bounds_and_the_newest_fitting_is_kept(
    answers: list[tuple[str, int, bool]], remember: int, budget: int
) -> None:
    book: RetryBook[str] = RetryBook(remember=remember, remember_bytes=budget)
    for request_id, size, failed in answers:
        headers = {"Hecate-Error": "internal"} if failed else None
        answer = (bytes(size), headers)
        book.finished(("t", request_id), answer)
        assert book.bytes_held == held(book) <= budget
        assert len(book.answered) <= remember
        fits = size + (len("Hecate-Error") + len("internal") if failed else 0) <= budget
        assert book.lookup(("t", request_id)) == (Answered(answer) if fits else None)
