"""A server in a child process of its own: tethered (it never outlives this process), up once
it answers a ready path, and stopped, with everything it started, when its block ends."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

import httpx

from loom.core.lifecycle import Started
from loom.proc.tether import Tethered

__all__ = ["ServerProcess", "ServerStartError", "free_port", "wait_ready"]


class ServerStartError(RuntimeError):
    """A server did not come up: what it was, and the tail of what it printed."""


def free_port() -> int:
    """A port free on loopback now (another process may take it before it is bound)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(
    url: str,
    path: str = "/health",
    timeout_s: float = 60.0,
    *,
    alive: Callable[[], bool] | None = None,
) -> None:
    """Until GET `url + path` answers below 500; ServerStartError after `timeout_s`, or as
    soon as `alive()` says the server has exited."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + path, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        if alive is not None and not alive():
            raise ServerStartError(f"{url} exited before {path} answered")
        time.sleep(0.1)
    raise ServerStartError(f"{url}{path} did not come up in {timeout_s:.0f} s")


class ServerProcess(Started):
    """`cmd` run as a server at `url`, ready once `ready` answers; a context manager. Its
    output goes to a file (a pipe nobody reads fills and blocks it; and sglang-router 0.3
    never starts serving with its output on /dev/null), whose tail a failed start reports.
    Stopping sends SIGTERM, then SIGKILL to its whole process group after `grace_s`."""

    def __init__(
        self,
        cmd: Sequence[str],
        url: str,
        *,
        ready: str = "/health",
        env: Mapping[str, str] | None = None,
        name: str | None = None,
        timeout_s: float = 60.0,
        grace_s: float = 10.0,
    ) -> None:
        self.cmd = list(cmd)
        self.url = url
        self.name = name or " ".join(self.cmd[:3])
        self._ready = ready
        self._env = dict(env) if env is not None else None
        self._timeout_s = timeout_s
        self._grace_s = grace_s
        self._log: IO[bytes] | None = None
        self._proc: Tethered | None = None

    @property
    def pid(self) -> int:
        assert self._proc is not None, f"{self.name} is not started"
        return self._proc.pid

    def start(self) -> ServerProcess:
        assert self._proc is None, f"{self.name} is started already"
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 (closed by stop())
        try:
            self._proc = Tethered(
                self.cmd, stdout=self._log, stderr=subprocess.STDOUT, env=self._env
            )
            wait_ready(self.url, self._ready, self._timeout_s, alive=self._alive)
        except BaseException as exc:
            tail = self._tail()
            self.stop()
            if isinstance(exc, ServerStartError):
                raise ServerStartError(f"{self.name}: {exc}; it said:\n{tail}") from None
            raise
        return self

    def _alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _tail(self, n: int = 2000) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-n:]

    def stop(self) -> None:
        """SIGTERM the server; after `grace_s`, or once it has exited, SIGKILL what is left of
        its process group (what it started, and its tether). Idempotent."""
        proc = self._proc
        if proc is not None:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
                _exited(proc.pid, self._grace_s)
                # NOTE: the group is signalled before its leader is reaped, so that its id
                # cannot have been reused
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)  # (and the tether, told so, ends what an exited leader left)
        if self._log is not None:
            self._log.close()
            self._log = None


def _exited(pid: int, timeout_s: float) -> bool:
    """Until child `pid` has exited (a zombie, not yet reaped) or `timeout_s` has passed."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.02)
    return False
