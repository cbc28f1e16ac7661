"""The group's side of a worker-process group: it starts one process per rank (`wpg.rank`),
sends every rank each operation as a `Request` and reads their `Result`s or `Failure`s, and
turns what went wrong into the group's errors (`wpg.errors`); `OneAtATime` is what every kind
of group (these processes, Ray actors) does around an operation."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection, Listener
from multiprocessing.connection import wait as wait_ready
from pathlib import Path
from typing import Any, Protocol

from loom.core.errors import ConfigError
from loom.proc.lifeline import child_popen
from loom.runtime.cluster.models.ref import ModelInfo
from loom.runtime.cluster.wpg.config import WorkerGroupConfig, check_op
from loom.runtime.cluster.wpg.errors import (
    BadMessage,
    FailureKind,
    GroupBroken,
    RankFailed,
    WorkerError,
)
from loom.runtime.cluster.wpg.messages import (
    AUTHKEY_ENV,
    OPS,
    Exit,
    Failure,
    Request,
    Result,
    decode_hello,
    decode_reply,
    decode_started,
    encode,
)
from loom.state.sidecar import TOKEN_ENV, SidecarConfig, StateClient, StateSidecar

__all__ = ["OneAtATime", "WorkerGroup", "Workers", "drop_state", "free_port"]

RANK_MODULE = "loom.runtime.cluster.wpg.rank"  # what a rank's process runs (`python -m`)


class Workers(Protocol):
    """What the cluster driver asks of a deployment's worker group, however its ranks run
    (worker processes here, Ray actors, a test's stand-in)."""

    config: WorkerGroupConfig
    ops_run: int

    def start(self) -> Workers: ...

    def check(self, op: str, payload: Any) -> None: ...

    def run(self, op: str, payload: dict[str, Any], timeout_s: float) -> dict[str, Any]: ...

    def settle(self, timeout_s: float) -> bool: ...

    def death(self) -> str | None: ...

    def state_intact(self) -> bool: ...

    def state(self, op: str, **kw: Any) -> list[Any]: ...

    @property
    def pids(self) -> list[int]: ...

    def kill(self) -> None: ...

    def close(self, *, keep_state: bool = False) -> None: ...


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class OneAtATime:
    """What every worker group does around an operation, however its ranks run: a known
    operation, one at a time, the replicas agreeing on the weights, rank 0's result."""

    config: WorkerGroupConfig
    _lock: threading.Lock
    running: str | None
    ops_run: int
    info: ModelInfo | None  # what its model is, once its ranks have built it

    def check(self, op: str, payload: Any) -> None:
        """Refuse a payload the group's model cannot run (ConfigError saying why)."""
        if self.info is None:
            raise WorkerError(f"{self.config.name} has not started")
        check_op(self.config, self.info, op, payload)

    def run(
        self, op: str, payload: dict[str, Any] | None = None, timeout_s: float = 600.0
    ) -> dict[str, Any]:
        """Run `op` on every rank and return rank 0's result; one operation at a time."""
        if op not in OPS:
            raise ConfigError(f"unknown operation {op!r}; known: {', '.join(OPS)}")
        self.check(op, payload or {})
        if not self._lock.acquire(blocking=False):
            raise WorkerError(
                f"{self.config.name}: {self.running} is running; one operation at a time"
            )
        try:
            self.running = op
            results = self._run_ranks(op, payload or {}, timeout_s)
            if op == "sync_weights" and len({r["digest"] for r in results}) != 1:
                raise WorkerError(f"{self.config.name}: replicas disagree on the weights")
            self.ops_run += 1
            result: dict[str, Any] = results[0]
            return result
        finally:
            self.running = None
            self._lock.release()

    def settle(self, timeout_s: float) -> bool:
        """After a `RankFailed`: wait up to `timeout_s` for the ranks still out to answer
        (their answers are dropped). True if the group can run again."""
        with self._lock:
            return self._settle(timeout_s)

    def _run_ranks(self, op: str, payload: dict[str, Any], timeout_s: float) -> list[Any]:
        """Every rank's result of `op`, in rank order; `RankFailed` at the first error."""
        raise NotImplementedError

    def _rank_failed(
        self, op: str, rank: int, failure: Failure, pending: Iterable[int]
    ) -> RankFailed:
        """The error of a rank's `failure` to run `op`, the ranks still out `pending`."""
        out = frozenset(pending)
        still = f" (ranks {sorted(out)} had not answered)" if out else ""
        return RankFailed(
            f"{self.config.name} {op}: rank {rank}: {failure.text()}{still}",
            out,
            error=failure.error,
            kind=failure.kind,
        )

    def _settle(self, timeout_s: float) -> bool:
        raise NotImplementedError


@dataclass
class WorkerGroup(OneAtATime):
    """The service-side handle of one WPG."""

    config: WorkerGroupConfig
    _procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _conns: list[Connection] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _tmp: tempfile.TemporaryDirectory[str] | None = None
    state_token: bytes | None = None  # the sidecar's, with config.state_address
    _state_address: str | None = None  # the sidecar its ranks use (its own, or the node's)
    _sidecar: StateSidecar | None = None  # a private one, when no address was given
    running: str | None = None  # the operation in flight, if any
    ops_run: int = 0
    info: ModelInfo | None = None
    _pending: set[int] = field(default_factory=set)  # ranks yet to answer a failed operation

    def start(self) -> WorkerGroup:
        """Start one process per rank (`python -m loom.runtime.cluster.wpg.rank`: a fresh
        interpreter, so the caller's script is never re-imported) and wait until every rank
        has joined the group and built its model."""
        cfg = self.config
        if cfg.state_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix=f"loom-wpg-{cfg.name}-")
            state_dir = Path(self._tmp.name)
        else:
            state_dir = Path(cfg.state_dir)
        state_dir.mkdir(parents=True, exist_ok=True)
        self._state_address = self._attach_sidecar(state_dir)
        spec = asdict(cfg) | {"state_dir": str(state_dir), "state_address": self._state_address}
        self._conns = self._spawn_ranks(json.dumps(spec))
        self._await_ready()
        return self

    def _attach_sidecar(self, state_dir: Path) -> str:
        """The address of the sidecar its ranks use: the node's, or one of its own."""
        cfg = self.config
        if cfg.state_address is not None:
            if self.state_token is None:
                raise ConfigError(f"{cfg.name}: state_address needs the sidecar's state_token")
            return cfg.state_address
        self._sidecar = StateSidecar(
            SidecarConfig(
                gpus=cfg.gpu_base + cfg.dp,
                device_bytes=cfg.device_bytes,
                host_bytes=cfg.host_bytes,
                disk_bytes=cfg.disk_bytes,
                disk_dir=str(state_dir / "state"),
            )
        ).start()
        self.state_token = self._sidecar.token
        return self._sidecar.address

    def _spawn_ranks(self, spec: str) -> list[Connection]:
        """Start the ranks' processes; their connections, in rank order, once each has said
        hello."""
        cfg = self.config
        assert self.state_token is not None, "the sidecar's token comes first"
        key = secrets.token_bytes(16)
        sock = str(
            Path(tempfile.gettempdir()) / f"loom-wpg-{os.getpid()}-{secrets.token_hex(6)}.sock"
        )
        port = free_port()
        by_rank: dict[int, Connection] = {}
        refused: list[str] = []  # hellos that were no hello
        with Listener(sock, family="AF_UNIX", authkey=key) as listener:
            for rank in range(cfg.dp):
                env = dict(
                    os.environ, **{AUTHKEY_ENV: key.hex(), TOKEN_ENV: self.state_token.hex()}
                )
                cmd = [sys.executable, "-m", RANK_MODULE, sock, str(rank), str(port), spec]
                tie = child_popen(env)  # the rank dies with this process, by any signal
                self._procs.append(subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, **tie))
            accepting = threading.Thread(
                target=lambda: self._accept(listener, by_rank, refused), daemon=True
            )
            accepting.start()
            deadline = time.monotonic() + cfg.start_timeout_s
            while accepting.is_alive():
                accepting.join(0.2)
                if time.monotonic() > deadline or any(p.poll() is not None for p in self._procs):
                    break
            if len(by_rank) < cfg.dp:
                self.close()
                why = f": {'; '.join(refused)}" if refused else ""
                raise WorkerError(f"{cfg.name}: the workers did not all connect{why}")
        return [by_rank[r] for r in range(cfg.dp)]

    def _accept(
        self, listener: Listener, by_rank: dict[int, Connection], refused: list[str]
    ) -> None:
        while len(by_rank) < self.config.dp:
            try:
                conn = listener.accept()
            except OSError:
                return
            try:
                hello = decode_hello(conn.recv_bytes())
            except (EOFError, OSError, BadMessage) as exc:  # (a process gone, or no rank)
                refused.append(str(exc) or type(exc).__name__)
                conn.close()
                continue
            by_rank[hello.rank] = conn

    def _await_ready(self) -> None:
        """Wait for every rank's answer to its start; rank 0's says what the model is."""
        cfg = self.config
        deadline = time.monotonic() + cfg.start_timeout_s
        for rank, conn in enumerate(self._conns):
            if not conn.poll(max(0.0, deadline - time.monotonic())):
                self.close()
                raise WorkerError(
                    f"{cfg.name}: rank {rank} did not start in {cfg.start_timeout_s} s"
                )
            try:
                started = decode_started(conn.recv_bytes())
            except (EOFError, OSError):  # it ended without a word
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._procs[rank].wait(5)  # (for its exit status)
                why = self._ended(rank) or f"rank {rank} is gone"
                self.close()
                raise WorkerError(f"{cfg.name}: rank {rank} failed to start: {why}") from None
            except BadMessage as exc:
                self.close()
                raise GroupBroken(f"{cfg.name}: rank {rank} answered its start with {exc}") from exc
            if isinstance(started, Failure):
                self.close()
                if started.kind is FailureKind.REFUSED:
                    raise ConfigError(f"{cfg.name}: {started.message}")
                raise WorkerError(f"{cfg.name}: rank {rank} failed to start: {started.message}")
            if rank == 0:
                self.info = started.info

    @property
    def alive(self) -> bool:
        return bool(self._procs) and all(p.poll() is None for p in self._procs)

    def death(self) -> str | None:
        """Which rank is gone and how, or None while every rank lives."""
        for rank in range(len(self._procs)):
            ended = self._ended(rank)
            if ended is not None:
                return ended
        return None if self._procs else "its ranks are stopped"

    def _ended(self, rank: int) -> str | None:
        p = self._procs[rank]
        code = p.poll()
        if code is None:
            return None
        how = f"was killed by {_signal_name(-code)}" if code < 0 else f"exited ({code})"
        return f"rank {rank} (pid {p.pid}) {how}"

    def state_intact(self) -> bool:
        """Whether the node's sidecar holds this group's whole state offloaded (what a
        restart of its ranks with `start_offloaded` loads)."""
        if self.state_token is None or self._state_address is None:
            return False
        try:
            with StateClient(self._state_address, self.state_token, timeout_s=30) as c:
                held = c.call("stats")["deployments"].get(self.config.name)
        except Exception:  # the sidecar is gone, or will not say: nothing to restart from
            return False
        return held is not None and not held["loaded"]

    def state(self, op: str, **kw: Any) -> list[Any]:
        """A call on the sidecar(s) holding this group's state, one result per node."""
        assert self.state_token is not None and self._state_address, "start the group first"
        with StateClient(self._state_address, self.state_token, timeout_s=600) as c:
            return [c.call(op, **kw)]

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def _run_ranks(self, op: str, payload: dict[str, Any], timeout_s: float) -> list[Any]:
        name = self.config.name
        if self._pending and not self._settle(self.config.settle_s):
            raise GroupBroken(
                f"{name}: ranks {sorted(self._pending)} never finished an earlier operation"
            )
        dead = self.death()
        if dead is not None:
            raise GroupBroken(f"{name}: {dead}")
        request = self._request_bytes(op, payload)
        pending = set(range(len(self._conns)))
        self._pending = pending  # (until every rank has answered)
        for rank in sorted(pending):
            try:
                self._conns[rank].send_bytes(request)
            except OSError:  # its end of the connection is gone: the process too
                raise GroupBroken(f"{name}: rank {rank} is gone ({op} not sent)") from None
        replies: dict[int, Any] = {}
        deadline = time.monotonic() + timeout_s
        while pending:
            left = deadline - time.monotonic()
            by_conn = {id(self._conns[r]): r for r in pending}
            ready = wait_ready([self._conns[r] for r in sorted(pending)], max(0.0, min(0.2, left)))
            for rank in sorted(by_conn[id(c)] for c in ready):
                reply = self._read_reply(rank, op)
                pending.discard(rank)
                if isinstance(reply, Failure):  # fail now: the others may wait for it
                    gone = self._peer_death(pending, self.config.peer_grace_s)
                    if gone is not None:  # its error is the collective losing that rank
                        raise GroupBroken(
                            f"{name}: {gone} during {op} (rank {rank}: {reply.text()})"
                        )
                    raise self._rank_failed(op, rank, reply, pending)
                replies[rank] = reply.result
            if pending and not ready:
                dead = self.death()
                if dead is not None:
                    raise GroupBroken(f"{name}: {dead} during {op}")
                if time.monotonic() >= deadline:
                    raise GroupBroken(
                        f"{name}: {op} ran past its deadline of {timeout_s:g} s "
                        f"(ranks {sorted(pending)} had not answered)"
                    )
        return [replies[r] for r in range(len(self._conns))]

    def _request_bytes(self, op: str, payload: dict[str, Any]) -> bytes:
        try:
            return encode(Request(op=op, payload=payload))
        except TypeError as exc:  # (`run` checked it: only a direct call gets here)
            raise ConfigError(f"{self.config.name} {op}: the payload is not JSON: {exc}") from None

    def _read_reply(self, rank: int, op: str) -> Result | Failure:
        """A rank's answer to `op`; `GroupBroken` if it is gone, or if what it sent is no
        answer (the group's state is then unknown)."""
        name = self.config.name
        try:
            return decode_reply(self._conns[rank].recv_bytes())
        except (OSError, EOFError):  # its end is closed: the process is exiting
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._procs[rank].wait(5)  # (for its exit status)
            raise GroupBroken(
                f"{name}: {self.death() or f'rank {rank} is gone'} during {op}"
            ) from None
        except BadMessage as exc:
            raise GroupBroken(f"{name}: rank {rank} answered {op} with {exc}") from exc

    def _peer_death(self, ranks: set[int], grace_s: float) -> str | None:
        """How one of `ranks` died, if one does within `grace_s`: a rank whose peer exits
        mid-collective raises too (gloo's "connection reset"), often before the parent sees
        the exit, and the exit is the cause to name."""
        deadline = time.monotonic() + grace_s
        while ranks:
            for rank in sorted(ranks):
                ended = self._ended(rank)
                if ended is not None:
                    return ended
            if time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        return None

    def _settle(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self._pending:
            if self.death() is not None:
                return False
            by_conn = {id(self._conns[r]): r for r in self._pending}
            left = deadline - time.monotonic()
            waiting = [self._conns[r] for r in sorted(self._pending)]
            ready = wait_ready(waiting, max(0.0, min(0.2, left)))
            for conn in ready:
                rank = by_conn[id(conn)]
                try:
                    self._conns[rank].recv_bytes()  # a late answer of the failed op: dropped
                except (OSError, EOFError):
                    return False
                self._pending.discard(rank)
            if self._pending and not ready and time.monotonic() >= deadline:
                return False
        return True

    def kill(self) -> None:
        """Stop the ranks at once (SIGKILL: they may be wedged) and end the sidecar calls
        they left waiting; the state the sidecar holds for the group stays (`close` drops
        it)."""
        for p in self._procs:
            if p.poll() is None:
                p.kill()
        for p in self._procs:
            p.wait(30)
        if self.state_token is not None and self._state_address is not None:
            address, token = self._state_address, self.state_token
            with contextlib.suppress(Exception), StateClient(address, token, timeout_s=10) as c:
                c.call("abandon", dep=self.config.name)

    def close(self, *, keep_state: bool = False) -> None:
        """Stop the ranks and drop the deployment's state from the sidecar (`keep_state`:
        leave it there, for ranks started again with `start_offloaded`)."""
        for conn in self._conns:
            with contextlib.suppress(Exception):
                conn.send_bytes(encode(Exit()))
        for p in self._procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        for conn in self._conns:
            conn.close()
        self._procs, self._conns, self._pending = [], [], set()
        if self._sidecar is not None:
            self._sidecar.close()
            self._sidecar = None
        elif self.state_token is not None and self._state_address is not None and not keep_state:
            drop_state(self._state_address, self.state_token, self.config.name)
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> WorkerGroup:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _signal_name(sig: int) -> str:
    with contextlib.suppress(ValueError):
        return signal.Signals(sig).name
    return f"signal {sig}"


def drop_state(address: str, token: bytes, name: str) -> None:
    """Forget a deployment on its node's sidecar (it is gone; nothing it held is needed)."""
    with contextlib.suppress(Exception), StateClient(address, token, timeout_s=10) as c:
        c.call("drop", dep=name)
