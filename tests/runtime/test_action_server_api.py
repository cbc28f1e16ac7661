"""API actions: real HTTP calls to a local server, under the Basic manager's limits."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from action_server_client import Client, max_overlap

from loom.runtime.actions import ApiLimitConfig

DELAY_S = 0.15


class _Upstream(ThreadingHTTPServer):
    """Counts the calls in flight at once; each takes DELAY_S."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lock = threading.Lock()
        self.in_flight = 0
        self.peak = 0
        self.calls = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: _Upstream

    def log_message(self, format: str, *args: object) -> None:  # quiet
        return

    def _reply(self, body: object) -> None:
        srv = self.server
        with srv.lock:
            srv.in_flight += 1
            srv.calls += 1
            srv.peak = max(srv.peak, srv.in_flight)
        time.sleep(DELAY_S)
        with srv.lock:
            srv.in_flight -= 1
        status = 500 if self.path == "/fail" else 200
        data = json.dumps({"path": self.path, "method": self.command, "body": body}).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._reply(None)

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        self._reply(json.loads(self.rfile.read(length)) if length else None)


@pytest.fixture
def upstream() -> Iterator[_Upstream]:
    srv = _Upstream()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()
    thread.join(5)


def test_api_calls_respect_the_concurrency_limit(
    make_client: Callable[..., Client], upstream: _Upstream
) -> None:
    client = make_client(api=[ApiLimitConfig(name="search", concurrency=2)])
    ids = [
        client.submit(
            trajectory_id=f"t{i}",
            api={"name": "search", "url": f"{upstream.url}/q/{i}", "body": {"i": i}},
        )
        for i in range(6)
    ]
    views = [client.wait(i) for i in ids]
    assert [v["status"] for v in views] == ["succeeded"] * 6
    assert upstream.peak == 2 and upstream.calls == 6
    assert max_overlap(views) <= 2
    first = views[0]
    assert first["kind"] == "api" and first["domain"] == "api:search" and first["exit_code"] == 200
    assert first["result"] == {
        "status_code": 200,
        "body": {"path": "/q/0", "method": "POST", "body": {"i": 0}},
    }


def test_api_quota_holds_calls_past_it_until_the_window_rolls(
    make_client: Callable[..., Client], upstream: _Upstream
) -> None:
    # A window of ~11 days: the third call waits for it, so the test cancels it.
    client = make_client(api=[ApiLimitConfig(name="paid", concurrency=8, quota=2, period_s=1e6)])
    call = {"name": "paid", "url": f"{upstream.url}/x", "method": "GET"}
    done = [client.run(trajectory_id=f"t{i}", api=call) for i in range(2)]
    assert [v["status"] for v in done] == ["succeeded"] * 2
    third = client.submit(trajectory_id="t3", api=call)
    time.sleep(0.1)
    assert client.view(third)["status"] == "queued"
    stats = client.http.get("/v1/stats").json()["api"]["paid"]
    assert stats["quota"] == 2 and stats["in_use"] == 0
    assert client.http.delete(f"/v1/actions/{third}").json()["status"] == "cancelled"
    assert upstream.calls == 2


def test_api_errors_fail_the_action(
    make_client: Callable[..., Client], upstream: _Upstream
) -> None:
    client = make_client(api=[ApiLimitConfig(name="web", concurrency=4)])
    v = client.run(api={"name": "web", "url": f"{upstream.url}/fail", "method": "GET"})
    assert v["status"] == "failed" and v["exit_code"] == 500 and v["error"] == "HTTP 500"
    v = client.run(api={"name": "web", "url": "http://127.0.0.1:9/", "method": "GET"})
    assert v["status"] == "failed" and "ConnectError" in v["error"]
    v = client.run(
        api={"name": "web", "url": f"{upstream.url}/slow", "method": "GET"}, timeout_s=0.05
    )
    assert v["status"] == "timed_out"


def test_a_call_past_the_quota_starts_when_the_window_rolls(
    make_client: Callable[..., Client], upstream: _Upstream
) -> None:
    # Nothing else happens after the first call ends: only the policy's wakeup starts the
    # second one, in a later window of 0.3 s.
    client = make_client(api=[ApiLimitConfig(name="rl", concurrency=4, quota=1, period_s=0.3)])
    call = {"name": "rl", "url": f"{upstream.url}/w", "method": "GET"}
    ids = [client.submit(trajectory_id=f"t{i}", api=call) for i in range(2)]
    first, second = (client.wait(i, timeout_s=5) for i in ids)
    assert first["status"] == second["status"] == "succeeded"
    assert second["scheduled_at"] >= first["scheduled_at"] and second["queue_s"] > 0
