"""The policy plays the built-in agent in-process, and its work is graded by the real evaluator (shell).

`LocalPolicy` answers the agent's completions the way the stack would: the chat template renders
the prompt (as `tokens.template_messages` and the proxy do), the model generates greedily up to
the end-of-turn token, and the proxy's own parser splits the output into text and tool calls.
It counts every call and the valid tool calls among them: a well-formed call of a tool the agent
offered, with that tool's required arguments. `solve` runs one instance end to end and grades
the workspace in the evaluator's sandbox. Used by the warm-start benchmark and its tests.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gyre.sandbox.host import SandboxHost
from gyre_app.warmstart.tokens import END_OF_TURN, template_messages
from services.engine.model_init import PAD_TOKEN as PAD
from services.evaluator.config import EvaluatorSettings
from services.evaluator.grading import Grader
from services.evaluator.taskset import load_task
from services.proxy.toolcalls import HERMES, parse_output
from services.runner.agent.context import Budget
from services.runner.agent.loop import AgentRun
from services.runner.agent.tools import Workspace


@dataclass(slots=True, kw_only=True)
class LocalPolicy:
    model: Any
    tokenizer: Any
    max_tokens: int = 160
    temperature: float = 0.0
    """0: greedy; above: sampled at that temperature (seed torch's generator for repeatable runs)."""
    num_calls: int = 0
    num_valid_tool_calls: int = 0
    transcript: list[str] = field(default_factory=list)

    def complete(
        self,
        messages: list[dict[str, Any]],
        *,
        role: str,
        agent_id: str,
        tools: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"tools": tools} if tools else {}
        prompt = self.tokenizer.apply_chat_template(
            template_messages(messages), add_generation_prompt=True, tokenize=False, **kwargs
        )
        ids = torch.tensor([self.tokenizer.encode(prompt, add_special_tokens=False)])
        with torch.no_grad():
            out = self.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=self.max_tokens,
                do_sample=self.temperature > 0,
                **({"temperature": self.temperature, "top_k": 0} if self.temperature > 0 else {}),
                eos_token_id=self.tokenizer.eos_token_id,
                pad_token_id=self.tokenizer.pad_token_id,
            )
        # Special tokens kept (the tool-call tags are special tokens), cut at the end of turn.
        text = self.tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=False)
        text = text.split(END_OF_TURN, 1)[0].replace(PAD, "")
        self.transcript.append(text)
        self.num_calls += 1
        parsed = parse_output(text, fmt=HERMES, call_ids=[f"call_{self.num_calls}_{i}" for i in range(8)])
        offered = {
            t["function"]["name"]: t["function"]["parameters"].get("required", []) for t in tools or []
        }
        calls = [
            c
            for c in parsed.tool_calls
            if c.name in offered and all(k in c.arguments for k in offered[c.name])
        ]
        if calls and not parsed.malformed and len(calls) == len(parsed.tool_calls):
            self.num_valid_tool_calls += 1
        reply: dict[str, Any] = {"role": "assistant", "content": parsed.text}
        if parsed.tool_calls:
            reply["tool_calls"] = [
                {
                    "id": c.call_id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
                }
                for c in parsed.tool_calls
            ]
        return reply


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    task: str
    score: float
    num_calls: int


def _fill(root: Path, template: Path) -> None:
    for src in template.rglob("*"):
        if src.is_file():
            dest = root / src.relative_to(template)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(src.read_bytes())


def solve(policy: LocalPolicy, task_folder: Path, *, max_turns: int = 8, grader: Grader) -> Outcome:
    """Run the agent with `policy` on one task and grade the workspace it leaves."""
    task = load_task(str(task_folder))
    before = policy.num_calls
    with tempfile.TemporaryDirectory(prefix="gyre-rollout-", dir="/var/tmp") as tmp:
        root = Path(tmp) / "ws"
        root.mkdir()
        _fill(root, task_folder / "workspace")
        run = AgentRun(
            client=policy,  # type: ignore[arg-type]  # duck-typed: complete() is all AgentRun calls
            workspace=Workspace(root, shell_timeout_s=20.0),
            budget=Budget(),
            max_turns=max_turns,
        )
        run.run(task.prompt)
        graded = asyncio.run(grader.grade(task, root))
    score = graded.scored.score if graded.scored.assessable else 0.0
    return Outcome(task=task.name, score=score, num_calls=policy.num_calls - before)


def make_grader() -> Grader:
    settings = EvaluatorSettings()
    host = SandboxHost(settings.sandbox_root, mode=settings.sandbox_mode, uid_base=settings.uid_base)
    return Grader(host, settings.limits(), attempts=settings.attempts)
