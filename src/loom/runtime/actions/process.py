"""CPU tools as real processes (AOE, §5.2): each action runs in its trajectory's workspace,
pinned to exactly the cores it was granted, under resource limits (no core dumps; an address
space of its `memory_gb`), in a session of its own whose every process is killed when it times
out, is cancelled, or ends."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import signal
import subprocess
from collections.abc import Callable, Mapping

from loom.core.actions import ActionStatus
from loom.runtime.actions.executor import ExecContext
from loom.runtime.actions.record import Outcome

__all__ = ["OutputTail", "ProcessExecutor", "kill_session"]

log = logging.getLogger(__name__)

_DRAIN_S = 1.0  # how long to wait for the pipes to close once the session is killed
_CHUNK = 1 << 16


class OutputTail:
    """The last `limit` bytes of a stream."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.truncated = False
        self._buf = bytearray()

    def add(self, chunk: bytes) -> None:
        self._buf += chunk
        if len(self._buf) > self.limit:
            del self._buf[: len(self._buf) - self.limit]
            self.truncated = True

    def text(self) -> str:
        return self._buf.decode(errors="replace")


async def _pump(stream: asyncio.StreamReader | None, tail: OutputTail) -> None:
    if stream is None:
        return
    while chunk := await stream.read(_CHUNK):
        tail.add(chunk)


def kill_session(pid: int) -> None:
    """SIGKILL every process of the process group `pid` leads (gone already is fine)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _address_space(memory_gb: float) -> Callable[[], None]:
    """The child's setup between fork and exec when its memory is capped: the limit must hold
    before the command's first allocation. It does nothing else (it runs in a forked copy of
    a threaded process)."""
    size = int(memory_gb * 2**30)

    def preexec() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (size, size))

    return preexec


def _after_spawn(pid: int, cores: frozenset[int]) -> None:
    """Check the child's cores (fix them if they are wrong) and forbid core dumps."""
    with contextlib.suppress(ProcessLookupError):  # it may have exited already
        if os.sched_getaffinity(pid) != cores:
            log.warning("process %d was not born on cores %s; pinning it now", pid, sorted(cores))
            os.sched_setaffinity(pid, cores)
        resource.prlimit(pid, resource.RLIMIT_CORE, (0, 0))


class ProcessExecutor:
    """Runs commands; keeps the tail (`max_output_bytes`) of stdout and stderr."""

    def __init__(self, max_output_bytes: int, base_env: Mapping[str, str] | None = None) -> None:
        self.max_output_bytes = max_output_bytes
        self._base_env = dict(os.environ if base_env is None else base_env)
        self._home: set[int] | None = None  # the spawning thread's own CPU mask

    def _env(self, ctx: ExecContext) -> dict[str, str]:
        req, start = ctx.request, ctx.start
        env = {**self._base_env, **req.env}
        env["LOOM_ACTION_ID"] = start.action.action_id
        env["LOOM_TRAJECTORY_ID"] = start.action.trajectory_id
        env["LOOM_CORES"] = ",".join(map(str, start.cores))
        if req.parallel_env:
            env[req.parallel_env] = str(len(start.cores))
        return env

    async def run(self, ctx: ExecContext) -> Outcome:
        argv = ctx.request.command
        cores = ctx.start.cores
        assert argv, "a CPU action has a command"
        assert cores and len(cores) == ctx.start.units, f"granted {cores} for {ctx.start.units}"
        mem = ctx.request.memory_gb
        pinned = frozenset(cores)
        if self._home is None:
            self._home = os.sched_getaffinity(0)
        # NOTE: the child inherits the spawning thread's CPU mask. Setting this (event loop)
        # thread's mask around the spawn pins the child from birth without a preexec_fn, so
        # Python can vfork: a fork that copies the server and runs Python in the child costs
        # milliseconds more per action. asyncio runs the fork before its first suspension, so
        # no other spawn can come between; every spawn restores the same home mask.
        os.sched_setaffinity(0, pinned)
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=ctx.workspace,
                env=self._env(ctx),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                preexec_fn=_address_space(mem) if mem is not None else None,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            return Outcome(status=ActionStatus.FAILED, error=f"cannot run {argv[0]!r}: {reason}")
        finally:
            os.sched_setaffinity(0, self._home)
        _after_spawn(proc.pid, pinned)
        ctx.started()
        out, err = OutputTail(self.max_output_bytes), OutputTail(self.max_output_bytes)
        readers = [
            asyncio.ensure_future(_pump(s, t)) for s, t in ((proc.stdout, out), (proc.stderr, err))
        ]
        timed_out = False
        try:
            try:
                await asyncio.wait_for(proc.wait(), ctx.timeout_s)
            except TimeoutError:
                timed_out = True
        finally:
            # NOTE: also after a normal exit: a process the command left behind would keep
            # running on cores that now belong to another action.
            kill_session(proc.pid)
            await proc.wait()
            _, pending = await asyncio.wait(readers, timeout=_DRAIN_S)
            for r in pending:  # a process that left the session still holds a pipe
                r.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        code = proc.returncode
        if timed_out:
            status = ActionStatus.TIMED_OUT
        else:
            status = ActionStatus.SUCCEEDED if code == 0 else ActionStatus.FAILED
        return Outcome(
            status=status,
            exit_code=code,
            stdout=out.text(),
            stderr=err.text(),
            truncated=out.truncated or err.truncated,
            error=f"timed out after {ctx.timeout_s:g} s" if timed_out else None,
        )

    async def close(self) -> None:
        return None
