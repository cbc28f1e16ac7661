"""One token for every service: `loom serve rollout`, `cluster`, `relay` and `actions` started
as a user starts them (the CLI, a real port), each refusing a request without the token with a
401 that says so, answering health and metrics without it (unless told not to), taking the
same flags, and stopping on SIGTERM; binding beyond loopback without a token is refused unless
`--allow-open`, which warns loudly."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from loom.runtime.access import Access, authorized, is_open, warn_if_open
from loom.runtime.rollout import RolloutServerConfig

TOKEN = "a-token-of-sixteen-chars"
# a protected route of each service, and its health route
SERVICES = {
    "rollout": ("/v1/stats", "/health", []),
    "relay": ("/v1/stats", "/healthz", []),
    "cluster": ("/v1/stats", "/healthz", []),
    "actions": ("/v1/stats", "/healthz", ["--sandbox", "none"]),
}


@contextmanager
def serve(name: str, *args: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    env = {k: v for k, v in os.environ.items() if k != "LOOM_TOKEN"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "loom.cli", "serve", name, "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**env, "COLUMNS": "300"},
    )
    try:
        assert proc.stdout is not None
        url = None
        deadline = time.monotonic() + 120
        lines = []
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
            lines.append(line)
            match = re.search(r"http://127\.0\.0\.1:\d+", line)
            url = match.group(0) if match else None
        assert url is not None, "".join(lines)
        wait_up(url, SERVICES[name][1])
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def wait_up(url: str, path: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx.get(url + path, timeout=5)  # any answer: it serves
            return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url}{path} never answered")


NO_TORCH = importlib.util.find_spec("torch") is None


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(
            name,
            marks=pytest.mark.skipif(
                name == "cluster" and NO_TORCH,
                reason="the cluster service needs the torch extra: pip install -e '.[torch]'",
            ),
        )
        for name in sorted(SERVICES)
    ],
)
def test_every_service_takes_the_same_token(name: str) -> None:
    protected, health, extra = SERVICES[name]
    with serve(name, "--token", TOKEN, *extra) as (proc, url):
        refused = httpx.get(url + protected, timeout=30)
        assert refused.status_code == 401 and "token" in refused.text
        wrong = httpx.get(url + protected, headers={"Authorization": "Bearer nope"}, timeout=30)
        assert wrong.status_code == 401
        ok = httpx.get(url + protected, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
        assert ok.status_code == 200, ok.text
        assert httpx.get(url + health, timeout=30).status_code in (200, 503)  # open
        assert httpx.get(url + "/metrics", timeout=30).status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) in (0, -signal.SIGTERM, 128 + signal.SIGTERM)
    with serve(name, "--token", TOKEN, "--closed-health", *extra) as (_, url):
        assert httpx.get(url + health, timeout=30).status_code == 401
        assert httpx.get(url + "/metrics", timeout=30).status_code == 401


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_beyond_loopback_without_a_token_is_refused_unless_allowed(name: str) -> None:
    from typer.testing import CliRunner

    from loom.cli import app

    out = CliRunner().invoke(
        app, ["serve", name, "--host", "0.0.0.0", "--port", "0"], env={"LOOM_TOKEN": ""}
    )
    assert out.exit_code != 0 and "token" in out.output and "--allow-open" in out.output


def test_the_rule_itself(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(ValueError, match="allow-open"):
        RolloutServerConfig(host="0.0.0.0")
    with pytest.raises(ValueError, match="16"):
        RolloutServerConfig(token="short")
    open_ = RolloutServerConfig(host="0.0.0.0", allow_open=True)
    with caplog.at_level("WARNING", logger="loom.access"):
        assert warn_if_open(open_, "rollout router")
    assert "WITHOUT A TOKEN" in caplog.text
    assert not warn_if_open(RolloutServerConfig(host="0.0.0.0", token=TOKEN), "x")
    assert not warn_if_open(RolloutServerConfig(), "x")  # loopback
    assert TOKEN not in repr(RolloutServerConfig(token=TOKEN))
    assert authorized(f"Bearer {TOKEN}", TOKEN) and not authorized(None, TOKEN)
    assert not authorized(f"Bearer {TOKEN}x", TOKEN)
    assert is_open("/metrics", True) and not is_open("/metrics", False)
    assert not is_open("/v1/stats", True)
    assert issubclass(RolloutServerConfig, Access)
