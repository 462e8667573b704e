"""HECATE: serve large-model inference from a swarm of machines.

The library every process shares (``shared/``): wire shapes and contract, the bus, the
pure cores more than one service uses, the engine, the client SDK and the ``hecate``
command's frame. Each process has its own package in ``services/`` above it.
"""
