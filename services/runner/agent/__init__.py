"""The built-in Gyre agent: a small multi-turn coding agent over OpenAI Chat Completions.

Tools: read/write files, a shell, the project's tests, and delegation to a sub-agent. When its
context passes a budget it compacts (a summary call, then a fresh context), so even a tiny model
yields branching execution trees. Every request tells the proxy its role and agent id
(`X-Gyre-Agent-Role`, `X-Gyre-Agent-Id`). Standard library only: it runs inside the sandbox.
"""
