"""Envelope naming and decoding rules (pure)."""

from __future__ import annotations

import pytest
from google.protobuf import any_pb2

from gyre.events import (
    UndecodableEvent,
    event_name_parts,
    new_event,
    parse_envelope,
    stream_name,
    subject_of,
    type_map,
    unpack_payload,
)
from gyre.ids import is_uuid
from gyre.scheduler.v1 import events_pb2, scheduler_pb2
from gyre.trajectory.v1 import events_pb2 as trajectory_events


def submitted() -> events_pb2.TaskSubmitted:
    return events_pb2.TaskSubmitted(task=scheduler_pb2.Task(task_id="t1"), request_id="r1")


def test_subject_and_stream_follow_the_producer_and_event_name() -> None:
    env = new_event(submitted(), producer="scheduler", correlation_id="t1")
    assert subject_of(env, prefix="gyre") == "gyre.scheduler.v1.TaskSubmitted"
    assert stream_name("scheduler", prefix="gyre") == "GYRE_SCHEDULER"
    assert env.event_type == "gyre.scheduler.v1.TaskSubmitted"
    assert is_uuid(env.event_id) and env.event_id[14] == "7"  # UUIDv7


def test_event_names_must_be_gyre_versioned_and_past_tense_capitalised() -> None:
    assert event_name_parts("gyre.trainer.v1.StepCompleted") == ("trainer", "v1", "StepCompleted")
    for bad in (
        "other.trainer.v1.StepCompleted",
        "gyre.trainer.StepCompleted",
        "gyre.trainer.v1.stepCompleted",
    ):
        with pytest.raises(ValueError):
            event_name_parts(bad)


def test_an_envelope_round_trips() -> None:
    env = new_event(submitted(), producer="scheduler", correlation_id="t1", causation_id="r1")
    decoded = unpack_payload(
        parse_envelope(env.SerializeToString()), env.payload, type_map([events_pb2.TaskSubmitted])
    )
    assert decoded is not None
    assert decoded.payload == submitted()
    assert decoded.envelope.causation_id == "r1"


def test_unhandled_types_are_skipped_not_failed() -> None:
    env = new_event(submitted(), producer="scheduler", correlation_id="t1")
    assert unpack_payload(env, env.payload, type_map([trajectory_events.GroupReady])) is None


def test_garbage_and_mismatched_payloads_are_undecodable() -> None:
    with pytest.raises(UndecodableEvent, match=r"not a gyre\.common\.v1\.Envelope"):
        parse_envelope(b"\xff\xff\xff not protobuf")
    with pytest.raises(UndecodableEvent, match="lacks event_id"):
        parse_envelope(b"")
    env = new_event(submitted(), producer="scheduler", correlation_id="t1")
    wrong = any_pb2.Any()
    wrong.Pack(trajectory_events.GroupReady(task_id="t1"))
    with pytest.raises(UndecodableEvent, match="does not match event_type"):
        unpack_payload(env, wrong, type_map([events_pb2.TaskSubmitted]))
