"""Prompts too long for the policy's context window, refused at submission (shell: model files).

The engine refuses a call whose prompt fills its model's context (`max_position_embeddings`), so
a task whose prompt alone is that long could only fail later, in every execution, as an
infrastructure failure. The harness wraps the prompt in a chat template and adds its own system
prompt and tools, so the first call is longer still: a prompt of `window` tokens or more can never
be answered. Shorter ones may still not fit with what the harness adds; that is the harness's to
manage, not something the scheduler can know.

Tokenizing a 1 MiB prompt takes a while, so only a prompt with at least `window` characters is
tokenized (a token is at least one character, so a shorter prompt cannot reach the window).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from gyre.errors import InvalidArgument
from services.scheduler.tasks import TaskSpec

log = structlog.get_logger(__name__)


@dataclass(slots=True)
class PromptWindow:
    model_dir: Path | None
    """The policy's checkpoint folder (`tokenizer.json`, `config.json`); None: nothing checked."""
    _loaded: tuple[Any, int] | None = None

    def _load(self) -> tuple[Any, int] | None:
        if self._loaded is None and self.model_dir is not None:
            from tokenizers import Tokenizer

            try:
                tokenizer = Tokenizer.from_file(str(self.model_dir / "tokenizer.json"))
                window = int(
                    json.loads((self.model_dir / "config.json").read_text())["max_position_embeddings"]
                )
            except Exception as exc:  # tokenizers raises a bare Exception for a file it cannot read
                # A server misconfigured is no fault of the task: log it and check nothing.
                log.warning("prompt_window_unreadable", model_dir=str(self.model_dir), error=str(exc))
                return None
            self._loaded = (tokenizer, window)
        return self._loaded

    def check(self, specs: Sequence[TaskSpec]) -> None:
        """Raise InvalidArgument naming the first prompt of `window` tokens or more (run it in a
        thread: a long prompt takes a moment to tokenize)."""
        if self.model_dir is None or all(len(s.prompt) < 2 for s in specs):
            return
        loaded = self._load()
        if loaded is None:
            return
        tokenizer, window = loaded
        for i, spec in enumerate(specs):
            if len(spec.prompt) < window:
                continue
            num_tokens = len(tokenizer.encode(spec.prompt, add_special_tokens=False).ids)
            if num_tokens >= window:
                raise InvalidArgument(
                    f"tasks[{i}].prompt",
                    f"is {num_tokens} tokens, and the policy's context window is {window}: no model "
                    "call could hold it (shorten it, or serve a model with a longer context)",
                )
