"""Trace-driven cluster simulator for the scheduling policies (`gyre sim`)."""
