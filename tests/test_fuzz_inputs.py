"""Property-based fuzzing of what callers send: any input is either accepted or refused with
InvalidArgument naming a field, never another exception (which would be a 500 / INTERNAL)."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gyre.errors import InvalidArgument
from gyre.proxy.v1 import proxy_pb2
from services.proxy import anthropic_api, openai_api
from services.proxy.request_body import json_depth
from services.scheduler.runnable import Catalog, check_runnable
from services.scheduler.tasks import TaskSpec, validate_specs
from services.trajectory.messages import record_from_proto

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ODD_TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=40) | st.sampled_from(
    ["", "\x00", "\u202e", "\ud7ff", "🙂" * 5, "user", "assistant", "tool", "system", "text", "function"]
)
SCALARS = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | ODD_TEXT
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(ODD_TEXT, inner, max_size=5),
    max_leaves=30,
)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool", "system", "x"]) | JSON},
    optional={"content": JSON, "tool_calls": JSON, "tool_call_id": JSON},
)
BODY = st.fixed_dictionaries(
    {"model": JSON, "messages": st.lists(MESSAGE, max_size=4) | JSON},
    optional={
        "max_tokens": JSON,
        "stream": JSON,
        "tools": JSON,
        "temperature": JSON,
        "system": JSON,
        "n": JSON,
    },
)


def accepted_or_refused(parse: Any, body: Any) -> None:
    try:
        parse(body)
    except InvalidArgument as exc:
        assert exc.field and exc.problem


@FUZZ
@given(BODY | JSON)
def test_openai_bodies_are_parsed_or_refused_by_field(body: Any) -> None:
    accepted_or_refused(openai_api.parse_request, body)


@FUZZ
@given(BODY | JSON)
def test_anthropic_bodies_are_parsed_or_refused_by_field(body: Any) -> None:
    accepted_or_refused(anthropic_api.parse_request, body)


@FUZZ
@given(JSON)
def test_json_depth_never_fails_and_counts_containers(body: Any) -> None:
    depth = json_depth(body, limit=64)
    assert depth >= (1 if isinstance(body, (dict, list)) else 0)


SPEC = st.builds(
    TaskSpec,
    name=ODD_TEXT,
    family=ODD_TEXT | st.sampled_from(["terminal", "repo_repair"]),
    prompt=ODD_TEXT,
    group_size=st.integers(-5, 2000),
    timeout_s=st.floats() | st.floats(-1e9, 1e9),
    harness=ODD_TEXT | st.just("gyre-agent"),
    workspace_template=ODD_TEXT
    | st.sampled_from(["task:csvsum", "task:nope", "https://x/y", "git+https://x/y"]),
    labels=st.lists(st.tuples(ODD_TEXT, ODD_TEXT), max_size=3).map(tuple),
)
CATALOG = Catalog(
    harnesses=frozenset({"gyre-agent"}),
    families=frozenset({"terminal"}),
    task_families={"csvsum": "terminal"},
)


@FUZZ
@given(st.lists(SPEC, max_size=3))
def test_task_specs_are_accepted_or_refused_by_field(specs: list[TaskSpec]) -> None:
    try:
        validate_specs(specs)
        check_runnable(specs, CATALOG)
    except InvalidArgument as exc:
        assert exc.field.startswith("tasks")
        return
    for spec in specs:  # what passes is storable and runnable
        assert "\x00" not in spec.prompt and math.isfinite(spec.timeout_s) and spec.harness == "gyre-agent"


IDS = st.lists(st.integers(-(2**31), 2**31 - 1), max_size=8)
RECORD = st.builds(
    proxy_pb2.CallRecord,
    execution_id=ODD_TEXT,
    call_id=ODD_TEXT,
    agent_role=st.integers(0, 5),
    agent_id=ODD_TEXT,
    output_ids=IDS,
    output_logprobs=st.lists(st.floats(width=32), max_size=8),
    engine_id=ODD_TEXT,
    output_policy_versions=st.lists(st.integers(0, 2**40), max_size=8),
)


@FUZZ
@given(RECORD, IDS, st.booleans(), st.integers(-5, 20))
def test_call_records_are_decoded_or_refused_by_field(
    record: proxy_pb2.CallRecord, prompt: list[int], delta: bool, shared: int
) -> None:
    if delta:
        record.prompt_delta.parent_call_id = "p"
        record.prompt_delta.num_shared_tokens = max(0, shared)
        record.prompt_delta.new_ids.extend(prompt)
    else:
        record.full_prompt.prompt_ids.extend(prompt)
    try:
        record_from_proto(record)
    except InvalidArgument as exc:
        assert exc.field.startswith("call")
