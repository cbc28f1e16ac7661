"""The router's Prometheus metrics, on a registry of its own (several routers may share a
process in tests and benchmarks).

NOTE: what the core counts (its `Ledger`: events, the turn and queueing histograms) and the
engines' gauges and token counts are read when /metrics is scraped, not set on every change:
the ledger is the one count, `/v1/stats` and `/metrics` two views of it. Only what the HTTP
layer sees (requests by route, errors by status) is counted here."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import Collector

from loom.runtime.rollout.ledger import LATENCY_BUCKETS, Ledger
from loom.runtime.rollout.ledger import Histogram as Observed
from loom.runtime.web.probes import exposition

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from loom.runtime.rollout.state import EngineState

__all__ = ["RouterMetrics"]

# the ledger's counts that Prometheus shows, by its name (loom_rollout_NAME_total)
_COUNTERS = {
    "preemptions": ("preemptions", "running turns evicted by an outranking one"),
    "migrations": ("migrations", "trajectories whose home engine moved"),
    "failovers": ("failovers", "turns resumed elsewhere after an engine failed"),
}


class _Ledger(Collector):
    """The ledger's counts and histograms and the engines' gauges, computed at scrape time."""

    def __init__(self, ledger: Ledger, engines: Callable[[], Iterable[EngineState]]) -> None:
        self.ledger = ledger
        self.engines = engines

    def collect(self) -> Iterator[Metric]:
        counts = self.ledger.counts
        for name, (key, doc) in _COUNTERS.items():
            c = CounterMetricFamily(f"loom_rollout_{name}", doc)
            c.add_metric([], counts[key])
            yield c
        yield _histogram(
            "loom_rollout_turn_seconds",
            "time from a turn's arrival to its end",
            self.ledger.turn_seconds,
        )
        yield _histogram(
            "loom_rollout_queueing_seconds",
            "time a turn waited in the router before an engine first took it",
            self.ledger.queueing_seconds,
        )
        load = GaugeMetricFamily(
            "loom_rollout_engine_turns", "turns at an engine, by state", labels=["engine", "state"]
        )
        alive = GaugeMetricFamily("loom_rollout_engine_alive", "1 if routable", labels=["engine"])
        tokens = CounterMetricFamily(
            "loom_rollout_generated_tokens",
            "tokens generated, by engine (rate() gives tokens/s)",
            labels=["engine"],
        )
        for e in self.engines():
            load.add_metric([e.id, "running"], len(e.running))
            load.add_metric([e.id, "waiting"], len(e.waiting))
            alive.add_metric([e.id], 1.0 if e.routable else 0.0)
            tokens.add_metric([e.id], e.tokens)
        yield load
        yield alive
        yield tokens


def _histogram(name: str, doc: str, h: Observed) -> HistogramMetricFamily:
    buckets, running = [], 0
    for bound, n in zip([*LATENCY_BUCKETS, float("inf")], h.counts, strict=True):
        running += n
        buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=h.total)


class RouterMetrics:
    def __init__(
        self, ledger: Ledger | None = None, engines: Callable[[], Iterable[EngineState]] = tuple
    ) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Histogram(
            "loom_rollout_request_seconds",
            "time from a request's arrival to its last byte, by route",
            ["route"],
            registry=r,
            buckets=LATENCY_BUCKETS,
        )
        self.errors = Counter(
            "loom_rollout_errors",
            "requests answered with an error, by status",
            ["status"],
            registry=r,
        )
        r.register(_Ledger(ledger or Ledger(), engines))
        self._routes: dict[str, Histogram] = {}

    def route(self, route: str) -> Histogram:
        child = self._routes.get(route)
        if child is None:
            child = self._routes[route] = self.requests.labels(route)
        return child

    def render(self) -> bytes:
        return exposition(self.registry)
