"""One execution as an ATIF trajectory, Harbor's Agent Trajectory Interchange Format (pure).

ATIF (Harbor RFC 0001) is a JSON document: `schema_version`, `session_id`, `agent`, ordered
`steps` (ids from 1; `source` user, agent or system; an agent step may hold `tool_calls` and
`metrics`) and `final_metrics`, with `extra` for anything else. Gyre writes:

- one `user` step with the execution's first full prompt, as the tokenizer decodes it (the
  rendered chat, system and task included: the proxy records tokens, not messages);
- one `agent` step per recorded model call, in the order the calls started, with its decoded
  output, the tool calls the proxy's parser finds in it, and its token counts;
- `final_metrics` with the totals, and `extra` with the task, the reward, how the execution ended
  and the training step that consumed it.

Tool results (observations) are not in the proxy's records as such: they are inside the next
call's prompt, so they stay there rather than being guessed apart.

Example (abridged):
    {"schema_version": "ATIF-v1.4", "session_id": "<execution id>",
     "agent": {"name": "gyre", "version": "...", "model_name": "policy"},
     "steps": [{"step_id": 1, "source": "user", "message": "<|im_start|>system..."},
               {"step_id": 2, "source": "agent", "message": "Let me look.",
                "tool_calls": [{"tool_call_id": "<call id>-0", "function_name": "ls",
                                "arguments": {"path": "."}}],
                "metrics": {"prompt_tokens": 212, "completion_tokens": 31}}],
     "final_metrics": {"total_prompt_tokens": 212, "total_completion_tokens": 31, "total_steps": 2},
     "extra": {"task_id": "...", "reward": 1.0, "ending": "done", "trained_at_step": 3}}
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from gyre_app.track_rows import ExecutionFacts

if TYPE_CHECKING:
    from gyre_app.track_ledger import CallFacts

SCHEMA_VERSION = "ATIF-v1.4"
AGENT_VERSION = "gyre"


def _timestamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=UTC).isoformat()


def _arguments(text: str) -> Any:
    """ATIF's `arguments` is an object; a model's text that is not one is kept as written."""
    try:
        value = json.loads(text)
    except ValueError:
        return {"_raw": text}
    return value if isinstance(value, dict) else {"_raw": text}


def atif_trajectory(
    execution: ExecutionFacts,
    calls: Sequence[CallFacts],
    *,
    step: int,
    agent_name: str,
    model_name: str,
) -> dict[str, Any]:
    """The ATIF document of one execution (see the module docstring for what goes where)."""
    ordered = sorted(calls, key=lambda c: c.started_s)
    steps: list[dict[str, Any]] = []
    first_prompt = next((c for c in ordered if c.prompt_text), None)
    if first_prompt is not None:
        steps.append(
            {
                "step_id": 1,
                "timestamp": _timestamp(first_prompt.started_s),
                "source": "user",
                "message": first_prompt.prompt_text,
            }
        )
    for call in ordered:
        agent_step: dict[str, Any] = {
            "step_id": len(steps) + 1,
            "timestamp": _timestamp(call.finished_s),
            "source": "agent",
            "model_name": model_name or agent_name,
            "message": call.output_text if call.decoded else "",
            "metrics": {"prompt_tokens": call.num_prompt_tokens, "completion_tokens": call.num_output_tokens},
            "extra": {"call_id": call.call_id, "agent_id": call.agent_id, "decoded": call.decoded},
        }
        if call.tool_calls:
            agent_step["tool_calls"] = [
                {
                    "tool_call_id": f"{call.call_id}-{i}",
                    "function_name": t.name,
                    "arguments": _arguments(t.arguments),
                }
                for i, t in enumerate(call.tool_calls)
            ]
        steps.append(agent_step)
    return {
        "schema_version": SCHEMA_VERSION,
        "session_id": execution.execution_id,
        "agent": {"name": agent_name, "version": AGENT_VERSION, "model_name": model_name or agent_name},
        "steps": steps,
        "final_metrics": {
            "total_prompt_tokens": sum(c.num_prompt_tokens for c in ordered),
            "total_completion_tokens": sum(c.num_output_tokens for c in ordered),
            "total_steps": len(steps),
        },
        "extra": {
            "task_id": execution.task_id,
            "reward": execution.reward,
            "assessable": execution.assessable,
            "ending": execution.ending,
            "trained_at_step": step,
        },
    }
