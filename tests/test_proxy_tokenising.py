"""Tokenising a prompt runs off the proxy's event loop, so one long prompt stalls no other call."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from gyre.errors import InvalidArgument
from services.proxy.calls import Calls
from services.proxy.chat import ChatMessage, ChatRequest
from services.proxy.generation import EnginePool
from services.proxy.model import ServedModel
from services.proxy.router import Router


class GatedTokenizer:
    """Renders only once the test opens the gate, as a tokenizer busy with a huge prompt would."""

    def __init__(self) -> None:
        self.gate = threading.Event()

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> str:
        assert self.gate.wait(timeout=10)
        return "".join(m["content"] for m in conversation)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) % 100 for c in text]

    def decode(self, token_ids: Any, skip_special_tokens: bool = False) -> str:
        return "".join(chr(i) for i in token_ids)


@pytest.mark.asyncio
async def test_a_prompt_being_tokenised_leaves_the_event_loop_free() -> None:
    tokenizer = GatedTokenizer()
    model = ServedModel(
        name="m", tokenizer=tokenizer, context_window_tokens=1000, tool_format=None, stop_texts=()
    )
    calls = Calls(model=model, router=Router(EnginePool()), recorder=None)  # type: ignore[arg-type]
    request = ChatRequest(model="m", messages=(ChatMessage(role="user", content="hello"),))
    rendering = asyncio.create_task(calls.render("e1", request))
    ticks = 0
    for _ in range(5):  # the loop keeps running other work while the tokenizer is busy
        await asyncio.sleep(0.01)
        ticks += 1
    assert ticks == 5 and not rendering.done()
    tokenizer.gate.set()
    prompt = await rendering
    assert prompt.text == "hello" and len(prompt.ids) == 5


@pytest.mark.asyncio
async def test_a_prompt_longer_than_the_window_can_hold_is_refused_before_tokenising() -> None:
    tokenizer = GatedTokenizer()  # never opened: tokenising would fail the test after 10 s
    model = ServedModel(
        name="m",
        tokenizer=tokenizer,
        context_window_tokens=100,
        tool_format=None,
        stop_texts=(),
        max_token_chars=4,
    )
    calls = Calls(model=model, router=Router(EnginePool()), recorder=None)  # type: ignore[arg-type]
    request = ChatRequest(model="m", messages=(ChatMessage(role="user", content="x" * 401),))
    with pytest.raises(InvalidArgument, match="over the context window of 100 tokens"):
        await calls.render("e1", request)
