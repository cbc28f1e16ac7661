"""The action server's Prometheus metrics (`GET /metrics`), on a registry of its own (several
servers may share a process in tests and benchmarks)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from loom.core.actions import ActionStatus
from loom.runtime.actions.record import ActionRecord
from loom.runtime.web.probes import exposition

__all__ = ["ActionMetrics"]

_ACT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)


def _failure(rec: ActionRecord) -> str | None:
    """Why an action did not succeed, in a few words fit for a label (None if it did)."""
    out = rec.outcome
    if out is None or out.status is ActionStatus.SUCCEEDED:
        return None
    if out.status is ActionStatus.FAILED:
        return "nonzero_exit" if out.exit_code is not None else "not_run"
    return out.status.name.lower()  # timed_out, cancelled


class ActionMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.queued = Gauge("loom_actions_queued", "actions waiting for resources", registry=r)
        self.running = Gauge("loom_actions_running", "actions executing", registry=r)
        self.busy_cores = Gauge("loom_actions_busy_cores", "cores granted now", registry=r)
        self.act = Histogram(
            "loom_action_completion_seconds",
            "action completion time (ACT: submit to end), by kind",
            ["kind"],
            registry=r,
            buckets=_ACT_BUCKETS,
        )
        self.finished = Counter(
            "loom_actions_finished",
            "terminal actions, by kind and status",
            ["kind", "status"],
            registry=r,
        )
        self.failures = Counter(
            "loom_action_failures",
            "actions that did not succeed, by kind and reason "
            "(nonzero_exit, not_run, timed_out, cancelled)",
            ["kind", "reason"],
            registry=r,
        )

    def record(self, rec: ActionRecord) -> None:
        """A terminal action."""
        kind = rec.spec.kind.value
        assert rec.outcome is not None and rec.finished is not None
        self.act.labels(kind).observe(rec.finished - rec.submitted)
        self.finished.labels(kind, rec.outcome.status.name.lower()).inc()
        if (reason := _failure(rec)) is not None:
            self.failures.labels(kind, reason).inc()

    def render(self, queued: int, running: int, busy_cores: int) -> bytes:
        self.queued.set(queued)
        self.running.set(running)
        self.busy_cores.set(busy_cores)
        return exposition(self.registry)
