"""Settings every test shares."""

from __future__ import annotations

from hypothesis import HealthCheck, settings

# Hypothesis times each example (a 200 ms deadline) and how long inputs take to draw
# (the too_slow health check), by the wall clock. On a busy machine (two cores shared
# with a swarm of processes) either one fails a test on one run that passes on the next.
# The properties here are about results, never speed: a test that needs a bound on time
# says so itself.
settings.register_profile("hecate", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("hecate")
