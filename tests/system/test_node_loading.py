"""A node that takes its time to start is not called down: on a real nats-server, with
telemetry, the planner, a router and the node as processes, a node whose loading holds
its interpreter (its heartbeats held with it) is starting, not down, and serves once
loaded."""

from __future__ import annotations

import itertools
import sys
import time

import msgspec
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from hecate.wire import subjects
from hecate.wire.messages import Heartbeat
from hecate_launcher import ProcessSpec
from tests.services.telemetry.test_liveness_bus import Events
from tests.support.swarm import EXAMPLES, Processes, start_planner, start_router, wait_until_serving
from tests.support.waits import listening, until

# Judged by the wall clock (how soon, how long): run alone, after the parallel tests.
pytestmark = pytest.mark.serial

NODE = "slow"
HOLD_S = 1.5  # three times the patience of a node heard twice at its 100 ms pace

# ``hecate node`` as run_service runs it, on the toy network, whose first warm-up (the
# end of loading its range) holds the interpreter for HOLD_S, as native code that does
# not let it go does (SmolLM2's tokenizer build holds it throughout, 0.14 s on an idle
# machine, longer on a busy one): no other thread of the node runs meanwhile, its
# heartbeats included. The switch interval is the only lever: Python code hands the
# interpreter over every 5 ms otherwise.
SLOW_TO_LOAD = """
import sys, time
from hecate.cli.process import run_service
from hecate.core.plan import NodeProfile
from hecate.model.toy import ToyModel
from hecate_node.service import Node
from hecate_node.config import NodeConfig

url, node_id, hold_s = sys.argv[1], sys.argv[2], float(sys.argv[3])

class SlowToLoad(ToyModel):
    held = False

    def warm_up(self, model_id, layer_start, layer_end):
        if not self.held:
            self.held = True
            switch = sys.getswitchinterval()
            sys.setswitchinterval(2 * hold_s)
            deadline = time.monotonic() + hold_s
            while time.monotonic() < deadline:
                pass
            sys.setswitchinterval(switch)
        super().warm_up(model_id, layer_start, layer_end)

config = NodeConfig(
    profile=NodeProfile(node_id=node_id, capacity_layers=12, latency_ms=5.0), executor="toy"
)
sys.exit(run_service(
    "node", node_id, url,
    lambda log, tp: Node(config, log=log, tracer_provider=tp, executor=SlowToLoad()),
))
"""


class Beats:
    """When each of the node's heartbeats arrived here, and what it said."""

    def __init__(self) -> None:
        self.heard: list[tuple[float, Heartbeat]] = []

    async def heard_one(self, msg: Msg) -> None:
        self.heard.append((time.monotonic(), msgspec.json.decode(msg.data, type=Heartbeat)))

    def longest_gap(self) -> float:
        times = [at for at, _ in self.heard]
        return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


async def test_a_node_whose_load_holds_its_heartbeats_is_not_called_down(
    processes: Processes, client: Client
) -> None:
    events = Events()
    beats = Beats()
    await client.subscribe(subjects.EVENT_NODE_DOWN, cb=events.heard)
    await client.subscribe(subjects.EVENT_NODE_UP, cb=events.heard)
    await client.subscribe(subjects.intake("*", NODE), cb=beats.heard_one)
    processes.start("telemetry", "telemetry", "--id", "telemetry")
    await listening(client, "telemetry", "telemetry", "heartbeat")
    topology = EXAMPLES / "swarm.json"
    start_planner(processes, topology, 1, settle_ms=100)
    start_router(processes, "router-1", topology)
    processes.supervisor.start(
        ProcessSpec(
            f"node-{NODE}",
            (SLOW_TO_LOAD, processes.url, NODE, str(HOLD_S)),
            {"HECATE_LOG_LEVEL": "INFO"},
            program=(sys.executable, "-c"),
        )
    )
    await wait_until_serving(client, "ncm-base")
    await until(lambda: beats.longest_gap() >= HOLD_S * 0.8, "the node's load holding its beats")
    # Two beats at its pace after the load: telemetry has judged it since.
    loaded = len(beats.heard)
    await until(lambda: len(beats.heard) >= loaded + 2, "the node beating again")
    await client.flush()
    assert events.of(NODE, "up"), events.seen
    assert not events.of(NODE, "down"), (events.seen, processes.log("telemetry"))
    assert any(beat.loading for _, beat in beats.heard), "the node never said it was loading"
    assert not beats.heard[-1][1].loading
