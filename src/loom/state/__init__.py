"""Model state that moves: weights between the training and serving sides of RL post-training
(`loom.state.weights`: the sparse-delta codec and shard plans), and a node's residency of model
and optimizer state across GPU, host and disk (`loom.state.manager`, PlexRL's StateManager;
needs the torch extra)."""

from loom.state import weights

__all__ = ["weights"]
