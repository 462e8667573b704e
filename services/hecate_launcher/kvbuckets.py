"""``hecate kv-buckets``: create the JetStream KV buckets the logged-in user owns, or
wait for buckets to exist.

Each bucket has one owner, the role the wire contract lets write it: the planner the
plan, telemetry the snapshot, the breaker service the circuits; the server lets no one
else create it. Run with an owner's credentials (``HECATE_NATS_USER``,
``HECATE_NATS_PASSWORD``, ``HECATE_NATS_CA``), this creates that owner's buckets with
``--replicas`` and the history the services expect. A cluster runs it before the
services, which would otherwise create a missing bucket themselves with one replica.
Idempotent: an existing bucket is left as it is, and the command says so.

With ``--await``, it creates nothing and waits until the named buckets exist: what a
service's init container runs, as that service's user, which the server lets read
only the buckets the contract gives it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections.abc import Awaitable, Sequence
from typing import Any, ClassVar, TypeVar

import nats
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import NotFoundError, ServerError, ServiceUnavailableError

from hecate.bus import kv
from hecate.bus.credentials import Credentials
from hecate.core import HecateError
from hecate.wire import contract, permissions

_T = TypeVar("_T")
# Transient: the server not up yet, JetStream without a meta leader (503) or failing an
# API call while it starts or is loaded (500, seen on a busy machine), a lost reply.
_TRANSIENT = (
    OSError,
    asyncio.TimeoutError,
    NatsTimeoutError,
    NoRespondersError,
    ServiceUnavailableError,
    ServerError,
    nats.errors.NoServersError,
)


class KvBucketsError(HecateError):
    """The buckets could not be made (or awaited); the message says why."""

    code: ClassVar[str] = "kv_buckets"


class NotOwner(KvBucketsError):
    """Asked to create a bucket the user does not own (checked before any request)."""

    code: ClassVar[str] = "not_bucket_owner"


class Refused(KvBucketsError):
    """The server refused a JetStream request: the user lacks the permission."""

    code: ClassVar[str] = "kv_refused"


def owners() -> dict[str, tuple[str, ...]]:
    """Each user that owns buckets, and the buckets it owns (from the wire contract)."""
    out: dict[str, list[str]] = {}
    for op in contract.OPERATIONS:
        channel = op.channel
        if channel.kv is None or op.action != "send" or channel.id in permissions.NOT_DEPLOYED:
            continue
        for user, roles in permissions.ACTS_AS.items():
            if op.role in roles:
                out.setdefault(user, []).append(channel.kv[0])
    return {user: tuple(dict.fromkeys(buckets)) for user, buckets in out.items()}


def owner_of(bucket: str) -> str | None:
    return next((u for u, owned in owners().items() if bucket in owned), None)


def buckets_to_create(user: str, requested: Sequence[str] = ()) -> tuple[str, ...]:
    """``requested`` (every bucket ``user`` owns when empty), or :class:`NotOwner` if
    ``user`` owns none of them, or not one of those requested."""
    owned = owners().get(user, ())
    who = f"user {user!r}" if user else "an anonymous connection"
    known = ", ".join(f"{b} ({u})" for u, bs in sorted(owners().items()) for b in bs)
    if not requested:
        if not owned:
            raise NotOwner(
                f"{who} owns no KV bucket; run this as a bucket's owner (the owners: {known})"
            )
        return owned
    for bucket in requested:
        if bucket not in owned:
            owner = owner_of(bucket)
            raise NotOwner(
                f"{who} may not create KV bucket {bucket!r}: "
                + (f"its owner is {owner!r}" if owner else f"no such bucket (the buckets: {known})")
            )
    return tuple(dict.fromkeys(requested))


def describe(state: kv.BucketState, replicas: int) -> str:
    """One line on what became of a bucket."""
    shape = f"replicas {state.replicas}, history {state.history}"
    if state.created:
        return f"{state.name}: created ({shape})"
    line = f"{state.name}: exists ({shape}), left as it is"
    if state.replicas != replicas:
        line += f"; asked for {replicas} replicas: deploy/README.md says how to change them"
    return line


class _Session:
    """One connection, and the permission violations the server sent on it."""

    def __init__(self, creds: Credentials) -> None:
        self.creds = creds
        self.refusals: asyncio.Queue[str] = asyncio.Queue()
        self.nc: Client | None = None

    async def on_error(self, exc: Exception) -> None:
        if "permissions violation" in str(exc).lower():
            self.refusals.put_nowait(str(exc).strip())

    async def connect(self, url: str) -> Client:
        self.nc = await nats.connect(
            [u.strip() for u in url.split(",") if u.strip()],
            name="hecate-kv-buckets",
            connect_timeout=2,
            allow_reconnect=False,
            max_reconnect_attempts=0,
            error_cb=self.on_error,
            **self.creds.options(),
        )
        return self.nc

    async def unless_refused(self, aw: Awaitable[_T], what: str) -> _T:
        """``aw``'s result, or :class:`Refused` as soon as the server refuses it (a
        refused request is never answered: nats-py would only time out)."""
        while not self.refusals.empty():  # left over from an earlier request
            self.refusals.get_nowait()
        task = asyncio.ensure_future(aw)
        refusal = asyncio.ensure_future(self.refusals.get())
        await asyncio.wait({task, refusal}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            refusal.cancel()
            return task.result()
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        who = self.creds.user or "anonymous"
        raise Refused(f"the server refused {who} {what}: {refusal.result()}")


async def _retrying(url: str, creds: Credentials, wait_s: float, job: Any) -> _T:
    """``await job(session)`` on a fresh connection, again on transient failures until
    ``wait_s`` has passed; a refusal is final."""
    deadline = time.monotonic() + wait_s
    while True:
        session = _Session(creds)
        try:
            await session.connect(url)
            result: _T = await job(session)
            return result
        except KvBucketsError:
            raise
        except _TRANSIENT as exc:
            if time.monotonic() >= deadline:
                who = f" as {creds.user!r}" if creds.user else " anonymously"
                raise KvBucketsError(
                    f"NATS JetStream at {url}{who} did not answer within {wait_s:g}s: {exc!r}"
                ) from None
        except nats.errors.Error as exc:  # bad credentials, TLS: not worth retrying
            raise KvBucketsError(f"cannot use NATS at {url}: {exc!r}") from None
        finally:
            if session.nc is not None:
                with contextlib.suppress(Exception):
                    await session.nc.close()
        await asyncio.sleep(1.0)


async def create(
    url: str,
    creds: Credentials,
    buckets: Sequence[str],
    *,
    replicas: int,
    wait_s: float = 0.0,
) -> list[kv.BucketState]:
    """Create each of ``buckets`` that is missing, as ``creds``' user."""

    async def job(session: _Session) -> list[kv.BucketState]:
        assert session.nc is not None
        return [
            await session.unless_refused(
                kv.ensure_bucket(session.nc, name, replicas=replicas),
                f"KV bucket {name!r} (owner {owner_of(name)!r})",
            )
            for name in buckets
        ]

    return await _retrying(url, creds, wait_s, job)


async def await_buckets(
    url: str, creds: Credentials, buckets: Sequence[str], *, wait_s: float
) -> None:
    """Return once every one of ``buckets`` exists; :class:`KvBucketsError` after
    ``wait_s``, or :class:`Refused` at once if the user may not look one up."""
    deadline = time.monotonic() + wait_s

    async def job(session: _Session) -> None:
        assert session.nc is not None
        js = session.nc.jetstream()
        for name in buckets:
            while True:
                try:
                    await session.unless_refused(
                        js.stream_info(f"KV_{name}"), f"looking up KV bucket {name!r}"
                    )
                    break
                except NotFoundError:
                    if time.monotonic() >= deadline:
                        raise KvBucketsError(
                            f"KV bucket {name!r} does not exist after {wait_s:g}s "
                            f"(its owner, {owner_of(name)!r}, creates it: hecate kv-buckets)"
                        ) from None
                    await asyncio.sleep(1.0)

    await _retrying(url, creds, wait_s, job)


def _run(args: argparse.Namespace) -> int:
    creds = Credentials.from_env()
    if args.await_:
        if not args.bucket:
            raise KvBucketsError("--await needs the buckets to wait for (--bucket NAME)")
        asyncio.run(await_buckets(args.nats, creds, args.bucket, wait_s=args.wait_s))
        for name in args.bucket:
            sys.stdout.write(f"{name}: exists\n")
        return 0
    buckets = buckets_to_create(creds.user, args.bucket)
    states = asyncio.run(
        create(args.nats, creds, buckets, replicas=args.replicas, wait_s=args.wait_s)
    )
    for state in states:
        sys.stdout.write(describe(state, args.replicas) + "\n")
    return 0


def add_parser(sub: Any) -> None:
    from hecate.cli.main import positive_int
    from hecate.cli.process import default_url

    p: argparse.ArgumentParser = sub.add_parser(
        "kv-buckets",
        help="create the KV buckets this NATS user owns (or --await buckets)",
        description=__doc__.split("\n\n")[1].replace("\n", " ") if __doc__ else None,
    )
    p.add_argument(
        "--nats", default=default_url(), help="NATS server URL (comma-separated: a cluster)"
    )
    p.add_argument(
        "--replicas",
        type=positive_int,
        default=1,
        help="replicas of a bucket created (default 1; one per server of a cluster)",
    )
    p.add_argument(
        "--bucket",
        action="append",
        default=[],
        metavar="NAME",
        help="only this bucket (repeatable; default: every bucket the user owns)",
    )
    p.add_argument(
        "--await",
        dest="await_",
        action="store_true",
        help="create nothing: wait until the --bucket buckets exist",
    )
    p.add_argument(
        "--wait-s",
        type=float,
        default=0.0,
        metavar="S",
        help="retry for up to S seconds while NATS or JetStream is not ready, or (with "
        "--await) a bucket is missing (default 0: try once)",
    )
    p.set_defaults(run=_run)
