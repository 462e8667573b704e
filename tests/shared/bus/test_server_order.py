"""One order of a cluster's servers for all the connections of a process."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from hecate.bus.connection import one_order, servers

_url = st.from_regex(r"nats://127\.0\.0\.1:[1-9][0-9]{3}", fullmatch=True)


@given(st.lists(_url, min_size=1, max_size=6, unique=True), st.integers(0, 2**32))
def test_the_order_is_the_servers_given_each_once(urls: list[str], seed: int) -> None:
    order = one_order(" , ".join(urls), random.Random(seed))
    assert sorted(servers(order)) == sorted(urls)


def test_processes_are_spread_over_the_cluster() -> None:
    url = "nats://a:1,nats://b:2,nats://c:3"
    firsts = {servers(one_order(url, random.Random(seed)))[0] for seed in range(50)}
    assert firsts == set(servers(url))
