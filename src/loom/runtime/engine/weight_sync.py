"""New weights into a running vLLM engine, without a restart: a worker extension that pulls a
model's versions from the weight relay and loads them through vLLM's own weight-loading path,
and the engine-side calls that drive it.

vLLM (0.32) needs two things: the extension on its workers, `--worker-extension-cls
loom.runtime.engine.weight_sync.WeightSync` (vLLM adds it to the worker's bases, the CPU worker's
too, so its methods run beside the worker's own `reload_weights`), and dev mode
(`VLLM_SERVER_DEV_MODE=1`), which serves `POST /collective_rpc` (a method name and string
arguments, run on every worker) and `POST /reset_prefix_cache`. `EngineConfig(weight_sync=True)`
(`loom serve engine --weight-sync`) starts an engine so.

A sync (`sync_engine`): `POST /collective_rpc {"method": "loom_update_weights", "args":
[request]}` — each worker catches its copy of the job's weights up to the version asked
(`WeightFollower`: the deltas after the version it holds, or a dense version first) and loads
them with `reload_weights` (vLLM's in-place reload: every layer's weights in the checkpoint's
names, then its post-load processing, e.g. the CPU's prepacked GEMM weights); then `POST
/reset_prefix_cache?reset_external=true`, so that no KV computed under the old weights is
reused, in the engine's prefix cache or in a KV connector's store. An engine may
serve several jobs' models in turn: each job's weights stay in host memory, at the version it
last loaded (RollMux's warm start), and a switch loads the whole of the other's.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

__all__ = ["EXTENSION", "EngineRef", "EngineSync", "WeightSync", "sync_engine", "sync_engines"]

log = logging.getLogger(__name__)

EXTENSION = "loom.runtime.engine.weight_sync.WeightSync"
_RPC_TIMEOUT_S = 600.0


class WeightSync:
    """vLLM worker extension (its methods become the worker's; names prefixed `loom_` so
    they clash with none of vLLM's)."""

    def loom_update_weights(self, request: str) -> dict[str, Any]:
        """`request` (JSON): `relay` (URL), `job` (whose weights), `version` (to load),
        `member` (the engine's name at the relay), `token` (the relay's, if any). Loads the
        job's weights at that version; returns what it pulled and how long it took."""
        from loom.runtime.relay.client import RelayClient
        from loom.runtime.relay.model_sync import WeightFollower

        req = json.loads(request)
        job, version = str(req["job"]), int(req["version"])
        state: dict[str, Any] = self.__dict__.setdefault(
            "_loom", {"jobs": {}, "relays": {}, "active": None}
        )
        follower = state["jobs"].get(job)
        if follower is None or state["relays"][job] != req["relay"]:
            store = RelayClient(req["relay"], token=req.get("token"), timeout_s=_RPC_TIMEOUT_S)
            follower = WeightFollower(store, member_id=str(req["member"]))
            state["jobs"][job], state["relays"][job] = follower, req["relay"]
        got = follower.catch_up(version)
        switch = state["active"] != job
        t0 = time.perf_counter()
        loaded = 0
        if switch or got.changed:
            # NOTE: every tensor, not only those that changed: vLLM fuses q/k/v and gate/up
            # and reprocesses a layer once all its weights are in; a part-loaded layer would
            # be rebuilt from uninitialised memory
            self.reload_weights(  # type: ignore[attr-defined]
                weights_iterator=iter(follower.tensors.items()), is_checkpoint_format=True
            )
            loaded = len(follower.tensors)
        state["active"] = job
        return {
            "job": job,
            "version": got.version,
            "kind": got.kind.value,
            "switched": switch,
            "pulled_bytes": got.bytes,
            "pull_s": got.seconds,
            "load_s": time.perf_counter() - t0,
            "loaded": loaded,
        }

    def loom_weights(self) -> dict[str, Any]:
        """Which job's weights are loaded, and the version each job's copy is at."""
        state: dict[str, Any] = self.__dict__.get("_loom", {"jobs": {}, "active": None})
        return {
            "active": state["active"],
            "versions": {job: f.version for job, f in state["jobs"].items()},
        }


@dataclass(frozen=True)
class EngineRef:
    """An engine: its URL and, where a rollout router routes to it, its id there."""

    url: str
    id: str | None = None

    @property
    def member(self) -> str:
        """Its name as a member of the relay."""
        return "engine-" + re.sub(r"[^A-Za-z0-9._-]+", "-", self.id or self.url).strip("-")


@dataclass(frozen=True, kw_only=True)
class EngineSync:
    """What one engine did in a sync."""

    url: str
    id: str | None
    version: int
    switched: bool  # it had another job's weights loaded
    pulled_bytes: int
    pull_s: float  # pulling and applying the deltas (in the worker)
    load_s: float  # vLLM's reload of the weights (in the worker)
    seconds: float  # the whole sync, prefix-cache reset included, as the caller saw it


def sync_engines(
    engines: Sequence[EngineRef],
    *,
    relay: str,
    job: str,
    version: int,
    router: str | None = None,
    router_version: int | None = None,
    token: str | None = None,
    timeout_s: float = _RPC_TIMEOUT_S,
) -> list[EngineSync]:
    """Every engine loads `job`'s weights at `version`, at once. With a rollout `router`: it
    is told first that `router_version` (default `version`) is current — the engines still
    behind take no new turns — and then, as each engine has loaded it, that the engine is at
    it (`PATCH /v1/engines/{id}`). `token`: the bearer token of the relay and the router."""
    rv = version if router_version is None else router_version
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(base_url=router or "http://unused", headers=headers, trust_env=False,
                      timeout=60) as http:  # fmt: skip
        if router is not None:
            _router_call(http, "PUT", "/v1/weights", {"version": rv, "engines": []})

        def one(engine: EngineRef) -> EngineSync:
            done = sync_engine(
                engine, relay=relay, job=job, version=version, relay_token=token,
                timeout_s=timeout_s,
            )  # fmt: skip
            if router is not None and engine.id is not None:
                _router_call(http, "PATCH", f"/v1/engines/{engine.id}", {"version": rv})
            return done

        with ThreadPoolExecutor(max(1, len(engines)), thread_name_prefix="engine-sync") as pool:
            return list(pool.map(one, engines))


def _router_call(http: httpx.Client, method: str, path: str, body: dict[str, Any]) -> None:
    resp = http.request(method, path, json=body)
    if resp.is_error:
        raise RuntimeError(f"the rollout router refused {method} {path}: {resp.text}")


def sync_engine(
    engine: EngineRef,
    *,
    relay: str,
    job: str,
    version: int,
    relay_token: str | None = None,
    timeout_s: float = _RPC_TIMEOUT_S,
) -> EngineSync:
    """Have `engine` load `job`'s weights at `version` from the relay, then drop its prefix
    cache. Raises `RuntimeError` saying what the engine answered when it could not (no
    extension, no dev mode, a version the relay cannot reach)."""
    t0 = time.perf_counter()
    url = engine.url
    request = {"relay": relay, "job": job, "version": version, "member": engine.member}
    if relay_token is not None:
        request["token"] = relay_token
    body = {"method": "loom_update_weights", "args": [json.dumps(request)], "timeout": timeout_s}
    with httpx.Client(base_url=url, timeout=timeout_s + 30, trust_env=False) as http:
        resp = http.post("/collective_rpc", json=body)
        if resp.status_code == 404:
            raise RuntimeError(
                f"engine {url} has no /collective_rpc: start it with VLLM_SERVER_DEV_MODE=1 "
                f"and --worker-extension-cls {EXTENSION} (EngineConfig(weight_sync=True))"
            )
        if resp.is_error:
            raise RuntimeError(f"engine {url} could not load the weights: {resp.text[-2000:]}")
        results = resp.json()["results"]
        bad = [r for r in results if not isinstance(r, dict)]
        if bad:
            raise RuntimeError(f"engine {url}: unexpected answer from its workers: {bad}")
        _reset_prefix_cache(http, url, deadline=time.monotonic() + timeout_s)
    first = results[0]
    return EngineSync(
        url=url,
        id=engine.id,
        version=int(first["version"]),
        switched=bool(first["switched"]),
        pulled_bytes=sum(int(r["pulled_bytes"]) for r in results),
        pull_s=max(float(r["pull_s"]) for r in results),
        load_s=max(float(r["load_s"]) for r in results),
        seconds=time.perf_counter() - t0,
    )


def _reset_prefix_cache(http: httpx.Client, url: str, *, deadline: float) -> None:
    """The engine's prefix cache emptied (it refuses while requests hold blocks: retried),
    and its KV connector's too (`reset_external`: Loom's moves to a new generation of its
    store, so that no block saved under the old weights loads)."""
    wait = 0.05
    while True:
        resp = http.post("/reset_prefix_cache", params={"reset_external": "true"})
        if resp.is_error:
            raise RuntimeError(f"engine {url} did not reset its prefix cache: {resp.text}")
        if resp.json().get("success"):
            return
        if time.monotonic() >= deadline:
            raise RuntimeError(
                f"engine {url} kept its prefix cache (requests still hold its blocks): KV of "
                "the old weights could be reused; sync between steps"
            )
        time.sleep(wait)
        wait = min(1.0, wait * 2)
