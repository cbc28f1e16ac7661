"""What one rank of a deployment runs: a `ModelWorker` holds the model it trains and says how
to compute its logits; the worker-process group does the rest (the data-parallel split, the
losses, the optimizer, the state moves through the node's sidecar, checkpoints, weight syncs).

A user's model is a subclass named `module:Class` in the deployment (`model`), built on every
rank with the deployment's seed and the rank's device, plus the deployment's `model_options`
as keyword arguments. It sets `module` (a `torch.nn.Module`: its parameters are what trains,
moves and syncs) and implements `logits`; any other method may be overridden (a faster
`generate`, another optimizer, the names its serving engine loads weights by, its
tensor-parallel layout). The built-in tiny decoder (`TinyWorker`) and Hugging Face models
(`HFWorker`) are two such workers.

    class MyWorker(ModelWorker):
        def __init__(self, *, seed: int, device: torch.device, width: int = 64) -> None:
            torch.manual_seed(seed)
            self.module = MyNet(width).to(device)
            self.vocab_size = 256

        def logits(self, ids: torch.Tensor) -> torch.Tensor:
            return self.module(ids)            # [rows, T, vocab]

Every data-parallel replica must build the same weights from the same seed, and compute the
same way: the group checks that the replicas agree after every `sync_weights`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from loom.runtime.cluster.models.ref import ModelInfo

__all__ = ["ModelWorker"]


class ModelWorker:
    """The model of one rank (see the module's docstring). `module` and `vocab_size` are set
    by a subclass's `__init__`; `logits` is its one required method."""

    module: nn.Module
    vocab_size: int

    def logits(self, ids: torch.Tensor) -> torch.Tensor:
        """Next-token logits at every position: `ids` [rows, T] -> [rows, T, vocab]."""
        raise NotImplementedError(f"{type(self).__name__} must implement logits(ids)")

    # ---- what the operations use; override where the model knows better -----------------

    def logprobs(self, ids: torch.Tensor) -> torch.Tensor:
        """log p(ids[:, t+1] | ids[:, :t+1]) for every position but the last: [rows, T-1]."""
        logits = self.logits(ids[:, :-1]).float()
        return torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None])[..., 0]

    @torch.no_grad()
    def generate(self, ids: torch.Tensor, max_tokens: int) -> torch.Tensor:
        """The greedy continuation of each row by exactly `max_tokens` tokens (no stop
        token): [rows, max_tokens]."""
        out = ids
        for _ in range(max_tokens):
            nxt = self.logits(out)[:, -1].argmax(-1, keepdim=True)
            out = torch.cat([out, nxt], dim=1)
        return out[:, ids.shape[1] :]

    def optimizer(self, lr: float) -> torch.optim.Optimizer:
        """The optimizer of `module`'s parameters (Adam)."""
        return torch.optim.Adam(self.module.parameters(), lr=lr)

    def serving_weights(self) -> dict[str, torch.Tensor]:
        """The weights an inference engine loads, by the names its loader takes (a Hugging
        Face checkpoint's for HF models): what `sync_weights` publishes."""
        return {n: p.detach() for n, p in self.module.named_parameters()}

    def param_specs(self) -> list[Any] | None:
        """The parameters as a tensor-parallel rollout layout splits them
        (`loom.state.weights.ParamSpec`), or None if the layout is unknown: inferred from
        Hugging Face module names (q/k/v, gate/up, embeddings, LM head by rows; o and down by
        columns; norms replicated)."""
        from loom.core.errors import ConfigError
        from loom.state.weights.params import param_specs

        shapes = [(n, tuple(p.shape)) for n, p in self.module.named_parameters()]
        try:
            return list(param_specs(shapes))
        except ConfigError:
            return None

    def tp_split(self) -> int | None:
        """What every tensor-parallel degree must divide (None: no TP layout): the gcd of
        the split dimensions of `param_specs`."""
        specs = self.param_specs()
        if specs is None:
            return None
        dims = [p.shape[p.rule.dim] for p in specs if p.rule.dim is not None]
        return math.gcd(*dims) if dims else None

    def info(self) -> ModelInfo:
        params = list(self.module.parameters())
        cls = type(self)
        return ModelInfo(
            kind=f"{cls.__module__}:{cls.__qualname__}",
            vocab=int(self.vocab_size),
            params=sum(p.numel() for p in params),
            bytes=sum(p.numel() * p.element_size() for p in params),
            tp_split=self.tp_split(),
        )
