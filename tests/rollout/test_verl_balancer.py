"""Loom's verl load balancer: verl's RequestLoadBalancer protocol over Loom's placements."""

from __future__ import annotations

import pytest

from loom.integrations.verl import LoomLoadBalancer
from loom.rollout.policy import PlacementKind


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.mark.parametrize("placement", list(PlacementKind))
def test_turns_of_a_trajectory_stay_put_and_loads_balance(placement) -> None:
    servers = {f"s{i}": f"handle{i}" for i in range(3)}
    lb = LoomLoadBalancer(servers, {"placement": placement.value})
    homes: dict[str, list[str]] = {}
    for turn in range(3):
        acquired = [(f"r{j}", *lb.acquire_server(f"r{j}", [j, 1, 2])) for j in range(9)]
        for rid, sid, handle in acquired:
            assert handle == servers[sid]
            homes.setdefault(rid, []).append(sid)
        loads = [s["inflight"] for s in lb.get_status()["servers"].values()]
        assert sum(loads) == 9 and max(loads) - min(loads) <= 3
        for rid, sid, _ in acquired:
            lb.release_server(sid, prompt_len=10 * (turn + 1), request_id=rid)
    assert all(s["inflight"] == 0 for s in lb.get_status()["servers"].values())
    if placement in (PlacementKind.CACHE_AWARE, PlacementKind.HYBRID):  # they keep its cache
        assert all(len(set(h)) == 1 for h in homes.values())


def test_servers_come_and_go_and_idle_trajectories_end() -> None:
    clock = Clock()
    lb = LoomLoadBalancer({"a": 1}, {"placement": "cache_aware", "idle_s": 10}, clock=clock)
    sid, _ = lb.acquire_server("x", [1])
    lb.release_server(sid, 1, "x")
    lb.add_servers({"b": 2})
    lb.remove_servers(["a"])
    assert lb.get_all_servers() == ["b"]
    assert lb.acquire_server("x", [1])[0] == "b"  # its server left: re-pinned
    lb.release_server("b", 1, "x")
    clock.t = 11
    lb.acquire_server("y", [2])
    assert lb.get_status()["trajectories"] == 1  # x ended after idling


def test_bad_config_is_refused() -> None:
    from loom.core.errors import ConfigError

    with pytest.raises(ConfigError, match="router_config"):
        LoomLoadBalancer({"a": 1}, {"placement": "nope"})
    with pytest.raises(RuntimeError, match="no servers"):
        LoomLoadBalancer({}, {}).acquire_server("r")
