"""The trainer's Prometheus series, from the steps it publishes (shell)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from gyre.metrics import on_published
from gyre.trainer.v1 import events_pb2

POLICY_VERSION = Gauge("gyre_trainer_policy_version", "Optimizer steps applied (the last committed step).")
STALENESS = Gauge(
    "gyre_trainer_step_staleness_steps",
    "Staleness of the last step's samples (trainer version minus the oldest version behind their "
    "tokens), mean and max.",
    ["stat"],
)
LOSS = Gauge("gyre_trainer_step_loss", "Loss of the last step.")
SAMPLES = Counter("gyre_trainer_samples_total", "Samples trained on.")
DROPPED_STALE = Counter("gyre_trainer_samples_dropped_stale_total", "Samples dropped as too stale.")


def observe_step(step: events_pb2.StepCompleted) -> None:
    POLICY_VERSION.set(step.version.steps)
    STALENESS.labels(stat="mean").set(step.staleness_mean_steps)
    STALENESS.labels(stat="max").set(step.staleness_max_steps)
    LOSS.set(step.loss)
    SAMPLES.inc(step.num_samples)
    DROPPED_STALE.inc(step.num_samples_dropped_stale)


def register() -> None:
    on_published(events_pb2.StepCompleted, observe_step)
