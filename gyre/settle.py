"""What becomes of a consumed message once its handler ran: ack, retry later or dead-letter (pure).

A consumer classifies each message's fate as an `Outcome`; `settle` turns it, with the number of
deliveries so far and the consumer's limits, into the one `Action` to take on the message.
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
