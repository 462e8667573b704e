"""``hecate chaos``: kill parts of a running swarm under a steady, bounded load and
count what happened to every request.

A scenario is one object, a subclass of :class:`hecate_dev.chaos.scenario.Scenario`:
its ``name``; the swarm and load it runs on (``setup``, ``timings``); ``inject``, the
fault it does to the running harness (the primitives are in :mod:`.faults`);
``findings``, its own checks on the finished record; ``expect``, what its run must show
(judged by ``accept`` with the rule of :mod:`.acceptance`); and ``explain(result)``, what
the figures mean and why the run passed or failed. A new scenario is a class in
:mod:`.scenarios` (or :mod:`.smollm2` for the real model) added to ``SCENARIOS``;
:mod:`.runner` runs any of them, and its figures are a
:class:`hecate_dev.chaos.results.ScenarioResult`."""
