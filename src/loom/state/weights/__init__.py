"""RL weight transfer from training to serving (ROSE §4.2): a sparse-delta codec for bf16
tensors and shard plans from a Megatron TP × PP (× DP) layout to a vLLM TP layout."""

from loom.state.weights.backends import Backend
from loom.state.weights.bf16 import bf16_bits_to_float32, float32_to_bf16_bits
from loom.state.weights.codec import (
    DENSE_THRESHOLD,
    MAX_SPARSE_NUMEL,
    BlobHeader,
    DType,
    Encoding,
    apply,
    choose_encoding,
    count_changed,
    decode,
    encode,
    encoded_nbytes,
    header_nbytes,
    read_header,
)
from loom.state.weights.ops import backend_of
from loom.state.weights.params import (
    ParamSpec,
    ShardRule,
    decoder_params,
    infer_rule,
    layer_of,
    model_params,
    param_specs,
)
from loom.state.weights.shards import (
    Box,
    Fetch,
    Piece,
    ServeLayout,
    TrainLayout,
    TrainRank,
    TransferPlan,
    plan_transfer,
    shard_box,
    stage_layers,
)

__all__ = [
    "DENSE_THRESHOLD",
    "MAX_SPARSE_NUMEL",
    "Backend",
    "BlobHeader",
    "Box",
    "DType",
    "Encoding",
    "Fetch",
    "ParamSpec",
    "Piece",
    "ServeLayout",
    "ShardRule",
    "TrainLayout",
    "TrainRank",
    "TransferPlan",
    "apply",
    "backend_of",
    "bf16_bits_to_float32",
    "choose_encoding",
    "count_changed",
    "decode",
    "decoder_params",
    "encode",
    "encoded_nbytes",
    "float32_to_bf16_bits",
    "header_nbytes",
    "infer_rule",
    "layer_of",
    "model_params",
    "param_specs",
    "plan_transfer",
    "read_header",
    "shard_box",
    "stage_layers",
]
