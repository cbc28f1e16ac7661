"""ARL-Tangram (seed 000): action-level orchestration of external resources with an elastic
scheduler over a unified, topology-agnostic DP (DPArrange)."""

from loom.actions.tangram.arrange import (
    Arrangement,
    ChunkOperator,
    DpOperator,
    Durations,
    UnitPoolOperator,
    dp_arrange,
    dp_arrange_chunks,
    free_blocks,
    pack_chunks,
)

__all__ = [
    "Arrangement",
    "ChunkOperator",
    "DpOperator",
    "Durations",
    "UnitPoolOperator",
    "dp_arrange",
    "dp_arrange_chunks",
    "free_blocks",
    "pack_chunks",
]
