"""Who answers for how a sandboxed run ended: the policy, or the infrastructure (pure).

Leaving the group's baseline is worth something to a failing policy, so a run is an
infrastructure failure only on facts the sandbox cannot write (DESIGN section 4). The facts
here are the host's own: the keeper's record of init's report on a pipe only the host reads
(`started`, made before the harness or the graded code ran), the host's own kill and its reason,
and the count of calls the proxy failed for its own or an engine's cause. No log text is
among them: a harness can write any log line it likes.

Everything after the program started is the policy's doing and is graded. The runner and the
grader both decide with `blame`; the table of cases is in docs/failure-classification.md.

Example:
    blame(HostFacts(started=True, exit_code=1))               -> POLICY ("the program exited with 1")
    blame(HostFacts(started=False, setup_error="bwrap: ..."))  -> INFRASTRUCTURE, kind "sandbox"
    blame(HostFacts(started=True, killed="deadline"))          -> POLICY (out of time)
"""

from __future__ import annotations

import errno
from dataclasses import dataclass

POLICY, INFRASTRUCTURE, CANCELLED = "policy", "infrastructure", "cancelled"
POLICY_KILLS = frozenset({"deadline", "disk_quota"})
"""Host kills the program earned: its time or its disk ran out."""


@dataclass(frozen=True, slots=True, kw_only=True)
class HostFacts:
    """What the host itself recorded about one sandboxed run."""

    started: bool
    """The keeper's record that set-up finished and the program began."""
    setup_errno: int = 0
    setup_error: str = ""
    """How set-up failed, as init reported it before the program existed."""
    killed: str = ""
    """Why the host killed the sandbox (`deadline`, `disk_quota`, `cancelled`, `keeper_lost`,
    a runner's stop); empty when the program ended by itself."""
    exit_code: int | None = None
    proxy_failed_calls: int = 0
    """Model calls the proxy failed for its own or an engine's cause (its count, not the
    harness's word)."""
    last_proxy_failure: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Blame:
    verdict: str
    """POLICY (grade it), INFRASTRUCTURE (keep it out of the baseline; retry where allowed) or
    CANCELLED (an operator stopped it)."""
    kind: str = ""
    """For INFRASTRUCTURE: `sandbox`, `harness_launch`, `runner_lost` or `model_unavailable`."""
    reason: str = ""

    @property
    def infrastructure(self) -> bool:
        return self.verdict == INFRASTRUCTURE


def blame(facts: HostFacts) -> Blame:
    """Decide from host facts alone; the order of the checks is the table's order."""
    if facts.killed == "cancelled":
        return Blame(verdict=CANCELLED, reason="cancelled by request")
    if facts.killed == "keeper_lost":
        return Blame(
            verdict=INFRASTRUCTURE, kind="runner_lost", reason="the sandbox's keeper ended without an outcome"
        )
    if not facts.started:
        if facts.killed and facts.killed not in POLICY_KILLS:
            why = f"the host stopped the sandbox before the program started: {facts.killed}"
            return Blame(verdict=INFRASTRUCTURE, kind="runner_lost", reason=why)
        why = facts.setup_error or "set-up ended before it reported"
        if facts.killed:
            why = f"set-up had not finished when the sandbox was killed ({facts.killed}): {why}"
        kind = "harness_launch" if facts.setup_errno in (errno.ENOENT, errno.EACCES) else "sandbox"
        return Blame(verdict=INFRASTRUCTURE, kind=kind, reason=f"sandbox set-up failed: {why}")
    if facts.killed and facts.killed not in POLICY_KILLS:
        why = f"the host killed the program: {facts.killed}"
        return Blame(verdict=INFRASTRUCTURE, kind="runner_lost", reason=why)
    if facts.killed:
        return Blame(verdict=POLICY, reason=f"killed by the host: {facts.killed.replace('_', ' ')} exceeded")
    if facts.exit_code not in (0, None) and facts.proxy_failed_calls > 0:
        why = (
            f"the proxy failed {facts.proxy_failed_calls} of the harness's model calls "
            f"(last: {facts.last_proxy_failure[:1000]}); it exited with {facts.exit_code}"
        )
        return Blame(verdict=INFRASTRUCTURE, kind="model_unavailable", reason=why)
    return Blame(verdict=POLICY, reason=f"the program exited with {facts.exit_code}")
