"""Seeded task-set generators for the three task families (repo-gen, repair, terminal)."""
