"""Fault injection against real node processes (Jepsen-style); see tests/faults/run.py."""
