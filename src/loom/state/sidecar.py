"""The StateManager as a per-node sidecar daemon (PlexRL §5.3).

One process per node owns a `StateManager` — every tensor's residency on that node — and
serves the node's worker processes and the scheduler over a Unix domain socket (and, for
migration between nodes, optionally TCP):

* **Data plane, synchronous.** A worker *exports* its memory instead of sending bytes: CUDA
  tensors as CUDA IPC handles (`torch.multiprocessing.reductions`), CPU tensors as a shared-
  memory file the two processes map. The sidecar is the active transfer endpoint: it maps the
  export, does the copy (device → pinned host on an offload, host → device on a load) and
  answers only when the copy is done, so a returned call means the state is where it was asked
  to be. An offload or load is collective over a deployment's ranks on the node: the sidecar
  waits for every rank's export, then moves each logical key once (data-parallel replicas are
  stored once) and answers them all. The copies are pipelined (`loom.state.copy`: chunks on
  several CUDA streams), and each export is mapped only when its copy is issued, so that
  mapping one tensor overlaps the copies of those before it.
* **Control plane.** The scheduler's plan (`plan`: eviction reads it), `prefetch` before a
  predicted switch, `stats`, checkpoints materialised from managed state (offloaded or not),
  rollout shards for another tensor-parallel layout (`materialize`), and `mirror`: a
  deployment's offloaded state sent to another node's sidecar, which `adopt`s it; `abandon`
  ends the collective calls a deployment's stopped ranks left waiting (`drop` does too).

Copies and every call on the StateManager run on one data-plane thread, in arrival order; the
event loop only frames messages and gathers the ranks of a collective call.

Messages are pickles framed by `multiprocessing.connection` (the framing the worker groups
use too), and a connection is trusted only once both sides have proved they know the
sidecar's token without sending it (its challenge and answer, each way: HMAC over a random
message, HMAC-MD5 on Python 3.11 and HMAC-SHA256 from 3.12), so nothing from an
unauthenticated peer is ever unpickled and no peer talks to a sidecar that is not the one it
was given. The socket lives in a private 0700 directory.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import pickle
import secrets
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass, field
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge
from pathlib import Path
from typing import Any, NamedTuple

from loom.core.errors import ConfigError
from loom.proc.lifeline import child_popen, watch_parent
from loom.state.copy import DEFAULT_CHUNK_BYTES, DEFAULT_STREAMS
from loom.state.manager import NotResident, StateKey, StateManager
from loom.state.tiers import Deferred, Tier, TierFull, nbytes

__all__ = ["Loaded", "SidecarConfig", "StateClient", "StateError", "StateSidecar", "serve"]

TOKEN_ENV = "LOOM_STATE_TOKEN"
_HANDSHAKE_S = 10.0  # a peer has this long to answer the challenge
_ALIGN = 64  # every tensor in a shared-memory export starts on a 64-byte boundary


class StateError(RuntimeError):
    """The sidecar refused or failed a call (its message says why)."""


_REMOTE: dict[str, type[StateError]] = {}


def _remote_error(kind: str, message: str) -> StateError:
    """An error the sidecar raised, as its kind where that kind crosses the wire (a
    `StateError` too, so that a caller catching the sidecar's failures catches it)."""
    base = _WIRE_ERRORS.get(kind)
    if base is None or base is StateError:
        return StateError(message)
    cls = _REMOTE.get(kind)
    if cls is None:
        cls = _REMOTE[kind] = type(
            kind,
            (StateError, base),
            {"__init__": StateError.__init__, "__str__": RuntimeError.__str__},
        )
    return cls(message)


class Loaded(NamedTuple):
    """A rank's state after a load: its tensors (fresh buffers the sidecar filled), the bytes
    the sidecar read, and the owner's notes kept with the state (a training step)."""

    views: dict[StateKey, Any]
    bytes: int
    meta: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class SidecarConfig:
    gpus: int = 1
    device_bytes: int | None = None  # per GPU: its memory; on a CPU node, the node's memory
    host_bytes: int = 1 << 30
    disk_bytes: int = 4 << 30
    disk_dir: str = ""  # a private temporary directory when empty
    device: str | None = None  # "cuda" where there is one, else "cpu"
    pin_host: bool | None = None  # pinned host memory where CUDA is present
    tcp_host: str | None = None  # also listen on TCP (host, a free port): peers migrate here
    collective_timeout_s: float = 120.0
    start_timeout_s: float = 60.0
    # copies in chunks of this many bytes on this many CUDA streams; 0: whole and one at a time
    copy_chunk_bytes: int = DEFAULT_CHUNK_BYTES
    copy_streams: int = DEFAULT_STREAMS

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise ConfigError(f"a sidecar needs gpus >= 1, got {self.gpus}")
        if min(self.device_bytes or 0, self.host_bytes, self.disk_bytes) < 0:
            raise ConfigError("tier capacities must be >= 0 bytes")
        if self.copy_chunk_bytes < 0 or self.copy_streams < 0:
            raise ConfigError("copy_chunk_bytes and copy_streams must be >= 0")


# ---- connections: multiprocessing.connection's framing and challenge over a socket -------


def _set_timeouts(sock: socket.socket, seconds: float | None) -> None:
    """Reads and writes on `sock`'s descriptor give up after `seconds` (None: never), also
    once it is a `Connection` (whose reads are os.read on the blocking descriptor)."""
    whole = int(seconds or 0)
    tv = struct.pack("ll", whole, int(((seconds or 0) - whole) * 1e6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)


def _connection(sock: socket.socket, timeout_s: float | None) -> Connection:
    sock.setblocking(True)
    _set_timeouts(sock, timeout_s)
    return Connection(sock.detach())


# ---- exports: a worker's memory, mapped by the sidecar ----------------------------------------


def _shm_dir() -> str:
    d = "/dev/shm"
    return d if os.path.isdir(d) and os.access(d, os.W_OK) else tempfile.gettempdir()


class _ShmBlock:
    """One shared-memory file holding several tensors at aligned offsets (one per transfer)."""

    def __init__(self, sizes: list[int]) -> None:
        import torch

        self.offsets = []
        total = 0
        for n in sizes:
            self.offsets.append(total)
            total += -(-max(n, 1) // _ALIGN) * _ALIGN
        self.path = os.path.join(_shm_dir(), f"loom-state-{os.getpid()}-{secrets.token_hex(8)}")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, max(total, 1))
        finally:
            os.close(fd)
        self.buf = torch.from_file(self.path, shared=True, size=max(total, 1), dtype=torch.uint8)

    def view(self, i: int, shape: tuple[int, ...], dtype: Any) -> Any:
        import torch

        n = _numel(shape) * torch.empty((), dtype=dtype).element_size()
        off = self.offsets[i]
        return self.buf[off : off + n].view(dtype).view(shape)

    def unlink(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def export_tensors(
    tensors: Mapping[StateKey, Any],
) -> tuple[dict[StateKey, Any], Callable[[], None]]:
    """What the sidecar needs to map `tensors`: CUDA IPC handles for CUDA tensors; CPU ones are
    copied into one shared-memory file. Call the returned cleanup once the sidecar answered."""
    from torch.multiprocessing.reductions import reduce_tensor

    out: dict[StateKey, Any] = {}
    cpu = [k for k, t in tensors.items() if not t.is_cuda]
    for k, t in tensors.items():
        if t.is_cuda:
            out[k] = ("cuda", reduce_tensor(t.detach()), tuple(t.shape), t.dtype)
    if out:
        import torch

        # what the sidecar copies is the memory as it is once queued work is done: a mapping it
        # reuses does not wait for this process's streams
        for device in {t.device for t in tensors.values() if t.is_cuda}:
            torch.cuda.current_stream(device).synchronize()
    if not cpu:
        return out, lambda: None
    block = _ShmBlock([nbytes(tensors[k]) for k in cpu])
    for i, k in enumerate(cpu):
        t = tensors[k]
        block.view(i, tuple(t.shape), t.dtype).copy_(t.detach())
        out[k] = ("shm", block.path, block.offsets[i], tuple(t.shape), t.dtype)
    return out, block.unlink


def alloc_targets(
    metas: Mapping[StateKey, tuple[tuple[int, ...], Any]], device: str = "cpu"
) -> tuple[dict[StateKey, Any], dict[StateKey, Any], Callable[[], None]]:
    """Fresh buffers for a load, exported for the sidecar to fill: (the worker's tensors, the
    exports, cleanup). On the CPU the tensors are views of one shared-memory file."""
    import torch
    from torch.multiprocessing.reductions import reduce_tensor

    keys = sorted(metas)
    if device != "cpu":
        views = {k: torch.empty(metas[k][0], dtype=metas[k][1], device=device) for k in keys}
        cuda: dict[StateKey, Any] = {
            k: ("cuda", reduce_tensor(v), tuple(v.shape), v.dtype) for k, v in views.items()
        }
        return views, cuda, lambda: None
    sizes = [_numel(metas[k][0]) * torch.empty((), dtype=metas[k][1]).element_size() for k in keys]
    block = _ShmBlock(sizes)
    views, exports = {}, {}
    for i, k in enumerate(keys):
        shape, dtype = metas[k]
        views[k] = block.view(i, tuple(shape), dtype)
        exports[k] = ("shm", block.path, block.offsets[i], tuple(shape), dtype)
    return views, exports, block.unlink


class _Mapper:
    """The sidecar's side of the exports of one call: each export becomes a `Deferred` tensor,
    mapped when a copy first needs it (each shared-memory file once). Every export is mapped
    by the end of the call (`finish`), used or not: a CUDA export's producer keeps its memory
    until the mapping is made and dropped. The mapper holds no mapping it made: each goes as
    soon as the StateManager and the copies are done with it. `hold`: a mapping of the same
    memory made earlier, kept until this one is made (which then reuses it)."""

    def __init__(self) -> None:
        self._files: dict[str, Any] = {}
        self._pending: dict[int, Deferred] = {}  # not mapped yet
        self.map_s = 0.0

    def __call__(self, export: Any, hold: Any = None) -> Deferred:
        import torch

        if not isinstance(export, tuple) or not export:
            raise StateError(f"a malformed export: {type(export).__name__}")
        kind = export[0]
        if kind == "cuda" and len(export) == 4:
            _, (rebuild, args), shape, dtype = export
            make = lambda: rebuild(*args)  # noqa: E731
        elif kind == "shm" and len(export) == 5:
            _, path, offset, shape, dtype = export
            make = lambda: self._shm(path, offset, shape, dtype)  # noqa: E731
        else:
            raise StateError(f"unknown export kind {kind!r} ({len(export)} fields)")
        if not isinstance(dtype, torch.dtype) or not all(isinstance(d, int) for d in shape):
            raise StateError(f"a malformed {kind} export: shape {shape!r}, dtype {dtype!r}")

        held = [hold]

        def timed() -> Any:
            t0 = time.perf_counter()
            try:
                return make()
            finally:
                self._pending.pop(id(d), None)
                held.clear()
                self.map_s += time.perf_counter() - t0

        d = Deferred(tuple(shape), dtype, timed)
        self._pending[id(d)] = d
        return d

    def _shm(self, path: str, offset: int, shape: tuple[int, ...], dtype: Any) -> Any:
        import torch

        buf = self._files.get(path)
        if buf is None:
            if not os.path.basename(path).startswith("loom-state-"):
                raise StateError(f"{path} is not a state export")
            size = os.path.getsize(path)
            buf = torch.from_file(path, shared=True, size=size, dtype=torch.uint8)
            self._files[path] = buf
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)  # mapped on both sides: nothing is left if a worker dies
        n = _numel(shape) * torch.empty((), dtype=dtype).element_size()
        return buf[offset : offset + n].view(dtype).view(shape)

    def finish(self) -> None:
        """Map every export not mapped yet (what nothing holds goes again at once); the first
        failure is raised after the rest."""
        error: BaseException | None = None
        while self._pending:
            _, d = self._pending.popitem()
            try:
                d.resolve()
            except Exception as exc:
                error = error or exc
        if error is not None:
            raise error

    def forget(self) -> None:
        """Let go of this call's shared-memory files (mappings the StateManager holds stay)."""
        self._pending.clear()
        self._files.clear()


# ---- the daemon ------------------------------------------------------------------------------


@dataclass
class _Gather:
    world: int
    items: dict[int, dict[str, Any]] = field(default_factory=dict)
    done: asyncio.Future[dict[int, Any]] | None = None
    full: asyncio.Event = field(default_factory=asyncio.Event)


class _Server:
    def __init__(self, sm: StateManager, token: bytes, cfg: SidecarConfig, address: str) -> None:
        self.sm, self.token, self.cfg, self.address = sm, token, cfg, address
        self._plane = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="loom-state")
        self._gathers: dict[tuple[str, str], _Gather] = {}
        self._stop = asyncio.Event()
        self.tcp_address: str | None = None
        # per data-plane call: seconds mapping exports, moving, letting mappings go, in all
        self.timings: dict[str, dict[str, float]] = {}

    # ---- connections ----------------------------------------------------------------------
    async def accept(self, listener: socket.socket) -> None:
        """Take connections on `listener`, each served by a thread of its own (the framing is
        blocking); the calls they carry run on this loop."""
        loop = asyncio.get_running_loop()
        while True:
            sock, _ = await loop.sock_accept(listener)
            conn = _connection(sock, _HANDSHAKE_S)
            threading.Thread(
                target=self._serve, args=(conn, loop), name="loom-state-conn", daemon=True
            ).start()

    def _serve(self, conn: Connection, loop: asyncio.AbstractEventLoop) -> None:
        with conn:
            try:
                # the sidecar challenges first, then answers the peer's challenge
                deliver_challenge(conn, self.token)
                answer_challenge(conn, self.token)
            except (AuthenticationError, AssertionError, OSError, EOFError):
                return  # not ours: nothing more of it is read, nothing it sent is unpickled
            with socket.socket(fileno=os.dup(conn.fileno())) as sock:
                _set_timeouts(sock, None)  # a rank waits in a collective as long as it takes
            while True:
                try:
                    frame = conn.recv_bytes()
                except (EOFError, OSError):
                    return
                try:
                    reply = asyncio.run_coroutine_threadsafe(self._answer(frame), loop).result()
                    conn.send_bytes(reply)
                except (concurrent.futures.CancelledError, RuntimeError, OSError):
                    return  # the sidecar is shutting down, or the peer went

    async def _answer(self, frame: bytes) -> bytes:
        req = pickle.loads(frame)
        try:
            reply = {"result": await self.dispatch(req)}
        except Exception as exc:  # every refusal goes back to the caller, with its kind
            reply = {"error": str(exc), "kind": type(exc).__name__}
        return pickle.dumps(reply, protocol=5)

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._plane, fn, *args)

    async def dispatch(self, req: dict[str, Any]) -> Any:
        op = str(req.get("op"))
        handler = _HANDLERS.get(op)
        if handler is None:
            raise StateError(f"unknown call {op!r}; the sidecar answers {sorted(_HANDLERS)}")
        return await handler(self, req)

    # ---- the calls: one handler each (the table `_HANDLERS` names them) -------------------
    async def _on_hello(self, req: dict[str, Any]) -> Any:
        return {"pid": os.getpid(), "tcp": self.tcp_address}

    async def _on_collective(self, req: dict[str, Any]) -> Any:
        return await self._collective(req["op"], req)

    async def _on_plan(self, req: dict[str, Any]) -> Any:
        return await self._run(self.sm.set_plan, list(req["upcoming"]))

    async def _on_use(self, req: dict[str, Any]) -> Any:
        return await self._run(self.sm.use, req["dep"], float(req["now"]))

    async def _on_prefetch(self, req: dict[str, Any]) -> Any:
        return await self._run(self.sm.prefetch, req["dep"])

    async def _on_drop(self, req: dict[str, Any]) -> Any:
        self._abandon(req["dep"], "it was dropped")
        return await self._run(self.sm.drop, req["dep"])

    async def _on_abandon(self, req: dict[str, Any]) -> Any:
        return self._abandon(req["dep"], "its ranks were stopped")

    async def _on_keys(self, req: dict[str, Any]) -> Any:
        return await self._run(self.sm.keys_of, req["dep"], int(req["rank"]))

    async def _on_stats(self, req: dict[str, Any]) -> Any:
        return await self._run(self._stats)

    async def _on_checkpoint(self, req: dict[str, Any]) -> Any:
        return await self._run(self._checkpoint, req["dep"], Path(req["path"]))

    async def _on_materialize(self, req: dict[str, Any]) -> Any:
        return await self._run(
            self.sm.materialize, req["model"], req["kind"], req["params"], req["tp"], req["rank"]
        )

    async def _on_mirror(self, req: dict[str, Any]) -> Any:
        return await self._mirror(req["dep"], req["to"], req["token"])

    async def _on_adopt(self, req: dict[str, Any]) -> Any:
        return await self._run(
            self.sm.adopt, req["dep"], req["ranks"], req["keys"], req["tensors"], req["meta"]
        )

    async def _on_shutdown(self, req: dict[str, Any]) -> Any:
        # NOTE: stop a moment later, so that this answer reaches its caller first
        asyncio.get_running_loop().call_later(0.1, self._stop.set)
        return True

    async def _collective(self, op: str, req: dict[str, Any]) -> Any:
        """Wait for every rank of the deployment on this node, run the move once, answer each."""
        key = (op, str(req["dep"]))
        rank, world = int(req["rank"]), int(req["world"])
        g = self._gathers.get(key)
        if g is None:
            g = self._gathers[key] = _Gather(world, done=asyncio.get_running_loop().create_future())
        if g.world != world:
            raise StateError(f"{key[1]} {op}: rank {rank} says {world} ranks, others {g.world}")
        if rank in g.items or not 0 <= rank < world:
            raise StateError(f"{key[1]} {op}: rank {rank} twice, or not in 0..{world - 1}")
        g.items[rank] = req
        assert g.done is not None
        if len(g.items) == world:
            del self._gathers[key]
            g.full.set()
            try:
                g.done.set_result(await self._run(getattr(self, f"_{op}"), g.items))
            except Exception as exc:
                g.done.set_exception(exc)
        else:
            # NOTE: only the gathering is timed: once every rank is in, the move runs to its
            # end and every rank gets its outcome (a slow copy must not split the ranks)
            try:
                await asyncio.wait_for(g.full.wait(), self.cfg.collective_timeout_s)
            except TimeoutError:
                if self._gathers.get(key) is g:
                    del self._gathers[key]  # a late rank starts a gather of its own
                missing = sorted(set(range(world)) - set(g.items))
                raise StateError(f"{key[1]} {op}: ranks {missing} never came") from None
        replies = await g.done
        return replies[rank]

    def _abandon(self, dep: str, why: str) -> int:
        """End the deployment's gathers still waiting for ranks (its ranks are gone: a new
        group's ranks of the same name start gathers of their own); returns how many."""
        gone = [k for k in self._gathers if k[1] == dep]
        for key in gone:
            g = self._gathers.pop(key)
            assert g.done is not None
            if not g.done.done():
                g.done.set_exception(StateError(f"{dep} {key[0]}: {why}"))
            g.full.set()
        return len(gone)

    # ---- data plane (on the one data-plane thread) -----------------------------------------
    @contextlib.contextmanager
    def _mapping(self, op: str) -> Any:
        """A call's exports, each mapped by the end of the call; its timings counted."""
        mapper = _Mapper()
        t0 = time.perf_counter()
        try:
            yield mapper
            mapper.finish()
        except BaseException:
            with contextlib.suppress(Exception):
                mapper.finish()  # (its producers wait for these mappings) the first error wins
            raise
        finally:
            t1 = time.perf_counter()
            mapper.forget()
            t2 = time.perf_counter()
            row = self.timings.setdefault(op, {})
            for name, v in (
                ("calls", 1.0),
                ("map_s", mapper.map_s),
                ("release_s", t2 - t1),
                ("total_s", t2 - t0),
            ):
                row[name] = row.get(name, 0.0) + v

    def _bind_all(self, items: dict[int, dict[str, Any]], mapper: _Mapper) -> None:
        for rank in sorted(items):
            req = items[rank]
            dep = req["dep"]
            # what the rank holds: a worker re-exports the memory it was loaded into, and
            # mapping that while the old mapping lives reuses it
            held: dict[StateKey, Any] = {}
            with contextlib.suppress(ConfigError, NotResident, KeyError):
                held = self.sm.tensors(dep, rank)
            views = {k: mapper(e, hold=held.get(k)) for k, e in req["exports"].items()}
            del held
            self.sm.bind(dep, rank, int(req["gpu"]), views)
        meta = items[min(items)].get("meta")
        if meta:
            self.sm.meta(items[min(items)]["dep"]).update(meta)

    def _bind(self, items: dict[int, dict[str, Any]]) -> dict[int, Any]:
        with self._mapping("bind") as mapper:
            self._bind_all(items, mapper)
        return {r: True for r in items}

    def _offload(self, items: dict[int, dict[str, Any]]) -> dict[int, Any]:
        with self._mapping("offload") as mapper:
            self._bind_all(items, mapper)
            first = items[min(items)]
            self.sm.use(first["dep"], time.monotonic())  # LRU, where no plan says otherwise
            written = self.sm.offload(first["dep"], Tier(first.get("tier", "host")))
            self._sync()
        return {r: {"bytes": written if r == min(items) else 0} for r in items}

    def _load(self, items: dict[int, dict[str, Any]]) -> dict[int, Any]:
        dep = items[min(items)]["dep"]
        if self.sm.is_loaded(dep):
            raise StateError(f"{dep} is loaded here already: its ranks and the sidecar disagree")
        with self._mapping("load") as mapper:
            try:
                for rank in sorted(items):
                    targets = {k: mapper(e) for k, e in items[rank]["exports"].items()}
                    self.sm.expect(dep, rank, targets)
                self.sm.use(dep, time.monotonic())
                read = self.sm.load(dep)
            finally:
                for dev in self.sm.devices:
                    dev.clear_expected()
            self._sync()
        meta = dict(self.sm.meta(dep))
        return {r: {"bytes": read if r == min(items) else 0, "meta": meta} for r in items}

    @staticmethod
    def _sync() -> None:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()  # a returned call means the copy is done

    def _stats(self) -> dict[str, Any]:
        st = self.sm.stats()
        return {
            "bytes_by_tier": st.bytes_by_tier,
            "unique_logical_bytes": st.unique_logical_bytes,
            "moved_bytes": st.moved_bytes,
            "capacity": {
                "device": [d.capacity for d in self.sm.devices],
                "host": self.sm.host.capacity,
                "disk": self.sm.disk.capacity,
            },
            "pinned_host": self.sm.host.pinned,
            "direct_io": self.sm.disk.direct_io,
            "copy": asdict(self.sm.copier.counters),
            "timings": {op: dict(row) for op, row in self.timings.items()},
            "plan": self.sm.plan,
            "deployments": self.sm.deployments(),
        }

    def _checkpoint(self, dep: str, path: Path) -> dict[str, Any]:
        meta = dict(self.sm.meta(dep))
        names = self.sm.checkpoint(dep, path, meta=meta)
        return {
            "path": str(path),
            "tensors": len(names),
            "bytes": path.stat().st_size,
            "meta": meta,
        }

    async def _mirror(self, dep: str, to: str, token: str) -> int:
        """Send a deployment's offloaded state to another node's sidecar. Only the read runs
        on the data plane (a copy, so that later moves here cannot touch what is sent); the
        send runs beside it, so two sidecars mirroring to each other do not wait on each other."""
        if to in (self.address, self.tcp_address):
            raise StateError("a deployment is mirrored to another node's sidecar, not its own")

        def read() -> dict[str, Any]:
            ranks, keys, meta = self.sm.owners(dep)
            tensors = {k: t.clone() for k, t in self.sm.offloaded(dep).items()}
            return {"ranks": ranks, "keys": keys, "meta": meta, "tensors": tensors}

        payload = await self._run(read)

        def send() -> int:
            timeout = self.cfg.collective_timeout_s
            with StateClient(to, bytes.fromhex(token), timeout_s=timeout) as peer:
                return int(peer.call("adopt", dep=dep, **payload))

        return await asyncio.get_running_loop().run_in_executor(None, send)


def _device_memory(cfg: SidecarConfig) -> int:
    import torch

    if cfg.device != "cpu" and torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(0).total_memory)
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def serve(address: str, cfg: SidecarConfig, token: bytes) -> None:
    """Run a sidecar until it is told to shut down (the body of `python -m loom.state.sidecar`)."""
    disk = Path(cfg.disk_dir) if cfg.disk_dir else Path(tempfile.mkdtemp(prefix="loom-state-"))
    sm = StateManager(
        gpus=cfg.gpus,
        device_bytes=cfg.device_bytes if cfg.device_bytes is not None else _device_memory(cfg),
        host_bytes=cfg.host_bytes,
        disk_bytes=cfg.disk_bytes,
        disk_dir=disk,
        device=cfg.device,
        pin_host=cfg.pin_host,
        external_device=True,
        copy_chunk_bytes=cfg.copy_chunk_bytes,
        copy_streams=cfg.copy_streams,
    )
    server = _Server(sm, token, cfg, address)

    async def main() -> None:
        unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        unix.bind(address)
        os.chmod(address, 0o600)
        listeners = [unix]
        if cfg.tcp_host:
            tcp = socket.create_server((cfg.tcp_host, 0))
            host, port = tcp.getsockname()[:2]
            server.tcp_address = f"tcp://{host}:{port}"
            listeners.append(tcp)
        for listener in listeners:
            listener.listen(64)
            listener.setblocking(False)
        accepting = [asyncio.create_task(server.accept(s)) for s in listeners]
        loop = asyncio.get_running_loop()
        parent = os.getppid()

        def orphan() -> None:  # its starter died without closing it: go too, cleaning up
            orphaned.set()
            loop.call_soon_threadsafe(server._stop.set)

        async def reparented() -> None:  # started by hand, not tied: watch the parent's pid
            while os.getppid() == parent:
                await asyncio.sleep(1.0)
            orphan()

        watch = None if watch_parent(orphan) else asyncio.create_task(reparented())
        await server._stop.wait()
        if watch is not None:
            watch.cancel()
        for task in accepting:
            task.cancel()
        for listener in listeners:
            listener.close()

    orphaned = threading.Event()
    try:
        asyncio.run(main())
    finally:
        server._plane.shutdown(wait=True)
        if not cfg.disk_dir:
            shutil.rmtree(disk, ignore_errors=True)
        home = os.path.dirname(address)
        if orphaned.is_set() and os.path.basename(home).startswith("loom-sidecar-"):
            shutil.rmtree(home, ignore_errors=True)  # the socket's directory, its starter's


_HANDLERS: dict[str, Callable[[_Server, dict[str, Any]], Awaitable[Any]]] = {
    "hello": _Server._on_hello,
    "offload": _Server._on_collective,
    "load": _Server._on_collective,
    "bind": _Server._on_collective,
    "plan": _Server._on_plan,
    "use": _Server._on_use,
    "prefetch": _Server._on_prefetch,
    "drop": _Server._on_drop,
    "abandon": _Server._on_abandon,
    "keys": _Server._on_keys,
    "stats": _Server._on_stats,
    "checkpoint": _Server._on_checkpoint,
    "materialize": _Server._on_materialize,
    "mirror": _Server._on_mirror,
    "adopt": _Server._on_adopt,
    "shutdown": _Server._on_shutdown,
}
# errors that cross the socket as themselves (anything else arrives as a StateError)
_WIRE_ERRORS: dict[str, type[Exception]] = {
    cls.__name__: cls for cls in (StateError, NotResident, TierFull, ConfigError, KeyError)
}


# ---- the client ------------------------------------------------------------------------------


class StateClient:
    """A blocking connection to a sidecar (one per worker rank or scheduler): a call returns
    once the sidecar has done it. `address` is a socket path, or tcp://host:port."""

    def __init__(self, address: str, token: bytes, timeout_s: float | None = None) -> None:
        self.address, self.timeout_s = address, timeout_s
        if address.startswith("tcp://"):
            host, port = address[len("tcp://") :].rsplit(":", 1)
            sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        else:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(timeout_s)
                sock.connect(address)
            except OSError:
                sock.close()
                raise
        self._conn = _connection(sock, timeout_s if timeout_s is not None else _HANDSHAKE_S)
        self._lock = threading.Lock()
        try:
            self._authenticate(token)
        except (OSError, EOFError, StateError):
            self._conn.close()
            raise
        if timeout_s is None:
            with socket.socket(fileno=os.dup(self._conn.fileno())) as dup:
                _set_timeouts(dup, None)

    def _authenticate(self, token: bytes) -> None:
        """Answer the sidecar's challenge, then challenge it (`multiprocessing.connection`)."""
        try:
            answer_challenge(self._conn, token)
        except AssertionError:  # (3.11 asserts that the first message is a challenge)
            raise StateError(f"{self.address} is not a Loom sidecar (no challenge)") from None
        except AuthenticationError as exc:
            if "rejected" in str(exc):
                raise StateError(f"the sidecar at {self.address} refused the token") from None
            raise StateError(f"{self.address} is not a Loom sidecar ({exc})") from None
        except EOFError:
            raise StateError(f"the sidecar at {self.address} refused the token") from None
        try:
            deliver_challenge(self._conn, token)
        except (AuthenticationError, EOFError):
            raise StateError(
                f"the sidecar at {self.address} did not prove it knows the token"
            ) from None

    def call(self, op: str, **kw: Any) -> Any:
        with self._lock:
            try:
                self._conn.send_bytes(pickle.dumps({"op": op, **kw}, protocol=5))
                reply = pickle.loads(self._conn.recv_bytes())
            except BlockingIOError:  # the descriptor's timeout (SO_RCVTIMEO) ran out
                raise TimeoutError(
                    f"the sidecar at {self.address} did not answer {op} in {self.timeout_s} s"
                ) from None
            except EOFError:
                raise StateError("the sidecar closed the connection") from None
        if "error" in reply:
            kind = str(reply.get("kind", "StateError"))
            raise _remote_error(kind, f"sidecar {op}: {kind}: {reply['error']}")
        return reply["result"]

    # the worker's side of the data plane
    def offload(
        self,
        dep: str,
        rank: int,
        world: int,
        gpu: int,
        tensors: Mapping[StateKey, Any],
        tier: str = "host",
        meta: Mapping[str, Any] | None = None,
    ) -> int:
        """Hand rank `rank`'s tensors to the sidecar (collective over the `world` ranks on
        this node); returns the bytes it wrote (on the first rank; 0 on the others)."""
        reply = self._export("offload", dep, rank, world, gpu, tensors, meta, tier=tier)
        return int(reply["bytes"])

    def bind(
        self,
        dep: str,
        rank: int,
        world: int,
        gpu: int,
        tensors: Mapping[StateKey, Any],
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        """Show the sidecar rank `rank`'s tensors as they are now (before it materialises a
        checkpoint or shards from them), without offloading them."""
        self._export("bind", dep, rank, world, gpu, tensors, meta)

    def _export(
        self,
        op: str,
        dep: str,
        rank: int,
        world: int,
        gpu: int,
        tensors: Mapping[StateKey, Any],
        meta: Mapping[str, Any] | None,
        **kw: Any,
    ) -> Any:
        exports, cleanup = export_tensors(tensors)
        try:
            return self.call(
                op, dep=dep, rank=rank, world=world, gpu=gpu, exports=exports,
                meta=dict(meta or {}), **kw,
            )  # fmt: skip
        finally:
            cleanup()

    def load(self, dep: str, rank: int, world: int, device: str = "cpu") -> Loaded:
        """Rank `rank`'s state, in fresh buffers the sidecar filled."""
        metas = self.call("keys", dep=dep, rank=rank)
        views, exports, cleanup = alloc_targets(metas, device)
        try:
            reply = self.call("load", dep=dep, rank=rank, world=world, exports=exports)
        finally:
            cleanup()
        return Loaded(views, int(reply["bytes"]), dict(reply["meta"]))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._conn.close()

    def __enter__(self) -> StateClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class StateSidecar:
    """Start and stop a node's sidecar process (`python -m loom.state.sidecar`)."""

    def __init__(self, config: SidecarConfig | None = None) -> None:
        self.config = config or SidecarConfig()
        self.token = secrets.token_bytes(16)
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
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(Exception), self.client(timeout_s=5) as c:
                c.call("shutdown")
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(5)
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> StateSidecar:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def main(argv: list[str]) -> None:
    address, spec = argv[0], json.loads(argv[1])
    token = bytes.fromhex(os.environ.pop(TOKEN_ENV))
    serve(address, SidecarConfig(**spec), token)


if __name__ == "__main__":
    main(sys.argv[1:])
