"""The kinds of executor, declared once: what an executor says it is
(:mod:`hecate.model.executor`, whose protocols implement each), and what a node's
profile and with it the plan carry to every router (:class:`hecate.core.plan.NodeProfile`).

* ``layers``: a layer network. Activations in, activations out; nothing is kept
  between requests.
* ``steps``: generation steps over a KV cache per session. A node keeps the session's
  state until the router releases it, and a request that moves is replayed.
* ``whole``: a whole model behind one call (an upstream provider).

Nothing else says which executor keeps sessions or generates: a router reads the kind
the plan carries for a model, so an executor a third party installs on the nodes only
is dispatched as it declares.
"""

from typing import Literal, get_args

ExecutorKind = Literal["layers", "steps", "whole"]
KINDS: tuple[ExecutorKind, ...] = get_args(ExecutorKind)


def keeps_sessions(kind: ExecutorKind) -> bool:
    """Whether nodes of this kind keep a session's state between stages (the router
    releases it when a generation ends or moves)."""
    return kind == "steps"
