"""Model state that moves between the training and serving sides of RL post-training: for now,
weights (`loom.state.weights`: the sparse-delta codec and shard plans)."""

from loom.state import weights

__all__ = ["weights"]
