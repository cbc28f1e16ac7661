"""A tiny random-weight Qwen3-shaped model and a word-level tokenizer, written once to a cache
directory so that a real inference engine can serve it on a CPU with nothing downloaded."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from loom.core.errors import ConfigError

__all__ = ["DEFAULT_CACHE_DIR", "TinyModelSpec", "build_tiny_model", "model_dir"]

log = logging.getLogger(__name__)

DEFAULT_CACHE_DIR = Path("~/.cache/loom/engine-model")
_MARKER = "loom-tiny-model.json"
_FORMAT = 2  # bump when the files written for a spec change, so that caches are rebuilt

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>")
# NOTE: Qwen's ChatML template, so that /v1/chat/completions renders turns as Qwen3 does.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# The chat template's role names, so that a rendered conversation has no unknown words.
ROLE_WORDS = ("system", "user", "assistant", "tool")
_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
_MAX_WORDS = len(_CONSONANTS) * len(_VOWELS) * (len(_CONSONANTS) * len(_VOWELS) + 1)


@dataclass(frozen=True, kw_only=True)
class TinyModelSpec:
    """Shape of the model. vLLM's CPU attention refuses head_dim < 64; fp32 on CPU."""

    num_layers: int = 2
    hidden_size: int = 128
    intermediate_size: int = 256
    num_heads: int = 2
    num_kv_heads: int = 2
    head_dim: int = 64
    max_position: int = 4096
    vocab_words: int = 1000
    seed: int = 0
    # NOTE: wide by default (see `_write_model`); a model to be trained wants a narrow one
    init_std: float = 0.5

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if name not in ("seed", "init_std") and value < 1:
                raise ConfigError(f"{name} must be >= 1, got {value}")
        if not self.init_std > 0:
            raise ConfigError(f"init_std must be > 0, got {self.init_std}")
        if self.head_dim < 64:
            raise ConfigError(
                f"head_dim must be >= 64 for vLLM's CPU attention, got {self.head_dim}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"num_kv_heads={self.num_kv_heads} must divide num_heads={self.num_heads}"
            )
        if self.vocab_words > len(_CONSONANTS) * len(_VOWELS) * (
            len(_CONSONANTS) * len(_VOWELS) + 1
        ):
            raise ConfigError(f"vocab_words={self.vocab_words} is more than the word list holds")

    @property
    def key(self) -> str:
        """A short hash of the spec: the cache subdirectory that holds this model."""
        fields = asdict(self)
        if fields["init_std"] == 0.5:  # (the default: the hash of the models built before it)
            del fields["init_std"]
        blob = json.dumps({**fields, "format": _FORMAT}, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]

    @property
    def vocab_size(self) -> int:
        """Embedding rows: the tokenizer's tokens, rounded up to a multiple of 64."""
        return -(-(len(SPECIAL_TOKENS) + len(ROLE_WORDS) + self.vocab_words) // 64) * 64


def _words(n: int) -> list[str]:
    """`n` distinct pronounceable words: consonant-vowel syllables, then pairs of them."""
    syllables = [c + v for c in _CONSONANTS for v in _VOWELS]
    words = syllables + [a + b for a in syllables for b in syllables]
    return words[:n]


def model_dir(spec: TinyModelSpec | None = None, cache_dir: str | Path | None = None) -> Path:
    """Where `build_tiny_model` writes (or has written) this spec's model."""
    spec = spec if spec is not None else TinyModelSpec()
    base = Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE_DIR
    return base.expanduser() / f"qwen3-tiny-{spec.key}"


def build_tiny_model(
    spec: TinyModelSpec | None = None, cache_dir: str | Path | None = None
) -> Path:
    """The directory of the model for `spec`, built on first use (a few seconds; deterministic
    under `spec.seed`) and reused afterwards. Needs torch, transformers and tokenizers."""
    spec = spec if spec is not None else TinyModelSpec()
    target = model_dir(spec, cache_dir)
    if (target / _MARKER).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        _write_tokenizer(spec, staging)
        _write_model(spec, staging)
        (staging / _MARKER).write_text(json.dumps(asdict(spec), indent=2) + "\n")
        try:
            os.replace(staging, target)
        except OSError:  # another process built it first
            if not (target / _MARKER).is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info("built tiny model %s", target)
    return target


def _write_tokenizer(spec: TinyModelSpec, out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {
        tok: i for i, tok in enumerate([*SPECIAL_TOKENS, *ROLE_WORDS, *_words(spec.vocab_words)])
    }
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.decoder = decoders.WordPiece(prefix="##")  # joins words with single spaces
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<unk>",
        additional_special_tokens=["<|im_start|>"],
        chat_template=CHAT_TEMPLATE,
        model_max_length=spec.max_position,
    )
    tok.save_pretrained(out)


def _write_model(spec: TinyModelSpec, out: Path) -> None:
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    eos = SPECIAL_TOKENS.index("<|im_end|>")
    pad = SPECIAL_TOKENS.index("<|endoftext|>")
    config = Qwen3Config(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position,
        # NOTE: untied output embeddings and a wide initialisation: with tied small weights the
        # greedy continuation of any prompt repeats its last token, which hides mistakes in tests.
        tie_word_embeddings=False,
        initializer_range=spec.init_std,
        bos_token_id=pad,
        eos_token_id=eos,
        pad_token_id=pad,
        dtype="float32",
    )
    torch.manual_seed(spec.seed)
    model = Qwen3ForCausalLM(config)  # fp32: torch's default dtype
    model.generation_config = GenerationConfig(bos_token_id=pad, eos_token_id=eos, pad_token_id=pad)
    model.save_pretrained(out)
