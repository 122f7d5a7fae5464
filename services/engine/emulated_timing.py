"""How long an emulated cell's engine takes: decode steps, prefill, KV moves, weight loads (pure).

EMULATION ONLY. The emulated engine (`emulated_engine.py`) spends these durations instead of
computing; every figure here is derived from a profile (`gyre_app/emulation/profile.py`) whose
figures name their published sources. It is a roofline, not a measurement:

- a decode step of `b` sequences holding `C` context tokens in all reads the cell's weights once
  and every cached token's KV once, and computes 2 FLOPs per parameter per sequence: it takes
  max(bytes / memory bandwidth, FLOPs / (peak x MFU));
- a prefill of `n` uncached tokens computes 2 FLOPs per parameter per token at the prefill MFU,
  and reads the weights at least once;
- moving a generation's KV carries `kv_bytes_per_token` per cached token over the cell's link;
- loading a weight version carries the weights over the link that feeds the cell.

Attention FLOPs are left out (at 2 x parameters per token they are under 10 % of a 7-70B
model's FLOPs below ~16k tokens of context, and decode is memory-bound there anyway); the
context's cost is counted in bytes, which is what bounds decode.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineTiming:
    """One cell's engine, in the units the roofline needs (all > 0 but the counts)."""

    weight_bytes: float
    """Bytes of one copy of the weights, spread over the cell's accelerators."""
    kv_bytes_per_token: float
    memory_bytes_per_s: float
    """Effective memory bandwidth of the whole cell (datasheet bandwidth x utilisation)."""
    flops_per_token: float
    """Forward FLOPs per token: 2 x parameters (active parameters for a mixture of experts)."""
    decode_flops_per_s: float
    """The cell's peak x decode MFU."""
    prefill_flops_per_s: float
    """The cell's peak x prefill MFU."""
    max_num_seqs: int
    """Most generations decoded together; more wait (vLLM's `max_num_seqs`)."""
    kv_capacity_tokens: int
    """Context tokens the cell's memory holds after the weights."""
    link_bytes_per_s: float
    """The cell's network: KV moves between cells."""
    weight_load_bytes_per_s: float
    """What a new weight version arrives at."""

    def decode_step_s(self, *, batch: int, context_tokens: int) -> float:
        """One token for each of `batch` sequences holding `context_tokens` in all.

        Example (8B bf16 on 8 H100, 80 % of 3.35 TB/s each): 16.4 GB of weights, batch 1,
        1,000 tokens of 147 kB -> (16.4e9 + 1.47e8) / 2.14e13 = 0.77 ms
        """
        if batch <= 0:
            return 0.0
        memory_s = (self.weight_bytes + context_tokens * self.kv_bytes_per_token) / self.memory_bytes_per_s
        compute_s = batch * self.flops_per_token / self.decode_flops_per_s
        return max(memory_s, compute_s)

    def prefill_s(self, num_tokens: int) -> float:
        """Prefill of `num_tokens` uncached prompt tokens (0 when the prefix cache had them all)."""
        if num_tokens <= 0:
            return 0.0
        compute_s = num_tokens * self.flops_per_token / self.prefill_flops_per_s
        return max(compute_s, self.weight_bytes / self.memory_bytes_per_s)

    def kv_move_s(self, num_tokens: int) -> float:
        """Carrying `num_tokens` of one generation's KV to another cell."""
        return max(num_tokens, 0) * self.kv_bytes_per_token / self.link_bytes_per_s

    def weight_load_s(self) -> float:
        return self.weight_bytes / self.weight_load_bytes_per_s

    def kv_bytes(self, num_tokens: int) -> int:
        return int(max(num_tokens, 0) * self.kv_bytes_per_token)


def advance(
    timing: EngineTiming, *, budget_s: float, batch: int, context_tokens: int, carry: float
) -> tuple[int, float]:
    """Whole decode steps that fit in `budget_s` of modelled time, and the fraction carried over.

    The emulated engine advances in ticks of wall time rather than one wake-up per token (256
    cells at ~100 steps/s each would be 25,600 wake-ups/s in one process); over a tick the batch
    and its context are taken as constant, which they are to within the tokens of that tick.

    Example: a 10 ms step, budget 25 ms, carry 0.6 -> 3.1 steps -> (3, 0.1)
    """
    step_s = timing.decode_step_s(batch=batch, context_tokens=context_tokens)
    if step_s <= 0.0:
        return 0, 0.0
    total = carry + budget_s / step_s
    whole = int(total)
    return whole, total - whole
