"""Render chat messages into prompt token ids, reusing the engine's own output ids (pure).

Re-tokenising text the model generated does not always give back the ids it sampled (BPE merges
across the boundary, a tool call re-serialised by the template with other spacing). Training on
such a prompt would attach tokens to a context the policy never saw. So after each call the
proxy remembers, per execution, how the chat template renders the assistant turn it returned
(`segment`) together with the sampled `output_ids`; when a later prompt contains that rendered
segment right after the template's generation prefix, those ids are spliced in verbatim and only
the text between such segments is tokenised.

Example (ChatML-like template, `|` marks the pieces):
    call 1 prompt text: "<s>user\\nhi</s>\\n<s>assistant\\n"       -> encode(all)
    call 1 output ids:  [100, 101, 2]  (decodes to "Hey!</s>")
    remembered:         segment "Hey!</s>\\n" -> [100, 101, 2] + encode("\\n")
    call 2 prompt text: "<s>user\\nhi</s>\\n<s>assistant\\n|Hey!</s>\\n|<s>user\\nmore..."
                     -> encode(gap 1) + [100, 101, 2] + encode("\\n") + encode(gap 2)

The ids of the execution's latest prompts are kept too: when a new prompt's text extends one of
them, its ids are taken as they were and only the rest is rendered into ids, so a growing
context keeps an exactly stable prefix and is not re-tokenised whole on every call.

`Tokenizer` is the slice of a `transformers` tokenizer this needs, so tests can pass any object
with these methods.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gyre.errors import InvalidArgument
from services.proxy.chat import ChatMessage, ChatRequest


class Tokenizer(Protocol):
    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: Any, skip_special_tokens: bool = ...) -> str: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class ReusableOutput:
    """An assistant turn as the template renders it, and the ids to put in its place."""

    segment: str
    gen_prefix: str
    ids: tuple[int, ...]


@dataclass(slots=True)
class OutputMemory:
    """One execution's reusable outputs by rendered segment, and its latest prompts (mutable;
    owned by the call shell)."""

    by_segment: dict[str, ReusableOutput] = field(default_factory=dict)
    prompts: deque[tuple[str, tuple[int, ...]]] = field(default_factory=lambda: deque(maxlen=16))

    def remember(self, item: ReusableOutput) -> None:
        self.by_segment[item.segment] = item

    def snapshot(self) -> OutputMemory:
        """A copy to render from in another thread while this one keeps changing."""
        return OutputMemory(by_segment=dict(self.by_segment), prompts=deque(self.prompts, maxlen=16))

    def remember_prompt(self, prompt: RenderedPrompt) -> None:
        self.prompts.append((prompt.text, prompt.ids))

    def longest_prefix(self, text: str) -> tuple[str, tuple[int, ...]]:
        """The latest prompt whose text `text` extends, with its ids; ("", ()) when none does."""
        best: tuple[str, tuple[int, ...]] = ("", ())
        for cached in self.prompts:
            if len(cached[0]) > len(best[0]) and text.startswith(cached[0]):
                best = cached
        return best


@dataclass(frozen=True, slots=True, kw_only=True)
class RenderedPrompt:
    ids: tuple[int, ...]
    text: str
    num_reused_outputs: int


def template_text(
    tokenizer: Tokenizer, messages: Sequence[ChatMessage], request: ChatRequest, *, generation: bool
) -> str:
    kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": generation}
    if request.tools:
        kwargs["tools"] = [t.as_template_dict() for t in request.tools]
    try:
        text = tokenizer.apply_chat_template([m.as_template_dict() for m in messages], **kwargs)
    except Exception as exc:  # jinja raises TemplateError (and friends) for shapes it refuses
        # Name the tools when the messages alone render: a schema the template cannot walk.
        culprit = "tools" if request.tools and _renders_without_tools(tokenizer, messages) else "messages"
        raise InvalidArgument(culprit, f"the model's chat template refused them: {quoted(exc)}") from exc
    if not isinstance(text, str):
        raise InvalidArgument("messages", "the model's chat template did not render them as text")
    return text


def _renders_without_tools(tokenizer: Tokenizer, messages: Sequence[ChatMessage]) -> bool:
    try:
        tokenizer.apply_chat_template([m.as_template_dict() for m in messages], tokenize=False)
    except Exception:  # the messages are at fault as well
        return False
    return True


def quoted(exc: BaseException, *, max_chars: int = 300) -> str:
    """An exception's text fit to put in an answer: cut short, and encodable whatever it quotes.

    Example: quoted(ValueError("bad \\ud800" + "x" * 1000), max_chars=8) -> "bad ?xxx..."
    """
    text = str(exc)
    text = text if len(text) <= max_chars else text[:max_chars] + "..."
    return text.encode("utf-8", "replace").decode("utf-8")


def render_prompt(
    tokenizer: Tokenizer, request: ChatRequest, memory: OutputMemory, *, context_window_tokens: int
) -> RenderedPrompt:
    """Prompt ids: an earlier prompt's ids where the text extends it, remembered output ids for
    rendered assistant turns, and the tokenised text in between.

    Reusing the earlier prompt's ids keeps each call's prompt an exact extension of the last
    one (the tree shares the prefix) and spares re-tokenising an hour-long context every call.
    """
    text = template_text(tokenizer, request.messages, request, generation=True)
    prefix_text, prefix_ids = memory.longest_prefix(text)
    spans = _find_spans(text, memory, start=len(prefix_text))
    ids: list[int] = list(prefix_ids)
    pos = len(prefix_text)
    for start, item in spans:
        if start > pos:
            ids.extend(tokenizer.encode(text[pos:start], add_special_tokens=False))
        ids.extend(item.ids)
        pos = start + len(item.segment)
    if pos < len(text):
        ids.extend(tokenizer.encode(text[pos:], add_special_tokens=False))
    if len(ids) >= context_window_tokens:
        raise InvalidArgument(
            "messages",
            f"the prompt is {len(ids)} tokens, which leaves no room in the model's context window of "
            f"{context_window_tokens} tokens",
        )
    return RenderedPrompt(ids=tuple(ids), text=text, num_reused_outputs=len(spans))


def _find_spans(text: str, memory: OutputMemory, *, start: int) -> list[tuple[int, ReusableOutput]]:
    """Non-overlapping occurrences, from `start` on, of remembered segments that follow a
    generation prefix."""
    found: list[tuple[int, ReusableOutput]] = []
    origin = start
    for item in memory.by_segment.values():
        start = text.find(item.segment, origin)
        while start >= 0:
            if text.startswith(item.gen_prefix, start - len(item.gen_prefix)) and start >= len(
                item.gen_prefix
            ):
                found.append((start, item))
            start = text.find(item.segment, start + 1)
    found.sort(key=lambda s: (s[0], -len(s[1].segment)))
    chosen: list[tuple[int, ReusableOutput]] = []
    end = origin
    for start, item in found:
        if start >= end:
            chosen.append((start, item))
            end = start + len(item.segment)
    return chosen


def reusable_output(
    tokenizer: Tokenizer,
    request: ChatRequest,
    *,
    prompt_text: str,
    returned: ChatMessage,
    output_ids: Sequence[int],
    stop_texts: Sequence[str],
) -> ReusableOutput | None:
    """How a later prompt will render the turn just returned, and the ids that stand for it.

    None when the template renders the turn in a way that does not extend this prompt (then a
    later prompt is tokenised from text, which is still a valid context, just not a reused one).
    """
    with_turn = template_text(tokenizer, (*request.messages, returned), request, generation=False)
    without = template_text(tokenizer, request.messages, request, generation=False)
    if not (with_turn.startswith(prompt_text) and prompt_text.startswith(without)):
        return None
    gen_prefix = prompt_text[len(without) :]
    segment = with_turn[len(prompt_text) :]
    if not segment:
        return None
    decoded = tokenizer.decode(list(output_ids), skip_special_tokens=False)
    if segment.startswith(decoded):
        tail = segment[len(decoded) :]
    else:  # the template re-serialised the turn; the sampled ids still stand for all of it
        cut = max((segment.rfind(s) + len(s) for s in stop_texts if s and s in segment), default=-1)
        if cut < 0:
            return None
        tail = segment[cut:]
    ids = (*output_ids, *(tokenizer.encode(tail, add_special_tokens=False) if tail else ()))
    return ReusableOutput(segment=segment, gen_prefix=gen_prefix, ids=tuple(ids))
