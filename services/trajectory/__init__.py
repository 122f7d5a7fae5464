"""Trajectory processor: the event log of model calls, execution trees, groups and replay."""
