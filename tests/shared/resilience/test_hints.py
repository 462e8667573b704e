"""Reading "slow down" hints: durations, Retry-After (seconds, ms, HTTP dates), resets."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hecate.resilience import parse_duration_seconds, parse_retry_after
from hecate.resilience.hints import DEFAULT_CAP_S

# 1994-11-06 08:49:37 UTC, the RFC 9110 example date, as POSIX seconds.
EPOCH_1994 = 784_111_777.0
IMF = "Sun, 06 Nov 1994 08:49:37 GMT"
IMF_PLUS_30 = "Sun, 06 Nov 1994 08:50:07 GMT"
RFC850_PLUS_30 = "Sunday, 06-Nov-94 08:50:07 GMT"
ASCTIME_PLUS_30 = "Sun Nov  6 08:50:07 1994"

Headers = Mapping[str, str] | Iterable[tuple[str, str]]


# -- parse_duration_seconds ------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("30", 30.0, id="integer-seconds"),
        pytest.param("1.5", 1.5, id="fractional-seconds"),
        pytest.param("500ms", 0.5, id="milliseconds"),
        pytest.param("1m30s", 90.0, id="minutes-and-seconds"),
        pytest.param("6m0s", 360.0, id="openai-reset-form"),
        pytest.param("1h2m3.5s", 3723.5, id="hours-minutes-fractional-seconds"),
        pytest.param("0", 0.0, id="zero"),
        pytest.param("  30 ", 30.0, id="surrounding-whitespace"),
        pytest.param("1ms", 0.001, id="one-millisecond"),
        pytest.param("2us", 2e-6, id="microseconds-ascii"),
        pytest.param("2µs", 2e-6, id="microseconds-micro-sign"),
        pytest.param("5ns", 5e-9, id="nanoseconds"),
        pytest.param("1h", 3600.0, id="hours-only"),
        pytest.param("2m", 120.0, id="minutes-only-not-milliseconds"),
        pytest.param("1s500ms", 1.5, id="seconds-and-milliseconds"),
        pytest.param("6M0S", 360.0, id="upper-case-units"),
    ],
)
def test_a_well_formed_duration_parses_to_seconds(text: str, expected: float) -> None:
    assert parse_duration_seconds(text) == pytest.approx(expected, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("5s; x", id="trailing-garbage"),
        pytest.param("5s; drop table", id="seed-regex-garbage"),
        pytest.param("1e3", id="exponent"),
        pytest.param("+5", id="plus-sign"),
        pytest.param("1_000", id="underscore"),
        pytest.param("-1", id="negative"),
        pytest.param("-1s", id="negative-duration"),
        pytest.param("inf", id="inf"),
        pytest.param("Infinity", id="infinity"),
        pytest.param("nan", id="nan"),
        pytest.param("", id="empty"),
        pytest.param("   ", id="blank"),
        pytest.param("s", id="unit-without-number"),
        pytest.param("m", id="minute-unit-without-number"),
        pytest.param("1m1h", id="units-in-wrong-order"),
        pytest.param("1s1s", id="unit-repeated"),
        pytest.param("1.", id="dangling-point"),
        pytest.param(".5", id="leading-point"),
        pytest.param("1 s", id="space-inside"),
        pytest.param("1d", id="unknown-unit"),
        pytest.param("0x10", id="hex"),
        pytest.param("1" * 65, id="very-long-number"),
        pytest.param("1h" + "0" * 200 + "s", id="very-long-duration"),
        pytest.param("9" * 10_000, id="enormous-string"),
    ],
)
def test_a_malformed_duration_is_none(text: str) -> None:
    assert parse_duration_seconds(text) is None


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(None, id="none"),
        pytest.param(30, id="int"),
        pytest.param(1.5, id="float"),
        pytest.param(b"30", id="bytes"),
        pytest.param(["30"], id="list"),
    ],
)
def test_a_non_string_duration_is_none(value: object) -> None:
    assert parse_duration_seconds(value) is None  # type: ignore[arg-type]


# -- parse_retry_after: seconds and precedence ----------------------------------------


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        pytest.param({"Retry-After": "30"}, 30.0, id="integer-seconds"),
        pytest.param({"Retry-After": "1.5"}, 1.5, id="fractional-seconds"),
        pytest.param({"Retry-After": "0"}, 0.0, id="zero"),
        pytest.param({"Retry-After": " 7 "}, 7.0, id="whitespace"),
        pytest.param({"retry-after-ms": "250"}, 0.25, id="milliseconds"),
        pytest.param({"retry-after-ms": "1.5"}, 0.0015, id="fractional-milliseconds"),
        pytest.param({"Retry-After": "1, 2"}, 2.0, id="joined-duplicates-longest"),
        pytest.param({"Retry-After": "2, 1"}, 2.0, id="joined-duplicates-longest-first"),
        pytest.param({"Retry-After": "x, 3"}, 3.0, id="joined-duplicates-one-garbage"),
        pytest.param({"retry-after-ms": "100, 900"}, 0.9, id="joined-ms-duplicates"),
        pytest.param([("Retry-After", "1"), ("retry-after", "2")], 2.0, id="repeated-pairs"),
    ],
)
def test_retry_after_in_seconds_is_read_exactly(headers: Headers, expected: float) -> None:
    assert parse_retry_after(headers, now=0.0) == pytest.approx(expected)


@pytest.mark.parametrize(
    "name", ["Retry-After", "retry-after", "RETRY-AFTER", "rEtRy-AfTeR", " Retry-After "]
)
@pytest.mark.parametrize("as_pairs", [False, True], ids=["mapping", "pairs"])
def test_header_names_are_case_insensitive_in_a_mapping_or_pairs(name: str, as_pairs: bool) -> None:
    headers: Headers = [(name, "12")] if as_pairs else {name: "12"}
    assert parse_retry_after(headers) == 12.0


@pytest.mark.parametrize("as_pairs", [False, True], ids=["mapping", "pairs"])
def test_retry_after_ms_beats_retry_after_which_beats_the_reset_headers(as_pairs: bool) -> None:
    full = {
        "X-RateLimit-Reset-Requests": "6m0s",
        "Retry-After": "20",
        "Retry-After-Ms": "1500",
    }
    headers: Headers = list(full.items()) if as_pairs else full
    assert parse_retry_after(headers) == 1.5
    del full["Retry-After-Ms"]
    headers = list(full.items()) if as_pairs else full
    assert parse_retry_after(headers) == 20.0
    del full["Retry-After"]
    headers = list(full.items()) if as_pairs else full
    assert parse_retry_after(headers, cap_s=3600.0) == 360.0
    assert parse_retry_after(headers) == 300.0


def test_an_unusable_higher_precedence_header_falls_through_to_the_next() -> None:
    assert parse_retry_after({"retry-after-ms": "soon", "retry-after": "4"}) == 4.0
    assert parse_retry_after({"retry-after-ms": "-5", "retry-after": "4"}) == 4.0
    assert parse_retry_after({"retry-after": "later", "x-ratelimit-reset-tokens": "2s"}) == 2.0


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("-1", id="minus-one"),
        pytest.param("-0.5", id="negative-fraction"),
        pytest.param("1e3", id="exponent"),
        pytest.param("1e400", id="overflowing-exponent"),
        pytest.param("1_000", id="underscore"),
        pytest.param("+5", id="plus-sign"),
        pytest.param("inf", id="inf"),
        pytest.param("-inf", id="minus-inf"),
        pytest.param("nan", id="nan"),
        pytest.param("NaN", id="nan-mixed-case"),
        pytest.param("", id="empty"),
        pytest.param("5s; x", id="trailing-garbage"),
        pytest.param("soon", id="word"),
        pytest.param("0x1F", id="hex"),
        pytest.param("Fri, 31 Dec 100000 23:59:59 GMT", id="year-100000"),
        pytest.param("Sun, 32 Nov 1994 08:49:37 GMT", id="day-32"),
        pytest.param("Sun, 06 Nov 1994 25:49:37 GMT", id="hour-25"),
    ],
)
def test_an_unusable_retry_after_is_none_without_raising(value: str) -> None:
    assert parse_retry_after({"Retry-After": value}, now=EPOCH_1994) is None
    assert parse_retry_after({"retry-after-ms": value}, now=EPOCH_1994) is None


def test_no_hint_headers_at_all_is_none() -> None:
    assert parse_retry_after({}) is None
    assert parse_retry_after([]) is None
    assert parse_retry_after({"Content-Type": "application/json"}) is None


def test_garbage_in_every_hint_header_is_none() -> None:
    headers = {
        "retry-after-ms": "soon",
        "retry-after": "Fri, 31 Dec 100000 23:59:59 GMT",
        "date": "yesterday",
        "x-ratelimit-reset-requests": "5s; x",
        "x-ratelimit-reset-tokens": "1m1h",
        "x-ratelimit-remaining-requests": "nan",
        "x-ratelimit-remaining-tokens": "-1",
    }
    assert parse_retry_after(headers, now=EPOCH_1994) is None


def test_non_string_header_keys_and_values_are_ignored() -> None:
    headers: list[tuple[object, object]] = [(b"retry-after", "5"), ("retry-after", 5), (1, 2)]
    assert parse_retry_after(headers) is None  # type: ignore[arg-type]
    headers.append(("Retry-After", "6"))
    assert parse_retry_after(headers) == 6.0  # type: ignore[arg-type]


# -- parse_retry_after: caps -----------------------------------------------------------


def test_the_default_cap_is_300_seconds() -> None:
    assert DEFAULT_CAP_S == 300.0


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({"Retry-After": "86400"}, id="one-day"),
        pytest.param({"Retry-After": "9" * 20}, id="twenty-digits"),
        pytest.param({"Retry-After": "9" * 100}, id="hundred-digits"),
        pytest.param({"Retry-After": "9" * 400}, id="beyond-float-range"),
        pytest.param({"retry-after-ms": "9" * 400}, id="ms-beyond-float-range"),
        pytest.param({"Retry-After": "Fri, 31 Dec 9999 23:59:59 GMT"}, id="far-future-date"),
        pytest.param({"x-ratelimit-reset-requests": "1000h"}, id="long-reset"),
    ],
)
def test_a_huge_hint_is_capped_never_replaced_by_something_shorter(
    headers: dict[str, str],
) -> None:
    assert parse_retry_after(headers, now=EPOCH_1994) == 300.0


@pytest.mark.parametrize(
    ("cap", "value", "expected"),
    [
        pytest.param(10.0, "60", 10.0, id="long-hint-capped"),
        pytest.param(10.0, "5", 5.0, id="short-hint-kept"),
        pytest.param(3600.0, "1000", 1000.0, id="above-default-cap-allowed"),
        pytest.param(0.0, "5", 0.0, id="zero-cap"),
        pytest.param(-5.0, "5", 0.0, id="negative-cap-never-negative"),
    ],
)
def test_a_custom_cap_is_honoured(cap: float, value: str, expected: float) -> None:
    assert parse_retry_after({"Retry-After": value}, cap_s=cap) == expected


# -- parse_retry_after: HTTP dates -----------------------------------------------------


@pytest.mark.parametrize(
    "when",
    [
        pytest.param(IMF_PLUS_30, id="imf-fixdate"),
        pytest.param(RFC850_PLUS_30, id="rfc-850"),
        pytest.param(ASCTIME_PLUS_30, id="asctime"),
    ],
)
@pytest.mark.parametrize(
    "now",
    [
        pytest.param(0.0, id="our-clock-at-1970"),
        pytest.param(EPOCH_1994, id="our-clock-in-sync"),
        pytest.param(EPOCH_1994 - 3600.0, id="our-clock-an-hour-behind"),
        pytest.param(2_000_000_000.0, id="our-clock-in-2033"),
    ],
)
def test_an_http_date_is_measured_against_the_response_date_so_skew_cancels(
    when: str, now: float
) -> None:
    headers = {"Date": IMF, "Retry-After": when}
    assert parse_retry_after(headers, now=now) == 30.0


@pytest.mark.parametrize(
    "when",
    [
        pytest.param(IMF_PLUS_30, id="imf-fixdate"),
        pytest.param(RFC850_PLUS_30, id="rfc-850"),
        pytest.param(ASCTIME_PLUS_30, id="asctime"),
    ],
)
def test_without_a_date_header_an_http_date_is_measured_against_now(when: str) -> None:
    assert parse_retry_after({"Retry-After": when}, now=EPOCH_1994) == 30.0
    assert parse_retry_after({"Retry-After": when}, now=EPOCH_1994 + 20.0) == 10.0


def test_an_unparseable_date_header_falls_back_to_now() -> None:
    headers = {"Date": "not a date", "Retry-After": IMF_PLUS_30}
    assert parse_retry_after(headers, now=EPOCH_1994 + 10.0) == 20.0


def test_an_http_date_in_the_past_means_retry_now() -> None:
    assert parse_retry_after({"Retry-After": IMF}, now=EPOCH_1994 + 1000.0) == 0.0
    headers = {"Date": IMF_PLUS_30, "Retry-After": IMF}
    assert parse_retry_after(headers, now=0.0) == 0.0


def test_an_http_date_with_the_wrong_weekday_still_parses() -> None:
    wrong_day = "Wed, 06 Nov 1994 08:50:07 GMT"  # 6 Nov 1994 was a Sunday
    assert parse_retry_after({"Retry-After": wrong_day}, now=EPOCH_1994) == 30.0


def test_an_http_date_in_year_100000_is_none_without_raising() -> None:
    headers = {"Date": IMF, "Retry-After": "Fri, 31 Dec 100000 23:59:59 GMT"}
    assert parse_retry_after(headers, now=EPOCH_1994) is None
    assert parse_retry_after({"Retry-After": "Sun Nov  6 08:49:37 100000"}) is None


def test_an_http_date_far_ahead_is_capped() -> None:
    headers = {"Date": IMF, "Retry-After": "Mon, 07 Nov 1994 08:49:37 GMT"}
    assert parse_retry_after(headers) == 300.0
    assert parse_retry_after(headers, cap_s=100_000.0) == 86_400.0


# -- parse_retry_after: x-ratelimit-reset-* --------------------------------------------


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        pytest.param({"x-ratelimit-reset-requests": "6m0s"}, 360.0, id="requests-only"),
        pytest.param({"x-ratelimit-reset-tokens": "500ms"}, 0.5, id="tokens-only"),
        pytest.param(
            {"x-ratelimit-reset-requests": "6m0s", "x-ratelimit-reset-tokens": "500ms"},
            360.0,
            id="both-unknown-which-the-longer",
        ),
        pytest.param(
            {
                "x-ratelimit-reset-requests": "6m0s",
                "x-ratelimit-reset-tokens": "500ms",
                "x-ratelimit-remaining-requests": "10",
                "x-ratelimit-remaining-tokens": "0",
            },
            0.5,
            id="tokens-exhausted",
        ),
        pytest.param(
            {
                "x-ratelimit-reset-requests": "500ms",
                "x-ratelimit-reset-tokens": "6m0s",
                "x-ratelimit-remaining-requests": "0",
                "x-ratelimit-remaining-tokens": "1000",
            },
            0.5,
            id="requests-exhausted",
        ),
        pytest.param(
            {
                "x-ratelimit-reset-requests": "6m0s",
                "x-ratelimit-reset-tokens": "500ms",
                "x-ratelimit-remaining-requests": "0",
                "x-ratelimit-remaining-tokens": "0",
            },
            360.0,
            id="both-exhausted-the-longer",
        ),
        pytest.param(
            {
                "x-ratelimit-reset-requests": "6m0s",
                "x-ratelimit-reset-tokens": "500ms",
                "x-ratelimit-remaining-requests": "3",
                "x-ratelimit-remaining-tokens": "7",
            },
            360.0,
            id="neither-exhausted-the-longer",
        ),
        pytest.param(
            {
                "x-ratelimit-reset-requests": "garbage",
                "x-ratelimit-reset-tokens": "500ms",
                "x-ratelimit-remaining-requests": "0",
            },
            0.5,
            id="exhausted-one-unparseable-use-the-other",
        ),
        pytest.param(
            {"X-RateLimit-Reset-Requests": "1m30s", "X-RateLimit-Remaining-Requests": "0"},
            90.0,
            id="mixed-case-names",
        ),
        pytest.param({"x-ratelimit-reset-requests": "1h2m3.5s"}, 3600.0, id="capped"),
    ],
)
def test_reset_headers_pick_the_exhausted_budget_otherwise_the_longer(
    headers: dict[str, str], expected: float
) -> None:
    assert parse_retry_after(headers, cap_s=3600.0) == pytest.approx(expected)


# -- properties ------------------------------------------------------------------------

HINT_NAMES = [
    "retry-after",
    "Retry-After",
    "RETRY-AFTER",
    "retry-after-ms",
    "Retry-After-Ms",
    "date",
    "Date",
    "x-ratelimit-reset-requests",
    "x-ratelimit-reset-tokens",
    "X-RateLimit-Reset-Tokens",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-remaining-tokens",
]
NASTY = [
    "",
    " ",
    "-1",
    "0",
    "-0",
    "1e3",
    "1e400",
    "1_000",
    "+5",
    "inf",
    "-inf",
    "nan",
    "NaN",
    "Infinity",
    "9" * 400,
    "9" * 5000,
    "1" * 65,
    "1, 2",
    ",,,",
    ", ",
    "1.",
    ".5",
    "5s; x",
    "1m1h",
    "1s1s",
    "6m0s",
    "500ms",
    "1h2m3.5s",
    "99999999999999999999h",
    IMF,
    IMF_PLUS_30,
    RFC850_PLUS_30,
    ASCTIME_PLUS_30,
    "Fri, 31 Dec 100000 23:59:59 GMT",
    "Sun Nov  6 08:49:37 100000",
    "Fri, 31 Dec 9999 23:59:59 GMT",
    "Mon, 01 Jan 0001 00:00:00 GMT",
    "Sun, 06 Nov 1994 08:49:37 +9999",
    "Sun, 06 Nov 1994 08:49:37 -9999",
    "Sun, 06 Nov 1994 99:99:99 GMT",
    "Sun, 06 Nov 1994",
    "\x00",
    "٣",
    "µs",
    "2µs",
]
header_values = st.one_of(st.text(), st.sampled_from(NASTY))
header_dicts = st.dictionaries(
    st.one_of(st.sampled_from(HINT_NAMES), st.text(max_size=20)), header_values, max_size=8
)
header_pairs = st.lists(st.tuples(st.sampled_from(HINT_NAMES), header_values), max_size=8)


@settings(max_examples=300, deadline=None)
@given(
    headers=st.one_of(header_dicts, header_pairs),
    now=st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)),
    cap=st.one_of(st.just(DEFAULT_CAP_S), st.floats(min_value=0.0, max_value=1e7)),
)
def test_parse_retry_after_never_raises_and_stays_within_zero_and_the_cap(
    headers: Headers, now: float | None, cap: float
) -> None:
    wait = parse_retry_after(headers, now=now, cap_s=cap)
    assert wait is None or (isinstance(wait, float) and math.isfinite(wait) and 0 <= wait <= cap)


@settings(max_examples=300, deadline=None)
@given(text=st.one_of(st.text(), st.sampled_from(NASTY)))
def test_parse_duration_never_raises_and_is_finite_and_non_negative(text: str) -> None:
    seconds = parse_duration_seconds(text)
    assert seconds is None or (
        isinstance(seconds, float) and math.isfinite(seconds) and seconds >= 0
    )


@settings(max_examples=300, deadline=None)
@given(
    h=st.integers(min_value=0, max_value=10_000),
    m=st.integers(min_value=0, max_value=59),
    s=st.integers(min_value=0, max_value=59),
    ms=st.integers(min_value=0, max_value=999),
)
def test_go_style_durations_round_trip(h: int, m: int, s: int, ms: int) -> None:
    assert parse_duration_seconds(f"{h}h{m}m{s}s") == h * 3600 + m * 60 + s
    assert parse_duration_seconds(f"{m}m{s}s") == m * 60 + s
    assert parse_duration_seconds(f"{ms}ms") == pytest.approx(ms / 1000)
    assert parse_duration_seconds(f"{h}h{m}m{s}s{ms}ms") == pytest.approx(
        h * 3600 + m * 60 + s + ms / 1000
    )
