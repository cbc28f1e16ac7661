"""Runs as tidy records: every figure a run reports, flat; a system's medians, runs and
spread; ratios to Heddle and the targets'."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from loom.bench.summary import (
    SIM_FIELDS,
    per_turn,
    profile_records,
    run_record,
    simulated,
    system_record,
    targets,
    with_vs_heddle,
)


def _row(system: str, makespan: float, router: float | None = 0.4, **extra: Any) -> dict:
    row = {
        "system": system,
        "makespan_s": makespan,
        "tokens": 1000,
        "throughput_tok_s": 1000 / makespan,
        "preemptions": 2,
        "migrations": 1,
        "timing": {"turns": 10, "queue_s": 1.0, "first_token_s": 0.5, "decode_s": 20.0},
        "wall_s": makespan * 0.1,
        "engines_cpu_s": 1.2,
        "agents_cpu_s": 0.4,
        "engine": {"preemptions": 3.0, "busy_s": 7.5},
        **extra,
    }
    if router is not None:
        row["router_cpu_s"] = router
    return row


def test_a_run_as_a_flat_record() -> None:
    rec = run_record(_row("heddle", 50.0), workload="coding", repeat=1, turns=20)
    assert rec == {
        "record": "run",
        "workload": "coding",
        "system": "heddle",
        "repeat": 1,
        "turns": 20,
        "makespan_s": 50.0,
        "wall_s": 5.0,
        "tokens": 1000,
        "throughput_tok_s": 20.0,
        "preemptions": 2,
        "migrations": 1,
        "router_cpu_s": 0.4,
        "router_cpu_ms_per_turn": pytest.approx(20.0),
        "router_cpu_share": pytest.approx(0.4 / 2.0),
        "engines_cpu_s": 1.2,
        "agents_cpu_s": 0.4,
        "run_cpu_s": pytest.approx(2.0),
        "queue_s_per_turn": 0.1,
        "first_token_s_per_turn": 0.05,
        "decode_s_per_turn": 2.0,
        "engine_preemptions": 3.0,
        "engine_busy_s": 7.5,
    }


def test_a_router_in_this_process_and_a_peer_have_no_figures_of_their_own() -> None:
    rec = run_record(_row("heddle", 50.0, router=None), workload="math", repeat=0, turns=20)
    assert rec["router_cpu_s"] is rec["router_cpu_ms_per_turn"] is rec["router_cpu_share"] is None
    assert rec["run_cpu_s"] == pytest.approx(1.6)
    assert per_turn(None) == dict.fromkeys(
        ("queue_s_per_turn", "first_token_s_per_turn", "decode_s_per_turn")
    )


def test_a_system_summarized_over_its_runs() -> None:
    runs = [
        run_record(_row("verl", m, router=r), workload="coding", repeat=i, turns=10)
        for i, (m, r) in enumerate([(40.0, 0.2), (60.0, 0.6), (50.0, 0.4)])
    ]
    got = system_record(runs)
    assert got["record"] == "system" and got["system"] == "verl" and got["runs"] == 3
    assert got["makespan_s"] == 50.0
    assert got["makespan_runs_s"] == [40.0, 60.0, 50.0]
    assert got["spread"] == pytest.approx(20.0 / 50.0)
    assert got["router_cpu_ms_per_turn"] == pytest.approx(40.0)
    assert got["throughput_tok_s"] == pytest.approx(20.0)
    with pytest.raises(ValueError, match="at least one run"):
        system_record([])


def test_ratios_to_heddle_and_the_targets() -> None:
    rows = [
        {"system": s, "makespan_s": m}
        for s, m in [("heddle", 100.0), ("verl", 90.0), ("slime", 120.0), ("sglang:manual", 80.0)]
    ]
    got = with_vs_heddle(rows)
    assert [r["vs_heddle"] for r in got] == [1.0, 0.9, 1.2, 0.8]
    assert targets(got) == {"best_baseline_over_heddle": 0.9, "best_peer_over_heddle": 0.8}
    no_heddle = with_vs_heddle(rows[1:])
    assert all(r["vs_heddle"] is None for r in no_heddle)
    assert targets(no_heddle) == {"best_baseline_over_heddle": None, "best_peer_over_heddle": None}


def test_the_simulators_figures_beside_the_real_makespan() -> None:
    bare = SimpleNamespace(
        makespan_s=50.0, preemptions=1, prefill_tokens=900, cache_hit_tokens=100, migrations=2
    )
    routed = SimpleNamespace(
        makespan_s=55.0, preemptions=1, prefill_tokens=900, cache_hit_tokens=100, migrations=2
    )
    got = simulated(60.0, bare, routed, 0.004)
    assert set(got) == set(SIM_FIELDS)
    assert got["sim_s"] == 50.0 and got["real_over_sim"] == pytest.approx(1.2)
    assert got["sim_routed_s"] == 55.0 and got["real_over_sim_routed"] == pytest.approx(60 / 55)
    assert got["sim_decision_s"] == 0.004
    assert (got["sim_preemptions"], got["sim_prefill_tokens"]) == (1, 900)
    assert (got["sim_cache_hit_tokens"], got["sim_migrations"]) == (100, 2)


def test_a_profile_as_records() -> None:
    assert profile_records([(2, 224, 0, 0, 0.01), (0, 0, 512, 0, 0.2)]) == [
        {"record": "profile", "decode_batch": 2, "decode_context_tokens": 224,
         "prefill_tokens": 0, "prefill_context_tokens": 0, "time_s": 0.01},
        {"record": "profile", "decode_batch": 0, "decode_context_tokens": 0,
         "prefill_tokens": 512, "prefill_context_tokens": 0, "time_s": 0.2},
    ]  # fmt: skip
