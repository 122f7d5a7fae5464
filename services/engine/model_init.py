"""Create a tiny Qwen2-architecture checkpoint and tokenizer in a folder, offline (shell: writes files).

The folder is an ordinary Hugging Face checkpoint (`config.json`, `model.safetensors`,
`tokenizer.json`, `tokenizer_config.json`, `generation_config.json`), so the engine, trainer and
proxy load it exactly like a real Qwen model: `AutoModelForCausalLM.from_pretrained(dir)` and
`AutoTokenizer.from_pretrained(dir)`. Nothing is downloaded.

Sizes are chosen for 1-2 CPU threads: 4 layers of width 128 and grouped-query attention with one
KV head (4 query heads), so a token's KV cache is small next to the compute its prefill costs
(what makes moving KV cheaper than recomputing it), and 131072 positions so a real harness's
prompts fit (Claude Code's first prompt is about 53k tokens).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

# The chat template follows Qwen2.5's: `<|im_start|>role\n...<|im_end|>\n` turns, tools listed in
# the system turn, calls as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` in the
# assistant turn, and results as `<tool_response>...</tool_response>` inside a user turn.
CHAT_TEMPLATE = """\
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
{{- '# Tools\\n\\nYou may call one or more functions. Signatures:\\n<tools>' }}
{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}
{{- '\\n</tools>\\n\\nFor each call return ' }}
{{- '<tool_call>{"name": <name>, "arguments": <args>}</tool_call>.<|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'system' %}
{%- if not loop.first %}{{- '<|im_start|>system\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}
{%- elif message.role == 'user' %}
{{- '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant\\n' }}
{%- if message.content %}{{- message.content }}{%- endif %}
{%- if message.tool_calls %}
{%- for tool_call in message.tool_calls %}
{%- set call = tool_call.function if tool_call.function is defined else tool_call %}
{%- if (loop.first and message.content) or not loop.first %}{{- '\\n' }}{%- endif %}
{{- '<tool_call>{"name": "' + call.name + '", "arguments": ' }}
{%- if call.arguments is string %}{{- call.arguments }}{%- else %}{{- call.arguments | tojson }}{%- endif %}
{{- '}</tool_call>' }}
{%- endfor %}
{%- endif %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""

CONTEXT_TOKENS = 131072
"""Positions of the tiny model: real harnesses fit (Claude Code's first prompt alone is ~53k
tokens with this tokenizer's kind of vocabulary); RoPE has no learned positions, so a long
window costs nothing until it is used."""
PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [
    PAD_TOKEN,
    IM_START,
    IM_END,
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
]

# A small corpus for the byte-level BPE: enough chat, code and JSON that common words become single
# tokens; the byte alphabet still encodes any text.
_CORPUS = [
    "You are a helpful coding assistant. Fix the failing test and run the test suite again.",
    "def main(argv: list[str]) -> int:\n    return 0\n\nif __name__ == '__main__':\n    main()\n",
    "import os\nimport sys\nfrom pathlib import Path\n\nclass Config:\n    name: str = 'value'\n",
    '{"name": "bash", "arguments": {"command": "ls -la && pytest -q"}}',
    '{"name": "read_file", "arguments": {"path": "src/app.py"}}',
    "The tests pass now. I changed the function to return the sum of the list.",
    "for i in range(10):\n    print(i, i * i)\nwhile True:\n    break\n",
    "git status\ngit diff\ngit commit -m 'fix the bug'\n",
    "user assistant system tool function result error warning file line column",
    'Traceback (most recent call last):\n  File "test.py", line 3, in <module>\nAssertionError\n',
]


def build_tokenizer(
    *,
    vocab_size: int = 768,
    corpus: Sequence[str] = (),
    max_length: int = CONTEXT_TOKENS,
) -> object:
    """A byte-level BPE tokenizer trained on `_CORPUS` (plus `corpus`), wrapped as a PreTrainedTokenizerFast.

    `corpus` lets a caller fit the merges to its own text (the warm start passes its rendered
    transcripts, so tool schemas and code take whole-word tokens, not one per byte). Merges never
    span words: loading the folder with `AutoTokenizer` (as every service does) gives Qwen2's
    tokenizer class, which splits words with Qwen's pattern before the merges apply.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([*(_CORPUS * 4), *corpus], trainer=trainer)
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        additional_special_tokens=SPECIAL_TOKENS[1:],
        chat_template=CHAT_TEMPLATE,
        model_max_length=max_length,
        clean_up_tokenization_spaces=False,
    )


def init_model(
    directory: str | Path,
    *,
    seed: int = 0,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 1,
    intermediate_size: int = 256,
    max_position_embeddings: int = CONTEXT_TOKENS,
    vocab_size: int = 768,
    corpus: Sequence[str] = (),
) -> Path:
    """Write a random-weight tiny Qwen2 checkpoint with its tokenizer into `directory`.

    The same seed writes the same weights, so two engines started from folders made with one seed
    hold the same model (and accept each other's KV caches).
    """
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(vocab_size=vocab_size, corpus=corpus, max_length=max_position_embeddings)
    vocab_size = len(tokenizer)  # type: ignore[arg-type]
    eos_id = tokenizer.convert_tokens_to_ids(IM_END)  # type: ignore[attr-defined]
    pad_id = tokenizer.convert_tokens_to_ids(PAD_TOKEN)  # type: ignore[attr-defined]
    config = Qwen2Config(  # type: ignore[call-arg]
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=max_position_embeddings,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        initializer_range=0.2,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        use_sliding_window=False,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    # A wide init (initializer_range 0.2, untied head) so a random model's next token depends on
    # its context and its distribution is far from flat: greedy runs do not just repeat one token,
    # and greedy and sampled runs differ, which the tests rely on.
    model.generation_config = GenerationConfig(  # type: ignore[no-untyped-call]
        eos_token_id=[eos_id], pad_token_id=pad_id, do_sample=False
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)  # type: ignore[attr-defined]
    (out / "gyre_model.json").write_text(json.dumps({"created_by": "gyre model init", "seed": seed}) + "\n")
    return out
