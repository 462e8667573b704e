"""``hecate gateway``: the OpenAI-compatible HTTP front door; ``hecate keys add``: an API
key for a tenant, printed once."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from hecate.cli.process import default_url, run_service


def _cmd_gateway(args: argparse.Namespace) -> int:
    from hecate_gateway.config import GatewayConfig
    from hecate_gateway.keys import Auth, KeyFileAuth, OpenAccess
    from hecate_gateway.service import GatewayService

    try:
        config = GatewayConfig(
            host=args.host,
            port=args.port,
            timeout_s=args.timeout_s,
            tenant_identities=args.tenant_identities,
            page_auth=args.page_auth,
            max_page_streams=args.max_page_streams,
            url_file=args.url_file,
            max_connections=args.max_connections,
            header_timeout_s=args.header_timeout_s,
        )
    except ValueError as exc:
        print(f"hecate gateway: {exc}", file=sys.stderr)
        return 2
    auth: Auth = OpenAccess() if args.open else KeyFileAuth(Path(args.keys))
    instance = args.id or f"gateway-{os.getpid()}"

    def build(log: Any, tp: Any) -> GatewayService:
        if args.open:
            log.warning("--open: no API keys are checked; every caller is tenant 'default'")
        elif isinstance(auth, KeyFileAuth) and not auth.keys:
            log.warning(f"no keys in {args.keys}: every request will be refused (hecate keys add)")
        return GatewayService(config=config, auth=auth, log=log, tracer_provider=tp)

    return run_service("gateway", instance, args.nats, build)


def _cmd_keys_add(args: argparse.Namespace) -> int:
    from hecate_gateway.keys import add

    path = Path(args.file)
    key = add(path, args.tenant)
    print(key)
    print(f"(for tenant {args.tenant!r}; only its hash is kept in {path})", file=sys.stderr)
    return 0


def add_parsers(sub: Any) -> None:
    from hecate_gateway.keys import default_path

    gw: argparse.ArgumentParser = sub.add_parser(
        "gateway", help="serve the OpenAI-compatible HTTP API (and the swarm page)"
    )
    gw.add_argument("--nats", default=default_url(), help="NATS server URL")
    gw.add_argument("--id", default=None, help="instance id in logs")
    gw.add_argument("--host", default="127.0.0.1", help="address to listen on")
    gw.add_argument("--port", type=int, default=8000, help="port (0: any free one, logged)")
    gw.add_argument(
        "--keys",
        default=str(default_path()),
        help="API keys file (default $HECATE_STATE/gateway-keys.json)",
    )
    gw.add_argument(
        "--open", action="store_true", help="no API keys: every caller is tenant 'default'"
    )
    gw.add_argument(
        "--timeout-s",
        type=float,
        default=300.0,
        help="how long a request may wait for the swarm's answer (default 300)",
    )
    gw.add_argument(
        "--tenant-identities",
        default="",
        metavar="DIR",
        help="a directory of <tenant>.env credentials (as hecate up --secure writes): each "
        "key's tenant asks with its own NATS identity, for routers that take the tenant "
        "from the bus (--tenant-from bus); default: the gateway's own connection",
    )
    gw.add_argument(
        "--page-auth",
        choices=("auto", "key", "open"),
        default="auto",
        help="who may read the swarm page's data (/v1/swarm and its events): key (an API "
        "key), open (anyone), auto (default: a key unless --host is a loopback address)",
    )
    gw.add_argument(
        "--max-page-streams",
        type=int,
        default=64,
        help="swarm page event streams open at once; one more is refused 429 (default 64)",
    )
    gw.add_argument(
        "--url-file",
        default="",
        metavar="PATH",
        help="write the URL it listens on to PATH once listening (port 0's choice "
        "included), and remove it on stopping",
    )
    gw.add_argument(
        "--max-connections",
        type=int,
        default=1000,
        help="connections (or requests in progress) at once; a request beyond is "
        "answered 503 (default 1000)",
    )
    gw.add_argument(
        "--header-timeout-s",
        type=float,
        default=10.0,
        help="how long a request's headers may take to arrive whole; a connection "
        "slower than that is closed (default 10)",
    )
    gw.set_defaults(run=_cmd_gateway)

    keys = sub.add_parser("keys", help="API keys of the gateway")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    add = keys_sub.add_parser("add", help="make a key for TENANT and print it (once)")
    add.add_argument("tenant", metavar="TENANT")
    add.add_argument(
        "--file",
        default=str(default_path()),
        help="keys file (default $HECATE_STATE/gateway-keys.json)",
    )
    add.set_defaults(run=_cmd_keys_add)
