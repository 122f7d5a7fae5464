"""The proxy's early refusals, as pure functions: every rendered part counts toward the size bound,
the refusal names the largest part in the dialect's own field names, and body decoding refuses
what no later step could encode (lone surrogates), naming where it is."""

from __future__ import annotations

import dataclasses
import json

import pytest

from gyre.errors import InvalidArgument
from services.proxy import anthropic_api, openai_api
from services.proxy.agents import Agent
from services.proxy.call_keys import call_key
from services.proxy.request_body import decode_body, unencodable_path
from services.proxy.request_size import SizeBound, body_limit, check_size, parts

BOUND = SizeBound(context_window_tokens=100, max_token_chars=4)  # 400 characters
USER = [{"role": "user", "content": "hi"}]


def refused_field(request: object) -> str:
    with pytest.raises(InvalidArgument) as info:
        check_size(request, BOUND)  # type: ignore[arg-type]
    assert "over the context window of 100 tokens" in info.value.message
    return info.value.field


def test_a_tool_description_counts_and_is_named_in_the_openai_shape() -> None:
    tool = {"type": "function", "function": {"name": "bash", "description": "d" * 500}}
    request = openai_api.parse_request({"model": "m", "messages": USER, "tools": [tool]})
    assert refused_field(request) == "tools[0].function.description"


def test_a_tool_schema_counts_and_is_named_in_the_anthropic_shape() -> None:
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(40)}}
    body = {"model": "m", "max_tokens": 1, "messages": USER, "tools": [{"name": "t", "input_schema": schema}]}
    assert refused_field(anthropic_api.parse_request(body)) == "tools[0].input_schema"


def test_tool_names_system_text_and_tool_call_arguments_count() -> None:
    named = {"model": "m", "max_tokens": 1, "messages": USER, "tools": [{"name": "n" * 401}]}
    assert refused_field(anthropic_api.parse_request(named)) == "tools[0].name"
    system = {
        "model": "m",
        "max_tokens": 1,
        "messages": USER,
        "system": [{"type": "text", "text": "s" * 401}],
    }
    assert refused_field(anthropic_api.parse_request(system)) == "system"
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "t", "arguments": json.dumps({"a": "x" * 400})},
    }
    messages = [*USER, {"role": "assistant", "content": None, "tool_calls": [call]}]
    assert (
        refused_field(openai_api.parse_request({"model": "m", "messages": messages}))
        == "messages[1].tool_calls[0]"
    )


def test_parts_that_add_up_over_the_bound_are_refused_naming_the_largest() -> None:
    messages = [{"role": "user", "content": "u" * 150}, {"role": "assistant", "content": "a" * 100}]
    tool = {"type": "function", "function": {"name": "t", "description": "d" * 160}}
    request = openai_api.parse_request({"model": "m", "messages": messages, "tools": [tool]})
    assert refused_field(request) == "tools[0].function.description"


def test_a_request_within_the_bound_passes_and_its_parts_are_all_counted() -> None:
    tool = {"type": "function", "function": {"name": "bash", "parameters": {}}}
    request = openai_api.parse_request({"model": "m", "messages": USER, "tools": [tool]})
    assert list(parts(request)) == [
        ("messages[0].content", 2),
        ("tools[0].function.name", 4),
        ("tools[0].function.description", 0),
        ("tools[0].function.parameters", 2),
    ]
    assert check_size(request, BOUND) == 8
    assert check_size(request, SizeBound(context_window_tokens=100, max_token_chars=0)) == 8  # no bound


def test_the_body_limit_covers_the_bound_fully_escaped_and_never_passes_the_ceiling() -> None:
    bound = SizeBound(context_window_tokens=4096, max_token_chars=16)
    assert body_limit(bound, ceiling=32 * 1024 * 1024) == 4096 * 16 * 12 + 1024 * 1024
    assert body_limit(bound, ceiling=1000) == 1000
    emoji = json.dumps({"content": "🙂" * bound.max_chars}).encode()  # 12 bytes a character
    assert len(emoji) <= body_limit(bound, ceiling=2**40)


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (b'{"messages": [{"content": "hi \\ud800"}]}', "messages[0].content"),
        (b'{"tools": [{"name": "\\udfff"}]}', "tools[0].name"),
        (b'{"metadata": {"k\\udc00": 1}}', "metadata"),
        (b'"\\ud83d"', "body"),
    ],
)
def test_a_lone_surrogate_is_refused_naming_where_it_is(raw: bytes, field: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        decode_body(raw)
    assert info.value.field == field
    info.value.message.encode("utf-8")  # the refusal itself is text an answer can carry


def test_paired_surrogates_and_other_text_decode() -> None:
    assert decode_body(b'{"content": "\\ud83d\\ude42 \\u00e9"}') == {"content": "🙂 é"}
    assert unencodable_path({"a": ["ok", {"b": "fine"}]}) is None


def test_out_of_range_integers_are_refused_by_name() -> None:
    for body in ({"seed": 2**64}, {"seed": -1}, {"max_completion_tokens": 2**63}):
        with pytest.raises(InvalidArgument) as info:
            openai_api.parse_request({"model": "m", "messages": USER, **body})
        assert info.value.field == next(iter(body))


def test_where_a_part_sat_in_the_body_does_not_change_the_call_key() -> None:
    """Call keys recorded before parts carried their body path still match a retry."""
    tool = {"type": "function", "function": {"name": "bash", "parameters": {}}}
    parsed = openai_api.parse_request({"model": "m", "messages": USER, "tools": [tool]})
    bare = dataclasses.replace(
        parsed,
        messages=tuple(dataclasses.replace(m, source="") for m in parsed.messages),
        tools=tuple(dataclasses.replace(t, source="", schema_field="parameters") for t in parsed.tools),
    )
    main = Agent(role="main", agent_id="main")
    assert call_key({}, parsed, main) == call_key({}, bare, main)
