"""The relay's Prometheus metrics (`GET /metrics`), on a registry of its own."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from loom.runtime.relay.memory import StoreStats
from loom.runtime.web.probes import exposition

__all__ = ["RelayMetrics"]


class RelayMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.stored = Gauge("loom_relay_stored_bytes", "bytes of objects stored", registry=r)
        self.capacity = Gauge("loom_relay_capacity_bytes", "memory cap (--max-bytes)", registry=r)
        self.objects = Gauge("loom_relay_objects", "objects stored", registry=r)
        self.versions = Gauge("loom_relay_versions", "versions stored", registry=r)
        self.members = Gauge("loom_relay_members", "live members", registry=r)
        self.puts = Counter("loom_relay_put_objects", "objects stored by PUT", registry=r)
        self.put_bytes = Counter("loom_relay_put_bytes", "bytes stored by PUT", registry=r)
        self.gets = Counter(
            "loom_relay_get_objects", "objects read (one GET, or each of a batch)", registry=r
        )
        self.get_bytes = Counter("loom_relay_get_bytes", "bytes of objects read", registry=r)
        self.batches = Counter("loom_relay_batches", "batch pulls answered", registry=r)
        self.refused = Counter(
            "loom_relay_refused",
            "requests the store refused, by error code (store_full, object_missing, ...)",
            ["code"],
            registry=r,
        )
        self.dropped = Counter("loom_relay_dropped_versions", "versions dropped", registry=r)
        self._dropped_seen = 0

    def read(self, objects: int, size: int) -> None:
        self.gets.inc(objects)
        self.get_bytes.inc(size)

    def render(self, stats: StoreStats) -> bytes:
        self.stored.set(stats.bytes)
        self.capacity.set(stats.max_bytes)
        self.objects.set(stats.objects)
        self.versions.set(stats.versions)
        self.members.set(stats.members)
        self.dropped.inc(stats.dropped - self._dropped_seen)
        self._dropped_seen = stats.dropped
        return exposition(self.registry)
