"""Local development stack: the embedded NATS and PostgreSQL used when no external ones are configured."""
