"""What becomes of a consumed message once its handler ran: ack, retry later or dead-letter (pure).

A consumer classifies each message's fate as an `Outcome`; `settle` turns it, with the number of
deliveries so far and the consumer's limits, into the one `Action` to take on the message.
Before that, `after_failure` decides whether a failed batch is settled at all: while the
consumer's database or bus is away, a failure says nothing about the message, so the consumer
holds it, waits for the dependency and applies it again (an outage costs no delivery).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Fate(Enum):
    APPLIED = "ok"
    """The handler's effects (and the inbox record) committed."""
    DUPLICATE = "duplicate"
    """The inbox already held the event: applied by an earlier delivery, nothing done now."""
    INVALID = "invalid"
    """The event itself is wrong: no retry helps."""
    WAITING = "waiting"
    """Not applicable yet (it depends on an event that has not arrived): retried later."""
    FAILED = "failed"
    """The handler (or the commit) failed: rolled back, retried with back-off."""
    UNAVAILABLE = "unavailable"
    """The handler (or the commit) failed because Postgres or NATS is away: rolled back, held
    and applied again once it is back; never counted against the message, never dead-lettered."""


@dataclass(frozen=True, slots=True)
class Outcome:
    fate: Fate
    reason: str = ""


APPLIED = Outcome(Fate.APPLIED)
DUPLICATE = Outcome(Fate.DUPLICATE)


@dataclass(frozen=True, slots=True)
class Limits:
    max_deliver: int
    max_wait_deliver: int
    retry_base_s: float
    wait_max_s: float = 30.0
    """Longest back-off of an event waiting for an earlier one. What it waits for is usually a
    redelivery due within the consumer's ack wait, so a short cap retries soon after it lands
    instead of up to 30 s later (a failing handler keeps the 30 s cap)."""

    def delay_s(self, num_delivered: int, *, cap_s: float = 30.0) -> float:
        return float(min(cap_s, self.retry_base_s * 2.0 ** max(0, num_delivered - 1)))


@dataclass(frozen=True, slots=True)
class Action:
    kind: str
    """`ack`, `nak` or `dead_letter`."""
    delay_s: float = 0.0
    reason: str = ""
    label: str = "ok"
    """The metric label: ok, duplicate, retried, waiting or dead_lettered."""


def settle(outcome: Outcome, *, num_delivered: int, limits: Limits) -> Action:
    """The action for one message; a retried one is dead-lettered at its limit, never dropped."""
    fate, why = outcome.fate, outcome.reason
    if fate is Fate.APPLIED:
        return Action("ack")
    if fate is Fate.DUPLICATE:
        return Action("ack", label="duplicate")
    if fate is Fate.UNAVAILABLE:  # reached only when the consumer stops while a dependency is away
        return Action("nak", delay_s=limits.retry_base_s, label="unavailable")
    if fate is Fate.INVALID:
        return Action("dead_letter", reason=f"invalid event: {why}", label="dead_lettered")
    if fate is Fate.WAITING:
        if num_delivered >= (limits.max_wait_deliver or limits.max_deliver):
            return Action(
                "dead_letter", reason=f"waited {num_delivered} deliveries: {why}", label="dead_lettered"
            )
        return Action("nak", delay_s=limits.delay_s(num_delivered, cap_s=limits.wait_max_s), label="waiting")
    if num_delivered >= limits.max_deliver:
        return Action(
            "dead_letter", reason=f"handler failed {num_delivered} times: {why}", label="dead_lettered"
        )
    return Action("nak", delay_s=limits.delay_s(num_delivered), label="retried")


class Hold(Enum):
    """What a consumer does with a fetched batch some of whose messages failed."""

    SETTLE = "settle"
    """Settle each message by its outcome: the failure is the handler's own (counted)."""
    WAIT = "wait"
    """Keep the messages, stop fetching, probe the dependencies until they answer, then apply
    the batch again."""
    RETRY = "retry"
    """Apply the batch again at once, uncounted: it failed on a lost connection, and the
    dependency answered the probe since (it came back, or the pool had a dead connection)."""


def after_failure(*, dependencies_away: bool, outage_error: bool, retried_in_place: int) -> Hold:
    """Whether a failed batch is settled, held for an outage, or applied again at once.

    The probe is what decides: a dependency that does not answer is an outage however the
    handler's error reads (a driver may wrap it), and a dependency that answers makes the next
    failure the handler's own, so an error that merely looks like a connection error (an
    `OSError` of the handler's own files) is retried in place once, then counted as usual.

    Example:
        away, any error                        -> WAIT (then applied again, uncounted)
        answers, connection error, 0 retries   -> RETRY
        answers, connection error, 1 retry     -> SETTLE (counted: nak with back-off)
        answers, another error                 -> SETTLE
    """
    if dependencies_away:
        return Hold.WAIT
    if outage_error and retried_in_place < 1:
        return Hold.RETRY
    return Hold.SETTLE


def probe_delay_s(num_probes: int, *, cap_s: float = 5.0) -> float:
    """Pause before the next probe of a dependency that is away: 0.5 s doubling to `cap_s`, so a
    restart of a few seconds is seen at once and a long outage costs one probe per `cap_s`."""
    return float(min(cap_s, 0.5 * 2.0 ** min(max(0, num_probes), 32)))
