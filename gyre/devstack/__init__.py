"""Embedded NATS and PostgreSQL for a machine without configured ones, scratch databases, and detached
server processes: plumbing for the application's local stack, tests and benchmarks."""
