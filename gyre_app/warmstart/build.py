"""`gyre model init DIR --warm-start`: build (or reuse) the warm-started tiny model (shell: files, torch).

Steps: generate the train split of the three families (seeded), have the scripted solver run
the built-in agent on each instance (`scripted`), fit the tokenizer's merges to those
transcripts and write a fresh tiny model with it (`gyre model init`'s own code), render the
transcripts as the proxy would (`tokens`), and fine-tune through the trainer's step in
supervised mode (`train`).

Cache: `<state>/warmstart/<key>/` where the key hashes every input — the seed, the sizes, the
training settings and the source of every module the result depends on — so a change to any
of them builds anew. `warmstart.json` there lists each file's SHA-256; a cached folder whose
files do not match (corrupt, truncated, half-deleted) is removed and rebuilt, said aloud.
Builds happen in a temporary sibling folder renamed into place; installing into DIR replaces
its files only after they were copied beside it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import gyre_app.warmstart as warmstart_package
import services.evaluator.generate as generate_package
import services.runner.agent as agent_package
from gyre_app.warmstart.scripted import record_transcript
from gyre_app.warmstart.tokens import Tokenizer, render_transcript, transcript_texts
from gyre_app.warmstart.train import TrainConfig, fine_tune
from services.engine import model_init
from services.evaluator.generate.families import build, plan
from services.trainer import loss, microbatch, packing, policy, steps

MANIFEST = "warmstart.json"
FORMAT = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class WarmStartConfig:
    seed: int = 0
    counts: tuple[tuple[str, int], ...] = (("repo-gen", 24), ("repair", 24), ("terminal", 96))
    """(`gyre tasks generate` family, instances generated) the scripted solver demonstrates; the
    train split (3 of every 4) becomes transcripts. Many instances seen a few times each
    generalise; 9 seen 25 times each were memorised (held-out replies garbled even greedy).
    Terminal tasks weigh most: they are what `gyre demo --learn` trains on, and their transcripts
    record in milliseconds, where every repo-gen and repair transcript runs pytest. 48 of each
    family in 80 steps took 528 s and left every held-out terminal result wrong."""
    compact_every: int = 3
    """Every n-th instance runs with a small context budget, so its transcript holds a compaction."""
    stop_early_fraction: float = 0.2
    """Share of demonstrations that declare the work done before their last workspace-changing
    step (`scripted.stopped_early`): the warm-started policy then sometimes stops too soon, so a
    group's executions earn different rewards and RL has a direction to move (finish the work).
    Kept below every "continue" choice's share: at 0.4 stopping was repo-gen's likeliest reply
    (its continuations split between writing the module and delegating it), even greedy."""
    wander_fraction: float = 0.3
    """Share of demonstrations that look around after their first step (`scripted.wandering`:
    the listing, then the task's file) and then do the rest of the reference solution. Under the
    demo's turn budget (the reference's turns, no spare) such a run is cut before its last write:
    the execution times out by its own budget, is graded for the partial work, and RL has a
    second direction (get on with the work) whose timeouts follow the policy, not the machine's
    load. Drawn from the same number as `stop_early_fraction` (the band above it), so the two
    never mix in one demonstration."""
    vocab_size: int = 2048
    """Merges fitted to the transcripts (whole words of the tool list, code and commands)."""
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)


def each(families: Sequence[str], count: int) -> tuple[tuple[str, int], ...]:
    """`count` instances of every family, as `WarmStartConfig.counts`.

    Example: each(["repair", "terminal"], 8) -> (("repair", 8), ("terminal", 8))
    """
    return tuple((f, count) for f in families)


def _source_digest() -> str:
    """SHA-256 over the source of everything the warm-started weights depend on."""
    files: list[Path] = []
    for package in (warmstart_package, generate_package, agent_package):
        files += sorted(Path(next(iter(package.__path__))).glob("*.py"))
    for module in (model_init, loss, microbatch, packing, policy, steps):
        assert module.__file__ is not None
        files.append(Path(module.__file__))
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def cache_key(config: WarmStartConfig) -> tuple[str, dict[str, Any]]:
    inputs = {"format": FORMAT, "config": dataclasses.asdict(config), "source": _source_digest()}
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:20], inputs


def _file_digests(folder: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.iterdir())
        if p.is_file() and p.name != MANIFEST
    }


def verify(folder: Path) -> str:
    """'' when the cached folder is intact, else what is wrong with it."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        expected = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"unreadable {MANIFEST}: {exc}"
    actual = _file_digests(folder)
    bad = sorted(n for n in set(expected) | set(actual) if expected.get(n) != actual.get(n))
    return f"files differ from their recorded SHA-256: {', '.join(bad)}" if bad else ""


def _build(dest: Path, config: WarmStartConfig, inputs: dict[str, Any], say: Callable[[str], None]) -> None:
    started = time.perf_counter()
    planned = [p for family, n in config.counts for p in plan([family], count=n) if p.split == "train"]

    def one(p: Any) -> Any:
        small = config.compact_every and p.index % config.compact_every == 1
        draw = random.Random(f"stop-early:{config.seed}:{p.name}").random()
        early = draw < config.stop_early_fraction
        wander = not early and draw < config.stop_early_fraction + config.wander_fraction
        return record_transcript(
            build(p, seed=config.seed),
            context_tokens=300 if small else 24000,
            stop_early=early,
            wander=wander,
        )

    with ThreadPoolExecutor(4) as pool:  # the scripted runs wait on pytest processes, not the CPU
        recorded = list(pool.map(one, planned))
    say(f"recorded {len(recorded)} scripted transcripts ({sum(len(r) for r in recorded)} calls)")
    base = cast(Tokenizer, model_init.build_tokenizer())
    corpus = [text for calls in recorded for text in transcript_texts(base, calls)]
    model_init.init_model(dest, seed=config.seed, vocab_size=config.vocab_size, corpus=corpus)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(dest)
    model = policy.load_model(dest)
    transcripts = [render_transcript(tokenizer, calls) for calls in recorded]
    report = fine_tune(
        model,
        transcripts,
        config=config.train,
        seed=config.seed,
        progress=lambda step, value: (
            say(
                f"step {step + 1}/{config.train.steps} loss {value:.3f} "
                f"({time.perf_counter() - started:.0f} s)"
            )
            if (step + 1) % 10 == 0 or step == 0
            else None
        ),
    )
    model.save_pretrained(dest)
    (dest / "gyre_model.json").write_text(
        json.dumps({"created_by": "gyre model init --warm-start", "seed": config.seed}) + "\n"
    )
    summary = {
        "inputs": inputs,
        "transcripts": len(transcripts),
        "train": dataclasses.asdict(report),
        "build_s": round(time.perf_counter() - started, 1),
    }
    (dest / MANIFEST).write_text(json.dumps({**summary, "files": _file_digests(dest)}, indent=1) + "\n")


def cached_warm_start(
    state_dir: Path, config: WarmStartConfig, *, say: Callable[[str], None] = lambda m: None
) -> tuple[Path, bool]:
    """The cached warm-started model folder for `config`, built when missing or corrupt; (folder, built)."""
    key, inputs = cache_key(config)
    root = state_dir / "warmstart"
    folder = root / key
    if folder.exists():
        problem = verify(folder)
        if not problem:
            return folder, False
        say(f"cached warm start {folder} is corrupt ({problem}); rebuilding")
        shutil.rmtree(folder)
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=root))
    try:
        _build(staging, config, inputs, say)
        staging.rename(folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return folder, True


def install(source: Path, directory: Path) -> None:
    """Copy a model folder's files to `directory`, replacing the checkpoint files it holds."""
    directory.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".install.", dir=directory))
    try:
        for f in source.iterdir():
            if f.is_file():
                shutil.copy2(f, staging / f.name)
        for f in staging.iterdir():
            f.replace(directory / f.name)  # rename within one filesystem: each file whole or not at all
    finally:
        shutil.rmtree(staging, ignore_errors=True)
