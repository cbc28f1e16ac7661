"""Experiments: each seed's evaluation as runs of registered policies on the simulators."""

from loom.experiments.registry import SYSTEMS, SystemKind

__all__ = ["SYSTEMS", "SystemKind"]
