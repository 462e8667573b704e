"""Who reads the swarm page's state: where the gateway asks for a key, ``/v1/swarm`` and
its event stream answer 401 without one and serve a key's holder (as a header, or as
the cookie the page sets once a person typed the key into it, in a real browser); and
however many clients come, only so many event streams are open at once."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from nats.aio.client import Client
from playwright.async_api import Dialog, async_playwright, expect
from prometheus_client import CollectorRegistry

from hecate_gateway.app import Gateway, build_app
from hecate_gateway.bridge import Bridge
from hecate_gateway.config import GatewayConfig
from hecate_gateway.keys import KeyFileAuth, add
from hecate_gateway.metrics import Metrics
from hecate_gateway.swarm import SwarmWatch
from tests.system.test_swarm_page import chromium, serving


def test_the_page_asks_for_a_key_wherever_it_listens_beyond_this_machine() -> None:
    for host in ("0.0.0.0", "::", "10.1.2.3", "gateway.example"):
        assert GatewayConfig(host=host).page_needs_key, host
    for host in ("127.0.0.1", "127.8.0.1", "::1", "localhost"):
        assert not GatewayConfig(host=host).page_needs_key, host
    assert GatewayConfig(host="127.0.0.1", page_auth="key").page_needs_key
    assert not GatewayConfig(host="0.0.0.0", page_auth="open").page_needs_key
    with pytest.raises(ValueError, match="page_auth"):
        GatewayConfig(page_auth="maybe")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_page_streams"):
        GatewayConfig(max_page_streams=0)


@pytest.fixture
async def keyed(client: Client, tmp_path: Path) -> AsyncIterator[tuple[str, str]]:
    """A gateway whose page asks for a key, at most two streams at once: (url, key)."""
    keys = tmp_path / "keys.json"
    key = add(keys, "tenant-a")
    gateway = Gateway(
        bridge=Bridge(client, timeout_s=5.0),
        auth=KeyFileAuth(keys),
        watch=SwarmWatch(),
        metrics=Metrics(CollectorRegistry()),
        log=logging.getLogger("hecate.test.gateway"),
        page_needs_key=True,
        max_page_streams=2,
    )
    async with serving(build_app(gateway)) as url:
        yield url, key


async def _first_event(stream: httpx.Response) -> AsyncIterator[bytes]:
    """Read up to the stream's first state; the reader to keep while it stays open
    (a reader dropped half-read is closed when collected, and the stream with it)."""
    reader = stream.aiter_bytes()
    async for chunk in reader:
        if b"event: state" in chunk:
            return reader
    raise AssertionError("the stream ended before its first state")


async def test_the_state_needs_a_key_and_streams_are_bounded(keyed: tuple[str, str]) -> None:
    url, key = keyed
    auth = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=url, timeout=5.0) as http:
        # The page itself holds no state: anyone gets it, to be asked for the key.
        assert (await http.get("")).status_code == 200
        for path in ("v1/swarm", "v1/swarm/events"):
            refused = await http.get(path)
            assert refused.status_code == 401, path
            assert "API key" in refused.json()["error"]["message"]
            wrong = await http.get(path, headers={"Authorization": "Bearer sk-wrong"})
            assert wrong.status_code == 401, path
        assert (await http.get("v1/swarm", headers=auth)).status_code == 200
        async with httpx.AsyncClient(base_url=url, cookies={"hecate_key": key}) as page:
            assert (await page.get("v1/swarm")).status_code == 200
            async with (
                http.stream("GET", "v1/swarm/events", headers=auth) as one,
                page.stream("GET", "v1/swarm/events") as two,
            ):
                assert one.status_code == two.status_code == 200
                readers = [await _first_event(one), await _first_event(two)]
                third = await http.get("v1/swarm/events", headers=auth)
                assert third.status_code == 429
                assert third.headers["retry-after"] == "5"
                assert "2 swarm event streams are open" in third.json()["error"]["message"]
                assert len(readers) == 2
        # The streams that closed give their places back (once the gateway notices).
        for _ in range(100):
            async with http.stream("GET", "v1/swarm/events", headers=auth) as again:
                if again.status_code == 200:
                    await _first_event(again)
                    break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("closed streams never gave their places back")


async def test_a_person_types_the_key_into_the_page_once(keyed: tuple[str, str]) -> None:
    url, key = keyed
    browser_path = chromium()
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=str(browser_path))
        try:
            asked: list[str] = []

            async def answer(dialog: Dialog, typed: str | None) -> None:
                asked.append(dialog.message)
                await (dialog.accept(typed) if typed else dialog.dismiss())

            refused = await browser.new_page()
            refused.on("dialog", lambda d: asyncio.ensure_future(answer(d, None)))
            await refused.goto(url)
            await expect(refused.locator("#conn")).to_have_text("an API key is needed")

            tab = await browser.new_page()
            tab.on("dialog", lambda d: asyncio.ensure_future(answer(d, key)))
            await tab.goto(url)
            await expect(tab.locator("#conn")).to_have_text("live", timeout=10_000)
            assert len(asked) == 2
            assert "API key" in asked[0]
            # Reloaded, the page keeps its key: nobody is asked again.
            await tab.reload()
            await expect(tab.locator("#conn")).to_have_text("live", timeout=10_000)
            assert len(asked) == 2
        finally:
            await browser.close()
