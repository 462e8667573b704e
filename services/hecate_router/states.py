"""A request's states in a router, and the one table of what may move it between them.

The table *is* the machine: :class:`~hecate_router.lifecycle.Lifecycle` changes state
only through :func:`move`, which raises :class:`IllegalMove` for any move the table does
not hold (in production too; not an ``assert`` that ``python -O`` strips). Whatever an
event does to a request, the table bounds it.

States and what moves a request between them::

    NEW        --Start-------------------------------> SENT
                 asks what its model cannot do (a
                 shape or log-probabilities of a
                 model that does not sample) --------> DONE
    SENT       --StageReplied (next stage / token)---> SENT
    SENT       --StageReplied (last) ----------------> DONE
    SENT       --StageFailed / NodeDown / Tick past
                 the deadline: rescued --------------> SENT
                 the server just came back,
                 or the router hears nobody ---------> RESENDING
                 a node went silent, no route left --> WAITING
                 no rescue, limits, request's fault -> DONE
    RESENDING  --Tick at resend time-----------------> SENT
    WAITING    --Tick: a route came back ------------> SENT
                 none within the wait, or limits ----> DONE
    any live   --Cancelled / Abort-------------------> DONE
    any live   --RetryJoined-------------------------> (unchanged)
    DONE       --anything----------------------------> DONE (ignored)

An event with no row for the request's state is ignored (:func:`accepts` is false):
that is how a late reply, or anything reaching a finished request, does nothing.
"""

from __future__ import annotations

import enum

from hecate_router.flow import (
    Abort,
    Cancelled,
    Event,
    NodeDown,
    RetryJoined,
    StageFailed,
    StageReplied,
    Start,
    Tick,
)


class State(enum.Enum):
    NEW = "new"
    SENT = "sent"  # one dispatch out, awaiting its outcome
    RESENDING = "resending"  # the bus just came back: the same stage goes again shortly
    WAITING = "waiting"  # no route after a silence: held for one to come back
    DONE = "done"  # answered; nothing acts on it any more


S = State
LIVE = (S.NEW, S.SENT, S.RESENDING, S.WAITING)

#: (state, event type) -> the states that event may leave the request in.
TRANSITIONS: dict[tuple[State, type[Event]], frozenset[State]] = {
    (S.NEW, Start): frozenset({S.SENT, S.DONE}),
    (S.SENT, StageReplied): frozenset({S.SENT, S.RESENDING, S.WAITING, S.DONE}),
    (S.SENT, StageFailed): frozenset({S.SENT, S.RESENDING, S.WAITING, S.DONE}),
    (S.SENT, NodeDown): frozenset({S.SENT, S.WAITING, S.DONE}),
    (S.SENT, Tick): frozenset({S.SENT, S.RESENDING, S.WAITING, S.DONE}),
    (S.RESENDING, Tick): frozenset({S.RESENDING, S.SENT}),
    (S.WAITING, Tick): frozenset({S.WAITING, S.SENT, S.DONE}),
    **{(s, Cancelled): frozenset({S.DONE}) for s in LIVE},
    **{(s, Abort): frozenset({S.DONE}) for s in LIVE},
    **{(s, RetryJoined): frozenset({s}) for s in LIVE},
}


class IllegalMove(RuntimeError):
    """A move the table does not hold: a defect in the machine, never the caller's."""


def accepts(state: State, event: Event) -> bool:
    """Whether ``event`` has a row for a request in ``state`` (else it is ignored)."""
    return (state, type(event)) in TRANSITIONS


def move(state: State, event: Event, to: State) -> State:
    """``to``, if the table lets ``event`` take a request from ``state`` there."""
    allowed = TRANSITIONS.get((state, type(event)))
    if allowed is None or to not in allowed:
        raise IllegalMove(f"{type(event).__name__} cannot move a request from {state} to {to}")
    return to
