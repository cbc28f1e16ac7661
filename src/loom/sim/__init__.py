"""Deterministic simulation: event engine, seeded streams, metrics, workloads, simulators."""

from loom.core.rng import Streams, stream
from loom.sim.engine import Engine, EventId
from loom.sim.metrics import Metrics

__all__ = ["Engine", "EventId", "Metrics", "Streams", "stream"]
