"""Score a fixed set of instances at one policy version, each sampled several times (shell: torch, sandbox).

The built-in agent runs in-process, driven by the weights being scored, and the evaluator grades
each workspace in its sandbox (`warmstart.rollout`). Sample `k` of instance `name` draws from
torch's generator seeded with (`seed`, `name`, `k`): the same weights give the same rewards, and
two versions scored with the same seed share their random numbers, so a paired gain measures the
weights rather than the draw.

Scores are cached by the SHA-256 of the weights file and the protocol (temperature, turns,
seed, samples), each instance by its name and its files' digest: a version whose weights are
byte-identical to one already scored (the control arm's, which a learning rate of 0 leaves
untouched) is not scored again. The cache is a JSON file per digest under `cache_dir`.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

WEIGHTS_FILE = "model.safetensors"


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeProtocol:
    samples: int = 4
    """Samples per instance (at least 4: one sample of a tiny policy at 0.7 is a coin flip)."""
    temperature: float = 0.7
    """The training temperature: what the policy does when it trains, not its greedy best."""
    max_turns: int = 3
    seed: int = 0
    max_tokens: int = 128


def weights_digest(model_dir: Path) -> str:
    """SHA-256 of a model folder's weights file (what the scores depend on)."""
    h = hashlib.sha256()
    with (model_dir / WEIGHTS_FILE).open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def instance_digest(folder: Path) -> str:
    """SHA-256 over an instance folder's files: a cached score is for this instance's content, not
    only its name (another task set reuses the names)."""
    h = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(folder)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def sample_seed(seed: int, name: str, k: int) -> int:
    """The torch seed of sample `k` of instance `name` (stable across processes, unlike hash()).

    Example: sample_seed(0, "terminal-0001", 2) == sample_seed(0, "terminal-0001", 2)
    """
    return zlib.crc32(f"{seed}/{name}/{k}".encode())


def score(
    model_dir: Path,
    tokenizer_dir: Path,
    tasks: Path,
    names: Sequence[str],
    protocol: ProbeProtocol,
    *,
    cache_dir: Path | None = None,
    say: Callable[[str], None] = lambda m: None,
) -> dict[str, list[float]]:
    """Instance -> its `protocol.samples` rewards with the weights in `model_dir`."""
    import torch
    from transformers import AutoTokenizer

    from gyre_app.warmstart.rollout import LocalPolicy, make_grader, solve
    from services.trainer.policy import load_model

    key = hashlib.sha256(
        json.dumps({"weights": weights_digest(model_dir), **asdict(protocol)}, sort_keys=True).encode()
    ).hexdigest()[:24]
    cached: dict[str, list[float]] = {}
    path = cache_dir / f"{key}.json" if cache_dir else None
    if path and path.is_file():
        cached = json.loads(path.read_text())
    entry = {n: f"{n}@{instance_digest(tasks / n)}" for n in names}
    todo = [n for n in names if entry[n] not in cached]
    if todo:
        torch.set_num_threads(1)  # see TrainConfig.threads: a second thread only spins on a busy machine
        policy = LocalPolicy(
            model=load_model(model_dir),
            tokenizer=AutoTokenizer.from_pretrained(tokenizer_dir),
            max_tokens=protocol.max_tokens,
            temperature=protocol.temperature,
        )
        grader = make_grader()
        for i, name in enumerate(todo):
            rewards = []
            for k in range(protocol.samples):
                torch.manual_seed(sample_seed(protocol.seed, name, k))
                rewards.append(solve(policy, tasks / name, grader=grader, max_turns=protocol.max_turns).score)
            cached[entry[name]] = rewards
            if (i + 1) % 8 == 0:
                say(f"scored {i + 1}/{len(todo)} instances with {model_dir}")
        if path:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(cached))
            tmp.replace(path)
    else:
        say(f"{len(names)} instances already scored with the weights in {model_dir}")
    return {n: cached[entry[n]] for n in names}
