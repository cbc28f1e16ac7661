"""A worker-process group (PlexRL §4.2): one logical deployment of a model — one real process per
(fake or real) GPU, joined in a torch.distributed group (gloo on the CPU) — that executes the
operations the scheduler admits, one at a time and in order.

Operations: `forward` (log-probabilities of token sequences), `forward_backward` (a policy-
gradient loss, gradients averaged over the data-parallel ranks), `optim_step` (Adam),
`generate` (greedy), `save_ckpt` / `load_ckpt`, `sync_weights` (the weights' version and
digest, which every replica must agree on), and the state moves the scheduler inserts on a job
change: `offload` (to host or disk) and `load`. State moves go through the node's StateManager
sidecar (`loom.state.sidecar`): every rank exports its memory and the sidecar copies each
logical tensor once (data-parallel replicas are stored once); on `load` each rank gets fresh
buffers the sidecar fills. While offloaded, a deployment refuses to compute (`nothing runs
unless its state is on the device`). Checkpoints are materialised by the sidecar from the state
it manages; `sync_weights` with a `tp` also cuts the rollout shards of a tensor-parallel layout
from it, each target rank fetching only its slices.

A group run alone starts a sidecar of its own; the cluster service gives every group on a node
the node's sidecar (`state_address`).

Failures: every rank checks a payload before it computes (`payloads`), so a payload no rank can
run fails on all of them alike. An operation fails at the first rank that raises
(`RankFailed`), without waiting for the others, which may be blocked in a collective for the
rank that gave up; `settle` then waits a short while for them. A rank that dies, an operation
past its deadline or ranks that never settle make the group unusable (`GroupBroken`): its owner
`kill`s it. Ranks and a private sidecar are tied to the process that started them
(`loom.proc.lifeline`): they die with it, by whatever signal.
"""

from __future__ import annotations

import contextlib
import hashlib
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
import traceback
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Client, Connection, Listener
from multiprocessing.connection import wait as wait_ready
from pathlib import Path
from typing import Any, Literal, Protocol

from loom.core.errors import ConfigError
from loom.proc.lifeline import child_popen, watch_parent
from loom.runtime.cluster.models.ref import BUILTIN_MODEL, ModelInfo, ModelRef, parse_model
from loom.runtime.cluster.payloads import FAULT_OP, check_payload
from loom.state.sidecar import TOKEN_ENV, SidecarConfig, StateClient, StateSidecar

__all__ = [
    "OPS",
    "GroupBroken",
    "OneAtATime",
    "RankFailed",
    "WorkerError",
    "WorkerGroup",
    "WorkerGroupConfig",
    "Workers",
]

OPS = (
    "forward",
    "forward_backward",
    "optim_step",
    "generate",
    "save_ckpt",
    "load_ckpt",
    "sync_weights",
    "offload",
    "load",
    FAULT_OP,  # refused unless the group's config allows faults (tests)
)


class WorkerError(RuntimeError):
    """An operation failed in a worker (its message says which rank and why)."""


class RankFailed(WorkerError):
    """A rank raised; `pending` are the ranks that had not answered yet (they may be waiting
    in a collective for the one that raised)."""

    def __init__(self, message: str, pending: frozenset[int]) -> None:
        super().__init__(message)
        self.pending = pending


class GroupBroken(WorkerError):
    """The group cannot run another operation: a rank died, an operation ran past its
    deadline, or ranks never came back from one. Kill it."""


@dataclass(frozen=True, kw_only=True)
class WorkerGroupConfig:
    name: str
    dp: int = 2
    vocab: int = 128
    dim: int = 64
    layers: int = 2
    heads: int = 4
    seed: int = 0
    lr: float = 1e-3
    # what it runs (`models.parse_model`): "tiny" (vocab, dim, layers, heads above), a local
    # Hugging Face directory, or a worker class "module:Class"; its options as keywords
    model: str = "tiny"
    model_options: dict[str, Any] = field(default_factory=dict)
    # "auto": a GPU per rank where CUDA has one for each (NCCL), else the CPU (gloo)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    device_bytes: int | None = None  # a rank's device tier on its own sidecar (None: all)
    host_bytes: int = 1 << 30
    disk_bytes: int = 4 << 30
    state_dir: Path | None = None
    start_timeout_s: float = 120.0
    state_address: str | None = None  # the node's sidecar; a private one when None
    gpu_base: int = 0  # rank r holds the node's GPU gpu_base + r
    start_offloaded: bool = False  # its state is on the sidecar already (a migration)
    settle_s: float = 10.0  # after a rank raised, how long the others have to answer
    peer_grace_s: float = 1.0  # ... and to be seen dead, if their death is why it raised
    faults: bool = False  # accept FAULT_OP (tests: a rank raises, hangs or exits)

    def __post_init__(self) -> None:
        if self.dp < 1:
            raise ConfigError(f"dp must be >= 1, got {self.dp}")
        if self.settle_s < 0:
            raise ConfigError(f"settle_s must be >= 0, got {self.settle_s}")
        if self.peer_grace_s < 0:
            raise ConfigError(f"peer_grace_s must be >= 0, got {self.peer_grace_s}")
        parse_model(self.model)  # (a ConfigError saying why it cannot be one)

    def model_ref(self) -> ModelRef:
        return parse_model(self.model)

    def model_kwargs(self) -> dict[str, Any]:
        """The keywords its worker class is built with (the tiny decoder's shape, or the
        deployment's model options)."""
        if self.model == BUILTIN_MODEL:
            shape = {"vocab": self.vocab, "dim": self.dim, "layers": self.layers}
            return shape | {"heads": self.heads} | self.model_options
        return dict(self.model_options)


def check_op(config: WorkerGroupConfig, info: ModelInfo, op: str, payload: Any) -> None:
    """Refuse a payload the group's model cannot run (ConfigError saying why)."""
    if op == FAULT_OP and not config.faults:
        raise ConfigError(f"unknown operation {op!r} (fault injection is off)")
    check_payload(op, payload, vocab=info.vocab, tp_split=info.tp_split, ranks=config.dp)


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


def _free_port() -> int:
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
        """Start one process per rank (`python -m loom.runtime.cluster.wpg`: a fresh
        interpreter, so the caller's script is never re-imported) and wait until every rank
        has joined the group and built its model."""
        cfg = self.config
        if cfg.state_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix=f"loom-wpg-{cfg.name}-")
            state_dir = Path(self._tmp.name)
        else:
            state_dir = Path(cfg.state_dir)
        state_dir.mkdir(parents=True, exist_ok=True)
        address = cfg.state_address
        if address is None:
            self._sidecar = StateSidecar(
                SidecarConfig(
                    gpus=cfg.gpu_base + cfg.dp,
                    device_bytes=cfg.device_bytes,
                    host_bytes=cfg.host_bytes,
                    disk_bytes=cfg.disk_bytes,
                    disk_dir=str(state_dir / "state"),
                )
            ).start()
            address, self.state_token = self._sidecar.address, self._sidecar.token
        elif self.state_token is None:
            raise ConfigError(f"{cfg.name}: state_address needs the sidecar's state_token")
        self._state_address = address
        key = secrets.token_bytes(16)
        sock = str(
            Path(tempfile.gettempdir()) / f"loom-wpg-{os.getpid()}-{secrets.token_hex(6)}.sock"
        )
        port = _free_port()
        spec = json.dumps(asdict(cfg) | {"state_dir": str(state_dir), "state_address": address})
        by_rank: dict[int, Connection] = {}
        with Listener(sock, family="AF_UNIX", authkey=key) as listener:
            for rank in range(cfg.dp):
                env = dict(os.environ, LOOM_WPG_AUTHKEY=key.hex())
                env[TOKEN_ENV] = self.state_token.hex()
                cmd = [
                    sys.executable,
                    "-m",
                    "loom.runtime.cluster.wpg",
                    sock,
                    str(rank),
                    str(port),
                    spec,
                ]
                tie = child_popen(env)  # the rank dies with this process, by any signal
                self._procs.append(subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, **tie))
            accepting = threading.Thread(
                target=lambda: self._accept(listener, by_rank), daemon=True
            )
            accepting.start()
            deadline = time.monotonic() + cfg.start_timeout_s
            while accepting.is_alive():
                accepting.join(0.2)
                if time.monotonic() > deadline or any(p.poll() is not None for p in self._procs):
                    break
            if len(by_rank) < cfg.dp:
                self.close()
                raise WorkerError(f"{cfg.name}: the workers did not all connect")
        self._conns = [by_rank[r] for r in range(cfg.dp)]
        deadline = time.monotonic() + cfg.start_timeout_s
        for rank, conn in enumerate(self._conns):
            if not conn.poll(max(0.0, deadline - time.monotonic())):
                self.close()
                raise WorkerError(
                    f"{cfg.name}: rank {rank} did not start in {cfg.start_timeout_s} s"
                )
            msg = conn.recv()
            if msg.get("error"):
                self.close()
                if msg.get("refused"):
                    raise ConfigError(f"{cfg.name}: {msg['error']}")
                raise WorkerError(f"{cfg.name}: rank {rank} failed to start: {msg['error']}")
            if rank == 0:
                self.info = ModelInfo(**msg["info"])
        return self

    def _accept(self, listener: Listener, by_rank: dict[int, Connection]) -> None:
        while len(by_rank) < self.config.dp:
            try:
                conn = listener.accept()
            except OSError:
                return
            hello = conn.recv()
            by_rank[int(hello["rank"])] = conn

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
        pending = set(range(len(self._conns)))
        self._pending = pending  # (until every rank has answered)
        for rank in sorted(pending):
            try:
                self._conns[rank].send((op, payload))
            except OSError:  # its end of the connection is gone: the process too
                raise GroupBroken(f"{name}: rank {rank} is gone ({op} not sent)") from None
        replies: dict[int, Any] = {}
        deadline = time.monotonic() + timeout_s
        while pending:
            left = deadline - time.monotonic()
            by_conn = {id(self._conns[r]): r for r in pending}
            ready = wait_ready([self._conns[r] for r in sorted(pending)], max(0.0, min(0.2, left)))
            for rank in sorted(by_conn[id(c)] for c in ready):
                try:
                    msg = self._conns[rank].recv()
                except (OSError, EOFError):  # its end is closed: the process is exiting
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        self._procs[rank].wait(5)  # (for its exit status)
                    raise GroupBroken(
                        f"{name}: {self.death() or f'rank {rank} is gone'} during {op}"
                    ) from None
                pending.discard(rank)
                if msg.get("error"):  # fail now: the others may wait in a collective for it
                    gone = self._peer_death(pending, self.config.peer_grace_s)
                    if gone is not None:  # its error is the collective losing that rank
                        raise GroupBroken(
                            f"{name}: {gone} during {op} (rank {rank}: {msg['error']})"
                        )
                    still = f" (ranks {sorted(pending)} had not answered)" if pending else ""
                    raise RankFailed(
                        f"{name} {op}: rank {rank}: {msg['error']}{still}", frozenset(pending)
                    )
                replies[rank] = msg["result"]
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
                    self._conns[rank].recv()  # a late answer of the failed operation: dropped
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
                conn.send(("exit", {}))
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


# ---- the worker process --------------------------------------------------------------------


def _worker_main(cfg: dict[str, Any], rank: int, port: int, conn: Connection, token: bytes) -> None:
    conn.send({"rank": rank})
    try:
        worker = _Worker(cfg, rank, port, token)
    except ConfigError as exc:  # the model cannot be built as named: the caller's mistake
        conn.send({"error": str(exc), "refused": True})
        return
    except Exception:
        conn.send({"error": traceback.format_exc(limit=3)})
        return
    conn.send({"ready": True, "info": asdict(worker.mw.info())})
    while True:
        try:
            op, payload = conn.recv()
        except EOFError:
            break
        if op == "exit":
            break
        try:
            conn.send({"result": worker.run(op, payload)})
        except Exception as exc:
            conn.send({"error": f"{type(exc).__name__}: {exc}"})
    worker.close()


class _Worker:
    def __init__(
        self,
        cfg: dict[str, Any],
        rank: int,
        port: int,
        token: bytes,
        master: str = "127.0.0.1",
        *,
        local: tuple[int, int] | None = None,
        gpu: int | None = None,
    ) -> None:
        """`local`: (this rank's index, the deployment's ranks) on its node's sidecar, and
        `gpu` the GPU it was given (Ray's: then the only one it sees); by default every rank
        is on one node, on GPU gpu_base + rank."""
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        self.torch, self.dist = torch, dist
        self.rank, self.world = rank, cfg["dp"]
        self.name = cfg["name"]
        self.cfg = WorkerGroupConfig(
            **{k: v for k, v in cfg.items() if k in WorkerGroupConfig.__dataclass_fields__}
        )
        where: tuple[int, int] = local if local is not None else (rank, int(self.world))
        self.local_rank, self.local_world = where
        self.gpu = int(cfg["gpu_base"]) + self.local_rank if gpu is None else gpu
        self.device = self._pick_device(assigned=gpu is not None)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        dist.init_process_group(
            "nccl" if self.device.type == "cuda" else "gloo",
            init_method=f"tcp://{master}:{port}",
            rank=rank,
            world_size=self.world,
        )
        from loom.runtime.cluster.models.build import build_worker

        self.mw = build_worker(
            self.cfg.model_ref(),
            seed=self.cfg.seed,
            device=self.device,
            options=self.cfg.model_kwargs(),
        )
        self.model = self.mw.module
        self.optim = self.mw.optimizer(self.cfg.lr)
        self.info = self.mw.info()
        self.step = 0
        self.resident = True
        self.publisher: Any = None  # what sync_weights pushed last (rank 0, with a relay)
        self.sc = StateClient(cfg["state_address"], token)
        if cfg.get("start_offloaded"):  # its state waits on the sidecar: drop the fresh one
            for t in self._state().values():
                t.data = torch.empty(0, dtype=t.dtype, device=t.device)
            self.resident = False

    def _pick_device(self, *, assigned: bool) -> Any:
        """A GPU of its own where CUDA gives every rank one (`auto`, `cuda`), else the CPU.
        Every rank of the group decides alike: from the same device count and layout."""
        torch = self.torch
        want = self.cfg.device
        n = torch.cuda.device_count() if want != "cpu" and torch.cuda.is_available() else 0
        fits = n > 0 and (assigned or self.cfg.gpu_base + self.local_world <= n)
        if want == "cuda" and not fits:
            raise ConfigError(
                f"device cuda: {n} CUDA devices here, the group needs GPUs "
                f"{self.cfg.gpu_base}..{self.cfg.gpu_base + self.local_world - 1}"
            )
        if not fits:
            return torch.device("cpu")
        return torch.device("cuda", 0 if assigned else self.gpu)

    def close(self) -> None:
        self.sc.close()
        with contextlib.suppress(Exception):
            self.dist.destroy_process_group()

    # ---- dispatch ---------------------------------------------------------------------------
    def run(self, op: str, p: dict[str, Any]) -> dict[str, Any]:
        # every rank checks the whole payload first: a bad one fails on all ranks alike,
        # before any collective
        check_op(self.cfg, self.info, op, p)
        if op in ("offload", "load"):
            return getattr(self, f"_{op}")(p)
        if not self.resident:
            raise RuntimeError(f"{self.name} is offloaded: load it before {op}")
        return getattr(self, f"_{op}")(p)

    def _inject_fault(self, p: dict[str, Any]) -> dict[str, Any]:
        """Test-only (the group's `faults`): rank `p["rank"]` raises, hangs `hang_s` or exits
        where the others wait for it in a collective."""
        if self.rank == p["rank"]:
            if p["action"] == "raise":
                raise RuntimeError(f"injected fault on rank {self.rank}")
            if p["action"] == "exit":
                os._exit(13)
            time.sleep(float(p.get("hang_s", 3600.0)))
        t = self.torch.ones((), device=self.device)
        self.dist.all_reduce(t)
        return {"sum": float(t)}

    def _mine(self, rows: list[Any]) -> list[Any]:
        """This rank's share of a batch's rows (every world-th, from its rank)."""
        return rows[self.rank :: self.world]

    def _rows(self, ids: list[list[int]]) -> Any:
        mine = self._mine(ids)
        return self.torch.tensor(mine, dtype=self.torch.long, device=self.device) if mine else None

    def _gather_rows(self, local: list[Any], n: int) -> list[Any]:
        parts: list[Any] = [None] * self.world
        self.dist.all_gather_object(parts, local)
        out: list[Any] = [None] * n
        for r, part in enumerate(parts):
            for i, row in enumerate(part):
                out[r + i * self.world] = row
        return out

    def _forward(self, p: dict[str, Any]) -> dict[str, Any]:
        ids = p["ids"]
        x = self._rows(ids)
        with self.torch.no_grad():
            local = self.mw.logprobs(x).tolist() if x is not None else []
        return {"logprobs": self._gather_rows(local, len(ids))}

    def _forward_backward(self, p: dict[str, Any]) -> dict[str, Any]:
        """The loss the payload names over the batch (`losses`); each rank scores its rows,
        the gradients summed over the ranks are the batch's. Gradients add up over calls
        until `optim_step` (micro-batches)."""
        from loom.runtime.cluster.losses import Agg, LossBatch, LossKind, loss_of

        torch, dist, dev = self.torch, self.dist, self.device
        ids = p["ids"]
        rows, width = len(ids), len(ids[0]) - 1
        kind, agg = LossKind(p.get("loss", "pg")), Agg(p.get("agg", "sequence"))
        mask = p.get("mask") or [[1] * width] * rows
        adv = p.get("advantages")
        if adv is None and kind is not LossKind.NLL:
            adv = [1.0] * rows
        tokens = sum(map(sum, mask))
        norm = float(tokens if agg is Agg.TOKEN else rows)  # the whole batch's, on every rank
        x = self._rows(ids)
        loss, stats = torch.zeros((), device=dev), {}
        if x is not None:

            def mine(v: list[Any]) -> Any:
                return torch.tensor(self._mine(v), dtype=torch.float32, device=dev)

            clip = p.get("clip") or 0.2
            out = loss_of(
                kind,
                LossBatch(
                    logp=self.mw.logprobs(x),
                    mask=mine(mask),
                    advantages=None if adv is None else mine(adv),
                    old_logp=mine(p["old_logprobs"]) if kind is LossKind.PPO else None,
                    agg=agg,
                    norm=norm,
                    clip_low=clip,
                    clip_high=p.get("clip_high") or clip,
                ),
            )
            out.loss.backward()
            loss, stats = out.loss, out.stats
        for param in self.model.parameters():
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            dist.all_reduce(param.grad)  # the rows' terms summed: the full batch's gradient
        total = loss.detach().clone()
        dist.all_reduce(total)
        result: dict[str, Any] = {"loss": float(total), "tokens": int(tokens)}
        if kind is LossKind.PPO:
            result |= self._ratio_stats(stats, tokens)
        return result

    def _ratio_stats(self, stats: dict[str, Any], tokens: int) -> dict[str, Any]:
        """The importance ratio over the batch's scored tokens: mean, spread, range, and the
        share of tokens whose clipped term was taken."""
        torch, dist, dev = self.torch, self.dist, self.device
        inf = float("inf")
        sums = torch.tensor(
            [float(stats.get(k, 0.0)) for k in ("ratio_sum", "ratio_sq_sum", "clipped")],
            dtype=torch.float64,
            device=dev,
        )
        low = torch.tensor([float(stats.get("ratio_min", inf))], dtype=torch.float64, device=dev)
        high = torch.tensor([float(stats.get("ratio_max", -inf))], dtype=torch.float64, device=dev)
        dist.all_reduce(sums)
        dist.all_reduce(low, op=dist.ReduceOp.MIN)
        dist.all_reduce(high, op=dist.ReduceOp.MAX)
        if not tokens:
            return {"ratio": None, "clipped": 0.0}
        total, sq, clipped = (float(v) for v in sums.tolist())
        mean = total / tokens
        return {
            "ratio": {
                "mean": mean,
                "std": max(0.0, sq / tokens - mean * mean) ** 0.5,
                "min": float(low),
                "max": float(high),
            },
            "clipped": clipped / tokens,
        }

    def _optim_step(self, p: dict[str, Any]) -> dict[str, Any]:
        """One step of the optimizer on the summed gradients (clipped to `max_grad_norm`
        first if given); it reports their norm."""
        torch = self.torch
        if p.get("lr") is not None:
            for g in self.optim.param_groups:
                g["lr"] = float(p["lr"])
        params = [q for q in self.model.parameters() if q.grad is not None]
        if p.get("max_grad_norm") is not None:
            norm = torch.nn.utils.clip_grad_norm_(params, float(p["max_grad_norm"]))
        else:
            norm = torch.nn.utils.get_total_norm([q.grad for q in params]) if params else 0.0
        self.optim.step()
        self.optim.zero_grad(set_to_none=True)
        self.step += 1
        return {"step": self.step, "grad_norm": float(norm)}

    def _generate(self, p: dict[str, Any]) -> dict[str, Any]:
        ids = p["ids"]
        x = self._rows(ids)
        local = self.mw.generate(x, int(p.get("max_tokens", 8))).tolist() if x is not None else []
        return {"tokens": self._gather_rows(local, len(ids))}

    def _bind(self) -> None:
        """Show the sidecar this rank's state as it is now (collective over the ranks)."""
        self.sc.bind(
            self.name, self.local_rank, self.local_world, self.gpu, self._state(),
            meta={"step": self.step},
        )  # fmt: skip

    def _save_ckpt(self, p: dict[str, Any]) -> dict[str, Any]:
        """A checkpoint materialised by the sidecar from the state it manages (§4.5.3)."""
        path = Path(p["path"])
        self._bind()
        out: dict[str, Any] = {"path": str(path), "step": self.step}
        if self.local_rank == 0 and self.rank == 0:
            done = self.sc.call("checkpoint", dep=self.name, path=str(path))
            out |= {k: v for k, v in done.items() if k != "meta"}
        self.dist.barrier()
        return out

    def _load_ckpt(self, p: dict[str, Any]) -> dict[str, Any]:
        """Read a checkpoint the sidecar wrote ({kind/name: tensor}, with the step)."""
        from loom.runtime.cluster.model import restore_items

        state = self.torch.load(Path(p["path"]), weights_only=False, map_location=self.device)
        meta = state.pop("__meta__", {})
        restore_items(self.model, self.optim, state)
        self.step = int(meta.get("step", 0))
        return {"step": self.step}

    def _digest(self) -> str:
        h = hashlib.sha256()
        for name, t in sorted(self.model.state_dict().items()):
            h.update(name.encode())
            h.update(
                t.detach().cpu().contiguous().view(-1).view(self.torch.uint8).numpy().tobytes()
            )
        return h.hexdigest()

    def _sync_weights(self, p: dict[str, Any]) -> dict[str, Any]:
        """The weights' version and digest (every replica must agree: checked before anything
        leaves). With `tp`, also the shards a rollout layout of that tensor-parallel degree
        loads, cut by the sidecar from the managed state: each target rank fetches only its
        slices. With a `relay`, rank 0 publishes them there as a new version (sparse deltas
        against the one before) and, with `engines`, has every engine load it without a
        restart and tells the `router` which engines serve it."""
        digest = self._digest()
        digests: list[Any] = [None] * self.world
        self.dist.all_gather_object(digests, digest)
        if len(set(digests)) != 1:
            raise RuntimeError(f"replicas disagree on the weights: {sorted(set(digests))}")
        out: dict[str, Any] = {"version": self.step, "digest": digest}
        tp = p.get("tp")
        if tp is not None:
            out["reshard"] = self._reshard(int(tp))
        if p.get("relay") is not None and self.rank == 0:
            out |= self._publish(p)
        return out

    def _reshard(self, tp: int) -> dict[str, Any] | None:
        specs = self.mw.param_specs()
        assert specs is not None, "the payload check refuses tp without a layout"
        self._bind()
        if self.rank != 0:
            return None
        fetched, digests = [], []
        for r in range(tp):
            shards, n = self.sc.call(
                "materialize", model=self.name, kind="weights", params=specs, tp=tp, rank=r
            )
            fetched.append(int(n))
            d = hashlib.sha256()
            for name in sorted(shards):
                d.update(name.encode())
                d.update(
                    shards[name].contiguous().view(-1).view(self.torch.uint8).numpy().tobytes()
                )
            digests.append(d.hexdigest())
        return {"tp": tp, "fetched_bytes": fetched, "shard_digests": digests}

    def _publish(self, p: dict[str, Any]) -> dict[str, Any]:
        """Publish the serving weights to the relay; then every engine named loads them."""
        from dataclasses import asdict as as_dict

        from loom.runtime.engine.weight_sync import EngineRef, sync_engines
        from loom.runtime.relay.client import RelayClient
        from loom.runtime.relay.model_sync import WeightPublisher

        t0 = time.perf_counter()
        relay = p["relay"]
        version = self.step if p.get("version") is None else int(p["version"])
        token = os.environ.get("LOOM_TOKEN")  # (the relay's and router's: one for every service)
        if self.publisher is None or self.publisher.store.base_url != relay["url"].rstrip("/"):
            store = RelayClient(relay["url"], token=token, timeout_s=600)
            member = "train-" + self.name.replace(":", "-")
            self.publisher = WeightPublisher(store, member_id=member)
        self.publisher.dense_every = int(relay.get("dense_every") or 0)
        published = self.publisher.publish(version, self.mw.serving_weights())
        out: dict[str, Any] = {"published": as_dict(published)}
        if p.get("engines"):
            done = sync_engines(
                [EngineRef(e["url"], e.get("id")) for e in p["engines"]],
                relay=relay["url"],
                job=relay.get("job") or self.name,
                version=version,
                router=p.get("router"),
                token=token,
            )
            out["engines"] = [as_dict(e) for e in done]
        out["sync_s"] = time.perf_counter() - t0
        return out

    # ---- state moves ------------------------------------------------------------------------
    def _state(self) -> dict[Any, Any]:
        from loom.runtime.cluster.model import state_items
        from loom.state.manager import StateKey

        out = {}
        for full, t in state_items(self.model, self.optim).items():
            kind, name = full.split("/", 1)
            out[StateKey(self.name, kind, name)] = t
        return out

    def _offload(self, p: dict[str, Any]) -> dict[str, Any]:
        """Every rank exports its state to the sidecar, which keeps one copy of each tensor;
        then the ranks free their memory."""
        if not self.resident:
            return {"bytes": 0}
        state = self._state()
        written = self.sc.offload(
            self.name, self.local_rank, self.local_world, self.gpu, state,
            tier=p.get("tier", "host"), meta={"step": self.step},
        )  # fmt: skip
        for t in state.values():  # free the deployment's memory on every rank
            t.data = self.torch.empty(0, dtype=t.dtype, device=t.device)
        self.resident = False
        return {"bytes": written}

    def _load(self, p: dict[str, Any]) -> dict[str, Any]:
        """Fresh buffers on every rank, filled by the sidecar."""
        if self.resident:
            return {"bytes": 0}
        from loom.runtime.cluster.model import adopt_items

        # NOTE: the buffers on the rank's own device (a GPU rank's state loads back into GPU
        # memory, not the host's)
        got = self.sc.load(self.name, self.local_rank, self.local_world, device=str(self.device))
        adopt_items(self.model, self.optim, {f"{k.kind}/{k.name}": v for k, v in got.views.items()})
        self.step = int(got.meta.get("step", self.step))
        self.resident = True
        return {"bytes": got.bytes}


def main(argv: list[str]) -> None:
    """A worker process: connect back to the group's listener, then serve operations."""
    watch_parent()  # this rank dies with the process that started it, however that dies
    address, rank, port, spec = argv[0], int(argv[1]), int(argv[2]), json.loads(argv[3])
    key = bytes.fromhex(os.environ.pop("LOOM_WPG_AUTHKEY"))
    token = bytes.fromhex(os.environ.pop(TOKEN_ENV))
    conn = Client(address, family="AF_UNIX", authkey=key)
    _worker_main(spec, rank, port, conn, token)


if __name__ == "__main__":
    main(sys.argv[1:])
