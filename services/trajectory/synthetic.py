"""Seeded synthetic agent executions for tests and benchmarks (pure: randomness from the seed).

An execution here looks like a long coding-agent run: a main agent alternates model turns and
tool observations in a growing context; now and then it starts a sub-agent (own context, its
final answer pasted back into the main context as plain context), a call fails and is retried
with the same prompt (a fork), and when the context passes `compaction_context_tokens` a
summary call condenses it and the main agent restarts from system prompt + task + summary.
Prompts are sent as the proxy sends them: a delta against the agent's previous call, and in full
after a compaction restart (a new context).

Token ids follow a Zipf law by id (frequent tokens get small ids, as in a BPE vocabulary built by
merge frequency); the unigram entropy is reported by `token_entropy_bits` so a storage figure can
be read against it.

Use:
    records = generate_execution("e1", config=SyntheticConfig(seed=7, target_tokens=1_000_000))
    # -> list[CallRecord] in the order the proxy would publish them
    json_lines = [record_to_json(r) for r in records]   # DESIGN section 4 shape
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np

from services.trajectory.records import CallMeta, CallRecord, Int32Array, PromptDelta

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True, kw_only=True)
class SyntheticConfig:
    seed: int = 0
    target_tokens: int = 200_000
    """Stop once the execution holds at least this many unique tokens."""
    vocab_size: int = 151_936
    zipf_a: float = 1.15
    zipf_q: float = 2.7
    """Zipf-Mandelbrot p(id) ~ 1 / (id + q)^a over the vocabulary: about 10.4 bits per token,
    close to the unigram entropy of BPE tokens in English and code (~10-11 bits)."""
    system_prompt_tokens: int = 1_500
    task_tokens: int = 300
    output_tokens_mean: float = 220.0
    observation_tokens_mean: float = 1_400.0
    compaction_context_tokens: int = 100_000
    summary_tokens: int = 900
    sub_agent_probability: float = 0.04
    retry_probability: float = 0.03
    policy_version: int = 0
    calls_per_version: int = 60
    """Every this many calls the policy version goes up by one (weights streamed in mid-run)."""
    split_version_probability: float = 0.05
    """Chance that a weight update lands in the middle of a call's output."""


class _Generator:
    def __init__(self, execution_id: str, config: SyntheticConfig) -> None:
        self.execution_id = execution_id
        self.c = config
        self.rng = np.random.default_rng(config.seed)
        p = 1.0 / (np.arange(config.vocab_size) + config.zipf_q) ** config.zipf_a
        self.cdf = np.cumsum(p / p.sum())
        self.records: list[CallRecord] = []
        self.unique_tokens = 0
        self.last_of_agent: dict[str, tuple[str, Int32Array]] = {}
        """agent_id -> (call_id, prompt + output) of its last call."""

    def tokens(self, n: int) -> Int32Array:
        ids = np.searchsorted(self.cdf, self.rng.random(n))
        return np.minimum(ids, self.c.vocab_size - 1).astype(np.int32)

    def length(self, mean: float, low: int, high: int) -> int:
        return int(np.clip(self.rng.lognormal(np.log(mean), 0.8), low, high))

    def version(self) -> int:
        return self.c.policy_version + len(self.records) // self.c.calls_per_version

    def call(
        self, role: str, agent_id: str, prompt: Int32Array, *, full: bool = False, finish: str = "stop"
    ) -> Int32Array:
        """Record one call of `agent_id` on `prompt`; returns its output ids."""
        n_out = self.length(self.c.output_tokens_mean, 8, 4_000)
        output = self.tokens(n_out)
        logprobs = -self.rng.exponential(0.35, n_out).astype(np.float32)
        version = self.version()
        versions = np.zeros(0, np.int64)
        if n_out > 1 and self.rng.random() < self.c.split_version_probability:
            cut = int(self.rng.integers(1, n_out))
            versions = np.concatenate([np.full(cut, version, np.int64), np.full(n_out - cut, version + 1)])
        previous = self.last_of_agent.get(agent_id)
        body: Int32Array | PromptDelta = prompt
        new_tokens = len(prompt)
        if previous is not None and not full:
            parent_id, parent_tokens = previous
            shared = _common_prefix(parent_tokens, prompt)
            body = PromptDelta(parent_call_id=parent_id, num_shared_tokens=shared, new_ids=prompt[shared:])
            new_tokens = len(prompt) - shared
        call_id = str(uuid.UUID(bytes=self.rng.bytes(16), version=4))
        started = EPOCH + timedelta(seconds=len(self.records) * 7)
        self.records.append(
            CallRecord(
                execution_id=self.execution_id,
                call_id=call_id,
                agent_role=role,
                agent_id=agent_id,
                prompt=body,
                output_ids=output,
                output_logprobs=logprobs,
                policy_version=version,
                output_policy_versions=versions,
                meta=CallMeta(
                    engine_id=f"cell-{1 + int(self.rng.integers(0, 4))}",
                    finish_reason=finish,
                    started_at=started,
                    finished_at=started + timedelta(seconds=5),
                ),
            )
        )
        self.unique_tokens += new_tokens + n_out
        self.last_of_agent[agent_id] = (call_id, np.concatenate([prompt, output]))
        return output

    def turn(self, role: str, agent_id: str, context: Int32Array, *, full: bool = False) -> Int32Array:
        """A model turn with an occasional failed attempt first; returns the kept output."""
        if self.rng.random() < self.c.retry_probability:
            self.call(role, agent_id, context, full=full, finish="cancelled")
            full = False
        return self.call(role, agent_id, context, full=full)

    def sub_agent(self, index: int, instruction: Int32Array, system: Int32Array) -> Int32Array:
        agent_id = f"sub-{index}"
        context = np.concatenate([system, instruction])
        output = self.turn("sub", agent_id, context)
        for _ in range(int(self.rng.integers(2, 8))):
            observation = self.tokens(self.length(self.c.observation_tokens_mean / 2, 20, 6_000))
            context = np.concatenate([context, output, observation])
            output = self.turn("sub", agent_id, context)
        return output

    def run(self) -> list[CallRecord]:
        system, task = self.tokens(self.c.system_prompt_tokens), self.tokens(self.c.task_tokens)
        sub_system = self.tokens(self.c.system_prompt_tokens // 2)
        context = np.concatenate([system, task])
        full, num_subs = True, 0
        while self.unique_tokens < self.c.target_tokens:
            output = self.turn("main", "main", context, full=full)
            full = False
            if self.rng.random() < self.c.sub_agent_probability:
                answer = self.sub_agent(num_subs, output[: max(1, len(output) // 2)], sub_system)
                num_subs += 1
                observation = answer.copy()  # pasted back: context here, however it was made
            else:
                observation = self.tokens(self.length(self.c.observation_tokens_mean, 20, 12_000))
            context = np.concatenate([context, output, observation])
            if len(context) > self.c.compaction_context_tokens:
                summary = self.call("summary", "main", np.concatenate([context, self.tokens(40)]))
                context = np.concatenate([system, task, summary, self.tokens(20)])
                full = True
        return self.records


def generate_execution(execution_id: str, *, config: SyntheticConfig | None = None) -> list[CallRecord]:
    """The call records of one synthetic execution, in publication order (deterministic per seed)."""
    return _Generator(execution_id, config or SyntheticConfig()).run()


def token_entropy_bits(config: SyntheticConfig, num_samples: int = 200_000) -> float:
    """Empirical unigram entropy of the synthetic token distribution, in bits per token."""
    ids = _Generator("entropy", config).tokens(num_samples)
    _, counts = np.unique(ids, return_counts=True)
    p = counts / counts.sum()
    return float(-(p * np.log2(p)).sum())


def _common_prefix(a: Int32Array, b: Int32Array) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n
