"""``hecate bench llm``'s locked-down swarm: the 3-stage SmolLM2 pipeline on the bus as
deployed (an account per tenant, TLS, a user per process, the router taking the tenant
from the account the server stamps) streams a tenant the single-process greedy text."""

from __future__ import annotations

import pytest

from hecate.llm.reference import greedy_text
from hecate.llm.store import pull
from hecate_dev.bench.llm import check_text
from hecate_dev.bench.llm_single import MODEL, PROMPT
from hecate_dev.bench.llm_swarm import swarm

# SmolLM2, pulled and prepared once per run (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("prepared_model")

THREE = [("s0", 0, 10), ("s1", 10, 20), ("s2", 20, 30)]


def test_a_tenant_hears_the_greedy_text_from_the_locked_down_swarm() -> None:
    tokens = 4
    expected = greedy_text(pull(MODEL, progress=lambda _line: None), PROMPT, tokens)
    run = check_text(swarm([THREE], tokens, secure=True), expected)
    assert run["text_ok"], run
    assert run["tokens_per_s"] > 0


def test_a_kill_is_timed_on_the_open_bus_only() -> None:
    # A tenant may not hear the swarm's failover events, which a kill run reports.
    with pytest.raises(ValueError, match="open bus"):
        swarm([THREE], 4, kill_after=2, secure=True)
