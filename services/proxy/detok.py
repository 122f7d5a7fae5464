"""Turn a growing list of output ids into text incrementally (pure, given a decode function).

Decoding all output ids on every streamed token costs O(n^2) over a long output. This keeps a
short window instead (the technique of HF's streamers and vLLM's detokenizer): decode the ids
from a few tokens back, and emit what that adds beyond the same window without the new ids. A
window ending inside a multi-byte character (U+FFFD at the end) waits for the next ids.

Example (byte-level BPE, "é" split over two ids 7, 8):
    push([5]) -> "a";  push([7]) -> "" (incomplete);  push([8]) -> "é"
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

Decode = Callable[[Sequence[int]], str]


class IncrementalText:
    def __init__(self, decode: Decode) -> None:
        self.decode = decode
        self.ids: list[int] = []
        self.text = ""
        self._prefix = 0
        self._read = 0

    def push(self, new_ids: Sequence[int]) -> str:
        """Append ids; return the text they complete (possibly empty)."""
        self.ids.extend(new_ids)
        before = self.decode(self.ids[self._prefix : self._read])
        after = self.decode(self.ids[self._prefix :])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        delta = after[len(before) :]
        self.text += delta
        self._prefix, self._read = self._read, len(self.ids)
        return delta
