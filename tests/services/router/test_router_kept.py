"""A router follows where the nodes say prompt prefixes are kept, on a real nats-server:
as it starts it asks each first node of its plan for the whole once, then plays their
news; a news naming another node than its subject is ignored; a missed news is noticed
at the node's reminder and the whole asked for again; and a chat's next turn is sent
to the pipeline whose first node says it keeps the chat's prefix.

The router runs in this process; the test plays the nodes on the bus."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg

from hecate.bus.server import NatsServer
from hecate.core import ModelSpec, NodeProfile, Pipeline, Stage, SwarmPlan
from hecate.model.prints import KeptPrint, ModelNews
from hecate.wire import subjects
from hecate.wire.common import ChatMessage
from hecate.wire.kept import PrefixNews, PrefixState
from hecate.wire.messages import InferRequest
from hecate_planner.planstore import publish_by_hand
from hecate_router.affinity import fingerprints
from hecate_router.service import RouterConfig, RouterService
from tests.support.waits import until

_log = logging.getLogger("hecate.test.router")
MODEL = "m"
NODES = ("a", "b")
CHAT = InferRequest(
    prompt="",
    messages=[ChatMessage(role="system", content="Be brief. " * 40)],
    max_tokens=2,
    tenant="alice",
)


def plan() -> SwarmPlan:
    return SwarmPlan(
        epoch=0,
        models=(ModelSpec(model_id=MODEL, layers=4, executor="smollm2"),),
        nodes=tuple(
            NodeProfile(node_id=n, capacity_layers=4, executor="smollm2", kind="steps")
            for n in NODES
        ),
        pipelines=tuple(
            Pipeline(
                pipeline_id=f"m-{n}",
                model_id=MODEL,
                stages=(Stage(node_id=n, layer_start=0, layer_end=4),),
            )
            for n in NODES
        ),
    )


class Nodes:
    """The nodes' side of the kept subjects: each answers the whole it keeps."""

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.kept: dict[str, PrefixState] = {
            n: PrefixState(node_id=n, boot="b1", seq=0) for n in NODES
        }
        self.asked: dict[str, int] = dict.fromkeys(NODES, 0)

    async def start(self) -> None:
        for n in NODES:
            await self.nc.subscribe(subjects.node_kept_whole(n), cb=self._whole)

    async def _whole(self, msg: Msg) -> None:
        node_id = msg.subject.split(".")[2]
        self.asked[node_id] += 1
        await msg.respond(msgspec.msgpack.encode(self.kept[node_id]))

    async def tell(self, news: PrefixNews, subject_node: str | None = None) -> None:
        subject = subjects.node_kept(subject_node or news.node_id)
        await self.nc.publish(subject, msgspec.msgpack.encode(news))


def keeps(node_id: str, seq: int, tokens: int, **more: object) -> PrefixNews:
    (print_, _share), *_ = fingerprints(CHAT)
    kept = [KeptPrint(print_, tokens)]
    return PrefixNews(
        node_id=node_id,
        boot="b1",
        seq=seq,
        models=[ModelNews(model_id=MODEL, kept=kept)],
        prefill_ms=1.0,
        **more,  # type: ignore[arg-type]
    )


@asynccontextmanager
async def router_with(server: NatsServer, nc: Client) -> AsyncIterator[RouterService]:
    await publish_by_hand(nc, plan())
    router = RouterService(RouterConfig(instance_id="r1", stage_timeout_s=600.0), log=_log)
    stop = asyncio.Event()
    task = asyncio.create_task(router.run(server.url, stop, grace=2.0))
    try:
        await until(lambda: _following(router), "the router follows both nodes")
        yield router
    finally:
        stop.set()
        await task


async def _following(router: RouterService) -> bool:
    return len(router.desk.affinity.kept) == len(NODES)


async def test_a_router_reads_each_node_whole_once_then_follows_and_routes_by_it(
    nats_server: NatsServer, client: Client
) -> None:
    nodes = Nodes(client)
    await nodes.start()
    async with router_with(nats_server, client) as router:
        kept = router.desk.affinity.kept
        assert nodes.asked == {"a": 1, "b": 1}
        # b says it keeps the chat's prefix (a body naming b on a's subject is ignored).
        await nodes.tell(keeps("b", 1, 320), subject_node="a")
        await nodes.tell(keeps("b", 1, 320))

        async def told() -> bool:
            return kept.status()["kept_prints"] == 1 and kept.status()["kept_ignored"] == 1

        await until(told, "b's news followed, the forged one ignored")
        runs = await client.subscribe("hecate.node.*.run")
        inbox = client.new_inbox()
        await client.publish(subjects.infer(MODEL), msgspec.json.encode(CHAT), reply=inbox)
        stage = await runs.next_msg(timeout=5)
        assert stage.subject == subjects.node_run("b")
        assert router.desk.counters["prefix_toward"] == 1
        # A news missed (2): the reminder of 3 says so, and the whole is asked again.
        nodes.kept["b"] = PrefixState(node_id="b", boot="b1", seq=3)
        await nodes.tell(keeps("b", 3, 320, again=True))
        await until(lambda: _asked(nodes, "b", 2), "b asked again")

        async def dropped() -> bool:
            return kept.status()["kept_prints"] == 0

        await until(dropped, "b's whole, keeping nothing, followed")
        assert nodes.asked["a"] == 1


async def _asked(nodes: Nodes, node_id: str, times: int) -> bool:
    return nodes.asked[node_id] == times
