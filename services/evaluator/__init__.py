"""Evaluator: grading of workspaces with partial credit."""
