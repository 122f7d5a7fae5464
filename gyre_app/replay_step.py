"""Re-derive the samples a step trained on and check them against the trainer's checksum (shell).

The trainer records, with each step, the exact `StreamSamples` request that fetched its samples,
the staleness rule that chose among them, and the SHA-256 of the chosen ones
(`services/trainer/batch_digest.py`). Sending the request again to the trajectory service,
applying the same rule and hashing the result must give the same digest: any difference means
the batch can no longer be reproduced from the event log (a call or reward changed or arrived
late), which is what this audit is for.
"""

from __future__ import annotations

from dataclasses import dataclass

from gyre.errors import Conflict
from gyre.trainer.v1 import trainer_pb2
from gyre_app.client import GyreClient
from services.trainer.batch_digest import batch_sha256
from services.trainer.samples import Sample, StalenessAction, admit, staleness_steps
from services.trainer.source import samples_from_response


@dataclass(frozen=True, slots=True, kw_only=True)
class StepReplay:
    step: trainer_pb2.Step
    fetched: tuple[Sample, ...]
    trained: tuple[Sample, ...]
    """The fetched samples the staleness rule kept, in batch order: what the step trained on."""
    derived_sha256: str
    task_of: dict[str, str]
    """execution id -> task id, as the trajectory service answered."""

    @property
    def version(self) -> int:
        return self.step.version.steps

    @property
    def trainer_version(self) -> int:
        return self.step.staleness.trainer_version.steps

    @property
    def matches(self) -> bool:
        return self.derived_sha256 == self.step.batch_sha256

    def staleness(self, sample: Sample) -> int:
        return staleness_steps(sample, trainer_version=self.trainer_version)


async def replay_step(client: GyreClient, version: int) -> StepReplay:
    """Fetch step `version`'s record and re-derive its batch; `NotFound` for a step never trained."""
    step = await client.step(version)
    if not step.batch_sha256 or not step.HasField("samples_request"):
        raise Conflict(
            f"step {version} was recorded before the trainer kept batch checksums: nothing to audit"
        )
    fetched: tuple[Sample, ...] = ()
    for response in await client.stream_samples(step.samples_request):
        fetched += samples_from_response(response, index=len(fetched))
    # The step committed, so under `fail` no sample passed the bound either: dropping is the same rule.
    admission = admit(
        fetched,
        trainer_version=step.staleness.trainer_version.steps,
        max_staleness_steps=step.staleness.max_staleness_steps,
        action=StalenessAction.DROP,
    )
    return StepReplay(
        step=step,
        fetched=fetched,
        trained=admission.kept,
        derived_sha256=batch_sha256(admission.kept),
        task_of={
            e.execution_id: task_id
            for task_id in step.task_ids
            for e in (await client.group(task_id)).executions
        },
    )
