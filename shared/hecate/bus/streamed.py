"""A request whose one reply is preceded by streamed messages on the same inbox.

What a request on ``hecate.stream.<model>`` gets from a router: each token comes back
on the request's own reply subject with the header ``Hecate-Stream: token``, then the
one reply without it. ``nc.request`` returns the first message only, so the callers that stream (the
client library, the gateway, the benchmarks) ask through :func:`request_streamed`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from hecate.wire.messages import STREAM_HEADER

NO_RESPONDERS = "503"  # the status the server answers a request nobody listens to with


def is_token(msg: Msg) -> bool:
    return (msg.headers or {}).get(STREAM_HEADER) == "token"


async def request_streamed(
    nc: Client,
    subject: str,
    body: bytes,
    *,
    timeout: float,
    on_token: Callable[[Msg], Awaitable[None]],
    headers: dict[str, str] | None = None,
) -> Msg:
    """Publish ``body`` with a fresh inbox as its reply subject; hand each streamed
    message to ``on_token`` as it comes and return the reply. Raises nats-py's own
    ``TimeoutError`` (no reply within ``timeout``) and ``NoRespondersError``, as
    ``nc.request`` does."""
    inbox = nc.new_inbox()
    reply: asyncio.Future[Msg] = asyncio.get_running_loop().create_future()

    async def on_msg(msg: Msg) -> None:
        if is_token(msg):
            await on_token(msg)
        elif not reply.done():
            reply.set_result(msg)

    sub = await nc.subscribe(inbox, cb=on_msg)
    try:
        await nc.publish(subject, body, reply=inbox, headers=headers)
        msg = await asyncio.wait_for(reply, timeout)
    except TimeoutError:
        raise NatsTimeout from None
    finally:
        await sub.unsubscribe()
    if (msg.headers or {}).get("Status") == NO_RESPONDERS:
        raise NoRespondersError
    return msg
