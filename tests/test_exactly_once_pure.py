"""The pure cores of the exactly-once path: what a consumer does with each outcome, a call's
identity across retries, and where a call goes when its engine broke."""

from __future__ import annotations

import pytest

from gyre.errors import InvalidArgument
from gyre.settle import APPLIED, DUPLICATE, Fate, Limits, Outcome, settle
from services.proxy.agents import Agent
from services.proxy.call_keys import (
    CallKey,
    StoredAnswer,
    answer_from_json,
    answer_to_json,
    call_key,
    replayable,
)
from services.proxy.chat import ChatMessage, ChatRequest, Sampling, ToolCall
from services.proxy.generation import EnginePool
from services.proxy.outcome import CallOutcome, Usage
from services.proxy.router import Router
from services.proxy.routing import Route

LIMITS = Limits(max_deliver=3, max_wait_deliver=5, retry_base_s=1.0)


def test_each_outcome_is_acked_retried_or_dead_lettered_never_dropped() -> None:
    assert settle(APPLIED, num_delivered=1, limits=LIMITS).kind == "ack"
    assert settle(DUPLICATE, num_delivered=2, limits=LIMITS).label == "duplicate"
    invalid = settle(Outcome(Fate.INVALID, "task_id: bad"), num_delivered=1, limits=LIMITS)
    assert (invalid.kind, invalid.reason) == ("dead_letter", "invalid event: task_id: bad")
    failed = Outcome(Fate.FAILED, "RuntimeError: x")
    assert [settle(failed, num_delivered=n, limits=LIMITS).kind for n in (1, 2, 3)] == [
        "nak",
        "nak",
        "dead_letter",
    ]
    assert settle(failed, num_delivered=2, limits=LIMITS).delay_s == 2.0
    waiting = Outcome(Fate.WAITING, "parent not stored")
    kinds = [settle(waiting, num_delivered=n, limits=LIMITS).kind for n in (3, 4, 5)]
    assert kinds == ["nak", "nak", "dead_letter"], "waiting has its own, longer limit"
    # A waiting event's back-off has its own cap; a failing handler's keeps the 30 s one.
    short = Limits(max_deliver=9, max_wait_deliver=9, retry_base_s=1.0, wait_max_s=4.0)
    assert [settle(waiting, num_delivered=n, limits=short).delay_s for n in (1, 2, 3, 4, 8)] == [
        1,
        2,
        4,
        4,
        4,
    ]
    assert settle(failed, num_delivered=8, limits=short).delay_s == 30.0


def chat(content: str = "hi", *, stream: bool = False, temperature: float = 1.0) -> ChatRequest:
    return ChatRequest(
        model="tiny",
        messages=(ChatMessage(role="user", content=content),),
        sampling=Sampling(temperature=temperature),
        stream=stream,
    )


MAIN = Agent(role="main", agent_id="main")


def test_a_calls_key_is_its_header_or_a_digest_of_what_was_asked_and_by_whom() -> None:
    assert call_key({"Idempotency-Key": "turn-7"}, chat(), MAIN) == CallKey("k:turn-7", explicit=True)
    derived = call_key({}, chat(), MAIN)
    assert not derived.explicit and derived.value.startswith("d:")
    assert call_key({}, chat(stream=True), MAIN) == derived, "streamed or not, the same call"
    assert call_key({}, chat("other"), MAIN) != derived
    assert call_key({}, chat(temperature=0.5), MAIN) != derived
    assert call_key({}, chat(), Agent(role="sub", agent_id="sub-1")) != derived
    for bad in ("", "x" * 256, "tab\there", "ключ"):
        with pytest.raises(InvalidArgument, match="Idempotency-Key"):
            call_key({"Idempotency-Key": bad}, chat(), MAIN)


def test_a_derived_key_answers_retries_only_until_its_answer_was_delivered() -> None:
    outcome = CallOutcome(
        text="",
        tool_calls=(ToolCall(call_id="c1", name="bash", arguments={"cmd": "ls"}),),
        finish="tool_calls",
        usage=Usage(prompt_tokens=5, output_tokens=3),
    )
    stored = answer_from_json(
        CallKey("d:1", explicit=False), answer_to_json("call-1", outcome, created_s=7), delivered=False
    )
    assert (stored.call_id, stored.outcome, stored.created_s) == ("call-1", outcome, 7)
    assert replayable(stored)
    stored.delivered = True
    assert not replayable(stored)
    explicit = StoredAnswer(
        key=CallKey("k:1", explicit=True), call_id="c", outcome=outcome, created_s=1, delivered=True
    )
    assert replayable(explicit) and not replayable(None)


async def test_a_broken_engine_rests_and_its_calls_go_to_another() -> None:
    a, b = (
        Route(cell_id=f"cell-{x}", engine_id=f"engine-{x}", address=f"h:{i}") for i, x in enumerate("ab", 1)
    )
    router = Router(EnginePool(), [a, b], down_s=60.0)
    assert await router.pick("exec-1") == a
    assert await router.failover("exec-1", a) == b
    assert await router.pick("exec-1") == b and await router.pick("exec-2") == b, "a rests: no calls"
    assert await router.failover("exec-1", b) is None, "no engine left"
    router.register(a)  # registered again: it serves again
    assert await router.pick("exec-3") == a
