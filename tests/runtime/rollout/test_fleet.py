"""The router's own engines in Heddle's planned layout: slots pack degrees onto GPUs without
spanning nodes; a change keeps what it can; the router starts the layout's emulated engines at
their degrees, plans again between steps (draining, stopping and starting engines), and
leaves nothing running when it stops, even when it is killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from loom.core.errors import ConfigError
from loom.core.trajectory import TrajectorySpec, TurnSpec, WorkloadKind
from loom.runtime.rollout import BackgroundRouter, RolloutServerConfig
from loom.runtime.rollout.config import FleetConfig
from loom.runtime.rollout.layout import Slot, change, planned_layout, slots

# ---- the layout, without I/O ---------------------------------------------------------------


def test_slots_pack_largest_first_on_whole_nodes() -> None:
    got = slots((1, 4, 2, 1), gpus=8, gpus_per_node=4)
    assert [(s.tp, s.gpus, s.node) for s in got] == [
        (4, (0, 1, 2, 3), 0),
        (2, (4, 5), 1),
        (1, (6,), 1),
        (1, (7,), 1),
    ]
    assert got[1].devices(4) == "0,1" and got[1].name == "tp2-g4"
    with pytest.raises(ConfigError, match="needs 10 GPUs"):
        slots((8, 2), gpus=8, gpus_per_node=8)
    with pytest.raises(ConfigError, match="span two nodes"):
        slots((2, 4), gpus=8, gpus_per_node=3)


def test_a_change_keeps_the_engines_of_the_same_degree_on_the_same_gpus() -> None:
    old = slots((2, 2, 2, 2), gpus=8, gpus_per_node=8)
    new = slots((4, 2, 2), gpus=8, gpus_per_node=8)
    step = change(old, new)
    assert [s.name for s in step.keep] == ["tp2-g4", "tp2-g6"]
    assert [s.name for s in step.stop] == ["tp2-g0", "tp2-g2"]
    assert [s.name for s in step.start] == ["tp4-g0"]
    assert change(old, old).none and not step.none
    assert change([], old).start == old
    assert Slot(2, (0, 1), 0) in set(old)


def _history(n: int) -> list[TrajectorySpec]:
    return [
        TrajectorySpec(
            traj_id=i,
            prompt_id=i,
            sample_idx=0,
            workload=WorkloadKind.CODING,
            turns=(TurnSpec(2000, 500 + 400 * (i % 7), 1.0), TurnSpec(300, 800, None)),
        )
        for i in range(n)
    ]


def test_the_layout_is_fixed_uniform_without_history_or_planned_from_it() -> None:
    fleet = FleetConfig(gpus=8, emulate="qwen3-14b@h100")
    assert planned_layout(fleet, [], "x", "y") == (1,) * 8
    fixed = fleet.model_copy(update={"layout": (4, 4)})
    assert planned_layout(fixed, _history(40), "x", "y") == (4, 4)
    planned = planned_layout(fleet, _history(40), "x", "y")
    assert sum(planned) <= 8 and set(planned) <= {1, 2, 4, 8}
    with pytest.raises(ConfigError, match="MODEL@GPU"):
        planned_layout(
            fleet.model_copy(update={"emulate": "qwen3-14b@h100:tp2"}), _history(4), "", ""
        )


# ---- the router's own engines ---------------------------------------------------------------


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _engine_pids(router_pid: int) -> list[int]:
    """Every process below the router's."""
    out = subprocess.run(["ps", "-eo", "pid,ppid"], capture_output=True, text=True).stdout
    children: dict[int, list[int]] = {}
    for line in out.splitlines()[1:]:
        pid, ppid = map(int, line.split())
        children.setdefault(ppid, []).append(pid)
    found, todo = [], [router_pid]
    while todo:
        for c in children.get(todo.pop(), []):
            found.append(c)
            todo.append(c)
    return found


def test_the_router_starts_its_layout_and_moves_to_a_new_one() -> None:
    fleet = FleetConfig(gpus=4, emulate="qwen3-14b@h100", layout=(2, 2), time_scale=0.1)
    cfg = RolloutServerConfig(port=0, fleet=fleet, placement="heddle", scheduler="pps")
    with BackgroundRouter(cfg) as r, httpx.Client(base_url=r.url, timeout=120) as http:
        view = http.get("/v1/fleet").json()
        assert view["layout"] == [2, 2]
        engines = {e["id"]: e for e in http.get("/v1/engines").json()["engines"]}
        assert set(engines) == {"tp2-g0", "tp2-g2"}
        assert {e["tp"] for e in engines.values()} == {2}
        old = [e["url"] for e in view["engines"]]
        body = {"prompt": [5] * 64, "max_tokens": 8, "ignore_eos": True}
        assert http.post("/v1/completions", json=body).status_code == 200
        moved = http.post("/v1/fleet/plan", json={"layout": [4]}).json()
        assert moved["before"] == [2, 2] and moved["layout"] == [4]
        assert moved["stopped"] == ["tp2-g0", "tp2-g2"] and moved["started"] == ["tp4-g0"]
        assert moved["seconds"] > 0 and moved["gpu_seconds"] == pytest.approx(
            moved["seconds"] / 0.1
        )
        engines = http.get("/v1/engines").json()["engines"]
        assert [(e["id"], e["tp"]) for e in engines] == [("tp4-g0", 4)]
        for url in old:  # the engines it left are gone
            with pytest.raises(httpx.TransportError):
                httpx.get(url + "/health", timeout=2)
        assert http.post("/v1/completions", json=body).status_code == 200
        assert http.post("/v1/fleet/plan", json={"layout": [8]}).status_code == 400
        assert http.post("/v1/fleet/plan", json={"layout": "x"}).status_code == 400
        new = http.get("/v1/fleet").json()["engines"][0]["url"]
    with pytest.raises(httpx.TransportError):  # and it stopped its engines when it stopped
        httpx.get(new + "/health", timeout=2)


def test_a_router_without_a_fleet_says_so() -> None:
    with BackgroundRouter(RolloutServerConfig(port=0)) as r:
        got = httpx.get(r.url + "/v1/fleet")
        assert got.status_code == 404 and "fleet" in got.json()["error"]["message"]


def test_a_killed_router_leaves_no_engine_running(tmp_path: Path) -> None:
    config = tmp_path / "rollout.json"
    fleet = {"gpus": 2, "emulate": "qwen3-14b@h100", "layout": [1, 1]}
    config.write_text(json.dumps({"port": 0, "fleet": fleet}))
    proc = subprocess.Popen(
        [sys.executable, "-m", "loom.cli", "serve", "rollout", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        engines: list[int] = []
        while len(engines) < 2:
            assert proc.poll() is None, "the router exited"
            assert time.monotonic() < deadline, "the fleet never started"
            time.sleep(0.2)
            engines = [
                p
                for p in _engine_pids(proc.pid)
                if "loom.runtime.emulate" in Path(f"/proc/{p}/cmdline").read_text(errors="replace")
            ]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in engines):
        assert time.monotonic() < deadline, "an engine outlived its router"
        time.sleep(0.1)
