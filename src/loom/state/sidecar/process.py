"""A node's sidecar process: `StateSidecar` starts it (`python -m loom.state.sidecar`), tied to
its starter so that it dies with it, and stops it; whoever outlives it removes what it left."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict

from loom.proc.lifeline import child_popen
from loom.state.errors import StateError
from loom.state.sidecar.client import StateClient
from loom.state.sidecar.config import SidecarConfig
from loom.state.sidecar.server import serve
from loom.state.sidecar.shm import sweep_orphans
from loom.state.sidecar.wire import TOKEN_ENV

__all__ = ["StateSidecar", "main"]


class StateSidecar:
    """Start and stop a node's sidecar process (`python -m loom.state.sidecar`)."""

    def __init__(self, config: SidecarConfig | None = None) -> None:
        self.config = config or SidecarConfig()
        self.token = os.urandom(16)
        self._dir = tempfile.mkdtemp(prefix="loom-sidecar-")
        os.chmod(self._dir, 0o700)
        self.address = os.path.join(self._dir, "state.sock")
        self.tcp_address: str | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> StateSidecar:
        env = dict(os.environ, **{TOKEN_ENV: self.token.hex()})
        cmd = [sys.executable, "-m", "loom.state.sidecar", self.address,
               json.dumps(asdict(self.config))]  # fmt: skip
        tie = child_popen(env)  # if this process dies, even by SIGKILL, the sidecar goes too
        self._proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, **tie)
        deadline = time.monotonic() + self.config.start_timeout_s
        while True:
            if self._proc.poll() is not None:
                self.close()
                raise StateError(f"the sidecar exited at start (code {self._proc.returncode})")
            if os.path.exists(self.address):
                try:
                    with self.client(timeout_s=5) as c:
                        self.tcp_address = c.call("hello")["tcp"]
                    return self
                except OSError:
                    pass
            if time.monotonic() > deadline:
                self.close()
                raise StateError(f"the sidecar did not start in {self.config.start_timeout_s} s")
            time.sleep(0.05)

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def exit_code(self) -> int | None:
        """Its exit status once it has exited (negative: the signal that ended it)."""
        return None if self._proc is None else self._proc.poll()

    def client(self, timeout_s: float | None = None) -> StateClient:
        return StateClient(self.address, self.token, timeout_s)

    def close(self) -> None:
        """Stop it (if it still runs), then remove what it or the workers it served left: its
        socket's directory and the exports of workers that died before it mapped them."""
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(Exception), self.client(timeout_s=5) as c:
                c.call("shutdown")
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(5)
        shutil.rmtree(self._dir, ignore_errors=True)
        sweep_orphans()

    def __enter__(self) -> StateSidecar:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def main(argv: list[str]) -> None:
    """The sidecar process: `python -m loom.state.sidecar ADDRESS CONFIG_JSON`, its token in
    the environment (`LOOM_STATE_TOKEN`, removed once read)."""
    address, spec = argv[0], json.loads(argv[1])
    token = bytes.fromhex(os.environ.pop(TOKEN_ENV))
    serve(address, SidecarConfig(**spec), token)
