"""Action servers on loopback for the runtime tests: real uvicorn, real processes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from action_server_client import Client

from loom.runtime.actions import ActionServerConfig, BackgroundServer
from loom.runtime.actions.sandbox import bubblewrap_missing
from loom.runtime.engine import INSTALL_HINT, EnginePool, engine_available
from loom.runtime.engine.model import TinyModelSpec

# The action server's default sandbox where this machine has it; tests of the sandbox itself
# are marked to skip without it.
SANDBOX = "none" if bubblewrap_missing() else "bwrap"

# An abort or a kill races the engine: it must land before the request finishes. With the tiny
# model a token costs vLLM's engine core about as much CPU as its API server spends streaming
# it, so on a loaded machine the API server falls seconds behind and the engine can finish
# thousands of tokens before a client (or the router) has seen the first (measured: the first
# chunk at 8 s, after all 4,000 tokens). A model ten times heavier per token (11 ms on one
# core) keeps the API server well ahead of the engine.
HEAVY_MODEL = TinyModelSpec(hidden_size=1024, intermediate_size=4096, num_heads=16, num_kv_heads=16)
# vLLM's CPU backend sizes its memory as a share of the NUMA node's, not the machine's: on a
# machine whose node 0 holds 9.5 of its 24 GB, the default 10% leaves 0.05 GiB of KV after the
# heavy model's 0.86 GiB, short of the 0.06 GiB its 4,096-token context needs; 15% leaves 0.5.
HEAVY_ENGINE = {"model_spec": HEAVY_MODEL, "gpu_memory_utilization": 0.15}


@pytest.fixture(scope="session")
def heavy_engine() -> dict[str, Any]:
    """`HEAVY_ENGINE`'s settings, for a test module that starts engines of its own."""
    return dict(HEAVY_ENGINE)


@pytest.fixture
def make_client(tmp_path: Path) -> Iterator[Callable[..., Client]]:
    """Start a server (config fields as keyword arguments) and a client for it. On teardown
    the server stops, and every action it accepted must be terminal."""
    clients: list[Client] = []

    def make(**settings: Any) -> Client:
        settings.setdefault("workdir", tmp_path / "work")
        settings.setdefault("sandbox", SANDBOX)
        cfg = ActionServerConfig(port=0, **settings)
        client = Client(BackgroundServer(cfg, trust_env=False).start())
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()
        client.server.stop()
        records = client.server.app.state.driver.records.values()
        lost = [r.id for r in records if not r.status.terminal]
        assert not lost, f"actions left without a terminal state: {lost}"


@pytest.fixture(scope="module")
def shared_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    """One default server for a whole module (tests that leave nothing running)."""
    cfg = ActionServerConfig(port=0, workdir=tmp_path_factory.mktemp("work"), sandbox=SANDBOX)
    client = Client(BackgroundServer(cfg, trust_env=False).start())
    yield client
    client.close()
    client.server.stop()


@pytest.fixture
def client(make_client: Callable[..., Client]) -> Client:
    """A server scheduling every core of this machine, no APIs, no GPU services."""
    return make_client()


@pytest.fixture(scope="session")
def engine_pool() -> Iterator[EnginePool]:
    """Real vLLM engines on the CPU (the tiny model), started on first `get(n)` and shared by
    the whole run: `engine_pool.get(2)` gives two. Skips without the cpu-engine extra."""
    if not engine_available():
        pytest.skip(f"vLLM is not installed: {INSTALL_HINT}")
    with EnginePool(limit=3) as pool:
        yield pool


@pytest.fixture(scope="session")
def heavy_engine_pool() -> Iterator[EnginePool]:
    """Up to two engines of `HEAVY_MODEL`, for tests that must act on a request while it
    decodes; shared by the session (an engine a test killed is replaced on the next `get`)."""
    if not engine_available():
        pytest.skip(f"vLLM is not installed: {INSTALL_HINT}")
    with EnginePool(limit=2, **HEAVY_ENGINE) as pool:
        yield pool
