"""The tiny model: built locally, deterministic under its seed, cached, and a tokenizer with a
chat template."""

from __future__ import annotations

from pathlib import Path

import pytest

from loom.core.errors import ConfigError
from loom.runtime.engine import TinyModelSpec, build_tiny_model, model_dir

pytest.importorskip("transformers", reason="needs the cpu-engine extra")
pytest.importorskip("torch", reason="needs the cpu-engine extra")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(cache_dir=tmp_path_factory.mktemp("cache"))


def test_same_seed_same_files_and_reused(built: Path, tmp_path: Path) -> None:
    again = build_tiny_model(cache_dir=tmp_path)
    assert again != built
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (again / name).read_bytes() == (built / name).read_bytes(), name
    stamp = (again / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_model(cache_dir=tmp_path) == again  # cached: not rebuilt
    assert (again / "model.safetensors").stat().st_mtime_ns == stamp
    other = build_tiny_model(TinyModelSpec(seed=1), cache_dir=tmp_path)
    assert other == model_dir(TinyModelSpec(seed=1), tmp_path) != again
    assert (other / "model.safetensors").read_bytes() != (again / "model.safetensors").read_bytes()


def test_tokenizer_renders_a_chat(built: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(built)
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "ba be bi"}], add_generation_prompt=True, tokenize=True
    )["input_ids"]
    assert tok.unk_token_id not in ids
    assert tok.decode(ids, skip_special_tokens=True) == "user ba be bi assistant"
    assert tok.eos_token == "<|im_end|>"
    assert tok.pad_token_id is not None


def test_greedy_continuations_vary(built: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(built)
    out = model.generate(torch.tensor([[5, 8, 9]]), max_new_tokens=20, do_sample=False)
    assert len(set(out[0, 3:].tolist())) > 5  # not one token repeated


@pytest.mark.parametrize(
    "field", [{"head_dim": 32}, {"num_layers": 0}, {"num_kv_heads": 3}, {"vocab_words": 10**6}]
)
def test_spec_refuses_bad_shapes(field: dict[str, int]) -> None:
    with pytest.raises(ConfigError):
        TinyModelSpec(**field)
