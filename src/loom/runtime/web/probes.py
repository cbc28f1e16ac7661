"""Health and metrics, the same on every service: a health body (or `Unavailable`, a 503) and
a Prometheus registry's exposition."""

from __future__ import annotations

from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from loom.core.errors import Unavailable

__all__ = ["METRICS_CONTENT_TYPE", "exposition", "health"]

METRICS_CONTENT_TYPE = CONTENT_TYPE_LATEST


def health(unavailable: str | None = None, **extra: Any) -> dict[str, Any]:
    """The body of `GET /health(z)`: `{"status": "ok", **extra}`; `Unavailable(unavailable)`
    (503) when the service says why it cannot serve."""
    if unavailable is not None:
        raise Unavailable(unavailable)
    return {"status": "ok", **extra}


def exposition(registry: CollectorRegistry) -> bytes:
    """The body of `GET /metrics` (`METRICS_CONTENT_TYPE`): the service's own registry."""
    return generate_latest(registry)
