"""Where the breaker service keeps each target's circuit: KV ``hecate-breakers/<target>``.

Every write is a compare-and-set on the revision read, so breaker replicas (and the
reports and probe requests one replica serves at once) never overwrite each other
blindly. A missing key is a fresh, closed circuit; any other failure to read or write
is :class:`StateUnavailable`, from which nothing may be concluded about the circuit.
"""

from __future__ import annotations

import msgspec
from nats.js.errors import APIError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from hecate.bus.service import encode
from hecate.resilience.breaker import BreakerSnapshot
from hecate.wire import subjects

_snapshot = msgspec.json.Decoder(BreakerSnapshot)
_STREAM_NOT_FOUND = 10059  # JetStream's error code when the bucket's stream is gone


class StateUnavailable(Exception):
    """The breaker bucket could not be read or written: neither a lost race nor a
    missing key, so nothing may be concluded about the circuit."""


def _bucket_missing(exc: KeyNotFoundError) -> bool:
    """nats-py reports a vanished bucket as a missing key; the server's own error, kept
    as the exception's context, tells the two apart."""
    cause = exc.__context__  # a deleted key's KeyDeletedError carries no err_code at all
    return isinstance(cause, APIError) and getattr(cause, "err_code", None) == _STREAM_NOT_FOUND


class BreakerStore:
    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv

    async def read(self, target: str) -> tuple[BreakerSnapshot | None, int]:
        """The stored snapshot and its revision; ``(None, 0)`` for a circuit never
        written or deleted (closed). Raises :class:`StateUnavailable` otherwise."""
        try:
            entry = await self._kv.get(target)
        except KeyNotFoundError as exc:
            if _bucket_missing(exc):
                raise StateUnavailable(f"bucket {subjects.BREAKER_BUCKET} is missing") from exc
            return None, 0  # create() takes over a deleted key's tombstone
        except Exception as exc:
            raise StateUnavailable(f"reading {target}: {exc!r}") from exc
        try:
            return (_snapshot.decode(entry.value) if entry.value else None), int(
                entry.revision or 0
            )
        except msgspec.DecodeError:
            return None, int(entry.revision or 0)

    async def write(self, target: str, snap: BreakerSnapshot, revision: int) -> bool:
        """Compare-and-set ``snap`` on ``revision``: False when someone wrote first.
        Raises :class:`StateUnavailable` when the write failed for any other reason."""
        try:
            if revision:
                await self._kv.update(target, encode(snap), last=revision)
            else:
                await self._kv.create(target, encode(snap))
        except KeyWrongLastSequenceError:  # lost a compare-and-set race
            return False
        except Exception as exc:
            raise StateUnavailable(f"writing {target}: {exc!r}") from exc
        return True
