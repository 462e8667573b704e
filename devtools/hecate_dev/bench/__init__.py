"""Benchmarks: commands that print figures. Targets live here, not in timed tests."""
