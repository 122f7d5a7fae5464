"""Recorded calls -> token ids as the proxy renders them -> supervised trainer samples (pure).

The prompt is what the proxy would send the engine for that call: the model's chat template over
the messages and tools, with the generation prefix, tool-call arguments as JSON objects (the
proxy parses them, the template serialises them). The target is the assistant turn the template
renders after it, through the end-of-turn token: exactly what the engine must generate.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gyre_app.warmstart.scripted import RecordedCall
from services.trainer.samples import Sample

END_OF_TURN = "<|im_end|>"


class Tokenizer(Protocol):
    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


def template_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as the proxy hands them to the template: tool-call arguments parsed into objects.

    Example:
        [{"role": "assistant", "tool_calls": [{"function": {"name": "ls", "arguments": "{}"}}]}]
        -> [{"role": "assistant", "content": "",
             "tool_calls": [{"function": {"name": "ls", "arguments": {}}}]}]
    """
    out = []
    for m in messages:
        m = dict(m) | {"content": m.get("content") or ""}
        if m.get("tool_calls"):
            m["tool_calls"] = [
                {
                    **c,
                    "function": {
                        **c["function"],
                        "arguments": json.loads(c["function"]["arguments"] or "{}"),
                    },
                }
                for c in m["tool_calls"]
            ]
        out.append(m)
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class RenderedChain:
    """One agent's chain of calls as one sequence: the last prompt and its reply, every reply a target."""

    token_ids: tuple[int, ...]
    target: tuple[bool, ...]


def chains(calls: Sequence[RecordedCall]) -> list[list[RecordedCall]]:
    """Group calls into trajectories (DESIGN section 4): a call joins the chain of its agent whose
    last prompt plus reply its own prompt extends; otherwise (a compaction, a new sub-agent, a
    summary call) it starts one.

    Example:
        main#0, main#1 (extends #0), summary (role differs), main#2 (fresh context)
        -> [[main#0, main#1], [summary], [main#2]]
    """
    out: list[list[RecordedCall]] = []
    for call in calls:
        for chain in out:
            last = chain[-1]
            n = len(last.messages)
            if (
                (last.role, last.agent_id) == (call.role, call.agent_id)
                and len(call.messages) > n
                and call.messages[:n] == last.messages
                and call.messages[n].get("tool_calls") == last.reply.get("tool_calls")
            ):
                chain.append(call)
                break
        else:
            out.append([call])
    return out


def _texts(tokenizer: Tokenizer, call: RecordedCall) -> tuple[str, str]:
    kwargs: dict[str, Any] = {"tokenize": False}
    if call.tools:
        kwargs["tools"] = list(call.tools)
    messages = template_messages(call.messages)
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, **kwargs)
    full = tokenizer.apply_chat_template([*messages, *template_messages([call.reply])], **kwargs)
    assert isinstance(prompt, str) and isinstance(full, str) and full.startswith(prompt), (
        "template not prefix-stable"
    )
    target = full[len(prompt) :]
    return prompt, target[: target.index(END_OF_TURN) + len(END_OF_TURN)]


def render_chain(tokenizer: Tokenizer, chain: Sequence[RecordedCall]) -> RenderedChain:
    """Token ids of a chain, each piece tokenised on its own as the proxy does (it splices the
    engine's output ids into later prompts and tokenises only the text between them)."""
    ids: list[int] = []
    target: list[bool] = []
    seen = ""
    for call in chain:
        prompt, reply = _texts(tokenizer, call)
        assert prompt.startswith(seen), "a chain's prompt must extend the previous prompt and reply"
        for text, is_target in ((prompt[len(seen) :], False), (reply, True)):
            piece = tokenizer.encode(text, add_special_tokens=False)
            ids.extend(piece)
            target.extend([is_target] * len(piece))
        seen = prompt + reply
    return RenderedChain(token_ids=tuple(ids), target=tuple(target))


def transcript_texts(tokenizer: Tokenizer, calls: Sequence[RecordedCall]) -> list[str]:
    """Each call's prompt and reply as text (what the tokenizer's merges are fitted to)."""
    return ["".join(_texts(tokenizer, c)) for c in calls]


def render_transcript(tokenizer: Tokenizer, calls: Sequence[RecordedCall]) -> list[RenderedChain]:
    return [render_chain(tokenizer, c) for c in chains(calls)]


def supervised_samples(
    transcripts: Sequence[Sequence[RenderedChain]],
    *,
    names: Sequence[str],
    version: int,
    pack_as: str = "",
) -> list[Sample]:
    """Trainer samples of whole transcripts: one per chain, targets the replies, weighted 1/(E*U_e).

    Each transcript is one execution (its chains pack into one tree: they share the system
    prompt); a target token of transcript `i` weighs 1/(E*U_i) as in DESIGN section 4, so every
    transcript counts the same whatever its length. `version` is the trainer's: supervised data
    is never stale. With `pack_as`, every sample carries that execution id instead, so the trainer
    packs all the transcripts into one tree (microbatches are per execution) and computes their
    common system prompt once; the weights stay per transcript.
    """
    e = len(transcripts)
    out: list[Sample] = []
    for name, rendered in zip(names, transcripts, strict=True):
        u = sum(sum(c.target) for c in rendered)
        for j, c in enumerate(rendered):
            n = len(c.token_ids)
            out.append(
                Sample(
                    execution_id=pack_as or name,
                    trajectory_id=f"{name}/{j}",
                    agent_role="main",
                    token_ids=c.token_ids,
                    loss_mask=c.target,
                    token_weight=tuple(1.0 / (e * u) if t else 0.0 for t in c.target),
                    old_logprobs=(0.0,) * n,
                    policy_versions=(version,) * n,
                    reward=0.0,
                    advantage=0.0,
                )
            )
    return out
