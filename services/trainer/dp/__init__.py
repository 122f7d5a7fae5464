"""Dynamic data parallelism: microbatches handed out as members ask, a gloo group per membership (shell).

The core cell hosts a `torch.distributed.TCPStore`. A step writes its microbatches there; every
member (the core included) takes the next one with an atomic `store.add`, so work goes to
whoever asks first. Membership is organised in *epochs*: each epoch has a fixed member list and
its own process group (`ProcessGroupGloo` on a `PrefixStore`, `ProcessGroupNCCL` on GPUs). A
satellite that asks to join mid-step makes the core close the epoch at its next microbatch
boundary: every member all-reduces the float64 sum of the gradients it computed in that epoch,
then the next epoch opens with the new member list and the core broadcasts the step's weights.
A leaving satellite finishes its microbatch, reduces, and is not in the next epoch.

Why the step gradient is the same whatever the membership: the loss is a weighted sum whose
weights are fixed for the whole batch (DESIGN section 4), so the step gradient is the sum of the
per-microbatch gradients; each microbatch is computed exactly once (the counter), in the same
weights, and the sums are taken in float64, so the partition only changes rounding far below
float32 resolution.

A satellite that dies (its heartbeat, `alive/<cell>` ticked by a thread of its own, stops for
`dead_after_s`) takes its unreduced partial sum with it. Redoing only "its" microbatches would
need to know which were in that sum; instead the core aborts the epoch (`end` with `abort`:
survivors skip the reduction), drops the dead member and computes the step again as a new
*attempt* (fresh counters) from the same weights and microbatches, so the gradient stays exact.
After `max_attempts` the step fails with StepFailed and the step loop retries it later (its
groups stay queued). Not covered: a member dying inside a collective makes the collective raise
on the core (then the same retry) but may also crash other satellites, which then count as lost.

The package holds three parts:
- `membership`: the rendezvous store, epoch plans, joins, leaves and heartbeats (who is in);
- `gradient`: the core's side of the gradient protocol (epochs, counters, reductions, attempts);
- `satellite_loop`: the satellite process's side (admission, compute, reduce until released).

Sessions and epochs: every admitted join opens a *session* of the satellite (`session/<cell>`
counts them) and records the first epoch it may take, the core's next epoch at that moment
(`join/<cell>/<n>`); the satellite walks the epochs from there and takes those naming it, so a
satellite that left and rejoined quickly never takes up an epoch of its earlier session (whose
group is gone). Its release (`released/<cell>/<n>`) is per session and never deleted. Before
anyone forms an epoch's group, each satellite marks itself ready (`epoch/<k>/ready/<cell>`) and
the core says `epoch/<k>/go` once all are; a member not ready within `join_timeout_s` (or silent)
is dropped and the epoch ends as aborted before it started, costing no work: a join that fails
fails in seconds, never in the collective timeout, and the cell ends out of the step.

Store keys: `model/config`, `loss/config`; `epoch/latest`; `epoch/<k>` (JSON plan);
`epoch/<k>/ready/<cell>`, `epoch/<k>/go`; `epoch/<k>/end` (JSON {"next": k+1, "abort"?});
`step/<v>/mb/<i>`; per attempt a: `step/<v>/<a>/next`, `step/<v>/<a>/done`,
`step/<v>/<a>/targets/<cell>`, `step/<v>/<a>/loss/<cell>`; `count/<cell>`; `session/<cell>`,
`join/<cell>/<n>`, `released/<cell>/<n>`; `alive/<cell>`.
"""

from services.trainer.dp.gradient import DataParallelCore, StepGradient
from services.trainer.dp.membership import EpochPlan, JoinTicket, LeaveResult, StepFailed, make_group
from services.trainer.dp.satellite_loop import run_satellite

__all__ = [
    "DataParallelCore",
    "EpochPlan",
    "JoinTicket",
    "LeaveResult",
    "StepFailed",
    "StepGradient",
    "make_group",
    "run_satellite",
]
