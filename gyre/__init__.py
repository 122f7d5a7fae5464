"""Gyre shared kernel: plumbing only (contracts, events, bus, database, settings, logging, dev stack, CLI)."""
