"""Rollout routers on loopback in front of stand-in SGLang engines, each a real process."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from loom.runtime.rollout import BackgroundRouter, EngineConfig, RolloutServerConfig
from loom.runtime.rollout.standin import StandinProcess, write_standin_profile


class Standin(StandinProcess):
    """A stand-in engine process with the test hooks it serves."""

    def get(self, path: str) -> Any:
        return httpx.get(self.url + path, timeout=10).json()

    def fault(self, mode: str) -> None:
        httpx.post(self.url + "/debug/fault", json={"mode": mode}, timeout=10)

    def kill(self) -> None:
        self.stop()


def wait_for(what: Callable[[], Any], timeout: float = 60.0) -> Any:
    """`what()` once it is truthy (polled every 20 ms); an error naming it after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := what():
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def start_standin(step_ms: float = 2.0, max_running: int = 64, *extra: str) -> Standin:
    return Standin("--step-ms", str(step_ms), "--max-running", str(max_running), *extra)


@dataclass
class Rig:
    router: BackgroundRouter
    engines: list[Standin]
    http: httpx.Client

    def gen(
        self, traj: str | None, tokens: int, prompt: list[int] | None = None, **extra: Any
    ) -> httpx.Response:
        headers = {"X-Trajectory-Id": traj} if traj is not None else {}
        body = {
            "input_ids": prompt or [5, 6, 7],
            "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True},
            **extra,
        }
        return self.http.post("/generate", json=body, headers=headers)

    def stats(self) -> dict[str, Any]:
        return self.http.get("/v1/stats").json()


@pytest.fixture
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Rig]]:
    """`rig(n_engines, **router settings, step_ms=, engine_running=, profile=)`: stand-in
    engines and a router in front of them; everything stops on teardown. `profile`: the
    router's cost model is the stand-ins' own (`write_standin_profile`: a step of `step_ms`,
    prefill free), not the default roofline of a 14B model on an H100."""
    made: list[Rig] = []
    spare: list[Standin] = []

    def make(
        n: int = 2,
        *,
        step_ms: float = 2.0,
        max_running: int | None = 4,
        engine_running: int = 64,
        engine_queue: int = 0,
        engine_args: tuple[str, ...] = (),
        profile: bool = False,
        **settings: Any,
    ) -> Rig:
        if profile:
            path = tmp_path_factory.mktemp("profile") / "standin.csv"
            write_standin_profile(path, step_ms / 1000)
            settings["profiles"] = (path,)
        engines = [start_standin(step_ms, engine_running, *engine_args) for _ in range(n)]
        spare.extend(engines)
        cfg = RolloutServerConfig(
            port=0,
            engines=tuple(
                EngineConfig(url=e.url, max_running=max_running, queue=engine_queue)
                for e in engines
            ),
            **settings,
        )
        router = BackgroundRouter(cfg).start()
        r = Rig(router, engines, httpx.Client(base_url=router.url, timeout=60))
        made.append(r)
        return r

    yield make
    for r in made:
        r.http.close()
        stuck = r.router.call(lambda d: [t.key for t in d.trajectories.values() if t.active])
        r.router.stop()
        assert not stuck, f"turns left in flight: {stuck}"
    for e in {id(e): e for e in [*spare, *(e for r in made for e in r.engines)]}.values():
        e.kill()
