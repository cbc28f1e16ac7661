"""Stand-in engines and Loom's router on loopback, shared by the harness's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from loom.bench.fleet import StandinEngines
from loom.bench.routers import ThreadRouter
from loom.bench.settings import RouterSetup, router_config


@pytest.fixture(scope="session")
def standins() -> Iterator[StandinEngines]:
    """Two stand-in engines on a 1 ms step (a test that reads their logs reads what came
    after where it found them)."""
    with StandinEngines(2, "--step-ms", "1") as fleet:
        yield fleet


@pytest.fixture(scope="module")
def router(standins: StandinEngines) -> Iterator[ThreadRouter]:
    """Loom's router in this process over `standins` (least-load placement, fcfs)."""
    config = router_config(RouterSetup(max_running=64), "least_load", "fcfs", standins.urls)
    with ThreadRouter(config) as r:
        yield r
