"""``hecate nats-config``: the ``authorization`` block of nats-server's configuration,
one user per service role, per node and per tenant, with the permissions the wire
contract gives them (see :mod:`hecate.wire.permissions`). ``deploy/nats/auth.conf`` is
its output for the nodes of ``examples/swarm.json``: a single account, where a request's
tenant is only what its body says, which no deployment here uses.

With ``--accounts``, the same users in an ``accounts`` block instead: the services in
one account and each tenant in its own, so the server vouches for a request's tenant
(``deploy/nats/accounts.conf``). With ``--secrets DIR``, everything a deployment needs in
that layout (docker-compose.yml and deploy/k8s run nothing without it): see
:func:`write_deployment`."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hecate.wire import permissions

# Where the files of ``--secrets`` go inside the containers (docker-compose.yml and
# deploy/k8s mount them here): the CA every client verifies the server with, the
# tenants' identities the gateway asks with, and the server's own directory.
CLIENT_CA = "/etc/hecate/tls/ca.pem"
SERVER_DIR = "/etc/nats"
NAMESPACE = "hecate"

# The nats-server configuration of docker-compose (``nats/server.conf`` of ``--secrets``,
# and deploy/nats/server.conf, which a test keeps equal to it). Kubernetes has its own
# (deploy/k8s/nats.yaml: a cluster of three) with the same TLS and accounts.
SERVER_CONF = """\
# nats-server for a HECATE deployment: JetStream, the payload limit the routers enforce,
# TLS on every client connection, and one account for the services and one per tenant.
#
# `hecate nats-config --secrets DIR --topology FILE [--tenant NAME ...]` writes this file,
# accounts.conf, the certificate and key into DIR/nats, and into DIR/nats-server.env:
#   HECATE_TLS_CERT, HECATE_TLS_KEY   the server's certificate and key (PEM paths)
#   HECATE_<USER>_PASSWORD            one per user of accounts.conf
#   nats-server -c DIR/nats/server.conf     (with those variables in its environment)
# The server refuses to start while any of them is missing.
# Each HECATE process then takes HECATE_NATS_USER, HECATE_NATS_PASSWORD and
# HECATE_NATS_CA (the CA that signed the certificate) from its own environment
# (DIR/users/<user>.env; a tenant's is DIR/tenants/<tenant>.env).

port: 4222
http_port: 8222
max_payload: 1MB

jetstream {
  store_dir: "/data"
}

tls {
  cert_file: $HECATE_TLS_CERT
  key_file: $HECATE_TLS_KEY
  timeout: 2
}

# Users, permissions and accounts, derived from the wire contract (routers run
# --tenant-from bus): `hecate nats-config --accounts` prints it.
include ./accounts.conf
"""


def deployment_hosts(namespace: str = NAMESPACE, extra: Sequence[str] = ()) -> tuple[str, ...]:
    """The names a deployment's clients and servers reach NATS by: ``nats`` (the compose
    service, the Kubernetes Service in its own namespace) and its fully qualified forms,
    each clustered server on its routes (``nats-0.nats-headless``, ...), and this
    machine; then ``extra``."""
    names = [
        "nats",
        f"nats.{namespace}",
        f"nats.{namespace}.svc",
        f"nats.{namespace}.svc.cluster.local",
        "*.nats-headless",
        f"*.nats-headless.{namespace}.svc",
        f"*.nats-headless.{namespace}.svc.cluster.local",
        "localhost",
        "127.0.0.1",
        *extra,
    ]
    return tuple(dict.fromkeys(names))


def secret_name(user: str) -> str:
    """The Kubernetes Secret holding ``user``'s HECATE_NATS_USER and _PASSWORD."""
    return f"hecate-nats-{user}"


def _env_text(values: dict[str, str]) -> str:
    # KEY=VALUE: what docker compose's env_file and the gateway's identities read.
    return "".join(f"{k}={v}\n" for k, v in values.items())


def _secret(name: str, namespace: str, data: dict[str, str], what: str) -> str:
    # JSON strings are YAML strings: any value (a PEM, a config) is quoted safely.
    lines = [
        f"# {what}",
        "apiVersion: v1",
        "kind: Secret",
        "metadata:",
        f"  name: {name}",
        f"  namespace: {namespace}",
        "  labels:",
        "    app.kubernetes.io/part-of: hecate",
        "type: Opaque",
        "stringData:",
        *(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in data.items()),
    ]
    return "\n".join(lines) + "\n"


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def write_deployment(
    directory: Path,
    tenant_names: Sequence[str],
    node_ids: Sequence[str],
    *,
    hosts: Sequence[str],
    namespace: str = NAMESPACE,
    days: int = 365,
) -> Path:
    """Fresh secrets for a deployment's bus, under ``directory`` (mode 0700; refused if it
    exists and is not empty, so no stale user survives):

    - ``nats/``: server.conf (:data:`SERVER_CONF`), accounts.conf, server.pem,
      server-key.pem, ca.pem: what the server mounts at /etc/nats;
    - ``nats-server.env``: every ``HECATE_<USER>_PASSWORD`` and the certificate paths;
    - ``ca/ca.pem``: what every client mounts at /etc/hecate/tls;
    - ``users/<user>.env``: a service role's, the operator's, each node's (node-<id>);
    - ``tenants/<tenant>.env``: the gateway's ``--tenant-identities`` directory;
    - ``k8s/secrets.yaml``: the same as Kubernetes Secrets in ``namespace``.

    Returns ``directory``. The CA's key is not kept: to renew, generate again."""
    from hecate.bus.secure import SecureBus, make_certificates, prepare

    permissions.users(tenant_names, node_ids)  # a bad name or a repeated node: ValueError
    if directory.exists() and any(directory.iterdir()):
        raise FileExistsError(f"{directory} exists and is not empty: remove it or pick another")
    server = directory / "nats"
    bus = prepare(server, tenant_names, nodes=node_ids, tls=False)
    directory.chmod(0o700)
    ca, cert, key = make_certificates(server, days, hosts=hosts, client_auth=True)
    bus = SecureBus(server, bus.passwords, ca, cert, key)
    accounts = permissions.render_accounts(bus.tenants, bus.nodes)
    (server / "server.conf").write_text(SERVER_CONF)
    (server / "accounts.conf").write_text(accounts)
    server_env = {
        "HECATE_TLS_CERT": f"{SERVER_DIR}/{cert.name}",
        "HECATE_TLS_KEY": f"{SERVER_DIR}/{key.name}",
        **bus.server_env(),
    }
    _write_private(directory / "nats-server.env", _env_text(server_env))
    ca_pem = ca.read_text()
    (directory / "ca").mkdir()
    (directory / "ca" / "ca.pem").write_text(ca_pem)
    tenant_set = set(bus.tenants)
    # DIR itself is 0700: no one else on the host gets in. tenants/ is mounted into the
    # gateway's container, whose user (uid 10001) is not the host's owner of the files,
    # so it is readable there; users/ is read by docker compose on the host (env_file).
    (directory / "users").mkdir(mode=0o700)
    (directory / "tenants").mkdir(mode=0o755)
    env_of: dict[str, dict[str, str]] = {}
    for user, password in bus.passwords.items():
        env = {"HECATE_NATS_USER": user, "HECATE_NATS_PASSWORD": password}
        env_of[user] = env
        sub = "tenants" if user in tenant_set else "users"
        path = directory / sub / f"{user}.env"
        _write_private(path, _env_text({**env, "HECATE_NATS_CA": CLIENT_CA}))
        if sub == "tenants":
            path.chmod(0o644)
    docs = [
        "\n".join(
            [
                "# Generated by `hecate nats-config --secrets`: real credentials, never commit.",
                "# kubectl apply -f THIS_FILE && kubectl apply -k deploy/k8s",
                "apiVersion: v1",
                "kind: Namespace",
                "metadata:",
                f"  name: {namespace}",
                "  labels:",
                "    app.kubernetes.io/part-of: hecate",
            ]
        )
        + "\n",
        _secret(
            "nats-server",
            namespace,
            {
                "accounts.conf": accounts,
                "server.pem": cert.read_text(),
                "server-key.pem": key.read_text(),
                "ca.pem": ca_pem,
            },
            "nats-server's accounts, certificate and key (routes verify each other by ca.pem)",
        ),
        _secret(
            "nats-server-passwords",
            namespace,
            bus.server_env(),
            "every user's password, in nats-server's environment",
        ),
        _secret(
            "hecate-nats-ca", namespace, {"ca.pem": ca_pem}, "what clients verify the server with"
        ),
        *(
            _secret(secret_name(user), namespace, env_of[user], f"the NATS identity of {user}")
            for user in bus.passwords
            if user not in tenant_set
        ),
        _secret(
            "hecate-gateway-tenants",
            namespace,
            {
                f"{t}.env": _env_text({**env_of[t], "HECATE_NATS_CA": CLIENT_CA})
                for t in bus.tenants
            },
            "the gateway's --tenant-identities: each tenant's NATS identity",
        ),
    ]
    (directory / "k8s").mkdir(mode=0o700)
    _write_private(directory / "k8s" / "secrets.yaml", "---\n".join(docs))
    return directory


def _run(args: argparse.Namespace) -> int:
    if args.secrets is not None:
        try:
            written = write_deployment(
                Path(args.secrets),
                tenants(args),
                nodes(args),
                hosts=deployment_hosts(args.namespace, args.host),
                namespace=args.namespace,
                days=args.days,
            )
        except (ValueError, FileExistsError) as exc:
            sys.stderr.write(f"hecate nats-config: {exc}\n")
            return 2
        sys.stdout.write(f"{written}\n")
        return 0
    try:
        chosen = nodes(args)
        render = permissions.render_accounts if args.accounts else permissions.render_authorization
        text = render(tenants(args), chosen)
    except ValueError as exc:  # a node listed twice (a bad topology: main says why)
        sys.stderr.write(f"hecate nats-config: {exc}\n")
        return 2
    sys.stdout.write(text)
    return 0


def _tenant(text: str) -> str:
    try:
        permissions.users((text,), ())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _node(text: str) -> str:
    try:
        permissions.node_permissions(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def add_tenant_option(p: argparse.ArgumentParser, purpose: str) -> None:
    """``--tenant NAME`` (repeatable), checked as it is parsed; read it with :func:`tenants`."""
    p.add_argument(
        "--tenant",
        action="append",
        default=[],
        type=_tenant,
        metavar="NAME",
        help=f"{purpose} (repeatable; default {', '.join(permissions.DEFAULT_TENANTS)})",
    )


def tenants(args: argparse.Namespace) -> tuple[str, ...]:
    return tuple(args.tenant) or permissions.DEFAULT_TENANTS


def nodes(args: argparse.Namespace) -> tuple[str, ...]:
    """The node ids given (``--node``), then those of ``--topology``'s nodes; the
    nodes of examples/swarm.json when neither is."""
    found = list(args.node)
    if args.topology is not None:
        from hecate.sim.topology import parse_topology

        found += [n.id for n in parse_topology(Path(args.topology).read_bytes()).nodes]
    return tuple(found) if found else permissions.DEFAULT_NODES


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "nats-config",
        help="print nats-server's authorization block: a user per role, node and tenant",
    )
    add_tenant_option(p, "a tenant user")
    p.add_argument(
        "--node",
        action="append",
        default=[],
        type=_node,
        metavar="ID",
        help="a node user, node-ID, that may speak only as node ID (repeatable)",
    )
    p.add_argument(
        "--topology",
        metavar="FILE",
        default=None,
        help="a node user for each node of this topology file "
        f"(default, without --node: {', '.join(permissions.DEFAULT_NODES)})",
    )
    p.add_argument(
        "--accounts",
        action="store_true",
        help="print an accounts block instead: the services in one account and one account "
        "per tenant importing what tenants send on, so the server names each request's "
        "tenant (routers run --tenant-from bus)",
    )
    p.add_argument(
        "--secrets",
        metavar="DIR",
        default=None,
        help="write a deployment's secrets into DIR instead of printing: the accounts, a CA "
        "and server certificate, every password, DIR/users/<user>.env, "
        "DIR/tenants/<tenant>.env and the Kubernetes Secrets (DIR/k8s/secrets.yaml)",
    )
    p.add_argument(
        "--host",
        action="append",
        default=[],
        metavar="NAME",
        help="with --secrets: one more name (or IP address) for the server's certificate "
        "(repeatable; nats, its Kubernetes names, localhost and 127.0.0.1 are always in)",
    )
    p.add_argument(
        "--namespace",
        default=NAMESPACE,
        help=f"with --secrets: the Kubernetes namespace (default {NAMESPACE})",
    )
    p.add_argument(
        "--days",
        type=int,
        default=365,
        help="with --secrets: how long the certificates are valid (default 365)",
    )
    p.set_defaults(run=_run)
