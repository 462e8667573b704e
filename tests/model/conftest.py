"""The integration fixtures (a real nats-server per test, services as processes), and
the model pulled and prepared once per run, before any node process loads it."""

from __future__ import annotations

import pytest

from hecate.llm.gguf_model import prepare
from hecate.llm.store import pull

from ..integration.conftest import client, nats_server, processes

__all__ = ["client", "nats_server", "processes"]


@pytest.fixture(scope="session", autouse=True)
def prepared_model() -> None:
    prepare(pull("smollm2-135m", progress=lambda _line: None))
