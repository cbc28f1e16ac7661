"""A Hugging Face causal language model from a local directory (`AutoModelForCausalLM`: any
architecture transformers loads, its weights as saved), as a `ModelWorker`. Nothing is
downloaded: the directory holds `config.json` and the weights."""

from __future__ import annotations

from pathlib import Path

import torch

from loom.core.errors import ConfigError
from loom.runtime.cluster.models.worker import ModelWorker

__all__ = ["HFWorker"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class HFWorker(ModelWorker):
    """`path`: the model directory. `dtype`: its parameters' type while it trains (float32 by
    default: the optimizer updates them in place). The seed does not matter: the weights are
    the directory's. The model stays in eval mode (no dropout), so that replicas compute alike
    and the logprobs it reports are the ones it trains on."""

    def __init__(
        self, *, seed: int, device: torch.device, path: str, dtype: str = "float32"
    ) -> None:
        from transformers import AutoModelForCausalLM

        if dtype not in _DTYPES:
            raise ConfigError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
        where = Path(path)
        model = AutoModelForCausalLM.from_pretrained(
            where, dtype=_DTYPES[dtype], local_files_only=True
        )
        module: torch.nn.Module = model  # (transformers' `to` is typed oddly)
        self.module = module.to(device).eval()
        self.vocab_size = int(model.config.vocab_size)
        self.path = where

    def logits(self, ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.module(input_ids=ids, use_cache=False).logits
        return out

    @torch.no_grad()
    def generate(self, ids: torch.Tensor, max_tokens: int) -> torch.Tensor:
        """Greedy, exactly `max_tokens` tokens, with the model's KV cache."""
        out = self.module(input_ids=ids, use_cache=True)
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        tokens = [nxt]
        for _ in range(max_tokens - 1):
            out = self.module(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            tokens.append(nxt)
        return torch.cat(tokens, dim=1)

    def tp_split(self) -> int | None:
        """The split dimensions' gcd, and the attention heads' (a TP rank holds whole heads)."""
        import math

        split = super().tp_split()
        if split is None:
            return None
        cfg = self.module.config
        heads = [
            int(h)
            for h in (
                getattr(cfg, "num_attention_heads", None),
                getattr(cfg, "num_key_value_heads", None),
            )
            if h
        ]
        return math.gcd(split, *heads)
