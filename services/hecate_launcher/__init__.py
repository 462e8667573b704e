"""Starting and stopping a swarm's processes: the commands (:mod:`.commands`, the very
``hecate <service> ...`` an operator types, in start order) and the one supervisor that
runs them (:mod:`.supervisor`), whose children do not outlive it (:mod:`hecate.cli.orphans`)."""

from hecate.cli.orphans import spawn
from hecate_launcher.commands import (
    BLAS_THREAD_TIMEOUT,
    GATEWAY_KEYS,
    GATEWAY_URL,
    gateway_address,
    node_argv,
    node_env,
    plan_commands,
)
from hecate_launcher.supervisor import ProcessSpec, Supervisor, hecate_command, terminate

__all__ = [
    "BLAS_THREAD_TIMEOUT",
    "GATEWAY_KEYS",
    "GATEWAY_URL",
    "ProcessSpec",
    "Supervisor",
    "gateway_address",
    "hecate_command",
    "node_argv",
    "node_env",
    "plan_commands",
    "spawn",
    "terminate",
]
