"""A child process's tie to its parent process: when the parent dies by any signal, SIGKILL
included, the child goes too.

The parent keeps the write end of one pipe open for its whole life and never writes to it;
each child it starts gets the read end (`child_popen`) and runs `watch_parent`: a thread
blocked reading it. When the parent's process is gone, the kernel closes its write end and
the read returns end-of-file, however the parent died.

NOTE: not `PR_SET_PDEATHSIG`: that signal follows the *thread* that forked the child, and the
cluster service starts its workers and sidecars from executor threads (a thread that ends
would take its children with it), and it is Linux-only. The write end is opened close-on-exec
(PEP 446) and closed in children forked without an exec, so no other process keeps it open.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["ENV", "child_popen", "watch_parent"]

ENV = "LOOM_LIFELINE_FD"

_lock = threading.Lock()
_pipe: tuple[int, int, int] | None = None  # (read end, write end, the pid that made them)


def _read_end() -> int:
    global _pipe
    with _lock:
        if _pipe is None or _pipe[2] != os.getpid():
            r, w = os.pipe()  # both non-inheritable: only pass_fds hands the read end on
            _pipe = (r, w, os.getpid())
        return _pipe[0]


def _forked() -> None:
    """In a child forked without an exec: the parent's write end must not keep its pipe open."""
    global _pipe
    if _pipe is not None:
        for fd in _pipe[:2]:
            with contextlib.suppress(OSError):
                os.close(fd)
        _pipe = None


os.register_at_fork(after_in_child=_forked)


def child_popen(env: dict[str, str]) -> dict[str, Any]:
    """What `subprocess.Popen` needs to start a child tied to this process: sets the child's
    `ENV` in `env` and returns the keyword arguments (`pass_fds`) to add."""
    r = _read_end()
    env[ENV] = str(r)
    return {"pass_fds": (r,)}


def watch_parent(on_death: Callable[[], None] | None = None, grace_s: float = 10.0) -> bool:
    """In a child started with `child_popen`: when the parent dies, call `on_death` (it starts
    a clean stop and returns; the process has `grace_s` to end) and then kill this process.
    False if this process was not started tied to a parent (nothing is watched)."""
    raw = os.environ.pop(ENV, None)
    if raw is None:
        return False
    fd = int(raw)
    os.set_inheritable(fd, False)  # nothing this process starts holds it

    def watch() -> None:
        while True:
            try:
                if not os.read(fd, 1):
                    break  # end of file: the parent's write end is closed
            except OSError:
                break
        if on_death is not None:
            on_death()
            time.sleep(grace_s)  # a clean stop ends the process (and this thread) before
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="loom-lifeline", daemon=True).start()
    return True
