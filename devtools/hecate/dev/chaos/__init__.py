"""``hecate chaos``: kill parts of a running swarm under a steady, bounded load and
count what happened to every request (see :mod:`hecate.dev.chaos.scenarios`)."""
