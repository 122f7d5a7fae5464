"""Runner: harness processes in sandboxed workspaces."""
