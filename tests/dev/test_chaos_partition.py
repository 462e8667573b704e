"""server-partition: a fronted cluster's routes all pass through their proxies, and the
short scenario (the callers' server of three cut from its peers and its clients, links
held, then its clients' reset) loses nothing, answers nothing wrong, moves the callers,
and keeps the plan readable and writable from the other two."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

from hecate_dev.chaos.harness import Swarm


def _routes(monitor_port: int) -> list[str]:
    """The peer names of a server's route connections (one per pooled connection)."""
    url = f"http://127.0.0.1:{monitor_port}/routez"
    with urllib.request.urlopen(url, timeout=5) as answer:
        return [str(r.get("remote_name", "")) for r in json.load(answer)["routes"]]


def test_a_fronted_cluster_routes_only_through_its_route_proxies(tmp_path: Path) -> None:
    swarm = Swarm(tmp_path, tmp_path / "topology.json", cluster=3, proxied={"nats-*"})
    try:
        swarm.start_servers()
        assert sorted(swarm.route_proxies) == [(i, j) for i in range(3) for j in range(3) if i != j]
        assert swarm.url == ",".join(swarm.proxy(f"nats-{i}").url for i in range(3))
        # Every route connection is seen by both its servers and passes one proxy: a
        # route dialled directly (to an address a peer told) would be seen and not passed.
        deadline = time.monotonic() + 20
        while True:
            seen = [_routes(s.monitor_port) for s in swarm.servers]
            passed = sum(p.connections for p in swarm.route_proxies.values())
            peers = [{n for n in names if n} for names in seen]
            full = all(len(p) == 2 for p in peers)
            if full and sum(map(len, seen)) == 2 * passed:
                break
            assert time.monotonic() < deadline, (seen, passed)
            time.sleep(0.05)
    finally:
        swarm.stop_all()
