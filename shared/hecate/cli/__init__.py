"""The ``hecate`` command line."""
