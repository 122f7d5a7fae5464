"""A deterministic scripted solver: the built-in agent's real loop, driven by a reference solution (shell).

`ScriptedClient` stands where the model endpoint would: it answers each completion with the
next tool call of the task's reference solution (`hidden/solution.json`), so `AgentRun` runs its
real loop — tools executed in a real workspace, a sub-agent for the delegated part, a summary
call when the context passes its budget — and every call it makes is recorded as the policy
should have answered it. Nothing here samples or reads a clock: the same instance and budget
give the same calls (pytest's timing line in tool output is normalised for that).
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.evaluator.generate.instance import Step, TaskInstance
from services.runner.agent.context import Budget
from services.runner.agent.loop import AgentRun
from services.runner.agent.tools import Workspace

TIMING = re.compile(r" in \d+\.\d+s")


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordedCall:
    """One completion of the run: what the agent sent and what the policy should answer."""

    role: str
    agent_id: str
    messages: tuple[dict[str, Any], ...]
    tools: tuple[dict[str, Any], ...]
    reply: dict[str, Any]


LOOK_AROUND = "Let me look at the workspace again first."
"""What a wandering demonstration says before its first look-around. Said, not only done: the
policy then chooses to wander at the reply's first token, as it chooses to stop early. Unsaid,
the detour was learned at a fraction of its share: as the first reply, `ls` came in 1 of 48
sampled first replies (20 % of the demonstrations); after the first step, where the next command
goes, in 0 of 85 sampled calls."""


def _tool_reply(step: Step, call_id: str, say: str = "") -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": say,
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": step.tool, "arguments": json.dumps(dict(step.arguments))},
            }
        ],
    }


def _summary(task: str, done: Sequence[Step]) -> str:
    did = "; ".join(
        f"{s.tool} {s.arguments.get('path') or s.arguments.get('command') or ''}".strip() for s in done
    )
    return f"Task: {task.splitlines()[0]}\nDone: {did or 'nothing yet'}.\nLeft: finish the remaining steps."


@dataclass(slots=True, kw_only=True)
class ScriptedClient:
    """Answers like a ChatClient, from a script per agent; records every call."""

    main: Sequence[Step]
    sub: Sequence[Step]
    delegate: str
    task: str
    delegate_at: int = 1
    """Where the delegation goes among the main agent's steps: after the first reference step."""
    say_before: Mapping[int, str] = field(default_factory=dict)
    """Main-agent step index -> text the reply says before that step's tool call."""
    calls: list[RecordedCall] = field(default_factory=list)
    _next: dict[str, int] = field(default_factory=dict)

    def _script(self, agent_id: str) -> list[Step]:
        if agent_id == "main":
            steps = list(self.main)
            if self.delegate:
                steps.insert(self.delegate_at, Step(tool="delegate", arguments={"task": self.delegate}))
            return steps
        return list(self.sub)

    def complete(
        self,
        messages: list[dict[str, Any]],
        *,
        role: str,
        agent_id: str,
        tools: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        script = self._script(agent_id)
        done = self._next.get(agent_id, 0)
        if role == "summary":
            reply: dict[str, Any] = {"role": "assistant", "content": _summary(self.task, script[:done])}
        elif done < len(script):
            self._next[agent_id] = done + 1
            say = self.say_before.get(done, "") if agent_id == "main" else ""
            reply = _tool_reply(script[done], f"call_{agent_id}_{done}", say)
        else:
            reply = {"role": "assistant", "content": "Done: the work is written and checked."}
        self.calls.append(
            RecordedCall(
                role=role,
                agent_id=agent_id,
                messages=tuple(json.loads(json.dumps(messages))),
                tools=tuple(tools or ()),
                reply=reply,
            )
        )
        return reply


class _StableWorkspace(Workspace):
    """The agent's tools, with pytest's run time cut from their output so transcripts repeat."""

    def shell(self, command: str, timeout_s: float | None = None) -> str:
        return TIMING.sub("", super().shell(command, timeout_s))


def _write(root: Path, files: Mapping[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def changes_workspace(step: Step) -> bool:
    """Whether a step writes the workspace (a file write, a delegation, a shell redirect).

    Example: shell "awk 'END{print NR-1}' data.csv > rows.txt" -> True; shell "head -3 data.csv" -> False
    """
    command = str(step.arguments.get("command", ""))
    return step.tool in ("write_file", "delegate") or (step.tool == "shell" and " > " in command)


def stopped_early(steps: Sequence[Step]) -> list[Step]:
    """The reference steps cut before their last workspace-changing step: a demonstration that
    declares the work done too soon (it earns part of the credit, or none).

    Example: [cut ... > result.txt, awk > rows.txt] -> [cut ... > result.txt]
    """
    last = max((i for i, s in enumerate(steps) if changes_workspace(s)), default=len(steps))
    return list(steps[:last])


def wandering(inst: TaskInstance) -> list[Step]:
    """Two look-arounds after the first piece of work: the workspace's listing, then the file the
    task names again (mid-transcript, where the policy also chooses between going on and stopping
    early: a first-reply detour, tried before, was learned at a tenth of its share).

    Example: a terminal instance -> [shell "ls", read_file "data.csv"]
    """
    look = Step(tool="read_file", arguments={"path": inst.requires[0]}) if inst.requires else None
    return [
        Step(tool="shell", arguments={"command": "ls"}),
        look or Step(tool="shell", arguments={"command": "ls -a"}),
    ]


def record_transcript(
    inst: TaskInstance,
    *,
    context_tokens: int,
    max_turns: int = 12,
    stop_early: bool = False,
    wander: bool = False,
) -> list[RecordedCall]:
    """Run the built-in agent on `inst` with its reference solution as the policy; its calls.

    With a delegated part, the main agent's step that writes it goes to a sub-agent instead.
    A small `context_tokens` makes the agent compact (a `summary` call, then a fresh context).
    `stop_early` replays an imperfect demonstration (`stopped_early`): the main agent answers
    "done" before its last workspace-changing step. `wander` replays a slow one (`wandering`):
    it looks around twice after the first reference step, so under a turn budget sized for the
    reference it runs out of turns with part of the work written.
    """
    steps = list(inst.solution)
    looks = wandering(inst) if wander else []
    sub: list[Step] = []
    if inst.delegate:
        # the step the sub-agent does: the one writing the file the delegated text names
        sub = [
            s for s in steps if s.tool == "write_file" and str(s.arguments.get("path", "")) in inst.delegate
        ]
        steps = [s for s in steps if s not in sub]
    delegate = inst.delegate if sub else ""
    if stop_early:
        if delegate:  # the delegation is the main agent's workspace-changing step after `__init__`
            steps.insert(1, Step(tool="delegate", arguments={"task": delegate}))
            steps, delegate = stopped_early(steps), ""
        else:
            steps = stopped_early(steps)
        sub = []
    client = ScriptedClient(
        main=steps[:1] + looks + steps[1:],
        sub=sub,
        delegate=delegate,
        task=inst.prompt,
        delegate_at=len(looks) + 1,
        say_before={1: LOOK_AROUND} if looks else {},
    )
    with tempfile.TemporaryDirectory(prefix="gyre-warmstart-") as tmp:
        root = Path(tmp)
        _write(root, inst.workspace)
        run = AgentRun(
            client=client,  # type: ignore[arg-type]  # duck-typed: complete() is all AgentRun calls
            workspace=_StableWorkspace(root, shell_timeout_s=60.0),
            budget=Budget(context_tokens=context_tokens),
            max_turns=max_turns,
        )
        run.run(inst.prompt)
    return client.calls
