"""A call's identity across retries, and the stored answer a retry gets (pure).

A harness whose call was cut (the proxy restarted after recording it, say) sends the same call
again. The proxy knows it as the same call by (execution, key): the key is the request's
`Idempotency-Key` header when it has one, else a digest of the request as parsed (messages,
tools, sampling, model) and of the agent that sent it. A retry of a recorded call is answered
from the record (`replayable`), neither generated nor recorded again.

An explicit key always names one call. A derived key answers a retry only while the first
answer has not been delivered whole: once it was, the same request again is a new call (an
agent may well ask the same thing twice and expect a fresh sample).

Example:
    call_key({"Idempotency-Key": "turn-7"}, chat, agent) -> CallKey(value="k:turn-7", explicit=True)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from gyre.errors import InvalidArgument
from services.proxy.agents import Agent
from services.proxy.chat import ChatRequest, ToolCall
from services.proxy.outcome import CallOutcome, Usage

IDEMPOTENCY_HEADER = "Idempotency-Key"
MAX_KEY_CHARS = 255


@dataclass(frozen=True, slots=True)
class CallKey:
    value: str
    explicit: bool


@dataclass(slots=True, kw_only=True)
class StoredAnswer:
    """A recorded call's answer as its harness saw (or should have seen) it."""

    key: CallKey
    call_id: str
    outcome: CallOutcome
    created_s: int
    """When the call started (the `created` of an OpenAI completion)."""
    delivered: bool = False


def call_key(headers: Mapping[str, str], chat: ChatRequest, agent: Agent) -> CallKey:
    explicit = headers.get(IDEMPOTENCY_HEADER)
    if explicit is not None:
        if not (1 <= len(explicit) <= MAX_KEY_CHARS and explicit.isascii() and explicit.isprintable()):
            raise InvalidArgument(
                IDEMPOTENCY_HEADER, f"must be 1..{MAX_KEY_CHARS} printable ASCII characters"
            )
        return CallKey(f"k:{explicit}", explicit=True)
    what = dataclasses.asdict(chat)
    what.pop("stream")  # the same call whether or not it is streamed
    for part in (*what["messages"], *what["tools"]):  # where a part sat in the body is not the call
        part.pop("source", None)
        part.pop("schema_field", None)
    what["agent"] = [agent.role, agent.agent_id]
    digest = hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()
    return CallKey(f"d:{digest}", explicit=False)


def replayable(stored: StoredAnswer | None) -> bool:
    """Whether a request with this key gets the stored answer instead of a new call."""
    return stored is not None and (stored.key.explicit or not stored.delivered)


def answer_to_json(call_id: str, outcome: CallOutcome, *, created_s: int) -> dict[str, Any]:
    return {
        "call_id": call_id,
        "created_s": created_s,
        "text": outcome.text,
        "tool_calls": [
            {"id": c.call_id, "name": c.name, "arguments": c.arguments} for c in outcome.tool_calls
        ],
        "finish": outcome.finish,
        "usage": dataclasses.asdict(outcome.usage),
    }


def answer_from_json(key: CallKey, data: Mapping[str, Any], *, delivered: bool) -> StoredAnswer:
    outcome = CallOutcome(
        text=data["text"],
        tool_calls=tuple(
            ToolCall(call_id=c["id"], name=c["name"], arguments=c["arguments"]) for c in data["tool_calls"]
        ),
        finish=data["finish"],
        usage=Usage(**data["usage"]),
    )
    return StoredAnswer(
        key=key, call_id=data["call_id"], outcome=outcome, created_s=data["created_s"], delivered=delivered
    )


class ReplayedRun:
    """A retried call answered from its record: the same interface as a `CallRun`, nothing generated."""

    def __init__(self, execution_id: str, stored: StoredAnswer) -> None:
        self.execution_id = execution_id
        self.stored = stored
        self.key = stored.key
        self.call_id = stored.call_id
        self.created_s = stored.created_s
        self.outcome: CallOutcome | None = stored.outcome
        self.num_prompt_tokens = stored.outcome.usage.prompt_tokens

    async def text_deltas(self) -> AsyncIterator[str]:
        if self.stored.outcome.text and not self.stored.outcome.tool_calls:
            yield self.stored.outcome.text

    async def run_to_end(self) -> CallOutcome:
        return self.stored.outcome

    def cancel(self) -> None:
        """Nothing runs."""
