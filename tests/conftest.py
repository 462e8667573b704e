"""Settings and fixtures every test shares: a real nats-server per test, services as
processes on it (tests.support.swarm), and SmolLM2 pulled and prepared once per run for
the modules that run it (``pytestmark = pytest.mark.usefixtures("prepared_model")``)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

from tests.support.swarm import client, nats_server, processes

__all__ = ["client", "nats_server", "processes"]

# Hypothesis times each example (a 200 ms deadline) and how long inputs take to draw
# (the too_slow health check), by the wall clock. On a busy machine (two cores shared
# with a swarm of processes) either one fails a test on one run that passes on the next.
# The properties here are about results, never speed: a test that needs a bound on time
# says so itself.
settings.register_profile("hecate", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("hecate")


@pytest.fixture(scope="session")
def prepared_model() -> None:
    """SmolLM2 pulled and prepared, before any node process loads it."""
    from hecate.llm.gguf_model import prepare
    from hecate.llm.store import pull

    prepare(pull("smollm2-135m", progress=lambda _line: None))
