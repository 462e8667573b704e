"""The live swarm page in a real browser (Debian's chromium driven by playwright) over a
real toy swarm: a node SIGKILLed while it carries traffic is shown down, and the
failover it caused is in the feed, within 2 s, without reloading the page. The JSON at
``/v1/swarm`` and the swarm gauges say the same."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import msgspec
import pytest
import uvicorn
from nats.aio.client import Client
from playwright.async_api import Page, async_playwright, expect
from prometheus_client import CollectorRegistry, generate_latest
from starlette.applications import Starlette

from hecate.gateway import page
from hecate.gateway.swarm import SwarmWatch
from hecate.wire import subjects
from hecate.wire.messages import InferReply, InferRequest

from .conftest import EXAMPLES, SWARM_NODES, Processes, start_swarm, wait_until_serving
from .waits import routers_ready, until

CHROMIUM = Path("/usr/bin/chromium")
MODEL = "ncm-base"
_reply = msgspec.json.Decoder(InferReply)


def chromium() -> Path:
    """Debian's chromium (``playwright install`` cannot download here): installed with
    apt-get when missing, or the test fails saying why."""
    if not CHROMIUM.exists():
        if shutil.which("apt-get") is None:
            pytest.fail(f"{CHROMIUM} is missing and there is no apt-get to install chromium")
        try:
            subprocess.run(
                ["apt-get", "install", "-y", "chromium"],
                check=True,
                capture_output=True,
                timeout=900,
            )
        except (subprocess.SubprocessError, OSError) as exc:
            out = getattr(exc, "stderr", b"") or b""
            pytest.fail(
                f"{CHROMIUM} is missing and `apt-get install -y chromium` failed "
                f"(as root, with the Debian archive reachable?): {exc} {out.decode()[-500:]}"
            )
        if not CHROMIUM.exists():
            pytest.fail(f"apt-get installed chromium but {CHROMIUM} is still missing")
    return CHROMIUM


@contextlib.asynccontextmanager
async def serving(app: Starlette) -> AsyncIterator[str]:
    """``app`` on uvicorn, in this event loop, on a free port; its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    host, port = sock.getsockname()
    config = uvicorn.Config(app, log_config=None, lifespan="off", timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await until(lambda: server.started or task.done(), "uvicorn listening")
        assert not task.done(), task
        yield f"http://{host}:{port}/"
    finally:
        server.should_exit = True
        await task
        sock.close()


async def trickle(nc: Client, watch: SwarmWatch, answered: list[InferReply]) -> None:
    """One request after another, as a client of the gateway would send them; the
    tokens each answer carried count towards the page's tokens/s."""
    body = msgspec.json.encode(InferRequest(prompt="the page is watching", max_tokens=6))
    while True:
        try:
            msg = await nc.request(subjects.infer(MODEL), body, timeout=3.0)
        except Exception:
            continue
        reply = _reply.decode(msg.data)
        answered.append(reply)
        if reply.ok:
            watch.count_tokens(reply.completion_tokens or 6, time.monotonic())


async def shot(tab: Page, tmp_path: Path) -> None:
    target = Path(os.environ.get("HECATE_SCREENSHOT") or tmp_path / "swarm-page.png")
    target.parent.mkdir(parents=True, exist_ok=True)
    await tab.screenshot(path=str(target), full_page=True)


async def test_a_killed_node_shows_down_with_its_failover_within_two_seconds(
    processes: Processes, client: Client, tmp_path: Path
) -> None:
    browser_path = chromium()
    start_swarm(processes, EXAMPLES / "swarm.json", SWARM_NODES)
    first = await wait_until_serving(client, MODEL)
    await routers_ready(client, "router-1")
    assert first.route is not None
    victim = first.route.stages[0].node_id  # on the cheapest pipeline: it carries the load

    watch = SwarmWatch()
    registry = CollectorRegistry()
    watch.register_metrics(registry)
    follow = asyncio.create_task(watch.run(client))
    answered: list[InferReply] = []
    load: list[asyncio.Task[None]] = []
    app = Starlette(routes=page.routes(watch))
    try:
        async with serving(app) as url, async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=str(browser_path))
            try:
                tab = await browser.new_page(viewport={"width": 1440, "height": 900})
                await tab.goto(url)
                row = tab.locator(f'#nodes tr[data-node="{victim}"]')
                await expect(row).to_have_attribute("data-health", "up", timeout=15_000)
                await expect(tab.locator(f'[data-model="{MODEL}"] .seg')).not_to_have_count(0)

                load = [asyncio.create_task(trickle(client, watch, answered)) for _ in range(4)]
                await until(lambda: len(answered) >= 40, "the trickle answered before the kill")
                await expect(tab.locator("#tokens")).not_to_have_text("0.0")
                processes.kill(f"node-{victim}", signal.SIGKILL)

                # Both measured from the kill: the page is told, nobody reloads it.
                failover = tab.locator(f'#feed li[data-kind="failover"][data-node="{victim}"]')
                await asyncio.gather(
                    expect(row).to_have_attribute("data-health", "down", timeout=2_000),
                    expect(failover.first).to_be_visible(timeout=2_000),
                )
                segments = tab.locator(f'.seg[data-node="{victim}"]')
                await expect(segments.first).to_have_attribute("data-health", "down")
                await expect(tab.locator("#nodes-down")).to_have_text("1")
                await until(lambda: answered[-1].ok, "an answer after the kill")
                await shot(tab, tmp_path)
            finally:
                await browser.close()

            async with httpx.AsyncClient(base_url=url) as http:
                doc = (await http.get("v1/swarm")).json()
            html = (await asyncio.to_thread(httpx.get, url)).text
        assert "<script>" in html
        assert "http://" not in html
        assert "https://" not in html  # nothing fetched from elsewhere
        nodes = {n["node_id"]: n for n in doc["nodes"]}
        assert nodes[victim]["health"] == "down"
        assert doc["counters"]["failovers"].get("replica", 0) >= 1
        assert any(e["kind"] == "failover" and e["node_id"] == victim for e in doc["feed"])
        (model,) = [m for m in doc["models"] if m["model_id"] == MODEL]
        assert model["servable"]
        assert model["complete_pipelines"] == len(model["pipelines"]) - 1
        assert doc["servable_models"] == watch.servable_models()
        assert MODEL in doc["servable_models"]

        metrics = generate_latest(registry).decode()
        assert 'hecate_swarm_nodes{health="down"} 1.0' in metrics
        assert f'hecate_swarm_pipelines_complete{{model="{MODEL}"}}' in metrics
        assert 'hecate_failovers_total{kind="replica"}' in metrics
        assert f'hecate_swarm_layer_min_live_replicas{{model="{MODEL}"}}' in metrics
    finally:
        for task in [*load, follow]:
            task.cancel()
        await asyncio.gather(*load, follow, return_exceptions=True)
