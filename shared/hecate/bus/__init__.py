"""The I/O layer: NATS connections, service shells, the embedded server, tracing.

Nothing in :mod:`hecate.core` imports this package; services import both.
"""
