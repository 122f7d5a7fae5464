"""One long trajectory's microbatch on the tiny model: time and peak memory (shell, benchmark).

    python -m bench.long_microbatch --tokens 8192 --json

Builds one sample of N tokens (3 targets at its end), plans it as the trainer does with the
default 4,096-token budget (a longer one trains alone: `plan_microbatches`) and times
`microbatch_gradient` (forward and backward through tree attention) on the CPU. Prints one JSON
object last: tokens, microbatches, seconds (wall), cpu_s, max_rss_mb.
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.long_microbatch", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    ns = parser.parse_args(argv)
    from transformers import AutoModelForCausalLM

    from services.engine.model_init import init_model
    from services.trainer.loss import LossConfig
    from services.trainer.microbatch import microbatch_gradient, plan_microbatches
    from services.trainer.samples import Sample

    n = ns.tokens
    with tempfile.TemporaryDirectory(prefix="gyre-long-mb-") as work:
        model = AutoModelForCausalLM.from_pretrained(str(init_model(Path(work) / "model")))
    sample = Sample(
        execution_id="e",
        trajectory_id="t",
        agent_role="main",
        token_ids=tuple(1 + i % 50 for i in range(n)),
        loss_mask=(False,) * (n - 3) + (True,) * 3,
        token_weight=(0.0,) * (n - 3) + (1 / 3,) * 3,
        old_logprobs=(0.0,) * n,
        policy_versions=(0,) * n,
        reward=1.0,
        advantage=0.5,
    )
    plan = plan_microbatches([sample], max_tokens=4096, max_sample_tokens=65536)
    wall, cpu = time.perf_counter(), time.process_time()
    microbatch_gradient(model, plan[0], LossConfig())
    figures = {
        "tokens": n,
        "microbatches": len(plan),
        "seconds": round(time.perf_counter() - wall, 1),
        "cpu_s": round(time.process_time() - cpu, 1),
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
    }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
