"""The router's Prometheus metrics, on a registry of its own (several routers may share a
process in tests and benchmarks)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

if TYPE_CHECKING:
    from loom.runtime.rollout.state import EngineState

__all__ = ["RouterMetrics"]

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class RouterMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Histogram(
            "loom_rollout_request_seconds",
            "time from a request's arrival to its last byte, by route",
            ["route"],
            registry=r,
            buckets=_LATENCY_BUCKETS,
        )
        self.turn_seconds = Histogram(
            "loom_rollout_turn_seconds",
            "time from a turn's arrival to its end",
            registry=r,
            buckets=_LATENCY_BUCKETS,
        )
        self.queueing = Histogram(
            "loom_rollout_queueing_seconds",
            "time a turn waited in the router before an engine first took it",
            registry=r,
            buckets=_LATENCY_BUCKETS,
        )
        self.tokens = Counter(
            "loom_rollout_generated_tokens",
            "tokens generated, by engine (rate() gives tokens/s)",
            ["engine"],
            registry=r,
        )
        self.load = Gauge(
            "loom_rollout_engine_turns",
            "turns at an engine, by state",
            ["engine", "state"],
            registry=r,
        )
        self.alive = Gauge("loom_rollout_engine_alive", "1 if routable", ["engine"], registry=r)
        self.preemptions = Counter(
            "loom_rollout_preemptions", "running turns evicted by an outranking one", registry=r
        )
        self.migrations = Counter(
            "loom_rollout_migrations", "trajectories whose home engine moved", registry=r
        )
        self.failovers = Counter(
            "loom_rollout_failovers", "turns resumed elsewhere after an engine failed", registry=r
        )
        self.errors = Counter(
            "loom_rollout_errors",
            "requests answered with an error, by status",
            ["status"],
            registry=r,
        )

    def engine_added(self, eid: str) -> None:
        self.alive.labels(eid).set(1)
        for state in ("running", "waiting"):
            self.load.labels(eid, state).set(0)

    def engine_removed(self, eid: str) -> None:
        for state in ("running", "waiting"):
            self.load.remove(eid, state)
        self.alive.remove(eid)

    def engine_state(self, eid: str, *, alive: bool) -> None:
        self.alive.labels(eid).set(1 if alive else 0)

    def engine_load(self, e: EngineState) -> None:
        self.load.labels(e.id, "running").set(len(e.running))
        self.load.labels(e.id, "waiting").set(len(e.waiting))

    def turn_done(self, seconds: float) -> None:
        self.turn_seconds.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
