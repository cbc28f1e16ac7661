"""A tiny decoder-only language model built in code (no download) for the cluster runtime's
worker-process groups: embeddings, a few pre-norm causal transformer layers, an LM head, with
weights drawn from a seed so that every data-parallel replica starts identical."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = [
    "TinyDecoder",
    "TinyDecoderSpec",
    "adopt_items",
    "param_specs",
    "restore_items",
    "state_items",
]


@dataclass(frozen=True, kw_only=True)
class TinyDecoderSpec:
    vocab: int = 128
    dim: int = 64
    layers: int = 2
    heads: int = 4
    seed: int = 0


class TinyDecoder(nn.Module):
    def __init__(self, spec: TinyDecoderSpec) -> None:
        super().__init__()
        gen = torch.random.fork_rng(devices=[])
        with gen:
            torch.manual_seed(spec.seed)
            self.embed = nn.Embedding(spec.vocab, spec.dim)
            layer = nn.TransformerEncoderLayer(
                spec.dim,
                spec.heads,
                dim_feedforward=4 * spec.dim,
                dropout=0.0,
                batch_first=True,
                norm_first=True,
            )
            self.layers = nn.TransformerEncoder(layer, spec.layers, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(spec.dim)
            self.head = nn.Linear(spec.dim, spec.vocab, bias=False)
        self.spec = spec

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        mask = torch.triu(torch.full((t, t), float("-inf"), device=ids.device), diagonal=1)
        h = self.layers(self.embed(ids), mask=mask, is_causal=True)
        return self.head(self.norm(h))

    def logprobs(self, ids: torch.Tensor) -> torch.Tensor:
        """log p(ids[:, i+1] | ids[:, :i+1]) for every position but the last."""
        logits = self.forward(ids[:, :-1])
        return torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None])[..., 0]

    @torch.no_grad()
    def generate(self, ids: torch.Tensor, max_tokens: int) -> torch.Tensor:
        """Greedy continuation of each row by `max_tokens` tokens."""
        out = ids
        for _ in range(max_tokens):
            nxt = self.forward(out)[:, -1].argmax(-1, keepdim=True)
            out = torch.cat([out, nxt], dim=1)
        return out[:, ids.shape[1] :]


def state_items(model: nn.Module, optim: Any) -> dict[str, torch.Tensor]:
    """Every tensor that makes up a training deployment's state: parameters and the
    optimizer's per-parameter state, by stable names."""
    out = {f"weights/{n}": p.data for n, p in model.named_parameters()}
    names = {id(p): n for n, p in model.named_parameters()}
    for p, st in optim.state.items():
        for k, v in st.items():
            if isinstance(v, torch.Tensor):
                out[f"optimizer/{names[id(p)]}/{k}"] = v
    return out


def restore_items(model: nn.Module, optim: Any, state: dict[str, torch.Tensor]) -> None:
    """Copy `state_items`-named tensors in (a checkpoint read): parameters in place, the
    optimizer's per-parameter state set (created where the optimizer has none yet)."""
    _put_items(model, optim, state, adopt=False)


def adopt_items(model: nn.Module, optim: Any, state: dict[str, torch.Tensor]) -> None:
    """Make `state_items`-named tensors the state itself, without a copy (buffers a load
    filled): parameters' storage swapped, the optimizer's state entries set."""
    _put_items(model, optim, state, adopt=True)


def _put_items(model: nn.Module, optim: Any, state: dict[str, torch.Tensor], adopt: bool) -> None:
    params = dict(model.named_parameters())
    want = set(params)
    with torch.no_grad():
        for full, t in state.items():
            kind, name = full.split("/", 1)
            if kind == "weights":
                if name not in params:
                    raise KeyError(f"the state has {name!r}, the model does not")
                if adopt:
                    params[name].data = t
                else:
                    params[name].copy_(t)
                want.discard(name)
            elif kind == "optimizer":
                pname, key = name.rsplit("/", 1)
                optim.state[params[pname]][key] = t if adopt else t.clone()
    if want:
        raise KeyError(f"the state lacks {sorted(want)[:3]}")


def param_specs(model: nn.Module) -> list[Any]:
    """The decoder's parameters as a tensor-parallel rollout layout splits them: the
    attention output and the second MLP projection by input columns (row-parallel), every
    other matrix by output rows (column-parallel), vectors replicated."""
    from loom.state.weights.params import ParamSpec, ShardRule

    out = []
    for name, p in model.named_parameters():
        if p.dim() < 2:
            rule = ShardRule.REPLICATED
        elif name.endswith(("out_proj.weight", "linear2.weight")):
            rule = ShardRule.ROW
        else:
            rule = ShardRule.COLUMN
        out.append(ParamSpec(name=name, shape=tuple(p.shape), rule=rule))
    return out
