"""A scripted OpenAI-compatible model on 127.0.0.1 for runner tests and the sandbox benchmark.

The model provider is an external boundary: this fixture stands in for the proxy + engine and
drives the built-in agent with tool calls from a script. It records every request's agent
headers and bearer token, so tests can check what the harness sent.

Script: {agent kind ("main", "sub", "summary"): [step, ...]}; a step is {"tool": name, "args":
{...}} or {"final": text}. Steps are counted per (token, agent id), so concurrent executions
and sub-agents each walk their own list; past the end the agent gets a final "done".
`scripts` holds more scripts by name: a conversation whose first user message contains
`[script: NAME]` walks that one instead (one model serves executions that behave differently).
"""

from __future__ import annotations

import json
import re
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Step = dict[str, Any]
SCRIPT_TAG = re.compile(r"\[script: ([\w-]+)\]")


@dataclass
class Seen:
    role: str
    agent_id: str
    token: str
    num_messages: int


@dataclass
class ScriptedModel:
    script: dict[str, list[Step]]
    scripts: dict[str, dict[str, list[Step]]] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)
    _counters: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    def start(self) -> str:
        model = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                answer = model.answer(
                    body,
                    role=self.headers.get("X-Gyre-Agent-Role", ""),
                    agent_id=self.headers.get("X-Gyre-Agent-Id", ""),
                    token=self.headers.get("Authorization", "").removeprefix("Bearer "),
                )
                data = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def _script_for(self, body: dict[str, Any]) -> dict[str, list[Step]]:
        for msg in body.get("messages", []):
            if msg.get("role") == "user" and isinstance(msg.get("content"), str):
                found = SCRIPT_TAG.search(msg["content"])
                return self.scripts.get(found.group(1), self.script) if found else self.script
        return self.script

    def answer(self, body: dict[str, Any], *, role: str, agent_id: str, token: str) -> dict[str, Any]:
        with self._lock:
            self.seen.append(
                Seen(role=role, agent_id=agent_id, token=token, num_messages=len(body.get("messages", [])))
            )
            key = (token, f"{role}/{agent_id}")
            n = self._counters[key]
            self._counters[key] += 1
        steps = self._script_for(body).get(role, [])
        step = steps[n] if n < len(steps) else {"final": "done"}
        if "final" in step:
            message: dict[str, Any] = {"role": "assistant", "content": step["final"]}
        else:
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call-{n}",
                        "type": "function",
                        "function": {"name": step["tool"], "arguments": json.dumps(step.get("args", {}))},
                    }
                ],
            }
        return {
            "id": f"cmpl-{n}",
            "object": "chat.completion",
            "model": body.get("model", ""),
            "choices": [
                {"index": 0, "message": message, "finish_reason": "stop" if "final" in step else "tool_calls"}
            ],
        }
