"""Loom: resource orchestration for RL post-training of LLMs."""

from typing import Any

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """`loom.phase`: the cluster client's phase decorator (imported on first use, so that
    `import loom` stays light)."""
    if name == "phase":
        from loom.client.cluster import phase

        return phase
    raise AttributeError(f"module 'loom' has no attribute {name!r}")
