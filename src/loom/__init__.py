"""Loom: resource orchestration for RL post-training of LLMs."""

from typing import Any

from loom._version import __version__

__all__ = ["__version__"]


def __getattr__(name: str) -> Any:
    """`loom.phase`: the cluster client's phase decorator (imported on first use, so that
    `import loom` stays light)."""
    if name == "phase":
        from loom.client.cluster import phase

        return phase
    raise AttributeError(f"module 'loom' has no attribute {name!r}")
