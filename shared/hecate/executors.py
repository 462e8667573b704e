"""The executor registry: a node's ``--executor`` name to the object that computes.

It sits above both executor families so neither imports the other: the layer networks
in :mod:`hecate.model` (``toy``, ``null``) and the real model in :mod:`hecate.llm`
(``smollm2`` and ``gemma3-270m`` on the engine, ``smollm2-numpy`` SmolLM2's float32
reference) each import only
the shared types of :mod:`hecate.model.executor`, and this module imports them all.
Factories import their executor when called, so naming ``toy`` never loads the real
model's code.

A package adds an executor by declaring an entry point in the ``hecate.executors``
group whose object is a factory taking no arguments (a class will do)::

    [project.entry-points."hecate.executors"]
    mine = "my_package.compute:MyExecutor"

Whatever a factory returns is checked against the protocol of the kind it declares
(:func:`kind_of`), so a broken executor stops the node's start.

A model registered with ``hecate model add NAME PATH.gguf`` is an executor too, named
as the model: the engine on that file (``"executor": "NAME"`` in a topology).
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points
from typing import cast

from hecate.model.executor import KINDS, PROTOCOLS, Executor, ExecutorError, ExecutorKind

GROUP = "hecate.executors"


def _toy() -> Executor:
    from hecate.model.toy import ToyModel

    return ToyModel()


def _null() -> Executor:
    from hecate.model.null import NullModel

    return NullModel()


def _smollm2() -> Executor:
    from hecate.llm.executor import LlmExecutor

    return LlmExecutor()  # the engine: ONNX Runtime on the GGUF's own blocks


def _gemma3_270m() -> Executor:
    from hecate.llm.executor import LlmExecutor

    return LlmExecutor(model="gemma3-270m", name="gemma3-270m")


def _smollm2_numpy() -> Executor:
    from hecate.llm.executor import LlmExecutor

    return LlmExecutor(engine="numpy")  # the reference: float32 weights, numpy


#: The built-ins: name -> factory. Factories take no arguments so a node config needs
#: only a name.
EXECUTORS: dict[str, Callable[[], Executor]] = {
    "toy": _toy,
    "null": _null,
    "smollm2": _smollm2,
    "smollm2-numpy": _smollm2_numpy,
    "gemma3-270m": _gemma3_270m,
}


#: The model file each built-in generative executor runs (pulled before its nodes start).
BUILT_IN_MODELS = {
    "smollm2": "smollm2-135m",
    "smollm2-numpy": "smollm2-135m",
    "gemma3-270m": "gemma3-270m",
}


def _registered(name: str) -> bool:
    from hecate.llm.store import registered

    return name not in EXECUTORS and name in registered()


def generative_model(name: str) -> str | None:
    """The model whose file the executor ``name`` runs, for the generative ones (their
    last stage samples tokens, their routers chain stages); None for the others."""
    if name in BUILT_IN_MODELS:
        return BUILT_IN_MODELS[name]
    return name if _registered(name) else None


def available() -> dict[str, str]:
    """Every executor name and where it comes from."""
    from hecate.llm.store import registered

    names = dict.fromkeys(EXECUTORS, "hecate (built in)")
    for ep in entry_points(group=GROUP):
        names.setdefault(ep.name, ep.value)
    for model, entry in registered().items():
        names.setdefault(model, f"hecate model add ({entry.path})")
    return names


def get_executor(name: str) -> Executor:
    """A fresh executor registered under ``name``, checked against its kind's protocol;
    raises ``unknown_executor`` for a name nobody registered or an object that is not
    an executor of the kind it declares."""
    factory: Callable[[], object] | None = EXECUTORS.get(name)
    if factory is None:
        for ep in entry_points(group=GROUP):
            if ep.name == name:
                factory = ep.load()
                break
    if factory is None and _registered(name):
        from hecate.llm.executor import LlmExecutor

        factory = lambda: LlmExecutor(model=name, name=name)  # noqa: E731
    if factory is None:
        known = ", ".join(sorted(available())) or "(none)"
        raise ExecutorError(
            "unknown_executor", f"no executor named {name!r}; known executors: {known}"
        )
    return checked(factory(), name)


def checked(executor: object, name: str) -> Executor:
    """``executor``, once it is known to be an executor of the kind it declares and
    named ``name`` (what the node joins as); raises ``unknown_executor`` otherwise."""
    kind_of(executor)
    actual = cast(Executor, executor)
    if actual.name != name:
        raise ExecutorError(
            "unknown_executor",
            f"executor {name!r} was asked for but the object given is {actual.name!r}",
        )
    return actual


def kind_of(executor: object) -> ExecutorKind:
    """The kind ``executor`` declares, once checked against that kind's protocol; raises
    ``unknown_executor`` naming what is missing otherwise."""
    declared = getattr(executor, "kind", None)
    name = getattr(executor, "name", type(executor).__name__)
    for kind in KINDS:
        if declared != kind:
            continue
        protocol = PROTOCOLS[kind]
        if not isinstance(executor, protocol):
            missing = [m for m in _members(protocol) if not hasattr(executor, m)]
            raise ExecutorError(
                "unknown_executor",
                f"executor {name!r} declares kind {kind!r} but lacks {', '.join(missing)}",
            )
        return kind
    raise ExecutorError(
        "unknown_executor",
        f"executor {name!r} declares kind {declared!r}; an executor's kind is one of "
        f"{', '.join(KINDS)}",
    )


def _members(protocol: type) -> list[str]:
    """What a protocol asks for: its annotated attributes and its methods."""
    names = set(getattr(protocol, "__annotations__", {}))
    names |= {n for n, v in vars(protocol).items() if callable(v) and not n.startswith("_")}
    return sorted(names)
