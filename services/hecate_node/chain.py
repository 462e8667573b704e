"""A node's part in chained dispatch: where a served stage's reply goes next.

With ``--dispatch chain`` the router sends the first stage with the rest of the route
(``chain``); each node runs its range, then sends the next stage itself, and only the
last answers the router, on ``<reply_base>-<stage index>``. NATS sends a no-responders
status only to a subscription *of the connection that published*, so a forward's reply
subject is this node's relay (``<node inbox>.<router subject>``): what comes back on
it, an error reply or no-responders, goes on to the router's subject for that stage
(the latter as the explicit error ``no_responders``).

A long sequence's chunks are in flight on several stages at once: the router lets the
first stage run ahead (``StepStage.run_ahead``), and it runs every chunk of what it was
sent itself, one a batch, forwarding each as soon as it is run (:func:`ahead`), so the
stages after compute one chunk while it runs the next. Each chunk that others follow is
marked ``more``, and so is the last stage's reply to it: the router hears every chunk,
in order, on the one send (NATS keeps one publisher's order to a subscriber), and a
stage that fails one answers for the send as before.
"""

from __future__ import annotations

import logging

import msgspec
from nats.aio.msg import Msg
from nats.errors import MaxPayloadError

from hecate.bus import tracing
from hecate.bus.logs import event
from hecate.bus.service import NO_RESPONDERS, Service, ServiceError, encode
from hecate.wire import subjects
from hecate.wire.stages import ActivationReply, LayersStage, StageReply, StageRequest, StepStage


def ahead(req: StageRequest, reply: StageReply) -> StepStage | None:
    """The first stage running ahead (``StepStage.run_ahead``): the step for the chunk
    after the one ``reply`` answers, or None once ``req``'s sequence is all run. The
    rest starts at the next position, the prompt as the tokens it was read as."""
    if not (isinstance(req, StepStage) and req.run_ahead and req.chain and req.layer_start == 0):
        return None
    if not isinstance(reply, ActivationReply) or not reply.positions:
        return None
    fed = req.tokens if req.tokens is not None else reply.prompt_tokens
    if fed is None or reply.positions >= len(fed):
        return None
    return msgspec.structs.replace(
        req,
        position=req.position + reply.positions,
        tokens=fed[reply.positions :],
        prompt="",
        messages=None,
        tools="",
        prompt_tokens=reply.prompt_tokens or req.prompt_tokens,
    )


def next_stage(req: StageRequest, reply: StageReply) -> StageRequest:
    """The request for the stage after ``req`` on its chain, fed ``reply``'s activation.
    The first stage's inputs stop here (later stages take the activation); a
    generation step carries its session, position and sampling along, and the first
    stage's tokenization of the prompt (a layer network's stage, its count of the
    prompt) down to the last, whose reply brings it back."""
    nxt, rest = req.chain[0], req.chain[1:]
    if not isinstance(reply, ActivationReply):
        raise ServiceError("internal", f"stage {req.stage_index} of a chain gave no activation")
    if isinstance(req, StepStage):
        return msgspec.structs.replace(
            req,
            layer_start=nxt.layer_start,
            layer_end=nxt.layer_end,
            chain=rest,
            stage_index=req.stage_index + 1,
            activation=reply.activation,
            prompt_tokens=reply.prompt_tokens,
            reused=reply.reused,
            prompt="",
            tokens=None,
            messages=None,
            run_ahead=False,  # the first stage's alone: the others run what they are sent
        )
    if isinstance(req, LayersStage):
        return msgspec.structs.replace(
            req,
            layer_start=nxt.layer_start,
            layer_end=nxt.layer_end,
            chain=rest,
            stage_index=req.stage_index + 1,
            activation=reply.activation,
            prompt_count=reply.prompt_count,
            prompt="",
        )
    raise ServiceError("bad_range", "a whole request is never chained")


class Chain:
    def __init__(self, service: Service, log: logging.Logger) -> None:
        self.service = service
        self.log = log
        self._relay_prefix = ""

    async def start(self) -> None:
        """Listen on the relay subject (once connected)."""
        nc = self.service.nc
        self._relay_prefix = nc.new_inbox()
        await nc.subscribe(f"{self._relay_prefix}.>", cb=self._relay)

    async def pass_on(self, req: StageRequest, reply: StageReply) -> StageReply | None:
        """``reply`` if the caller waits for it; None when it went elsewhere: to the next
        stage of the chain (in the end, the last one answers the router), or, from the
        chain's last stage, to the router's subject for it (its own reply subject is
        the previous node's relay, which only carries failures back)."""
        if req.chain:
            await self._forward(req, reply)
            return None
        if req.reply_base:
            await self.service.nc.publish(
                f"{req.reply_base}-{req.stage_index}", encode(reply, "msgpack")
            )
            return None
        return reply

    async def _forward(self, req: StageRequest, reply: StageReply) -> None:
        """Send the next stage, replying-to our relay for the router's subject for that
        stage: if the next node is gone, NATS tells us and we tell the router."""
        forward = next_stage(req, reply)
        node_id = req.chain[0].node_id
        headers = tracing.inject({}) if self.service.tracing else None
        body = encode(forward, "msgpack")
        nc = self.service.nc
        try:
            await nc.publish(
                subjects.node_run(node_id),
                body,
                reply=f"{self._relay_prefix}.{req.reply_base}-{forward.stage_index}",
                headers=headers,
            )
        except MaxPayloadError:  # the activation outgrew the bus: no node is at fault
            raise ServiceError(
                "payload_too_large",
                f"the activation for {node_id} is {len(body):,} bytes, over the bus's "
                f"max_payload of {nc.max_payload:,}: the prompt is too long for this swarm",
            ) from None
        except Exception as exc:
            raise ServiceError(
                "forward_failed", f"could not forward to {node_id}: {exc!r}"
            ) from None

    async def _relay(self, msg: Msg) -> None:
        """A failure answering one of our forwards: pass it to the router's subject for
        that stage, a no-responders status as the explicit ``no_responders`` error."""
        target = msg.subject[len(self._relay_prefix) + 1 :]
        try:
            if msg.headers and msg.headers.get("Status") == NO_RESPONDERS:
                stage = target.rsplit("-", 1)[-1]
                await self.service.reply_error(
                    target, "no_responders", f"no node took chained stage {stage}", "msgpack"
                )
            else:
                await self.service.nc.publish(target, msg.data, headers=msg.headers)
        except Exception as exc:  # disconnected: the router's stage timeout covers it
            event(self.log, "relay failed", logging.WARNING, error=repr(exc))
