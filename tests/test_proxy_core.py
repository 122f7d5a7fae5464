"""The proxy's pure core: tool-call parsing, prompt deltas, routing choice, agent detection,
request parsing and prompt rendering with output-id reuse."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from proxy_support import write_tokenizer

from gyre.errors import InvalidArgument
from services.proxy import anthropic_api, openai_api
from services.proxy.agents import detect
from services.proxy.chat import ChatMessage, ChatRequest
from services.proxy.delta import CallHistory
from services.proxy.detok import IncrementalText
from services.proxy.render import OutputMemory, render_prompt, reusable_output
from services.proxy.routing import Load, Route, behind, choose_engine
from services.proxy.toolcalls import HERMES, parse_output, visible_prefix


def test_tool_calls_are_split_from_text_and_malformed_ones_counted() -> None:
    text = 'Look.<tool_call>{"name": "ls", "arguments": {"path": "."}}</tool_call><tool_call>{bad</tool_call>'
    parsed = parse_output(text, fmt=HERMES, call_ids=["c0", "c1"])
    assert parsed.text == "Look."
    assert [(c.call_id, c.name, c.arguments) for c in parsed.tool_calls] == [("c0", "ls", {"path": "."})]
    assert parsed.malformed == 1
    assert parse_output("plain", fmt=HERMES, call_ids=[]).tool_calls == ()
    assert visible_prefix("Hello <tool_c", HERMES) == "Hello "
    assert visible_prefix('Hi<tool_call>{"na', HERMES) == "Hi"


def test_a_prompt_is_encoded_against_the_call_it_shares_most_with() -> None:
    history = CallHistory()
    history.add("c1", [1, 2, 3], [100, 101])
    history.add("c2", [1, 2, 9], [102])
    delta = history.encode([1, 2, 3, 100, 101, 4, 5])
    assert (delta.parent_call_id, delta.num_shared_tokens, delta.new_ids) == ("c1", 5, (4, 5))
    assert history.encode([7, 8]).parent_call_id == ""
    assert history.encode([1, 2, 9, 102]).parent_call_id == "c2"


def test_routing_is_sticky_while_the_engine_serves_and_least_loaded_otherwise() -> None:
    a = Load(route=Route(cell_id="cell-1", engine_id="a", address="x:1"), num_in_flight=3)
    b = Load(route=Route(cell_id="cell-2", engine_id="b", address="x:2"), num_in_flight=1)
    c = Load(route=Route(cell_id="cell-3", engine_id="c", address="x:3", state="draining"), num_in_flight=0)
    loads = [a, b, c]
    assert choose_engine(loads, sticky_engine_id="a") == a.route
    assert choose_engine(loads, sticky_engine_id="c") == b.route
    assert choose_engine(loads, sticky_engine_id="") == b.route
    assert choose_engine(loads, sticky_engine_id="", allowed_cells={"cell-1"}) == a.route
    assert choose_engine([c], sticky_engine_id="c") is None


def test_a_call_goes_only_to_an_engine_with_weights_of_its_admitted_version_or_newer() -> None:
    new = Load(
        route=Route(cell_id="cell-1", engine_id="new", address="x:1", policy_version=2), num_in_flight=3
    )
    old = Load(
        route=Route(cell_id="cell-2", engine_id="old", address="x:2", policy_version=1), num_in_flight=0
    )
    gone = Load(
        route=Route(cell_id="cell-3", engine_id="gone", address="x:3", state="drained", policy_version=0),
        num_in_flight=0,
    )
    loads = [new, old, gone]
    assert choose_engine(loads, sticky_engine_id="old", min_version=2) == new.route, "sticky yields"
    assert choose_engine(loads, sticky_engine_id="", min_version=1) == old.route, "least loaded"
    assert choose_engine(loads, sticky_engine_id="", min_version=3) is None, "none yet: the call waits"
    assert behind(loads, min_version=2) == [old.route], "a drained engine is not asked"
    assert behind(loads, min_version=0) == []


def test_agent_detection_and_header_overrides() -> None:
    main = detect(
        system="You are Claude Code, Anthropic's official CLI", first_user="a", last_user="a", headers={}
    )
    assert (main.role, main.agent_id) == ("main", "main")
    sub = detect(system="You are an agent for Claude Code.", first_user="find x", last_user="b", headers={})
    again = detect(system="You are an agent for Claude Code.", first_user="find x", last_user="c", headers={})
    assert sub.role == "sub" and sub.agent_id == again.agent_id
    intro = "You are a Claude agent, built on Anthropic's Claude Agent SDK."
    sdk_sub = f"cc_entrypoint=sdk-cli; cc_is_subagent=true;\n{intro}"
    assert detect(system=sdk_sub, first_user="t", last_user="t", headers={}).role == "sub"
    sdk_main = f"cc_entrypoint=sdk-cli;\n{intro}"
    assert detect(system=sdk_main, first_user="t", last_user="t", headers={}).role == "main"
    summary = detect(system="", first_user="", last_user="Please summarize the conversation", headers={})
    assert summary.role == "summary"
    forced = detect(
        system="", first_user="", last_user="", headers={"x-gyre-agent-role": "sub", "x-gyre-agent-id": "w1"}
    )
    assert (forced.role, forced.agent_id) == ("sub", "w1")
    with pytest.raises(InvalidArgument, match="X-Gyre-Agent-Role"):
        detect(system="", first_user="", last_user="", headers={"x-gyre-agent-role": "boss"})


def test_anthropic_requests_accept_claude_codes_shapes() -> None:
    body: dict[str, Any] = {
        "model": "m",
        "max_tokens": 10,
        "system": [
            {"type": "text", "text": "S1", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "S2"},
        ],
        "messages": [
            {"role": "system", "content": "late system"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "..."},
                    {"type": "tool_use", "id": "t1", "name": "ls", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": [{"type": "text", "text": "a.py"}],
                    }
                ],
            },
        ],
        "tools": [
            {"name": "ls", "input_schema": {"type": "object"}},
            {"type": "web_search_20250305", "name": "web_search"},
        ],
        "thinking": {"type": "enabled", "budget_tokens": 5},
        "context_management": {},
        "metadata": {"user_id": "x"},
    }
    request = anthropic_api.parse_request(body)
    assert [m.role for m in request.messages] == ["system", "system", "user", "assistant", "tool"]
    assert request.messages[0].content == "S1\n\nS2"
    assert request.messages[4].content == "a.py" and request.messages[4].tool_call_id == "t1"
    assert [t.name for t in request.tools] == ["ls"]


def test_openai_requests_refuse_what_they_cannot_honour() -> None:
    with pytest.raises(InvalidArgument, match="stop"):
        openai_api.parse_request(
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "stop": ["\n"]}
        )
    with pytest.raises(InvalidArgument, match=r"messages\[0\].content\[0\].type"):
        openai_api.parse_request(
            {
                "model": "m",
                "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
            }
        )


def test_rendering_splices_remembered_output_ids_in_place_of_the_rendered_turn(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(write_tokenizer(tmp_path)))
    first = ChatRequest(model="m", messages=(ChatMessage(role="user", content="hi"),))
    memory = OutputMemory()
    prompt = render_prompt(tok, first, memory, context_window_tokens=10_000)
    assert list(prompt.ids) == tok.encode(prompt.text, add_special_tokens=False)
    # The engine spelled "Done" letter by letter; BPE would merge it.
    output = [*(tok.convert_tokens_to_ids(c) for c in "Done"), tok.convert_tokens_to_ids("<|im_end|>")]
    returned = ChatMessage(role="assistant", content="Done")
    item = reusable_output(
        tok, first, prompt_text=prompt.text, returned=returned, output_ids=output, stop_texts=["<|im_end|>"]
    )
    assert item is not None
    memory.remember(item)
    second = ChatRequest(
        model="m", messages=(*first.messages, returned, ChatMessage(role="user", content="more"))
    )
    again = render_prompt(tok, second, memory, context_window_tokens=10_000)
    assert again.num_reused_outputs == 1
    assert list(again.ids[: len(prompt.ids) + len(output)]) == [*prompt.ids, *output]
    assert list(again.ids) != tok.encode(again.text, add_special_tokens=False)


def test_incremental_text_waits_for_a_whole_character() -> None:
    stream = IncrementalText(lambda ids: bytes(ids).decode("utf-8", errors="replace"))
    e_acute = list("é".encode())
    assert stream.push([ord("a")]) == "a"
    assert stream.push(e_acute[:1]) == ""
    assert stream.push(e_acute[1:]) == "é"
    assert stream.push([ord("b"), ord("c")]) == "bc"
    assert stream.text == "aébc"


def test_a_prompt_that_extends_an_earlier_one_keeps_its_ids_and_encodes_only_the_rest(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(write_tokenizer(tmp_path)))
    encoded: list[str] = []

    class Counting:
        def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any:
            return tok.apply_chat_template(conversation, **kwargs)

        def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
            encoded.append(text)
            return list(tok.encode(text, add_special_tokens=add_special_tokens))

        def decode(self, token_ids: Any, skip_special_tokens: bool = False) -> str:
            return str(tok.decode(token_ids, skip_special_tokens=skip_special_tokens))

    memory = OutputMemory()
    first = ChatRequest(model="m", messages=(ChatMessage(role="user", content="hello there"),))
    one = render_prompt(Counting(), first, memory, context_window_tokens=10_000)
    memory.remember_prompt(one)
    encoded.clear()
    second = ChatRequest(
        model="m",
        messages=(
            *first.messages,
            ChatMessage(role="assistant", content="hi"),
            ChatMessage(role="user", content="x"),
        ),
    )
    two = render_prompt(Counting(), second, memory, context_window_tokens=10_000)
    assert two.ids[: len(one.ids)] == one.ids
    assert "".join(encoded) == two.text[len(one.text) :]  # only the new text was tokenised


def test_a_model_folder_written_after_start_is_picked_up(tmp_path: Path) -> None:
    from gyre.errors import Unavailable
    from services.proxy.calls import Calls
    from services.proxy.generation import EnginePool
    from services.proxy.model import load_model
    from services.proxy.router import Router

    folder = tmp_path / "model"
    calls = Calls(
        model=None,
        router=Router(EnginePool()),
        recorder=None,  # type: ignore[arg-type]
        load_model=lambda: load_model(folder) if folder.exists() else None,
    )
    with pytest.raises(Unavailable, match="no model"):
        _ = calls.model
    write_tokenizer(folder)
    with pytest.raises(Unavailable):  # looked at most every few seconds
        _ = calls.model
    calls._model_tried_s -= 10
    assert calls.model.name == "model"
