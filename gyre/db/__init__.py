"""Postgres plumbing: engines, per-service migrations, the outbox and the consumer inbox."""
