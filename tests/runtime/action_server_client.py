"""A test client of the action server, and measures over action views."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx

from loom.runtime.actions import BackgroundServer


class Client:
    """A thin test client: submit, wait, read views."""

    def __init__(self, server: BackgroundServer) -> None:
        self.server = server
        self.http = httpx.Client(base_url=server.url, trust_env=False, timeout=30.0)

    def submit(self, **body: Any) -> str:
        body.setdefault("trajectory_id", "t0")
        r = self.http.post("/v1/actions", json=body)
        assert r.status_code == 202, r.text
        return str(r.json()["id"])

    def view(self, action_id: str, wait_s: float = 0.0) -> dict[str, Any]:
        r = self.http.get(f"/v1/actions/{action_id}", params={"wait_s": wait_s})
        assert r.status_code == 200, r.text
        out: dict[str, Any] = r.json()
        return out

    def wait(self, action_id: str, timeout_s: float = 20.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            v = self.view(action_id, wait_s=min(5.0, max(deadline - time.monotonic(), 0.0)))
            if v["status"] not in ("queued", "running"):
                return v
            assert time.monotonic() < deadline, f"{action_id} still {v['status']}"

    def wait_status(self, action_id: str, status: str, timeout_s: float = 10.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while (v := self.view(action_id))["status"] != status:
            assert time.monotonic() < deadline, f"{action_id} is {v['status']}, not {status}"
            time.sleep(0.01)
        return v

    def run(self, **body: Any) -> dict[str, Any]:
        return self.wait(self.submit(**body))

    @property
    def workdir(self) -> Path:
        return self.server.app.state.driver.workspaces.root / "trajectories"

    def close(self) -> None:
        self.http.close()


def max_overlap(views: list[dict[str, Any]]) -> int:
    """The most actions executing at one instant, from their started/finished times."""
    events = sorted(
        [(v["started_at"], 1) for v in views] + [(v["finished_at"], -1) for v in views],
        key=lambda e: (e[0], e[1]),  # an end before a start at the same instant
    )
    now = peak = 0
    for _, delta in events:
        now += delta
        peak = max(peak, now)
    return peak


def _live(pid: str) -> bool:
    """Not exited (a zombie awaiting its reaper counts as exited)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def procs_with(marker: str) -> list[int]:
    """Live processes of this machine whose command line contains `marker` (host pids: an
    action in a PID namespace knows itself by another number)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline and _live(entry.name):
            found.append(int(entry.name))
    return found


def wait_no_procs(marker: str, timeout_s: float = 3.0) -> list[int]:
    """Until no live process carries `marker`; the ones still alive at the deadline."""
    deadline = time.monotonic() + timeout_s
    while (left := procs_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return left
