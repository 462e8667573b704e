"""The flight deck's reading of the router's reconnects into its reconnect window.

No bus: the service is never started, its connections are nats-py clients that never
connect, and a reconnect is what nats-py itself records on one (its reconnect count).
"""

from __future__ import annotations

import logging
import time
from collections import Counter

from nats.aio.client import Client

from hecate.bus.service import Service
from hecate.core.failover import FailoverOptions
from hecate.wire.messages import NodeTelemetry, TelemetrySnapshot
from hecate_router.admission import AdmissionDesk
from hecate_router.flightdeck import FlightDeck
from hecate_router.flow import FlowOptions
from hecate_router.quotagate import Admission
from hecate_router.swarmview import SwarmView

GRACE = FlowOptions().reconnect_grace_s
log = logging.getLogger("test.flightdeck")


def _deck() -> tuple[FlightDeck, Service, Client]:
    svc = Service(kind="router", name="router", instance_id="r1", description="", log=log)
    svc.inbound, svc.outbound = Client(), Client()
    view = SwarmView(failover=FailoverOptions(), suspect_s=1.0, stale_s=5.0, log=log)
    deck = FlightDeck(svc, view, AdmissionDesk[Admission](), FlowOptions(), Counter())
    return deck, svc, svc.inbound


def _snapshot(wall_now: float) -> TelemetrySnapshot:
    return TelemetrySnapshot(
        written_at=wall_now,
        nodes={
            "a": NodeTelemetry(alive=True, last_seen=wall_now),
            "b": NodeTelemetry(alive=False, last_seen=wall_now - 10),
        },
    )


def test_without_a_reconnect_the_window_stays_shut() -> None:
    deck, _svc, _inbound = _deck()
    deck.view.telemetry = _snapshot(time.time())
    deck._observe(time.monotonic())
    assert deck.reconnect.at == float("-inf")
    assert (deck.reconnect.heard, deck.reconnect.down) == ({}, {})


def test_a_reconnect_opens_the_window_and_reads_telemetry_into_it_once() -> None:
    deck, svc, inbound = _deck()
    inbound.stats["reconnects"] += 1
    back = svc.reconnected_at
    deck.view.telemetry = _snapshot(time.time() + 1)  # written after we were back
    now = back + 0.1
    deck._observe(now)
    assert deck.reconnect.at == back
    assert deck.reconnect.expected == {"a"}
    assert set(deck.reconnect.heard) == {"a"}
    assert set(deck.reconnect.down) == {"b"}
    heard = dict(deck.reconnect.heard)
    deck._observe(now + 0.1)  # the same snapshot again: nothing new
    assert deck.reconnect.heard == heard


def test_a_reconnect_first_seen_past_its_grace_opens_a_window_already_shut() -> None:
    deck, svc, inbound = _deck()
    inbound.stats["reconnects"] += 1
    back = svc.reconnected_at
    deck.view.telemetry = _snapshot(time.time() + 1)
    deck._observe(back + GRACE)
    assert deck.reconnect.at == back
    assert (deck.reconnect.heard, deck.reconnect.down) == ({}, {})  # telemetry not read


def test_a_window_closes_after_its_grace_and_reopens_on_the_next_reconnect() -> None:
    deck, svc, inbound = _deck()
    inbound.stats["reconnects"] += 1
    first = svc.reconnected_at
    deck._observe(first)
    deck.view.telemetry = _snapshot(time.time() + 1)
    deck._observe(first + GRACE)  # closed: the snapshot is not read
    assert not deck.reconnect.heard
    assert svc.outbound is not None
    svc.outbound.stats["reconnects"] += 1
    second = svc.reconnected_at
    assert second > first
    deck._observe(second + 0.1)
    assert deck.reconnect.at == second
    assert set(deck.reconnect.heard) == {"a"}
