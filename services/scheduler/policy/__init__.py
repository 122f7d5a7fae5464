"""Scheduling policies as pure code: the simulator and the live scheduler run the same functions."""
