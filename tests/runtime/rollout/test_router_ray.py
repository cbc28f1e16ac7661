"""The router and stand-in engines deployed on a local Ray cluster with fake GPUs: placement,
engines joining the serving router, lookup by name, teardown, and the errors a user meets."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from loom.cli import app
from loom.runtime.rollout import RolloutServerConfig
from loom.runtime.rollout.ray_deploy import (
    RAY_INSTALL_HINT,
    DeployError,
    EngineLauncher,
    PlacementError,
    RayDeployConfig,
    RayUnavailableError,
    connect,
    deploy,
    require_ray,
)

requires_ray = pytest.mark.skipif(
    importlib.util.find_spec("ray") is None, reason=f"needs the ray extra: {RAY_INSTALL_HINT}"
)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """A local Ray with 4 fake GPUs and 4 CPUs; nothing of ours is left on it afterwards."""
    import ray

    ray.init(
        num_gpus=4,
        num_cpus=4,
        object_store_memory=100 * 2**20,
        include_dashboard=False,
        namespace="loom-test",
        log_to_driver=False,
    )
    yield ray
    ray.shutdown()


def standins(**overrides: Any) -> RayDeployConfig:
    values: dict[str, Any] = {
        "engines": 2,
        "tp": 2,
        "launcher": EngineLauncher.STANDIN,
        "max_running": 8,
        "host": "127.0.0.1",
        "namespace": "loom-test",
        "standin_args": ("--step-ms", "2"),
        "placement_timeout_s": 30,
        "engine_timeout_s": 120,
    }
    return RayDeployConfig(**{**values, **overrides})


def leftovers(ray: Any) -> tuple[list[Any], list[str]]:
    """Named actors still alive and placement groups not removed (our actors are all named)."""
    from ray.util.placement_group import placement_group_table

    actors = ray.util.list_named_actors(all_namespaces=True)
    groups = [g["name"] for g in placement_group_table().values() if g["state"] != "REMOVED"]
    return actors, groups


def wait_empty(ray: Any, timeout_s: float = 20.0) -> tuple[list[Any], list[str]]:
    deadline = time.monotonic() + timeout_s
    while (left := leftovers(ray)) != ([], []) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


@pytest.mark.ray
@requires_ray
def test_deploy_reserves_tp_bundles_and_engines_join_the_router(cluster: Any) -> None:
    ray = cluster
    from ray.util.placement_group import placement_group_table

    rollout = deploy(standins(), RolloutServerConfig(port=0, placement="least_load"), wait=False)
    try:
        serving = httpx.get(f"{rollout.url}/v1/stats", timeout=30).json()  # before any joined
        assert set(serving["engines"]) <= {"ray-e0", "ray-e1"}
        joined: list[str] = []
        rollout.wait_engines(60, on_join=lambda e: joined.append(e["id"]))
        assert sorted(joined) == ["ray-e0", "ray-e1"]

        table = placement_group_table(rollout.placement_group)
        assert table["state"] == "CREATED" and table["strategy"] == "PACK"
        assert table["bundles"] == {0: {"GPU": 2.0, "CPU": 1.0}, 1: {"GPU": 2.0, "CPU": 1.0}}
        assert ray.available_resources().get("GPU", 0.0) == 0.0
        gpus = [e["gpu_ids"] for e in rollout.joined]
        assert sorted(map(len, gpus)) == [2, 2] and len({g for ids in gpus for g in ids}) == 4

        stats = httpx.get(f"{rollout.url}/v1/stats", timeout=30).json()
        assert set(stats["engines"]) == {"ray-e0", "ray-e1"}
        assert [(e["tp"], e["kind"]) for e in stats["engines"].values()] == [(2, "sglang")] * 2
        body = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 8}}
        resp = httpx.post(f"{rollout.url}/generate", json=body, timeout=30)
        assert resp.status_code == 200 and len(resp.json()["output_ids"]) == 8

        assert ray.get_actor("loom-rollout-router", namespace="loom-test") is not None
        with pytest.raises(DeployError, match="runs in namespace"):
            deploy(standins())
    except BaseException:
        rollout.shutdown()
        raise
    found = connect("loom-rollout-router", namespace="loom-test")  # as another driver would
    assert found.url == rollout.url and len(found.engines) == 2
    assert found.stats()["policy"]["turns"] == 1
    found.shutdown()  # the router's record names every actor and the placement group
    assert wait_empty(ray) == ([], [])
    for e in rollout.joined:  # the engine processes went with their actors
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{e['url']}/health", timeout=2)


@pytest.mark.ray
@requires_ray
def test_engines_that_do_not_fit_fail_clearly(cluster: Any) -> None:
    t0 = time.monotonic()
    with pytest.raises(PlacementError) as info:
        deploy(standins(engines=1, tp=8, placement_timeout_s=2))
    message = str(info.value)
    assert "1 engines of GPU 8, CPU 1" in message and "at most GPU 4" in message
    assert time.monotonic() - t0 < 20
    assert wait_empty(cluster) == ([], [])


def test_without_ray_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(RayUnavailableError, match=r"pip install -e '\.\[ray\]'"):
        require_ray()
    result = CliRunner().invoke(app, ["serve", "rollout", "--ray", "--engines", "1"])
    assert result.exit_code == 1 and RAY_INSTALL_HINT in result.output


@pytest.mark.parametrize(
    "flag", [["--engines", "2"], ["--engine-model", "/m"], ["--engine-arg=--dtype"]]
)
def test_cli_ray_flags_need_ray(flag: list[str]) -> None:
    result = CliRunner().invoke(app, ["serve", "rollout", *flag])
    assert result.exit_code == 2 and "--ray" in result.output


def _serve(cluster: Any) -> tuple[subprocess.Popen[str], list[str], list[str]]:
    """`loom serve rollout --ray` with two stand-in engines on the running `cluster` (as on a
    shared one, whose life is not the command's), once every engine joined: the process,
    its output so far and the URLs it announced (the router's, then each engine's)."""
    address = cluster.get_runtime_context().gcs_address
    cmd = [sys.executable, "-m", "loom.cli", "serve", "rollout", "--ray", "--ray-address"]
    cmd += [address, "--engines", "2", "--engine-kind", "standin", "--engine-gpus", "0"]
    cmd += ["--host", "127.0.0.1", "--port", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "every engine joined" in line:
                break
        assert any("every engine joined" in line for line in lines), "".join(lines)
        names = {a["name"] for a in cluster.util.list_named_actors(all_namespaces=True)}
        engines = {f"loom-rollout-router/engine-{i}" for i in (0, 1)}
        assert names == {"loom-rollout-router", *engines}
    except BaseException:
        proc.kill()
        proc.communicate()
        raise
    urls = re.findall(r"http://127\.0\.0\.1:\d+", "".join(lines))
    assert len(set(urls)) == 3, "".join(lines)
    return proc, lines, list(dict.fromkeys(urls))


def _answering(urls: list[str]) -> list[str]:
    up = []
    for url in urls:
        with contextlib.suppress(httpx.TransportError):
            httpx.get(f"{url}/health", timeout=2, trust_env=False)
            up.append(url)
    return up


@pytest.mark.ray
@pytest.mark.slow
@requires_ray
def test_serve_on_a_shared_cluster_leaves_nothing_behind_on_sigterm(cluster: Any) -> None:
    # SIGTERM must stop its actors and remove its placement group
    proc, lines, urls = _serve(cluster)
    try:
        os.kill(proc.pid, signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert "stopped the router and 2 engines" in rest, "".join(lines) + rest
    assert wait_empty(cluster) == ([], [])
    assert _answering(urls) == []


@pytest.mark.ray
@pytest.mark.slow
@requires_ray
def test_serve_killed_with_sigkill_leaves_nothing_behind(cluster: Any) -> None:
    # nothing of the command runs its teardown: its actors are its own (not detached), so
    # Ray ends them and the placement group with the driver, and each engine's tether ends
    # the engine's process with its actor
    proc, _, urls = _serve(cluster)
    proc.kill()
    proc.communicate()
    assert wait_empty(cluster, timeout_s=60) == ([], [])
    deadline = time.monotonic() + 60
    while (up := _answering(urls)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert up == [], "the router or an engine still answers"


@pytest.mark.ray
@pytest.mark.slow
@requires_ray
def test_a_detached_deployment_outlives_its_driver_until_shut_down(cluster: Any) -> None:
    address = cluster.get_runtime_context().gcs_address
    code = textwrap.dedent(
        f"""
        import time
        from loom.runtime.rollout import RolloutServerConfig
        from loom.runtime.rollout.ray_deploy import EngineLauncher, RayDeployConfig, deploy
        config = RayDeployConfig(
            engines=1, gpus=0, launcher=EngineLauncher.STANDIN, host="127.0.0.1",
            namespace="loom-test", address={address!r}, detached=True,
        )
        rollout = deploy(config, RolloutServerConfig(port=0))
        print(rollout.url, flush=True)
        time.sleep(600)
        """
    )
    driver = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert driver.stdout is not None
        url = driver.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url
    finally:
        driver.kill()
        driver.communicate()
    left = leftovers(cluster)
    assert sorted(a["name"] for a in left[0]) == [
        "loom-rollout-router",
        "loom-rollout-router/engine-0",
    ]
    assert left[1] == ["loom-rollout-router/engines"]
    assert _answering([url]) == [url]
    connect(namespace="loom-test").shutdown()
    assert wait_empty(cluster) == ([], [])
    assert _answering([url]) == []
