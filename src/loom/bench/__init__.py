"""Loom's benchmark harness: a batch of agentic trajectories replayed through a router over a
fleet of engines, the same batch in the simulator, and what each run took, written as one JSON
document of tidy records. The scripts in `benchmarks/` parse arguments, call this and print.

Modules, one concept each: `batch` (the scaled workload), `replay` (the agents and their
client pools), `fleet` (engines: stand-in, vLLM, emulated, running), `routers` (Loom's, served
or in a thread, and sglang-router), `systems` (the rollout systems compared), `settings`
(router settings and their simulator counterparts), `simulate`, `calibrate` (engines' served
profile), `measure` (CPU and round trips), `summary` (records of runs), `overhead`,
`continuous` and `soak` (the router benchmarks' loads), `process` (a server in a child
process), `progress` (a bar with time left), `results` (the JSON document) and `script` (a
script's `--json PATH` option, writing that document).

NOTE: the names below are loaded on first use, so that a reader of results
(`loom.bench.results`) does not import the router, the simulator and their dependencies."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loom.bench.batch import Batch, BatchConfig, Turn, draw_tokens, scaled_batch
    from loom.bench.fleet import (
        EmulatedEngines,
        Fleet,
        RunningEngines,
        StandinEngines,
        VllmEngines,
    )
    from loom.bench.progress import RunProgress
    from loom.bench.replay import run_batch, run_peer_batch, vocabulary
    from loom.bench.results import ResultsError, read_results, results, write_results
    from loom.bench.routers import Router, ServedRouter, SglangRouter, ThreadRouter
    from loom.bench.script import add_json_option, write_json
    from loom.bench.settings import RouterSetup, router_setting
    from loom.bench.systems import SYSTEMS, Bench, System

_EXPORTS = {
    "batch": ("Batch", "BatchConfig", "Turn", "draw_tokens", "scaled_batch"),
    "fleet": ("EmulatedEngines", "Fleet", "RunningEngines", "StandinEngines", "VllmEngines"),
    "progress": ("RunProgress",),
    "replay": ("run_batch", "run_peer_batch", "vocabulary"),
    "results": ("ResultsError", "read_results", "results", "write_results"),
    "routers": ("Router", "ServedRouter", "SglangRouter", "ThreadRouter"),
    "script": ("add_json_option", "write_json"),
    "settings": ("RouterSetup", "router_setting"),
    "systems": ("SYSTEMS", "Bench", "System"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = [
    "SYSTEMS",
    "Batch",
    "BatchConfig",
    "Bench",
    "EmulatedEngines",
    "Fleet",
    "ResultsError",
    "Router",
    "RouterSetup",
    "RunProgress",
    "RunningEngines",
    "ServedRouter",
    "SglangRouter",
    "StandinEngines",
    "System",
    "ThreadRouter",
    "Turn",
    "VllmEngines",
    "add_json_option",
    "draw_tokens",
    "read_results",
    "results",
    "router_setting",
    "run_batch",
    "run_peer_batch",
    "scaled_batch",
    "vocabulary",
    "write_json",
    "write_results",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'loom.bench' has no attribute {name!r}")
    return getattr(importlib.import_module(f"loom.bench.{module}"), name)
