"""The live swarm page in a real browser (Debian's chromium driven by playwright) over a
real toy swarm, served by the gateway's own app with OpenAI requests trickling through
it: a node SIGKILLed while it carries traffic is shown down, and the failover it caused
is in the feed, within 2 s, without reloading the page. The JSON at ``/v1/swarm`` and
the swarm gauges on ``/metrics`` say the same."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from nats.aio.client import Client
from playwright.async_api import Page, async_playwright, expect
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette

from hecate_gateway.app import Gateway, build_app
from hecate_gateway.bridge import Bridge
from hecate_gateway.keys import OpenAccess
from hecate_gateway.metrics import Metrics
from hecate_gateway.swarm import SwarmWatch
from tests.support.swarm import EXAMPLES, SWARM_NODES, Processes, start_swarm, wait_until_serving
from tests.support.waits import planned, routers_ready, until

# Judged by the wall clock (how soon, how long): run alone, after the parallel tests.
pytestmark = pytest.mark.serial

CHROMIUM = Path("/usr/bin/chromium")
MODEL = "ncm-base"


def chromium() -> Path:
    """Debian's chromium (``playwright install`` cannot download here): installed with
    apt-get when missing, or the test fails saying why."""
    if not CHROMIUM.exists():
        if shutil.which("apt-get") is None:
            pytest.fail(f"{CHROMIUM} is missing and there is no apt-get to install chromium")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}

        def apt(*args: str) -> None:
            subprocess.run(
                ["apt-get", *args], check=True, capture_output=True, timeout=900, env=env
            )

        try:
            try:
                apt("install", "-y", "-q", "chromium")
            except subprocess.CalledProcessError:  # stale package lists: refresh, once
                apt("update", "-q")
                apt("install", "-y", "-q", "chromium")
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


async def trickle(http: httpx.AsyncClient, answered: list[int]) -> None:
    """One completion after another through the gateway, as any OpenAI client sends them
    (the status of each answer in ``answered``)."""
    body = {"model": MODEL, "prompt": "the page is watching", "max_tokens": 6}
    while True:
        try:
            r = await http.post("v1/completions", json=body)
        except httpx.HTTPError:
            continue
        answered.append(r.status_code)


async def stopped(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def shot(tab: Page, tmp_path: Path) -> None:
    target = Path(os.environ.get("HECATE_SCREENSHOT") or tmp_path / "swarm-page.png")
    target.parent.mkdir(parents=True, exist_ok=True)
    await tab.screenshot(path=str(target), full_page=True)


async def test_a_killed_node_shows_down_with_its_failover_within_two_seconds(
    processes: Processes, client: Client, tmp_path: Path
) -> None:
    browser_path = chromium()
    start_swarm(processes, EXAMPLES / "swarm.json", SWARM_NODES)
    await wait_until_serving(client, MODEL)
    await routers_ready(client, "router-1")
    # Both pipelines planned before the kill, or there is no replica to fail over to.
    await planned(client, MODEL, pipelines=2, routers=1)
    first = await wait_until_serving(client, MODEL)
    assert first.route is not None
    victim = first.route.stages[0].node_id  # on the cheapest pipeline: it carries the load

    watch = SwarmWatch()
    follow = asyncio.create_task(watch.run(client))
    metrics = Metrics(CollectorRegistry())
    watch.register_metrics(metrics.registry)  # as the gateway service does
    gateway = Gateway(
        bridge=Bridge(client, timeout_s=10.0),
        auth=OpenAccess(),
        watch=watch,
        metrics=metrics,
        log=logging.getLogger("hecate.test.gateway"),
    )
    answered: list[int] = []
    load: list[asyncio.Task[None]] = []
    try:
        async with (
            serving(build_app(gateway)) as url,
            httpx.AsyncClient(base_url=url, timeout=15.0) as http,
            async_playwright() as pw,
        ):
            browser = await pw.chromium.launch(executable_path=str(browser_path))
            try:
                tab = await browser.new_page(viewport={"width": 1440, "height": 900})
                await tab.goto(url)
                row = tab.locator(f'#nodes tr[data-node="{victim}"]')
                await expect(row).to_have_attribute("data-health", "up", timeout=15_000)
                await expect(tab.locator(f'[data-model="{MODEL}"] .seg')).not_to_have_count(0)
                await expect(tab.locator("#conn")).to_have_text("live")

                load = [asyncio.create_task(trickle(http, answered)) for _ in range(4)]
                await until(lambda: answered.count(200) >= 40, "answers before the kill")
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
                await expect(tab.locator("#tokens")).to_have_text(re.compile(r"^\d+\.\d$"))
                served = len(answered)
                await until(lambda: len(answered) > served + 10, "answers after the kill")
                await stopped(load)
                await shot(tab, tmp_path)
            finally:
                await browser.close()

            doc = (await http.get("v1/swarm")).json()
            html = (await http.get("")).text
            exposed = (await http.get("metrics")).text
        assert "<script>" in html
        assert "http://" not in html
        assert "https://" not in html  # nothing fetched from elsewhere
        assert 200 in answered[served:]
        nodes = {n["node_id"]: n for n in doc["nodes"]}
        assert nodes[victim]["health"] == "down"
        assert doc["counters"]["failovers"].get("replica", 0) >= 1
        assert any(e["kind"] == "failover" and e["node_id"] == victim for e in doc["feed"])
        (model,) = [m for m in doc["models"] if m["model_id"] == MODEL]
        assert model["servable"]
        assert model["complete_pipelines"] == len(model["pipelines"]) - 1
        assert doc["servable_models"] == watch.servable_models()
        assert MODEL in doc["servable_models"]

        lines = exposed.splitlines()
        assert 'hecate_swarm_nodes{health="down"} 1.0' in lines
        assert f'hecate_swarm_pipelines_complete{{model="{MODEL}"}} 1.0' in lines
        assert any(line.startswith('hecate_failovers_total{kind="replica"}') for line in lines)
        assert any(
            line.startswith(f'hecate_swarm_layer_min_live_replicas{{model="{MODEL}"}}')
            for line in lines
        )
    finally:
        await stopped([*load, follow])
