"""A locked-down bus for one machine: per-role, per-node and per-tenant NATS users with
the permissions derived from the wire contract, random passwords, and TLS with a
throwaway CA.

``hecate up --secure``, the permission tests and anyone wanting to try the deployment
configuration locally use :func:`prepare`. The deployments (docker-compose.yml,
deploy/k8s) get their own CA and secrets from ``hecate nats-config --secrets`` and run
the accounts layout: the services in one account and one account per tenant
(``deploy/nats/accounts.conf``, :func:`hecate.wire.permissions.render_accounts`), so the
server names each request's tenant, as ``hecate up --secure`` does. The single-account
layout (``deploy/nats/auth.conf``, :func:`hecate.wire.permissions.render_authorization`)
is no deployment's: there a request's tenant is only what its body says.
"""

from __future__ import annotations

import datetime
import ipaddress
import itertools
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from hecate.bus.credentials import Credentials
from hecate.wire import permissions

if TYPE_CHECKING:
    from cryptography import x509

# The names a server on this machine is reached by (its certificate's, by default).
LOCAL_HOSTS: tuple[str, ...] = ("localhost", "127.0.0.1")

# How :mod:`hecate.wire.permissions` lays the users out: one account, or one per tenant.
Layout = Literal["authorization", "accounts"]


@dataclass(frozen=True, slots=True)
class SecureBus:
    directory: Path
    passwords: dict[str, str] = field(repr=False)
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None

    @property
    def tls(self) -> bool:
        return self.ca_file is not None

    def server_config(self, layout: Layout = "authorization") -> str:
        """What goes into nats-server's configuration besides ports and limits.
        ``layout``: everyone in one account (``authorization``), or the services in one
        and each tenant in its own (``accounts``, for routers run ``--tenant-from bus``)."""
        render = (
            permissions.render_accounts
            if layout == "accounts"
            else permissions.render_authorization
        )
        parts = [render(self.tenants, self.nodes)]
        if self.tls:
            parts.append(
                "tls {\n"
                f'  cert_file: "{self.cert_file}"\n'
                f'  key_file: "{self.key_file}"\n'
                "  timeout: 2\n"
                "}\n"
            )
        return "\n".join(parts)

    @property
    def tenants(self) -> tuple[str, ...]:
        roles = {*permissions.SERVICE_USERS, permissions.GATEWAY, permissions.OPERATOR}
        return tuple(
            u for u in self.passwords if u not in roles and not permissions.is_node_user(u)
        )

    @property
    def nodes(self) -> tuple[str, ...]:
        """The ids of the nodes that have a user."""
        prefix = len(permissions.node_user(""))
        return tuple(u[prefix:] for u in self.passwords if permissions.is_node_user(u))

    def server_env(self) -> dict[str, str]:
        """The variables the configuration reads passwords from."""
        return {permissions.password_variable(u): pw for u, pw in self.passwords.items()}

    def credentials(self, user: str) -> Credentials:
        """The credentials of ``user`` (a node's user is ``node-<id>``:
        :meth:`service_credentials` finds it from the command)."""
        return Credentials(
            user=user,
            password=self.passwords[user],
            ca_file=str(self.ca_file) if self.ca_file else "",
        )

    def service_credentials(self, argv: Sequence[str]) -> Credentials:
        """Whom the service ``hecate <argv>`` logs in as: its role's user, or, for a
        node, the user of the node ``--id`` names."""
        if argv[0] == permissions.NODE:
            node_id = next((b for a, b in itertools.pairwise(argv) if a == "--id"), "")
            if node_id not in self.nodes:
                raise KeyError(f"no NATS user for node {node_id!r}: add it to the topology")
            return self.credentials(permissions.node_user(node_id))
        return self.credentials(argv[0])

    @property
    def tenant_identities(self) -> Path:
        """The directory of the tenants' ``<tenant>.env`` files and nothing else: what
        the gateway is given (``--tenant-identities``), which asks as each tenant and
        must hold no service's or node's password."""
        return self.directory / "tenants"

    def write_env_files(self) -> dict[str, Path]:
        """``<user>.env`` per user (mode 0600): ``. tenant-a.env`` gives a shell the
        tenant's credentials for ``hecate infer``; each tenant's again under
        :attr:`tenant_identities`."""
        out = {}
        self.tenant_identities.mkdir(mode=0o700, exist_ok=True)
        for user in self.passwords:
            lines = [f"export {k}={v}" for k, v in self.credentials(user).to_env().items()]
            body = "\n".join(lines) + "\n"
            path = self.directory / f"{user}.env"
            _write_private(path, body)
            out[user] = path
            if user in self.tenants:
                _write_private(self.tenant_identities / f"{user}.env", body)
        return out


def prepare(
    directory: Path,
    tenants: Sequence[str] = permissions.DEFAULT_TENANTS,
    *,
    nodes: Sequence[str] = permissions.DEFAULT_NODES,
    tls: bool = True,
    hosts: Sequence[str] = LOCAL_HOSTS,
    days: int = 30,
) -> SecureBus:
    """Fresh passwords for every user, one per node of ``nodes`` among them (and a CA and
    server certificate for ``hosts`` with ``tls``), kept under ``directory`` (mode 0700)."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    users = [*permissions.users(tenants, nodes)]
    passwords = {user: new_password() for user in users}
    if not tls:
        return SecureBus(directory, passwords)
    ca, cert, key = make_certificates(directory, days, hosts=hosts)
    return SecureBus(directory, passwords, ca, cert, key)


def new_password() -> str:
    """192 random bits as a token nats-server reads back from its environment as a plain
    string (it parses variables as configuration values: a leading digit or ``-`` would
    make a number of it, so the token starts with a letter and holds only hex)."""
    return "p" + secrets.token_hex(24)


def make_certificates(
    directory: Path,
    days: int = 30,
    *,
    hosts: Sequence[str] = LOCAL_HOSTS,
    client_auth: bool = False,
) -> tuple[Path, Path, Path]:
    """A self-signed CA and a server certificate it signs for ``hosts`` (DNS names, or IP
    addresses; a deployment adds the names clients reach the server by, e.g. ``nats``):
    ``(ca.pem, server.pem, server-key.pem)``. ``client_auth``: the certificate may also
    authenticate its holder as a client, as clustered servers do to each other on their
    routes."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    until = now + datetime.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "HECATE local CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "nats-server")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(until)
        .add_extension(
            x509.SubjectAlternativeName([_alt_name(h) for h in hosts]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [
                    x509.oid.ExtendedKeyUsageOID.SERVER_AUTH,
                    *([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH] if client_auth else []),
                ]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    ca_file, cert_file, key_file = (
        directory / "ca.pem",
        directory / "server.pem",
        directory / "server-key.pem",
    )
    ca_file.write_bytes(ca_cert.public_bytes(pem))
    cert_file.write_bytes(cert.public_bytes(pem))
    _write_private(
        key_file,
        key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode(),
    )
    return ca_file, cert_file, key_file


def _alt_name(host: str) -> x509.GeneralName:
    from cryptography import x509

    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
