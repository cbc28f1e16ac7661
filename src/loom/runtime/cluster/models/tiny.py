"""The built-in model: the tiny decoder built in code (`loom.runtime.cluster.model`), drawn
from the deployment's seed, as a `ModelWorker` (a deployment's `model` "tiny")."""

from __future__ import annotations

import math
from typing import Any

import torch

from loom.runtime.cluster.model import TinyDecoder, TinyDecoderSpec, param_specs
from loom.runtime.cluster.models.worker import ModelWorker

__all__ = ["TinyWorker"]


class TinyWorker(ModelWorker):
    def __init__(
        self,
        *,
        seed: int,
        device: torch.device,
        vocab: int = 128,
        dim: int = 64,
        layers: int = 2,
        heads: int = 4,
    ) -> None:
        spec = TinyDecoderSpec(vocab=vocab, dim=dim, layers=layers, heads=heads, seed=seed)
        self.module = TinyDecoder(spec).to(device)
        self.vocab_size = vocab
        self.spec = spec

    def logits(self, ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.module(ids)
        return out

    def param_specs(self) -> list[Any]:
        return param_specs(self.module)

    def tp_split(self) -> int:
        """The decoder's split dimensions (its attention projections 3·dim and dim, its MLP's
        4·dim, its vocabulary) and its heads."""
        s = self.spec
        return math.gcd(3 * s.dim, s.dim, 4 * s.dim, s.vocab, s.heads)
