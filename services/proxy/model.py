"""The model the proxy serves: its tokenizer, chat template, context window (shell: reads files).

Loaded from the model folder (`gyre model init DIR` makes a tiny one); nothing is downloaded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gyre.errors import InvalidArgument
from services.proxy.render import Tokenizer
from services.proxy.toolcalls import ToolCallFormat

END_OF_TURN_CANDIDATES = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>", "</s>")


@dataclass(frozen=True, slots=True, kw_only=True)
class ServedModel:
    name: str
    tokenizer: Tokenizer
    context_window_tokens: int
    tool_format: ToolCallFormat | None
    stop_texts: tuple[str, ...]
    max_token_chars: int = 0
    """Longest vocabulary entry in characters: a text of n characters needs at least
    n / max_token_chars tokens (0: unknown, no early size check)."""

    def visible_text(self, output_ids: list[int]) -> str:
        """Output text with end-of-turn markers removed (tool-call tags stay, for the parser)."""
        return self.strip_stops(self.tokenizer.decode(output_ids, skip_special_tokens=False))

    def strip_stops(self, text: str) -> str:
        for stop in self.stop_texts:
            text = text.replace(stop, "")
        return text

    def tool_call_id(self, call_id: str, index: int) -> str:
        """Deterministic per call, so a replayed answer names its tool calls the same way."""
        return f"call_{call_id.replace('-', '')[-20:]}_{index}"


class _BackendTokenizer:
    """Encode and decode straight through the `tokenizers` backend of a fast HF tokenizer.

    The proxy encodes and decodes on every call and every streamed chunk; the backend gives the
    same ids and text without the wrapper's per-call bookkeeping. Used only when the wrapper adds
    nothing on top (no text clean-up).
    """

    def __init__(self, hf: Any) -> None:
        self.hf = hf
        self.backend = hf._tokenizer

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any:
        return self.hf.apply_chat_template(conversation, **kwargs)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        # encode_batch, not encode: the backend's encode holds the GIL throughout (a prompt of 65k
        # characters: ~25 ms in which the event loop, run on another thread, cannot), while its
        # encode_batch releases it. Same ids.
        encoded = self.backend.encode_batch([text], add_special_tokens=add_special_tokens)
        ids: list[int] = encoded[0].ids
        return ids

    def decode(self, token_ids: Any, skip_special_tokens: bool = False) -> str:
        text: str = self.backend.decode(list(token_ids), skip_special_tokens=skip_special_tokens)
        return text


def load_model(model_dir: Path, *, name: str = "", context_window_tokens: int = 0) -> ServedModel:
    from transformers import AutoTokenizer

    if not (model_dir / "tokenizer_config.json").is_file():
        raise InvalidArgument("model_dir", f"{model_dir} holds no tokenizer (tokenizer_config.json)")
    tokenizer: Any = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    template = tokenizer.chat_template
    if not isinstance(template, str) or not template:
        raise InvalidArgument("model_dir", f"the tokenizer in {model_dir} has no chat template")
    window = context_window_tokens or _window_from_config(model_dir) or 4096
    vocab = tokenizer.get_vocab()
    stops = tuple(s for s in END_OF_TURN_CANDIDATES if s in vocab)
    if tokenizer.eos_token and tokenizer.eos_token not in stops:
        stops = (*stops, tokenizer.eos_token)
    fast = getattr(tokenizer, "is_fast", False) and not getattr(
        tokenizer, "clean_up_tokenization_spaces", True
    )
    return ServedModel(
        name=name or model_dir.resolve().name,
        tokenizer=_BackendTokenizer(tokenizer) if fast else tokenizer,
        context_window_tokens=window,
        tool_format=ToolCallFormat.from_template(template),
        stop_texts=stops,
        max_token_chars=max((len(t) for t in vocab), default=0),
    )


def _window_from_config(model_dir: Path) -> int:
    config = model_dir / "config.json"
    if not config.is_file():
        return 0
    value = json.loads(config.read_text()).get("max_position_embeddings", 0)
    return int(value) if isinstance(value, int) else 0
