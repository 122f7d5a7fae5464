"""Scheduler: tasks, executions, cells and the scheduling policy."""
