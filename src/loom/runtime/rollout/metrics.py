"""The router's Prometheus metrics, on a registry of its own (several routers may share a
process in tests and benchmarks).

NOTE: the engines' gauges (turns running and waiting, alive) are read from the engines when
/metrics is scraped, not set on every change: a request's path pays for counters only, and
a counter's child is looked up once per engine."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from loom.runtime.rollout.state import EngineState

__all__ = ["RouterMetrics"]

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class _Engines(Collector):
    """The engines' gauges, computed at scrape time."""

    def __init__(self, engines: Callable[[], Iterable[EngineState]]) -> None:
        self.engines = engines

    def collect(self) -> Iterator[Metric]:
        load = GaugeMetricFamily(
            "loom_rollout_engine_turns", "turns at an engine, by state", labels=["engine", "state"]
        )
        alive = GaugeMetricFamily("loom_rollout_engine_alive", "1 if routable", labels=["engine"])
        for e in self.engines():
            load.add_metric([e.id, "running"], len(e.running))
            load.add_metric([e.id, "waiting"], len(e.waiting))
            alive.add_metric([e.id], 1.0 if e.routable else 0.0)
        yield load
        yield alive


class RouterMetrics:
    def __init__(self, engines: Callable[[], Iterable[EngineState]] = tuple) -> None:
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
        r.register(_Engines(engines))
        self._tokens: dict[str, Counter] = {}
        self._routes: dict[str, Histogram] = {}

    def engine_tokens(self, eid: str) -> Counter:
        """The token counter of one engine (its child, looked up once)."""
        child = self._tokens.get(eid)
        if child is None:
            child = self._tokens[eid] = self.tokens.labels(eid)
        return child

    def route(self, route: str) -> Histogram:
        child = self._routes.get(route)
        if child is None:
            child = self._routes[route] = self.requests.labels(route)
        return child

    def engine_removed(self, eid: str) -> None:
        if self._tokens.pop(eid, None) is not None:
            self.tokens.remove(eid)

    def turn_done(self, seconds: float) -> None:
        self.turn_seconds.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
