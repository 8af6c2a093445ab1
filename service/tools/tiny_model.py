"""A tiny random-weight Llama checkpoint for tests and the local stack (no download).

A tool of its own: ``python -m tenure.service.tools.tiny_model [CACHE_DIR]`` writes the checkpoint
(default ``~/.cache/tenure/models``) and prints its path, for serving it with ``vllm serve``
by hand; ``tenure up`` and the engine tests call :func:`ensure_tiny_model`. Needs the ``dev``
extra (``transformers``, ``safetensors``) and ``torch`` from the engine install.

Random but non-zero weights matter: with vLLM's ``--load-format dummy`` the output ignores the KV
contents, so a corrupted KV load would go unnoticed; with these weights a wrong load changes the
greedy tokens and a correct one reproduces them. The checkpoint is deterministic (fixed seed), so
a cached copy is reused when its marker matches.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "DEMO_SHAPE",
    "JSON_TOKENS",
    "PLAIN_WORDS",
    "TINY_MODEL_VERSION",
    "TINY_SHAPE",
    "TOOL_NAME",
    "VOCAB_SIZE",
    "ModelLayout",
    "ensure_tiny_model",
    "layout_named",
    "word_prompt",
]

#: Bump when the layout changes, so stale cached copies are rebuilt.
TINY_MODEL_VERSION = "tiny-llama-v3"
#: The tool the vocabulary can call, as its quoted JSON string token.
TOOL_NAME = "bash"
#: The pieces of the one tool call the vocabulary can spell, ``[{"name": "bash"
#: ,"parameters":{}}]``: vLLM's structured output for ``tool_choice="required"`` (a JSON array
#: of ``{"name", "parameters"}``) can then make even this random model answer with a real tool
#: call, and since no other token starts or continues that JSON, the answer is always these 3
#: tokens + EOS. Spaces fall only between JSON tokens, so the tokenizer's space-joined decoding
#: and the grammar engine's raw concatenation read as the same JSON.
JSON_TOKENS = ['[{"name":', f'"{TOOL_NAME}"', ',"parameters":{}}]']
_SPECIAL = ["<unk>", "<s>", "</s>", "<pad>"]
#: The word-level vocabulary of v1 (2048 entries) plus the JSON tokens.
VOCAB_SIZE = 2048 + len(JSON_TOKENS)
#: Plain words ``w0 .. w<PLAIN_WORDS - 1>``: one token each, the stuff prompts are made of.
PLAIN_WORDS = 2048 - len(_SPECIAL) - 3
_MARKER = "tenure_tiny_model.json"


@dataclass(frozen=True, slots=True)
class ModelLayout:
    """The shape of a random-weight Llama (same vocabulary and chat template for every one)."""

    name: str
    #: Directory (and marker) of the cached checkpoint: bump when the layout changes.
    version: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def matmul_params(self) -> int:
        """Parameters of the matmuls a token goes through (2 FLOPs each), LM head included."""
        attn = 2 * self.hidden * self.hidden + 2 * self.hidden * self.kv_heads * self.head_dim
        mlp = 3 * self.hidden * self.intermediate
        return self.layers * (attn + mlp) + self.hidden * VOCAB_SIZE

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V of one token, every layer."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes


#: The engine tests' model: 2 layers, hidden 256, 4 KV heads (cheap to start and to run).
TINY_SHAPE = ModelLayout("tiny", TINY_MODEL_VERSION, 256, 512, 2, 4, 4)
#: ``tenure up``'s model (issue 28): chosen so that recomputing a KV block costs, relative to
#: loading it from the host tier, about what it costs on an H100 serving Llama-3.1-8B (which
#: has 61,000 matmul parameters per KV byte; this CPU's float32 matmuls and host copies need
#: fewer for the same ratio). Measured with ``tenure calibrate-profile``: see
#: :mod:`tenure.service.calibrate.demo_profile`. Grouped-query attention (one KV head for 8 query
#: heads, as Llama's 4:1 but further) keeps the KV small while the matmuls grow.
DEMO_SHAPE = ModelLayout("demo", "demo-llama-v1", 512, 1536, 4, 8, 1)
_LAYOUTS = {layout.name: layout for layout in (TINY_SHAPE, DEMO_SHAPE)}


def layout_named(name: str) -> ModelLayout:
    layout = _LAYOUTS.get(name)
    if layout is None:
        raise ValueError(f"unknown model layout {name!r}; valid: {', '.join(sorted(_LAYOUTS))}")
    return layout


_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ message['role'] }} : {{ message['content'] }} </s> "
    "{% endfor %}{% if add_generation_prompt %}assistant : {% endif %}"
)


def _words() -> list[str]:
    # Plain lowercase pseudo-words: whitespace-split prompts map one word to one token.
    return [f"w{i}" for i in range(PLAIN_WORDS)] + ["user", "assistant", ":"]


def word_prompt(seed: int, n_tokens: int) -> str:
    """A deterministic prompt of ``n_tokens`` vocabulary words (one token each)."""
    import random

    rng = random.Random(seed)
    words = _words()[:-3]
    return " ".join(rng.choice(words) for _ in range(n_tokens))


def _write(target: Path, layout: ModelLayout) -> None:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(_SPECIAL + _words() + JSON_TOKENS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
    )
    fast.chat_template = _CHAT_TEMPLATE
    fast.save_pretrained(target)

    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=layout.hidden,
        intermediate_size=layout.intermediate,
        num_hidden_layers=layout.layers,
        num_attention_heads=layout.heads,
        num_key_value_heads=layout.kv_heads,
        # Room for the live A/B's scaled Claude Code contexts (one token per 64-token block).
        max_position_embeddings=4096,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        tie_word_embeddings=False,
    )
    torch.manual_seed(1234)
    model = LlamaForCausalLM(config)  # type: ignore[no-untyped-call]
    with torch.no_grad():
        # Larger-than-default init so attention over the (re)loaded KV visibly shapes the output.
        for param in model.parameters():
            if param.dim() >= 2:
                param.normal_(0.0, 0.08)
    model = model.to(torch.bfloat16)  # type: ignore[arg-type]
    model.config.torch_dtype = torch.bfloat16
    model.save_pretrained(target, safe_serialization=True)
    (target / _MARKER).write_text(json.dumps({"version": layout.version}))


def ensure_tiny_model(cache_dir: str | os.PathLike[str], layout: ModelLayout = TINY_SHAPE) -> Path:
    """Return the path of the model of ``layout`` (the tiny one by default) under
    ``cache_dir``, generating it if missing."""
    root = Path(cache_dir)
    target = root / layout.version
    marker = target / _MARKER
    if marker.is_file():
        try:
            if json.loads(marker.read_text()).get("version") == layout.version:
                return target
        except (OSError, ValueError):
            pass
    root.mkdir(parents=True, exist_ok=True)
    # Build in a sibling temp dir and rename, so a concurrent or interrupted build never leaves
    # a half-written model that looks complete.
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-", dir=root))
    _write(tmp, layout)
    try:
        tmp.rename(target)
    except OSError:
        if not marker.is_file():  # lost a race to another writer: theirs is complete
            raise
    return target


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m tenure.service.tools.tiny_model",
        description="write the tiny random-weight Llama checkpoint and print its path",
    )
    parser.add_argument(
        "cache_dir",
        nargs="?",
        default=str(Path.home() / ".cache" / "tenure" / "models"),
        help="where the checkpoint goes (a subdirectory per layout version)",
    )
    parser.add_argument(
        "--layout", default="tiny", choices=sorted(_LAYOUTS), help="which model (tiny)"
    )
    args = parser.parse_args(argv)
    print(ensure_tiny_model(args.cache_dir, _LAYOUTS[args.layout]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
