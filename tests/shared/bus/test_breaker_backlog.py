"""The backlog of breaker reports waiting for a later try (the breaker service's, when the
bucket cannot take them; a router's, when no breaker service hears it), on an injected
clock: oldest first, bounded in length and age, and every report leaves it exactly once."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hecate.bus.backlog import Backlog
from hecate.wire.messages import OutcomeReport


def report(n: int) -> OutcomeReport:
    return OutcomeReport(target="gpu", ok=False, code=f"c{n}")


def test_reports_wait_oldest_first() -> None:
    backlog = Backlog(max_age_s=30.0, max_len=100)
    for n in range(3):
        assert backlog.hold(report(n), now=float(n)) == []
    seen = []
    while (held := backlog.first()) is not None:
        seen.append(held.report.code)
        backlog.pop()
    assert seen == ["c0", "c1", "c2"]


def test_a_full_backlog_pushes_out_its_oldest_report() -> None:
    backlog = Backlog(max_age_s=30.0, max_len=2)
    backlog.hold(report(0), now=0.0)
    backlog.hold(report(1), now=1.0)
    pushed = backlog.hold(report(2), now=2.0)
    assert [h.report.code for h in pushed] == ["c0"]
    assert len(backlog) == 2


def test_reports_held_longer_than_the_window_expire() -> None:
    backlog = Backlog(max_age_s=1.0, max_len=100)
    backlog.hold(report(0), now=0.0)
    backlog.hold(report(1), now=0.8)
    assert backlog.expired(now=1.0) == []  # exactly the window: still in it
    assert [h.report.code for h in backlog.expired(now=1.5)] == ["c0"]
    assert [h.report.code for h in backlog.expired(now=9.0)] == ["c1"]
    assert len(backlog) == 0


# One step: ("hold", dt) | ("pop", dt) | ("expire", dt); dt advances the clock.
steps = st.lists(
    st.tuples(st.sampled_from(["hold", "pop", "expire"]), st.floats(0.0, 2.0)), max_size=60
)


@given(steps, st.integers(1, 5), st.floats(0.1, 5.0))
def test_every_report_leaves_exactly_once_and_in_order(
    ops: list[tuple[str, float]], max_len: int, max_age: float
) -> None:
    backlog = Backlog(max_age_s=max_age, max_len=max_len)
    now, held, out = 0.0, 0, []
    for op, dt in ops:
        now += dt
        if op == "hold":
            out += [h.report.code for h in backlog.hold(report(held), now)]
            held += 1
        elif op == "pop" and (first := backlog.first()) is not None:
            out.append(first.report.code)
            backlog.pop()
        else:
            out += [h.report.code for h in backlog.expired(now)]
            oldest = backlog.first()
            assert oldest is None or now - oldest.received <= max_age
        assert len(backlog) <= max_len
    while (first := backlog.first()) is not None:
        out.append(first.report.code)
        backlog.pop()
    assert out == [f"c{n}" for n in range(held)]
