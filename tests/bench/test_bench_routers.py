"""The routers a benchmark starts: Loom's served in a process of its own and in a thread,
the peers (sglang-router, smg, vllm-router) where installed, and the server process under
them; each answers, and after its block nothing it started is left running."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from unittest.mock import ANY

import httpx
import pytest
from bench_rig import below_me, left_running

from loom.bench.fleet import EmulatedEngines, StandinEngines
from loom.bench.measure import cpu_s
from loom.bench.peers import PEERS
from loom.bench.process import ServerProcess, ServerStartError, free_port
from loom.bench.routers import (
    SGLANG_ROUTER_HINT,
    PeerRouter,
    PeerUnavailableError,
    ProxyRouter,
    ServedRouter,
    SglangRouter,
    ThreadRouter,
    sglang_router_available,
)
from loom.bench.settings import RouterSetup, router_config


def _generate(url: str) -> httpx.Response:
    body = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 3, "ignore_eos": True}}
    return httpx.post(url + "/generate", json=body, timeout=30)


def test_a_served_router_routes_and_leaves_nothing_running(standins: StandinEngines) -> None:
    before = below_me()
    flags = ["--placement", "least_load", "--scheduler", "fcfs"]
    for url in standins.urls:
        flags += ["--engine", f"{url},max_running=8"]
    with ServedRouter(flags) as router:
        assert router.pid is not None and cpu_s(router.pid) > 0
        got = _generate(router.url)
        assert got.status_code == 200, got.text
        assert len(got.json()["output_ids"]) == 3
    assert left_running(before) == {}
    with pytest.raises(httpx.TransportError):
        httpx.get(router.url + "/health", timeout=2)


def test_the_bare_proxy_relays_the_engines_answer_and_leaves_nothing_running(
    standins: StandinEngines,
) -> None:
    before = below_me()
    with ProxyRouter(standins.urls[0]) as proxy:
        assert proxy.pid is not None and cpu_s(proxy.pid) > 0
        got = _generate(proxy.url)
        assert got.status_code == 200, got.text
        assert got.json() == _generate(standins.urls[0]).json() | {"meta_info": ANY}
        bad = httpx.post(proxy.url + "/generate", content=b"{", timeout=10)
        direct = httpx.post(standins.urls[0] + "/generate", content=b"{", timeout=10)
        assert (bad.status_code, bad.content) == (direct.status_code, direct.content)  # relayed
    assert left_running(before) == {}


def test_a_router_in_a_thread(standins: StandinEngines) -> None:
    config = router_config(RouterSetup(max_running=8), "heddle", "pps", standins.urls)
    with ThreadRouter(config) as router:
        assert router.pid is None
        assert _generate(router.url).status_code == 200
    with pytest.raises(httpx.TransportError):
        httpx.get(router.url + "/health", timeout=2)


def test_a_server_that_does_not_come_up_says_what_it_printed() -> None:
    before = below_me()
    code = "import sys; print('no such flag --bogus', flush=True); sys.exit(3)"
    url = f"http://127.0.0.1:{free_port()}"
    with (
        pytest.raises(ServerStartError, match=r"(?s)bogus server: .*exited.*no such flag --bogus"),
        ServerProcess([sys.executable, "-c", code], url, name="bogus server"),
    ):
        pass
    assert left_running(before) == {}


def test_a_server_that_ignores_sigterm_is_killed_with_its_children() -> None:
    """A server that starts a child and ignores SIGTERM: stopping it still leaves nothing."""
    before = below_me()
    port = free_port()
    code = (
        "import signal, subprocess, sys, http.server\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"http.server.HTTPServer(('127.0.0.1', {port}), http.server.SimpleHTTPRequestHandler)"
        ".serve_forever()\n"
    )
    server = ServerProcess(
        [sys.executable, "-c", code], f"http://127.0.0.1:{port}", ready="/", grace_s=0.5
    )
    with server:
        assert len(below_me() - before) >= 3  # the server, its child and its tether
    assert left_running(before) == {}


@pytest.mark.skipif(
    not sglang_router_available(), reason=f"needs the peer sglang-router: {SGLANG_ROUTER_HINT}"
)
def test_sglang_router_routes_and_leaves_nothing_running(standins: StandinEngines) -> None:
    before = below_me()
    with SglangRouter(standins.urls, "round_robin") as router:
        assert router.pid is not None
        assert _generate(router.url).status_code == 200
    assert left_running(before) == {}


def test_a_peer_not_installed_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    import loom.bench.peers as peers

    monkeypatch.setattr(peers.importlib.util, "find_spec", lambda name: None)  # not here
    monkeypatch.setenv("LOOM_PEERS_DIR", str(tmp_path))  # nor there
    for name in PEERS:
        with pytest.raises(PeerUnavailableError, match=f"loom.bench.peers install {name}"):
            PeerRouter(name, ["http://127.0.0.1:1"], PEERS[name].policies[0]).start()


def test_an_unknown_peer_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown sglang policy 'fastest'"):
        SglangRouter(["http://127.0.0.1:1"], "fastest")
    with pytest.raises(ValueError, match="sticky_least_loaded"):
        PeerRouter("vllm-router", ["http://127.0.0.1:1"], "least_load")


@pytest.fixture(scope="module")
def emulated() -> Iterator[EmulatedEngines]:
    with EmulatedEngines("qwen3-8b@h100", 2, time_scale=0.05) as fleet:
        yield fleet


@pytest.mark.parametrize(
    ("peer", "policy"),
    [("smg", "cache_aware"), ("smg", "manual"), ("vllm-router", "sticky_least_loaded")],
)
def test_a_peer_routes_the_agents_requests_and_leaves_nothing_running(
    emulated: EmulatedEngines, peer: str, policy: str
) -> None:
    if not PEERS[peer].installed():
        pytest.skip(f"needs the peer {peer}: python -m loom.bench.peers install {peer}")
    before = below_me()
    with PeerRouter(peer, emulated.urls, policy) as router:
        body = {"model": emulated.model_name(), "prompt": "t5 t6 t7", "max_tokens": 4}
        headers = {"X-SMG-Routing-Key": "t1", "X-Session-ID": "t1"}
        got = httpx.post(router.url + "/v1/completions", json=body, headers=headers, timeout=60)
        assert got.status_code == 200, got.text
        assert got.json()["usage"]["completion_tokens"] == 4
    assert left_running(before) == {}
