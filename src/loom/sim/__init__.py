"""Deterministic simulation: event engine, seeded streams, metrics, workloads, simulators."""

from loom.sim.engine import Engine, EventId
from loom.sim.metrics import Metrics
from loom.sim.rng import Streams, stream

__all__ = ["Engine", "EventId", "Metrics", "Streams", "stream"]
