"""A model's parameters and their tensor-parallel sharding rules, inferred from HF names and shapes.

ROSE §4.2 infers "each parameter's sharding rule by identifying the sharded dimension from the
module type and parameter shape". With Megatron/vLLM tensor parallelism on a Qwen/Llama
decoder: q/k/v and gate/up projections are column-parallel (output rows split), o and down
projections row-parallel (input columns split), the embedding and LM head vocab-parallel
(rows split), norms replicated. HF `nn.Linear` weights are `(out_features, in_features)`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from loom.core.errors import ConfigError
from loom.perf.specs import ModelSpec, model_spec

__all__ = [
    "ParamSpec",
    "ShardRule",
    "decoder_params",
    "infer_rule",
    "layer_of",
    "model_params",
    "param_specs",
]

BF16_BYTES = 2


class ShardRule(StrEnum):
    COLUMN = "column"  # split dim 0 across TP ranks: output rows, or vocab rows
    ROW = "row"  # split dim 1 across TP ranks: input columns
    REPLICATED = "replicated"  # every TP rank holds all of it

    @property
    def dim(self) -> int | None:
        """The dimension split across TP ranks; None when replicated."""
        return _SPLIT_DIM[self]


_SPLIT_DIM = {ShardRule.COLUMN: 0, ShardRule.ROW: 1, ShardRule.REPLICATED: None}

# Module type (the name's second-to-last part) -> rule of its weight. Biases of column-parallel
# modules (Qwen2's q/k/v) split with their rows; a row-parallel module's bias is added after the
# all-reduce, so every rank holds it.
_COLUMN_MODULES = frozenset(
    {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "embed_tokens", "lm_head"}
)
_ROW_MODULES = frozenset({"o_proj", "down_proj"})
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


@dataclass(frozen=True, kw_only=True)
class ParamSpec:
    """One parameter: HF name, full (unsharded) shape, TP rule, decoder layer (None outside)."""

    name: str
    shape: tuple[int, ...]
    rule: ShardRule
    layer: int | None = None

    def __post_init__(self) -> None:
        if not self.shape or any(not isinstance(d, int) or d <= 0 for d in self.shape):
            raise ConfigError(f"{self.name}: shape must be positive ints, got {self.shape}")
        dim = self.rule.dim
        if dim is not None and dim >= len(self.shape):
            raise ConfigError(
                f"{self.name}: a {self.rule} rule needs dim {dim}, shape {self.shape}"
            )
        if self.layer is not None and self.layer < 0:
            raise ConfigError(f"{self.name}: layer must be >= 0, got {self.layer}")

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes in bf16."""
        return BF16_BYTES * self.numel


def layer_of(name: str) -> int | None:
    """Decoder layer index in an HF name (`model.layers.{i}.…`), None outside the layers."""
    match = _LAYER.search(name)
    return int(match.group(1)) if match else None


def infer_rule(name: str, shape: tuple[int, ...]) -> ShardRule:
    """TP rule of parameter `name` of `shape`, from its module type; `ConfigError` if unknown."""
    parts = name.split(".")
    module, leaf = (parts[-2], parts[-1]) if len(parts) >= 2 else ("", name)
    if module in _COLUMN_MODULES:
        return ShardRule.COLUMN
    if module in _ROW_MODULES:
        if leaf == "weight" and len(shape) == 2:
            return ShardRule.ROW
        if leaf == "bias" and len(shape) == 1:
            return ShardRule.REPLICATED
        raise ConfigError(f"{name}: row-parallel {leaf} of shape {shape} is not a 2-d weight")
    if module.endswith("norm") and len(shape) == 1:
        return ShardRule.REPLICATED
    raise ConfigError(
        f"cannot infer a sharding rule for {name} of shape {shape}: module {module!r} is not a "
        "known projection, embedding, LM head or norm; give a ParamSpec with its rule"
    )


def param_specs(named_shapes: Iterable[tuple[str, tuple[int, ...]]]) -> tuple[ParamSpec, ...]:
    """Specs of `(name, shape)` pairs, e.g. from `model.named_parameters()`, rules inferred."""
    return tuple(
        ParamSpec(
            name=name, shape=tuple(shape), rule=infer_rule(name, tuple(shape)), layer=layer_of(name)
        )
        for name, shape in named_shapes
    )


def decoder_params(
    *,
    num_layers: int,
    hidden_size: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    intermediate_size: int,
    vocab_size: int,
    qk_norm: bool = False,
    qkv_bias: bool = False,
) -> tuple[ParamSpec, ...]:
    """Parameters of a Llama-style decoder in HF naming: Qwen3 adds per-head `q_norm`/`k_norm`
    (`qk_norm`), Qwen2 biases on q/k/v (`qkv_bias`). With GQA, k/v projections have
    `num_kv_heads · head_dim` rows. The LM head is untied (as in Qwen3-8B and larger)."""
    h, q, kv = hidden_size, num_heads * head_dim, num_kv_heads * head_dim
    shapes: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (vocab_size, h))]
    for i in range(num_layers):
        p = f"model.layers.{i}"
        shapes += [
            (f"{p}.input_layernorm.weight", (h,)),
            (f"{p}.self_attn.q_proj.weight", (q, h)),
            (f"{p}.self_attn.k_proj.weight", (kv, h)),
            (f"{p}.self_attn.v_proj.weight", (kv, h)),
        ]
        if qkv_bias:
            shapes += [(f"{p}.self_attn.{m}.bias", (n,)) for m, n in _qkv(q, kv)]
        if qk_norm:
            shapes += [
                (f"{p}.self_attn.q_norm.weight", (head_dim,)),
                (f"{p}.self_attn.k_norm.weight", (head_dim,)),
            ]
        shapes += [
            (f"{p}.self_attn.o_proj.weight", (h, q)),
            (f"{p}.post_attention_layernorm.weight", (h,)),
            (f"{p}.mlp.gate_proj.weight", (intermediate_size, h)),
            (f"{p}.mlp.up_proj.weight", (intermediate_size, h)),
            (f"{p}.mlp.down_proj.weight", (h, intermediate_size)),
        ]
    shapes += [("model.norm.weight", (h,)), ("lm_head.weight", (vocab_size, h))]
    return param_specs(shapes)


def _qkv(q: int, kv: int) -> list[tuple[str, int]]:
    return [("q_proj", q), ("k_proj", kv), ("v_proj", kv)]


# Architecture details a `ModelSpec` row does not carry, by model family (config.json of each).
_FAMILY = {"qwen3": {"qk_norm": True}, "qwen2": {"qkv_bias": True}}


def model_params(spec: ModelSpec | str) -> tuple[ParamSpec, ...]:
    """Parameters of a model with a spec row (e.g. `"qwen3-8b"`), with no download."""
    if isinstance(spec, str):
        spec = model_spec(spec)
    family = next((f for f in _FAMILY if spec.name.startswith(f)), None)
    return decoder_params(
        num_layers=spec.num_layers,
        hidden_size=spec.hidden_size,
        num_heads=spec.num_heads,
        num_kv_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        intermediate_size=spec.intermediate_size,
        vocab_size=spec.vocab_size,
        **(_FAMILY[family] if family else {}),
    )
