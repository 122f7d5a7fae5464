"""Trace-driven cluster simulator for the scheduling policies (`gyre sim`).

The discrete-event engine (`engine.Simulation`) runs the live scheduler's own policy functions
on a virtual clock. What is modelled, and how:
- **Rollout.** A rollout cell serves at most `executions_per_cell` executions at full speed; an
  execution holds a slot for its (timeout-capped) duration. The task queue is FIFO: an admitted
  group's executions start in admission order as slots free up (the group's staleness counts
  from its admission). New executions go to the fullest cell with room, so the emptiest cells are
  cheap to free.
- **Migration.** Freeing a rollout cell moves its executions to other cells (`policy.migration`)
  with their KV cache: the context an execution has built so far (its tokens in proportion to the
  time it has run, at most `max_context_tokens`) times `kv_bytes_per_token`. The moves out of one
  cell share its link (`link_bytes_per_s`), so each of them pauses `migrate_s` plus all of that
  cell's KV bytes over the link, and the freed cell spends as long on the transfer.
- **Joining and leaving training.** A satellite's switch to training also pays the weight
  broadcast (`replica_bytes` over its link). A training round whose members differ from the
  previous round's first forms the data-parallel group anew (`group_setup_s`): cells joining or
  leaving make the whole group pay.
- **Training in microbatches.** A step trains the tokens of its groups in lockstep rounds of one
  microbatch per training cell (`microbatch_tokens`); the last round of available tokens is split
  evenly. Every round with n > 1 members ends with a ring all-reduce of the gradients
  (`Workload.allreduce_s(n)`: 2(n-1)/n of the gradient bytes over each link). Cells join or leave
  a step only between rounds: a satellite that finishes switching waits for the running round,
  and one told to leave finishes its microbatch first.
- **Starting a step.** Its first microbatch round begins `step_start_s` after its first group is
  assigned (live: the trainer fetches the samples first); cells that finish switching into
  training meanwhile are members from that first round.
- **Weight publication.** After a step's B groups are trained, the optimizer update and weight
  publication take `step_overhead_s` on one training cell (an update always holds one: if every
  cell was told to leave, one stays until it is published); no training happens meanwhile (the
  next step needs the new weights); rollout goes on. The version then increments.
- **Staleness.** Groups carry their admission version; the engine asserts the policy kept the
  bound.
"""
