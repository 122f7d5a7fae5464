"""Read the dead-letter stream and send its messages back to their subjects (shell).

A consumer that gives up on a message (`gyre.consume`) parks it on the stream
`<PREFIX>_DEADLETTER` with its original subject, its stream sequence there, the reason and the
message's bytes (`DeadLetter` in `proto/gyre/common/v1/envelope.proto`). `list_dead_letters`
reads them back; `redrive` publishes each one's bytes to its original subject again and then
deletes it from the dead-letter stream.

A redriven message is handled once:
- JetStream would drop a republish that kept `Nats-Msg-Id = event_id` as a duplicate within the
  stream's duplicate window, so it goes out under `redrive:<subject>:<sequence>` instead: unique
  per original message, so redriving the same dead letter twice (or the dead letters of two
  consumers that gave up on the same message) publishes it once;
- the envelope inside keeps its `event_id`, so every consumer that already applied it (each
  consumer of the subject receives the copy) finds it in its exactly-once record and only acks
  it, and the consumer that gave up, whose claim was rolled back with its failed handler,
  applies it now. A consumer without a database (an engine following weights) has no such
  record and sees it again.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC
from typing import Any

from google.protobuf.message import DecodeError
from nats.js import JetStreamContext
from nats.js.errors import APIError, NotFoundError

from gyre.bus import DEAD_LETTER_SERVICE
from gyre.common.v1 import envelope_pb2
from gyre.events import stream_name

NO_MESSAGE_FOUND = 10057
"""JetStream's error code for deleting a message that is not (or no longer) in the stream."""
MAX_LISTED = 10_000
"""Most dead letters read in one listing (oldest first)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadLetterRow:
    sequence: int
    """Where it sits in the dead-letter stream: what `gyre dead-letters redrive` takes."""
    consumer: str
    subject: str
    event_type: str
    event_id: str
    reason: str
    num_delivered: int
    dead_lettered_at: str
    """ISO 8601, UTC."""
    record: envelope_pb2.DeadLetter

    def as_dict(self) -> dict[str, Any]:
        return {
            "sequence": self.sequence,
            "consumer": self.consumer,
            "subject": self.subject,
            "event_type": self.event_type,
            "event_id": self.event_id,
            "reason": self.reason,
            "num_delivered": self.num_delivered,
            "dead_lettered_at": self.dead_lettered_at,
        }


def dead_letter_stream(prefix: str) -> str:
    return stream_name(DEAD_LETTER_SERVICE, prefix=prefix)


async def count_dead_letters(js: JetStreamContext, prefix: str) -> int:
    """How many dead letters wait (0 when no consumer ever gave up: the stream does not exist)."""
    try:
        info = await js.stream_info(dead_letter_stream(prefix))
    except NotFoundError:
        return 0
    return int(info.state.messages)


async def list_dead_letters(js: JetStreamContext, prefix: str) -> list[DeadLetterRow]:
    """Every dead letter still parked, oldest first (at most `MAX_LISTED`)."""
    stream = dead_letter_stream(prefix)
    try:
        info = await js.stream_info(stream)
    except NotFoundError:
        return []
    rows: list[DeadLetterRow] = []
    first, last = info.state.first_seq, info.state.last_seq
    for sequence in range(first, last + 1) if info.state.messages else ():
        try:
            raw = await js.get_msg(stream, sequence)
        except NotFoundError:  # redriven (deleted) since
            continue
        rows.append(_row(sequence, raw.data or b""))
        if len(rows) >= MAX_LISTED:
            break
    return rows


def _row(sequence: int, data: bytes) -> DeadLetterRow:
    record = envelope_pb2.DeadLetter.FromString(data)
    try:
        envelope = envelope_pb2.Envelope.FromString(record.data)
        event_type, event_id = envelope.event_type, envelope.event_id
    except DecodeError:
        event_type, event_id = "(undecodable)", ""
    return DeadLetterRow(
        sequence=sequence,
        consumer=record.consumer,
        subject=record.subject,
        event_type=event_type,
        event_id=event_id,
        reason=record.reason,
        num_delivered=record.num_delivered,
        dead_lettered_at=record.dead_lettered_at.ToDatetime(tzinfo=UTC).isoformat(timespec="seconds"),
        record=record,
    )


async def redrive(js: JetStreamContext, prefix: str, rows: list[DeadLetterRow]) -> list[dict[str, Any]]:
    """Send each row's message to its original subject, then delete the row from the dead-letter
    stream; one report per row (`published` false: an earlier redrive already sent it)."""
    stream = dead_letter_stream(prefix)
    out = []
    for row in rows:
        msg_id = f"redrive:{row.subject}:{row.record.stream_sequence}"
        ack = await js.publish(row.subject, row.record.data, headers={"Nats-Msg-Id": msg_id})
        # Deleted only once the copy is stored: a crash between the two leaves it listed, and a
        # second redrive is then a duplicate the stream drops.
        try:
            await js.delete_msg(stream, row.sequence)
        except APIError as exc:
            if exc.err_code != NO_MESSAGE_FOUND:  # else: deleted by an earlier redrive (a stale listing)
                raise
        out.append({**row.as_dict(), "published": not ack.duplicate, "new_sequence": ack.seq})
    return out
