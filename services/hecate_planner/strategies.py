"""Planner strategies by name: the core's built-ins plus any a third party installs.

A package adds a strategy by declaring an entry point in the ``hecate.planners`` group
whose object is a :class:`hecate.core.Planner` subclass::

    [project.entry-points."hecate.planners"]
    mine = "my_package.planning:MyPlanner"
"""

from __future__ import annotations

from importlib.metadata import entry_points

from hecate.core import PLANNERS, Planner, UnknownPlanner

GROUP = "hecate.planners"


def available() -> dict[str, str]:
    """Every strategy name and where it comes from."""
    names = {name: f"hecate.core ({cls.__name__})" for name, cls in PLANNERS.items()}
    for ep in entry_points(group=GROUP):
        names.setdefault(ep.name, ep.value)
    return names


def load(name: str) -> Planner:
    if name in PLANNERS:
        return PLANNERS[name]()
    for ep in entry_points(group=GROUP):
        if ep.name == name:
            cls = ep.load()
            if not (isinstance(cls, type) and issubclass(cls, Planner)):
                raise UnknownPlanner(f"entry point {name!r} ({ep.value}) is not a Planner")
            return cls()
    raise UnknownPlanner(
        f"no planner named {name!r}; known planners: {', '.join(sorted(available()))}"
    )
