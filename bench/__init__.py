"""Benchmarks: `python -m bench.<name> --json` prints its figures as one JSON object on its last line."""
