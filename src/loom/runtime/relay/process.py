"""`loom serve relay` in a process of its own (tests, benchmarks, a trainer that hosts the
relay): started on a free loopback port, its URL read from the line it prints once bound."""

from __future__ import annotations

import collections
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import IO

from loom.core.errors import LoomError

__all__ = ["RelayProcess", "RelayStartError"]

_BOUND = re.compile(r"loom relay on (http://\S+)")
_TAIL = 50  # output lines kept to explain a failed start


class RelayStartError(LoomError, RuntimeError):
    """The relay exited, or did not say where it listens, in time; its last output is kept."""


class RelayProcess:
    """A running relay: `url`, `pid`; `stop` (SIGTERM), `kill` (SIGKILL), `cpu_seconds`. As
    a context manager it stops the relay on exit."""

    def __init__(self, proc: subprocess.Popen[str], url: str, output: collections.deque[str]):
        self.proc = proc
        self.url = url
        self.output = output

    @property
    def pid(self) -> int:
        return self.proc.pid

    @classmethod
    def start(cls, *args: str, host: str = "127.0.0.1", timeout_s: float = 60.0) -> RelayProcess:
        """Start `python -m loom.cli serve relay --host HOST --port 0 ARGS...` (this Python, this
        environment) and wait until it names its URL."""
        cmd = [sys.executable, "-u", "-m", "loom.cli", "serve", "relay"]
        cmd += ["--host", host, "--port", "0", *args]
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        )
        output: collections.deque[str] = collections.deque(maxlen=_TAIL)
        found: list[str] = []
        bound = threading.Event()
        assert proc.stdout is not None
        threading.Thread(
            target=_drain, args=(proc.stdout, output, found, bound), daemon=True
        ).start()
        deadline = time.monotonic() + timeout_s
        while not bound.wait(0.05):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                said = "".join(output).strip() or "(nothing)"
                raise RelayStartError(f"`{' '.join(cmd)}` did not start; it said:\n{said}")
        return cls(proc, found[0], output)

    def cpu_seconds(self) -> float:
        """User and system CPU time the relay has used so far (Linux /proc)."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(fields[11]) + int(fields[12])  # utime, stime
        return ticks / os.sysconf("SC_CLK_TCK")

    def kill(self) -> None:
        """SIGKILL: gone at once, mid-request or not."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def stop(self, timeout_s: float = 10.0) -> int:
        """SIGTERM, then SIGKILL after `timeout_s`; the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()

    def __enter__(self) -> RelayProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _drain(
    stream: IO[str], output: collections.deque[str], found: list[str], bound: threading.Event
) -> None:
    """Read the relay's output to its end (a full pipe would block it), noting its URL."""
    for line in stream:
        output.append(line)
        if not bound.is_set() and (match := _BOUND.search(line)):
            found.append(match.group(1))
            bound.set()
    stream.close()
