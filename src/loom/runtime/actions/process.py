"""CPU tools as real processes (AOE, §5.2): each action runs in its trajectory's workspace, on
exactly the cores it was granted, with no core dumps. With cgroups (`cgroups.py`) it runs in a
cgroup of its own (cpuset, pids.max) inside its trajectory's memory group, and every process
it started dies with it, however it detached; under bubblewrap (`sandbox.py`) it sees nothing
of the server but the read-only system and its own workspace. Without cgroups the limits fall
back to a session killed as a group and an address-space limit of `memory_gb` per process.

An action ends when its main process exits: its status comes from that exit code, and what
it left running is killed after `linger_s`. If the server dies (SIGKILL included), its reaper
(`loom.runtime.reaper`) kills the sessions of the actions still running and their cgroups."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import shutil
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

from loom.core.actions import ActionStatus
from loom.runtime.actions.cgroups import ActionGroup, CgroupError, Cgroups
from loom.runtime.actions.executor import ExecContext
from loom.runtime.actions.record import Outcome
from loom.runtime.actions.sandbox import Bubblewrap, minimal_env, program_paths
from loom.runtime.reaper import Reaper

__all__ = ["OutputTail", "ProcessExecutor", "kill_session"]

log = logging.getLogger(__name__)

_DRAIN_S = 1.0  # how long to wait for the pipes to close once the session is killed
_CHUNK = 1 << 16
# The command starts as this shell, which writes itself ("0": the writer) into each of the
# action's cgroup.procs files and then becomes the command: it is in its groups before it can
# fork, and the server still spawns it with vfork (no preexec_fn, which forks the server).
_JOIN = 'while [ "$1" != -- ]; do echo 0 > "$1" || exit 126; shift; done; shift; exec "$@"'


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


def _locate(prog: str, cwd: Path, env: dict[str, str]) -> Path | str:
    """Where program `prog` is (an absolute path), or why it cannot be run, checked before
    spawning: once wrapped in a shell and a sandbox, a missing program would be only an exit
    code."""
    if "/" in prog:
        path = cwd / prog
        if not path.exists():
            return f"cannot run {prog!r}: No such file or directory"
        if path.is_dir() or not os.access(path, os.X_OK):
            return f"cannot run {prog!r}: Permission denied"
        return Path(os.path.abspath(path))
    found = shutil.which(prog, path=env.get("PATH"))
    if found is None:
        return f"cannot run {prog!r}: not found on PATH ({env.get('PATH')})"
    return Path(os.path.abspath(found))


async def _exited(pid: int) -> None:
    """Until process `pid` exits (a pidfd turns readable), whoever reaps it and whatever still
    holds its pipes."""
    loop = asyncio.get_running_loop()
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    done: asyncio.Future[None] = loop.create_future()

    def exited() -> None:
        if not done.done():
            done.set_result(None)

    loop.add_reader(fd, exited)
    try:
        await done
    finally:
        loop.remove_reader(fd)
        os.close(fd)


class ProcessExecutor:
    """Runs commands; keeps the tail (`max_output_bytes`) of stdout and stderr. `cgroups` and
    `sandbox` contain them when given; `linger_s` is how long what a command left running may
    go on after it exits."""

    def __init__(
        self,
        max_output_bytes: int,
        *,
        cgroups: Cgroups | None = None,
        sandbox: Bubblewrap | None = None,
        linger_s: float = 0.0,
    ) -> None:
        self.max_output_bytes = max_output_bytes
        self.cgroups = cgroups
        self.sandbox = sandbox
        self.linger_s = linger_s
        self.reaper: Reaper | None = None  # ends the actions' sessions if the server dies
        self._home: set[int] | None = None  # the spawning thread's own CPU mask

    def _env(self, ctx: ExecContext) -> dict[str, str]:
        req, start = ctx.request, ctx.start
        env = minimal_env(req.env, ctx.workspace)
        env["LOOM_ACTION_ID"] = start.action.action_id
        env["LOOM_TRAJECTORY_ID"] = start.action.trajectory_id
        env["LOOM_CORES"] = ",".join(map(str, start.cores))
        if req.parallel_env:
            env[req.parallel_env] = str(len(start.cores))
        return env

    def _argv(
        self, ctx: ExecContext, env: dict[str, str], group: ActionGroup | None, program: Path
    ) -> list[str]:
        argv = list(ctx.request.command or ())
        if self.sandbox is not None:
            argv = self.sandbox.argv(
                argv,
                workspace=ctx.workspace,
                env=env,
                network=ctx.request.network,
                reveal=program_paths(program, env.get("PATH")),
            )
        if group is not None:
            argv = ["/bin/sh", "-c", _JOIN, "sh", *map(str, group.procs_files), "--", *argv]
        return argv

    def _group(self, ctx: ExecContext) -> ActionGroup | None:
        if self.cgroups is None:
            return None
        mem = ctx.request.memory_gb
        return self.cgroups.action(
            ctx.start.action.trajectory_id,
            ctx.start.action.action_id,
            ctx.start.cores,
            None if mem is None else int(mem * 2**30),
        )

    def end_trajectory(self, trajectory_id: str) -> None:
        if self.cgroups is not None:
            self.cgroups.end_trajectory(trajectory_id)

    async def run(self, ctx: ExecContext) -> Outcome:
        argv = ctx.request.command
        cores = ctx.start.cores
        assert argv, "a CPU action has a command"
        assert cores and len(cores) == ctx.start.units, f"granted {cores} for {ctx.start.units}"
        try:
            group = self._group(ctx)
        except (CgroupError, OSError) as exc:
            return Outcome(status=ActionStatus.FAILED, error=f"cannot contain the action: {exc}")
        try:
            return await self._run(ctx, argv[0], group)
        finally:
            if group is not None:
                await asyncio.to_thread(group.remove)

    async def _run(self, ctx: ExecContext, prog: str, group: ActionGroup | None) -> Outcome:
        mem = ctx.request.memory_gb
        pinned = frozenset(ctx.start.cores)
        env = self._env(ctx)
        program = _locate(prog, ctx.workspace, env)
        if isinstance(program, str):
            return Outcome(status=ActionStatus.FAILED, error=program)
        argv = self._argv(ctx, env, group, program)
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
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                # without cgroups, the address-space limit per process is all there is
                preexec_fn=_address_space(mem) if mem is not None and group is None else None,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            return Outcome(status=ActionStatus.FAILED, error=f"cannot run {argv[0]!r}: {reason}")
        finally:
            os.sched_setaffinity(0, self._home)
        if self.reaper is not None:
            self.reaper.track(proc.pid)  # its session's id
        _after_spawn(proc.pid, pinned)
        ctx.started()
        out, err = OutputTail(self.max_output_bytes), OutputTail(self.max_output_bytes)
        readers = [
            asyncio.ensure_future(_pump(s, t)) for s, t in ((proc.stdout, out), (proc.stderr, err))
        ]
        timed_out = False
        try:
            try:
                await asyncio.wait_for(_exited(proc.pid), ctx.timeout_s)
            except TimeoutError:
                timed_out = True
            if not timed_out and self.linger_s > 0 and group is not None:
                await self._linger(group)
        finally:
            # NOTE: also after a normal exit: a process the command left behind would keep
            # running on cores that now belong to another action.
            if group is not None:
                await asyncio.to_thread(group.kill)
            kill_session(proc.pid)
            if self.reaper is not None:
                self.reaper.forget(proc.pid)  # before it is reaped, while its pid is its own
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

    async def _linger(self, group: ActionGroup) -> None:
        """Let what the command left running finish, for up to `linger_s`."""
        deadline = asyncio.get_running_loop().time() + self.linger_s
        while group.pids() and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)

    async def close(self) -> None:
        return None
