"""Loom: resource orchestration for RL post-training of LLMs."""

__version__ = "0.1.0"
