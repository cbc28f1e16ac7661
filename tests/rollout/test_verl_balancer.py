"""Loom's verl load balancer: verl's RequestLoadBalancer protocol over Loom's placements, as
verl 0.9.1 calls it (keywords; fire-and-forget releases carrying the request id)."""

from __future__ import annotations

import pytest

from loom.core.errors import ConfigError
from loom.integrations.verl import NO_SERVERS, LoomLoadBalancer
from loom.rollout.policy import PlacementKind


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.mark.parametrize("placement", [p for p in PlacementKind if p is not PlacementKind.ROSE])
def test_turns_of_a_trajectory_stay_put_and_loads_balance(placement) -> None:
    servers = {f"s{i}": f"handle{i}" for i in range(3)}
    lb = LoomLoadBalancer(servers, {"placement": placement.value})
    assert lb.require_acquire_fields() == ["prompt_ids"]
    assert lb.require_release_fields() == ["request_id"]
    homes: dict[str, list[str]] = {}
    for turn in range(3):
        acquired = []
        for j in range(9):
            sid, handle = lb.acquire_server(request_id=f"r{j}", prompt_ids=[j] * (turn + 1))
            acquired.append((f"r{j}", sid, handle))
        for rid, sid, handle in acquired:
            assert handle == servers[sid]
            homes.setdefault(rid, []).append(sid)
        loads = list(lb.get_status()["servers"].values())
        assert sum(loads) == 9 == lb.get_total_inflight() and max(loads) - min(loads) <= 3
        for rid, sid, _ in acquired:
            lb.release_server(server_id=sid, request_id=rid)
    assert lb.get_total_inflight() == 0
    if placement in (PlacementKind.CACHE_AWARE, PlacementKind.HYBRID):  # they keep its cache
        assert all(len(set(h)) == 1 for h in homes.values())


def test_releases_never_leak_and_never_go_below_zero() -> None:
    lb = LoomLoadBalancer({"a": 1, "b": 2}, {"placement": "least_load"})
    sid, _ = lb.acquire_server(request_id="x", prompt_ids=[1])
    lb.release_server(server_id=sid, request_id="x")
    lb.release_server(server_id=sid, request_id="x")  # repeated: ignored
    lb.release_server(server_id="zz", request_id="y")  # unknown: ignored
    assert lb.get_total_inflight() == 0
    sid, _ = lb.acquire_server(request_id="x", prompt_ids=[1, 2])
    lb.remove_servers(server_ids=[sid])  # its turn no longer counts
    assert lb.get_total_inflight() == 0
    lb.release_server(server_id=sid, request_id="x")  # a late release of a removed server
    assert lb.get_total_inflight() == 0


def test_servers_come_and_go_and_idle_trajectories_end() -> None:
    clock = Clock()
    lb = LoomLoadBalancer({"a": 1}, {"placement": "cache_aware", "idle_s": 10}, clock=clock)
    sid, _ = lb.acquire_server("x", [1])
    lb.release_server(sid, "x")
    lb.add_servers({"b": 2})
    lb.remove_servers(["a"])
    assert lb.get_all_servers() == ["b"]
    assert lb.acquire_server("x", [1])[0] == "b"  # its server left: re-pinned
    lb.release_server("b", "x")
    clock.t = 11
    lb.acquire_server("y", [2])
    assert lb.get_status()["trajectories"] == 1  # x ended after idling


def test_a_phase_switch_clears_the_trajectories_between_turns() -> None:
    lb = LoomLoadBalancer({"a": 1, "b": 2})
    lb.acquire_server("busy", [1])
    sid, _ = lb.acquire_server("idle", [2])
    lb.release_server(sid, "idle")
    out = lb.clear_sticky_cache()
    assert out["cleared_entries"] == 1 and set(out["server_loads"]) == {"a", "b"}
    assert lb.get_status()["trajectories"] == 1  # the one in flight stays


def test_verl_constructs_it_either_way() -> None:
    LoomLoadBalancer({"a": 1}, {"router_class": "loom.integrations.verl.LoomLoadBalancer"})
    LoomLoadBalancer(servers={}, max_cache_size=10000)  # load_balancer_cls; empty pool ok


def test_bad_config_and_an_empty_pool_are_refused() -> None:
    with pytest.raises(ConfigError, match="router_config"):
        LoomLoadBalancer({"a": 1}, {"placement": "nope"})
    with pytest.raises(ConfigError, match="unknown loom router_config keys"):
        LoomLoadBalancer({"a": 1}, {"placment": "heddle"})
    with pytest.raises(RuntimeError, match=NO_SERVERS):
        LoomLoadBalancer({}, {}).acquire_server("r")
