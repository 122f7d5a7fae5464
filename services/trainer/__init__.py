"""Trainer: optimizer on the core cell, data-parallel satellites, weight publishing."""
