"""Gyre services: one process each, talking gRPC and JetStream."""
