"""Which proxy process owns an execution, when several serve one address (pure).

Several proxy processes share the HTTP port (SO_REUSEPORT: the kernel spreads connections over
them), but an execution's state lives in one process: its sticky engine, its renders in order,
the outputs its next prompt reuses, its open calls the revocation must count. So every
execution is pinned to one process, the *owner*, by a stable hash of its id: every process
computes the same owner without asking anyone, and a call landing elsewhere is forwarded to
the owner whole (`peers.forward`). The hash is CRC-32, not Python's `hash` (salted per process).

Example (3 processes):
    owner("0b7e...", processes=3) -> 2 in every process, every run
    owner(anything, processes=1)  -> 0
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

PEER_HEADER = "x-gyre-proxy-peer"
"""Set, with the peers' shared secret, on a request one proxy process forwards to another."""


def owner(execution_id: str, *, processes: int) -> int:
    """The index (0..processes-1) of the process that serves `execution_id`'s calls."""
    if processes < 1:
        raise ValueError(f"processes must be >= 1, got {processes}")
    return zlib.crc32(execution_id.encode()) % processes


@dataclass(frozen=True, slots=True, kw_only=True)
class Peers:
    """This process's place among the proxy processes: its index, every process's private HTTP
    URL (index order; forwarded calls and peer control go there) and the secret they share."""

    index: int
    urls: tuple[str, ...]
    secret: str

    @property
    def processes(self) -> int:
        return len(self.urls)

    def owner_of(self, execution_id: str) -> int:
        return owner(execution_id, processes=self.processes)

    def others(self) -> list[int]:
        return [i for i in range(self.processes) if i != self.index]
