"""API keys: ``Authorization: Bearer <key>`` names a tenant.

The keys file holds only each key's SHA-256, its tenant, when it was made and the first
characters of the key (to tell keys apart in the file); a stolen file lets nobody in.
``hecate keys add TENANT`` makes a key, stores its hash and prints the key, once.

A key is 256 random bits, so a plain hash is enough (no salt or slow hash: there is no
password to guess). The gateway reads the file again when it changes, at most once a
second, so a key added while it runs works without a restart.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import time
from pathlib import Path
from typing import Annotated, Protocol

import msgspec

from hecate.core.errors import HecateError

PREFIX = "sk-hecate-"
TENANT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
RELOAD_S = 1.0


class KeysError(HecateError):
    """A keys file that cannot be used, or a tenant name that cannot be a tenant."""

    code = "bad_keys"


class KeyRecord(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    sha256: Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]
    tenant: Annotated[str, msgspec.Meta(pattern=TENANT_PATTERN)]
    created: float
    prefix: str = ""


class KeysFile(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    keys: list[KeyRecord] = []


def digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def default_path() -> Path:
    return Path(os.environ.get("HECATE_STATE", ".hecate")) / "gateway-keys.json"


def read(path: Path) -> KeysFile:
    """The file's keys; an absent file has none. Raises :class:`KeysError`."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return KeysFile()
    try:
        return msgspec.json.decode(data, type=KeysFile)
    except msgspec.DecodeError as exc:
        raise KeysError(f"{path}: not a keys file: {exc}") from None


def add(path: Path, tenant: str, now: float | None = None) -> str:
    """Make a key for ``tenant``, store its hash in ``path`` and return the key (the only
    time anyone sees it). The file is replaced whole (write, then rename) and readable
    by its owner only."""
    if not re.fullmatch(TENANT_PATTERN, tenant):
        raise KeysError(f"tenant {tenant!r} must match {TENANT_PATTERN}")
    key = PREFIX + secrets.token_urlsafe(32)
    current = read(path)
    record = KeyRecord(
        sha256=digest(key),
        tenant=tenant,
        created=round(time.time() if now is None else now, 3),
        prefix=key[: len(PREFIX) + 4],
    )
    updated = KeysFile(keys=[*current.keys, record])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(msgspec.json.format(msgspec.json.encode(updated), indent=2) + b"\n")
    tmp.replace(path)
    return key


class KeyRing:
    """Who a key belongs to."""

    def __init__(self, keys: KeysFile) -> None:
        self._tenants = [(k.sha256.encode(), k.tenant) for k in keys.keys]

    def __len__(self) -> int:
        return len(self._tenants)

    def tenant_for(self, key: str) -> str | None:
        # Every stored hash is compared, in constant time, whichever matches: how long
        # this takes tells nothing about the keys (there are tens of them, not millions).
        h = digest(key).encode()
        found = None
        for stored, tenant in self._tenants:
            if hmac.compare_digest(stored, h):
                found = tenant
        return found


def bearer(authorization: str | None) -> str | None:
    """The key in an ``Authorization`` header value, if it is a bearer token."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


class Auth(Protocol):
    def tenant(self, authorization: str | None) -> str | None:
        """The caller's tenant, or None: refuse it (401)."""
        ...


class OpenAccess:
    """``--open``: no keys; every caller is tenant ``default``."""

    def tenant(self, _authorization: str | None) -> str | None:
        return "default"


class KeyFileAuth:
    """Keys from a file, read again when it changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._ring = KeyRing(read(path))
        self._stamp = self._stat()
        self._checked = time.monotonic()

    def _stat(self) -> tuple[int, int] | None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return st.st_mtime_ns, st.st_size

    def _refresh(self) -> None:
        now = time.monotonic()
        if now - self._checked < RELOAD_S:
            return
        self._checked = now
        stamp = self._stat()
        if stamp != self._stamp:
            try:
                self._ring = KeyRing(read(self.path))
            except KeysError:
                return  # a half-written edit: keep the keys we had, look again later
            self._stamp = stamp

    @property
    def keys(self) -> int:
        return len(self._ring)

    def tenant(self, authorization: str | None) -> str | None:
        key = bearer(authorization)
        if key is None:
            return None
        self._refresh()
        return self._ring.tenant_for(key)
