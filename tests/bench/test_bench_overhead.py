"""What a router adds to a request, measured against the engine direct; the targets' ratios."""

from __future__ import annotations

import os

import pytest

from loom.bench.fleet import StandinEngines
from loom.bench.overhead import FLOOR, measure, ratios
from loom.bench.routers import ThreadRouter


def test_overhead_against_the_engine_direct(standins: StandinEngines, router: ThreadRouter) -> None:
    got = measure(standins.urls[0], router.url, os.getpid(), 200, 2, 2, "ids")
    assert got["requests"] == 200
    assert got["added_p50_ms"] == pytest.approx(got["routed_p50_ms"] - got["direct_p50_ms"])
    assert got["added_p99_ms"] == pytest.approx(got["routed_p99_ms"] - got["direct_p99_ms"])
    assert got["router_cpu_ms_per_request"] > 0 and got["requests_per_s"] > 0


def test_ratios_need_both_routers_at_one_and_eight() -> None:
    rows = [
        {"router": r, "concurrency": c, "added_p50_ms": a, "router_cpu_ms_per_request": cpu,
         "requests_per_s": rps}
        for r, c, a, cpu, rps in [
            ("loom", 1, 0.5, 0.4, 900.0), ("loom", 8, 0.9, 0.3, 2000.0),
            ("sglang-router", 1, 0.2, 0.2, 1000.0), ("sglang-router", 8, 0.3, 0.1, 2500.0),
        ]
    ]  # fmt: skip
    assert ratios(rows) == {
        "loom_added_p50_ms": 0.5,
        "sglang_router_added_p50_ms": 0.2,
        "cpu_per_request_over_sglang_router": pytest.approx(2.0),
        "requests_per_s_over_sglang_router": pytest.approx(0.8),
    }
    assert ratios(rows[:2]) is None


def test_a_router_cpu_under_a_clock_tick_is_not_a_ratio() -> None:
    """CPU time is counted in clock ticks: a short run may read none, and the ratio is then
    unknown (None), never a division by zero."""

    def row(router: str, c: int, cpu: float | None) -> dict[str, object]:
        return {"router": router, "concurrency": c, "added_p50_ms": 0.3,
                "router_cpu_ms_per_request": cpu, "requests_per_s": 100.0 * c}  # fmt: skip

    got = ratios([row("loom", 1, 0.5), row("loom", 8, 0.5),
                  row("sglang-router", 1, None), row("sglang-router", 8, 0.2)])  # fmt: skip
    assert got is not None and got["cpu_per_request_over_sglang_router"] is None
    assert got["requests_per_s_over_sglang_router"] == 1.0
    both = ratios([row("loom", 1, 0.5), row("loom", 8, 0.5),
                   row("sglang-router", 1, 0.25), row("sglang-router", 8, 0.2)])  # fmt: skip
    assert both is not None and both["cpu_per_request_over_sglang_router"] == 2.0


def test_the_floor_beside_the_routers_where_the_bare_proxy_ran() -> None:
    def row(router: str, c: int, added: float, cpu: float, rps: float) -> dict[str, object]:
        return {"router": router, "concurrency": c, "added_p50_ms": added,
                "router_cpu_ms_per_request": cpu, "requests_per_s": rps}  # fmt: skip

    rows = [row("loom", 1, 0.6, 0.6, 500.0), row("loom", 8, 0.9, 0.5, 2000.0),
            row("sglang-router", 1, 0.3, 0.3, 600.0), row("sglang-router", 8, 0.4, 0.2, 2500.0),
            row(FLOOR, 1, 0.4, 0.4, 550.0), row(FLOOR, 8, 0.5, 0.3, 2250.0)]  # fmt: skip
    got = ratios(rows)
    assert got is not None
    assert got["floor_added_p50_ms"] == 0.4
    assert got["floor_cpu_per_request_over_sglang_router"] == pytest.approx(4 / 3)
    assert got["floor_requests_per_s_over_sglang_router"] == pytest.approx(0.9)
    assert got["cpu_per_request_over_floor"] == pytest.approx(1.5)
    without = ratios(rows[:4])
    assert without is not None and "cpu_per_request_over_floor" not in without
