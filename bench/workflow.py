"""`python -m bench.workflow --json`: tracking rows per sink, export fidelity, the docs build.

- `tracker_rows_match`: every enabled sink (JSONL and each optional one installed) holds exactly
  one row per step. Default: a short run's events (`--steps` steps of one group of 4 executions,
  each with a model call, an end and a reward, then `StepCompleted`), published as the services
  publish them on a private NATS server, followed by the tracker. `--live`: a real run instead,
  `gyre up --track ...` then `gyre demo` on a private stack, checked against the trainer's steps.
- `export_logits_max_abs_diff`: a tiny model trained 2 optimizer steps and checkpointed as the
  trainer does, exported with `gyre export`'s code, loaded with plain transformers; the largest
  logit difference against the trainer's model.
- `docs_build_s`, `docs_broken_links`: `make docs` timed; the links mkdocs reports as broken in a
  non-strict build of the same site.
- `compose_up_s`, `compose_demo_ok` (where Podman is installed): deploy/docker-compose.yml brought
  up with podman-compose, the quick demo's loop against it, brought down (`make compose-smoke`);
  `compose_build_s` is the image build before it (0 when the images' hash is cached).
- `lora_update_bytes_ratio`: the bytes of the weight update a LoRA run publishes (the adapter,
  rank 8 on q/k/v/o, the default) over a full-weight update's, both written by the trainer's
  `publish` from bench.trainer's tiny model; `lora_update_bytes_ratio_7b_shape`: the same ratio
  from parameter counts for a Qwen2-7B-shaped model built on the meta device (no weights).
- `lora_reward_gain`: bench.trainer's learning task (`reward_gain`: mean reward of the last 5
  steps minus the first 5, 15 steps, seed 0) trained with LoRA adapters; beside it the controls
  on the same samples' seed: `lora_reward_gain_lr0` (learning rate 0: luck alone),
  `full_reward_gain` (every weight, bench.trainer's settings) and
  `lora_reward_gain_attention_only` (the default targets, without lm_head).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
PROJECT = "gyre-bench"
GROUP = (1.0, 0.0, 0.5, 1.0)


def installed_sinks() -> tuple[str, ...]:
    import importlib.util

    from gyre_app.track_sinks import OPTIONAL_PACKAGES

    return ("jsonl", *(n for n, p in OPTIONAL_PACKAGES.items() if importlib.util.find_spec(p) is not None))


async def publish_short_run(bus: Any, steps: int, tokenizer: Any) -> None:
    from gyre.common.v1 import ids_pb2
    from gyre.evaluator.v1 import evaluator_pb2
    from gyre.evaluator.v1 import events_pb2 as evaluator_events
    from gyre.events import new_event
    from gyre.proxy.v1 import events_pb2 as proxy_events
    from gyre.proxy.v1 import proxy_pb2
    from gyre.runner.v1 import events_pb2 as runner_events
    from gyre.trainer.v1 import events_pb2 as trainer_events

    output = tokenizer.encode('<tool_call>{"name": "ls", "arguments": {}}</tool_call>')
    for version in range(1, steps + 1):
        task_id = f"task-{version}-{uuid.uuid4().hex[:6]}"
        for index, reward in enumerate(GROUP):
            execution_id = f"{task_id}-e{index}"
            ref = ids_pb2.ExecutionRef(task_id=task_id, execution_id=execution_id, index_in_group=index)
            record = proxy_pb2.CallRecord(
                execution_id=execution_id,
                call_id=f"{execution_id}-c0",
                agent_id="main",
                full_prompt=proxy_pb2.FullPrompt(prompt_ids=tokenizer.encode("fix the failing test")),
                output_ids=output,
                finish_reason=proxy_pb2.CALL_FINISH_REASON_STOP,
            )
            record.started_at.FromSeconds(1_000 * version + index)
            record.finished_at.FromSeconds(1_000 * version + index + 2)
            for payload, producer in (
                (proxy_events.LlmCallRecorded(call=record), "proxy"),
                (runner_events.ExecutionFinished(execution=ref, family="terminal"), "runner"),
                (
                    evaluator_events.RewardAssigned(
                        grade=evaluator_pb2.Grade(
                            execution_id=execution_id, task_id=task_id, score=reward, assessable=True
                        )
                    ),
                    "evaluator",
                ),
            ):
                await bus.publish(new_event(payload, producer=producer, correlation_id=task_id))
        step = trainer_events.StepCompleted(
            version=ids_pb2.PolicyVersion(steps=version),
            num_groups_consumed=1,
            task_ids=[task_id],
            num_samples=len(GROUP),
            num_target_tokens=128,
            loss=0.1,
            duration_s=0.5,
        )
        await bus.publish(new_event(step, producer="trainer", correlation_id=task_id))


def tracker_from_events(steps: int, root: Path) -> dict[str, Any]:
    """The short run's events on a private NATS server, followed once by the tracker."""
    from transformers import AutoTokenizer

    from gyre.bus import Bus, BusConfig
    from gyre.devstack.embedded import start_nats, stop_nats_in
    from gyre_app.track_config import TrackSettings
    from gyre_app.track_follow import follow
    from gyre_app.track_readback import logged_steps
    from services.engine.model_init import init_model

    sinks = installed_sinks()
    os.environ["TRACKIO_DIR"] = str(root / "track" / "trackio")
    os.environ.setdefault("WANDB_SILENT", "true")
    model_dir = init_model(root / "model", seed=0, hidden_size=32, num_layers=1)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    server = start_nats(root / "nats")
    polls: list[int] = []

    def once(_: list[int]) -> bool:
        polls.append(1)
        return len(polls) == 1

    async def go() -> list[int]:
        bus = await Bus.connect(BusConfig(url=server.url, prefix="benchwf"))
        try:
            await publish_short_run(bus, steps, tokenizer)
            settings = TrackSettings(run_name="bench", project=PROJECT)
            result = await follow(
                bus, settings, root / "track", sinks=sinks, tokenizer_dir=model_dir, keep_going=once
            )
            return result.steps
        finally:
            await bus.close()

    t0 = time.perf_counter()
    try:
        followed = asyncio.run(go())
    finally:
        stop_nats_in(root / "nats")
    held = logged_steps(root / "track", sinks, project=PROJECT, run_name="bench")
    expected = list(range(1, steps + 1))
    return {
        "tracker_source": "published events (private NATS)",
        "tracker_sinks": list(sinks),
        "tracker_steps": steps,
        "tracker_rows_by_sink": {k: len(v) for k, v in held.items()},
        "tracker_rows_match": followed == expected and all(v == expected for v in held.values()),
        "tracker_follow_s": round(time.perf_counter() - t0, 2),
    }


def tracker_live(root: Path, timeout_s: float) -> dict[str, Any]:
    """`gyre up --track <all installed>` then `gyre demo` on a private stack; rows vs trainer steps."""
    from gyre_app.track_readback import logged_steps

    sinks = installed_sinks()
    os.environ["TRACKIO_DIR"] = str(root / "trackio")  # where this process's Trackio reader looks
    env = {k: v for k, v in os.environ.items() if not k.startswith("GYRE_")}
    env |= {
        "GYRE_STATE_DIR": str(root / "state"),
        "TRACKIO_DIR": str(root / "trackio"),
        "WANDB_SILENT": "true",
    }
    env["GYRE_TRACK_RUN_NAME"], env["GYRE_TRACK_PROJECT"] = "live", PROJECT

    def gyre(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "gyre_app.cli", *args]
        return subprocess.run(cmd, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout_s)

    t0 = time.perf_counter()
    try:
        up = gyre("up", "--track", ",".join(s for s in sinks if s != "jsonl"))
        if up.returncode != 0:
            raise RuntimeError(f"gyre up failed: {up.stderr[-2000:]}")
        folder = Path(json.loads(up.stdout)["tracking"])
        demo = gyre("demo", "--keep")
        # The stack trains on after the demo returns (its last group): wait until the trainer's
        # version has held still for a few seconds and the tracker has a row for each step.
        version, stable_since, deadline = -1, time.monotonic(), time.monotonic() + 120
        while time.monotonic() < deadline:
            status = gyre("status", "--json")
            if status.returncode != 0:  # a service restarting: ask again
                time.sleep(1)
                continue
            now = int(json.loads(status.stdout)["version"])
            if now != version:
                version, stable_since = now, time.monotonic()
            status_file = folder / "status.json"
            tracked = json.loads(status_file.read_text())["steps"] if status_file.exists() else 0
            if tracked == version and time.monotonic() - stable_since >= 5:
                break
            time.sleep(1)
    finally:
        gyre("down")
    held = logged_steps(folder, sinks, project=PROJECT, run_name="live")
    expected = list(range(1, version + 1))
    return {
        "tracker_source": "live run (gyre up --track, gyre demo)",
        "tracker_demo_rc": demo.returncode,
        "tracker_demo_stderr_tail": demo.stderr[-300:] if demo.returncode else "",
        "tracker_sinks": list(sinks),
        "tracker_steps": version,
        "tracker_rows_by_sink": {k: len(v) for k, v in held.items()},
        "tracker_rows_match": version > 0 and all(v == expected for v in held.values()),
        "tracker_live_s": round(time.perf_counter() - t0, 1),
    }


def export_diff(root: Path) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    from gyre_app.export_hf import export_step
    from services.engine.model_init import init_model
    from services.trainer.checkpoint import checkpoint_folder, save_checkpoint
    from services.trainer.policy import load_model

    torch.set_num_threads(1)
    model_dir = init_model(root / "export-model", seed=3)
    model = load_model(model_dir)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = torch.randint(0, model.config.vocab_size, (4, 64), generator=torch.Generator().manual_seed(0))
    for version in (1, 2):
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        save_checkpoint(model, optimizer, checkpoint_folder(root / "checkpoints", version), version=version)
    t0 = time.perf_counter()
    exported = export_step(root / "checkpoints", 2, root / "hf", tokenizer_dir=model_dir)
    export_s = time.perf_counter() - t0
    loaded = AutoModelForCausalLM.from_pretrained(exported.folder).float().eval()
    with torch.no_grad():
        diff = (loaded(input_ids=ids).logits - model.eval()(input_ids=ids).logits).abs().max().item()
    return {
        "export_logits_max_abs_diff": diff,
        "export_s": round(export_s, 3),
        "export_files": list(exported.files),
        "export_has_optimizer_state": "optimizer.pt" in exported.files,
    }


LORA_LEARNING_TARGETS = ("k_proj", "lm_head", "o_proj", "q_proj", "v_proj")
"""The toy task rewards output tokens below 256, a property of the output head: adapters on the
attention alone barely move it in 15 steps (`lora_reward_gain_attention_only`)."""
LORA_LEARNING_RATE = 5e-2
"""Adapters start at B = 0 and move by about the learning rate per step: LoRA is usually trained
at a higher rate than full fine-tuning (bench.trainer's 1e-2)."""


def lora_update_ratio(root: Path) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from services.trainer.lora import LoraSpec, attach_lora
    from services.trainer.policy import build_model, tiny_config
    from services.trainer.weights import publish, write_base_folder

    model = build_model(tiny_config(), seed=0)
    full = publish(model, root / "full", version=1)
    base = write_base_folder(model, root / "lora-base")
    adapter = publish(attach_lora(model, LoraSpec(), seed=0), root / "lora", version=1, base=base)
    with torch.device("meta"):
        shape = Qwen2Config(  # Qwen2-7B's published configuration
            vocab_size=152064,
            hidden_size=3584,
            intermediate_size=18944,
            num_hidden_layers=28,
            num_attention_heads=28,
            num_key_value_heads=4,
            tie_word_embeddings=False,
        )
        big = AutoModelForCausalLM.from_config(shape)  # type: ignore[no-untyped-call]
        total = sum(p.numel() for p in big.parameters())
        attach_lora(big, LoraSpec(), seed=0)
        lora = sum(p.numel() for n, p in big.named_parameters() if ".lora_" in n)
    return {
        "lora_update_bytes": adapter.size_bytes,
        "full_update_bytes": full.size_bytes,
        "lora_update_bytes_ratio": round(adapter.size_bytes / full.size_bytes, 5),
        "lora_update_bytes_ratio_7b_shape": round(lora / total, 6),
    }


def lora_learning(steps: int) -> dict[str, Any]:
    import torch

    from bench.trainer import bench_learning
    from services.trainer.lora import LoraSpec

    torch.set_num_threads(1)
    spec = LoraSpec(target_modules=LORA_LEARNING_TARGETS)
    runs = {
        "lora_reward_gain": bench_learning(steps, 0, lora=spec, learning_rate=LORA_LEARNING_RATE),
        "lora_reward_gain_lr0": bench_learning(steps, 0, lora=spec, learning_rate=0.0),
        "full_reward_gain": bench_learning(steps, 0),
        "lora_reward_gain_attention_only": bench_learning(
            steps, 0, lora=LoraSpec(), learning_rate=LORA_LEARNING_RATE
        ),
    }
    return {
        **{name: run["reward_gain"] for name, run in runs.items()},
        "lora_reward_by_step": runs["lora_reward_gain"]["reward_by_step"],
        "lora_learning": f"rank 8, alpha 16, targets {','.join(spec.target_modules)}, "
        f"lr {LORA_LEARNING_RATE}, {steps} steps, seed 0",
    }


def docs_figures() -> dict[str, Any]:
    t0 = time.perf_counter()
    strict = subprocess.run(["make", "docs"], cwd=REPO_ROOT, capture_output=True, text=True)
    build_s = time.perf_counter() - t0
    site = tempfile.mkdtemp(prefix="gyre-docs-")
    try:
        loose = subprocess.run(
            [str(Path(sys.executable).parent / "mkdocs"), "build", "--no-strict", "--site-dir", site],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        )
    finally:
        shutil.rmtree(site, ignore_errors=True)
    broken = [
        line for line in loose.stderr.splitlines() if "WARNING" in line and re.search(r"link|anchor", line)
    ]
    return {
        "docs_build_s": round(build_s, 1),
        "docs_build_ok": strict.returncode == 0,
        "docs_broken_links": len(broken),
    }


def compose_figures() -> dict[str, Any]:
    """`make compose-smoke`'s figures; none where Podman is not installed."""
    if shutil.which("podman") is None:
        return {}
    done = subprocess.run(
        [sys.executable, "-m", "gyre_app.compose_smoke", "--json"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    lines = done.stdout.strip().splitlines()
    summary = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {"error": done.stderr[-500:]}
    return {
        "compose_build_s": summary.get("build_s"),
        "compose_up_s": summary.get("compose_up_s"),
        "compose_demo_s": summary.get("demo_s"),
        "compose_demo_ok": bool(summary.get("compose_demo_ok")) and not summary.get("leftovers"),
        "compose_error": summary.get("error", ""),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.add_argument("--steps", type=int, default=5, help="steps of the short run (published events)")
    parser.add_argument("--live", action="store_true", help="track a real run on a private stack instead")
    parser.add_argument("--live-timeout-s", type=float, default=900.0)
    parser.add_argument("--no-compose", action="store_true", help="skip the compose smoke run")
    parser.add_argument("--lora-steps", type=int, default=15, help="steps of each LoRA learning run")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="gyre-bench-workflow-"))
    try:
        figures: dict[str, Any] = {}
        figures |= (
            tracker_live(root, args.live_timeout_s) if args.live else tracker_from_events(args.steps, root)
        )
        figures |= export_diff(root)
        figures |= lora_update_ratio(root)
        figures |= lora_learning(args.lora_steps)
        figures |= docs_figures()
        if not args.no_compose:
            figures |= compose_figures()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if not args.json:
        for key, value in figures.items():
            print(f"{key}: {value}")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
