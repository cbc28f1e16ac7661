"""The sidecar's server: one `StateManager` served over a socket, each typed call answered by
its handler; copies and every call on the StateManager run on one data-plane thread, in
arrival order, and the event loop only gathers the ranks of a collective call."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from loom.core.errors import ConfigError
from loom.proc.lifeline import watch_parent
from loom.state.errors import BadMessage, InvalidCall, NotResident, StateError
from loom.state.manager import StateKey, StateManager
from loom.state.sidecar.config import SidecarConfig
from loom.state.sidecar.shm import Mapper, blob, dtype_name, sweep_orphans, unblob, unlink_exports
from loom.state.sidecar.wire import (
    HANDSHAKE_S,
    Abandon,
    Adopt,
    Bind,
    Checkpoint,
    Drop,
    Failure,
    Hello,
    Keys,
    KeyShapes,
    Load,
    Materialize,
    Mirror,
    Offload,
    Plan,
    Prefetch,
    Reply,
    Request,
    Result,
    Shards,
    Shutdown,
    Stats,
    Use,
    accept_peer,
    connection,
    decode,
    encode,
    failure,
    set_timeouts,
)
from loom.state.tiers import Tier

__all__ = ["serve"]

Collective = Offload | Bind | Load


@dataclass
class _Gather:
    world: int
    items: dict[int, Any] = field(default_factory=dict)  # rank -> its Offload, Bind or Load
    done: asyncio.Future[dict[int, Any]] | None = None
    full: asyncio.Event = field(default_factory=asyncio.Event)

    def unlink_unmapped(self) -> None:
        """The gather ends unserved: its ranks' shared-memory exports are never mapped, and a
        rank that died waiting cannot remove its own."""
        for req in self.items.values():
            unlink_exports(req.exports)


class Server:
    def __init__(self, sm: StateManager, token: bytes, cfg: SidecarConfig, address: str) -> None:
        self.sm, self.token, self.cfg, self.address = sm, token, cfg, address
        self._plane = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="loom-state")
        self._gathers: dict[tuple[str, str], _Gather] = {}
        self.stop = asyncio.Event()
        self.tcp_address: str | None = None
        # per data-plane call: seconds mapping exports, moving, letting mappings go, in all
        self.timings: dict[str, dict[str, float]] = {}
        self._handlers: dict[type[Request], Callable[[Any], Awaitable[Reply]]] = {
            Hello: self._on_hello,
            Offload: self._collective,
            Bind: self._collective,
            Load: self._collective,
            Plan: self._on_plan,
            Use: self._on_use,
            Prefetch: self._on_prefetch,
            Drop: self._on_drop,
            Abandon: self._on_abandon,
            Keys: self._on_keys,
            Stats: self._on_stats,
            Checkpoint: self._on_checkpoint,
            Materialize: self._on_materialize,
            Mirror: self._on_mirror,
            Adopt: self._on_adopt,
            Shutdown: self._on_shutdown,
        }

    # ---- connections ----------------------------------------------------------------------
    async def accept(self, listener: socket.socket) -> None:
        """Take connections on `listener`, each served by a thread of its own (the framing is
        blocking); the calls they carry run on this loop."""
        loop = asyncio.get_running_loop()
        while True:
            sock, _ = await loop.sock_accept(listener)
            conn = connection(sock, HANDSHAKE_S)
            threading.Thread(
                target=self._serve, args=(conn, loop), name="loom-state-conn", daemon=True
            ).start()

    def _serve(self, conn: Connection, loop: asyncio.AbstractEventLoop) -> None:
        with conn:
            try:
                if not accept_peer(conn, self.token):
                    return  # not ours: nothing more of it is read
            except (OSError, EOFError):
                return
            with socket.socket(fileno=os.dup(conn.fileno())) as sock:
                set_timeouts(sock, None)  # a rank waits in a collective as long as it takes
            while True:
                try:
                    frame = conn.recv_bytes()
                except (EOFError, OSError):
                    return
                try:
                    reply = asyncio.run_coroutine_threadsafe(self.answer(frame), loop).result()
                    conn.send_bytes(reply)
                except (concurrent.futures.CancelledError, RuntimeError, OSError):
                    return  # the sidecar is shutting down, or the peer went

    async def answer(self, frame: bytes) -> bytes:
        """The encoded answer to one frame: its call's reply, or the refusal, typed."""
        try:
            req: Request = decode(frame, Request)
            reply = await self._handlers[type(req)](req)
        except Exception as exc:  # every refusal goes back to the caller, with its kind
            reply = failure(exc)
        try:
            return encode(reply)
        except (TypeError, ValueError) as exc:
            return encode(Failure(code=StateError.code, message=f"an unsendable result: {exc}"))

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._plane, fn, *args)

    # ---- the calls: one handler each --------------------------------------------------------
    async def _on_hello(self, req: Hello) -> Reply:
        return Result(value={"pid": os.getpid(), "tcp": self.tcp_address})

    async def _on_plan(self, req: Plan) -> Reply:
        return Result(value=await self._run(self.sm.set_plan, req.upcoming))

    async def _on_use(self, req: Use) -> Reply:
        return Result(value=await self._run(self.sm.use, req.dep, req.now))

    async def _on_prefetch(self, req: Prefetch) -> Reply:
        return Result(value=await self._run(self.sm.prefetch, req.dep))

    async def _on_drop(self, req: Drop) -> Reply:
        self._abandon(req.dep, "it was dropped")
        return Result(value=await self._run(self.sm.drop, req.dep))

    async def _on_abandon(self, req: Abandon) -> Reply:
        return Result(value=self._abandon(req.dep, "its ranks were stopped"))

    async def _on_keys(self, req: Keys) -> Reply:
        keys = await self._run(self.sm.keys_of, req.dep, req.rank)
        entries = [(k, tuple(shape), dtype_name(dtype)) for k, (shape, dtype) in keys.items()]
        return KeyShapes(entries=entries)

    async def _on_stats(self, req: Stats) -> Reply:
        waiting = {f"{op} {dep}": sorted(g.items) for (op, dep), g in self._gathers.items()}
        return Result(value=await self._run(self._stats) | {"waiting": waiting})

    async def _on_checkpoint(self, req: Checkpoint) -> Reply:
        return Result(value=await self._run(self._checkpoint, req.dep, Path(req.path)))

    async def _on_materialize(self, req: Materialize) -> Reply:
        shards, fetched = await self._run(
            self.sm.materialize, req.model, req.kind, req.params, req.tp, req.rank
        )
        return Shards(tensors={n: blob(t) for n, t in shards.items()}, fetched=int(fetched))

    async def _on_mirror(self, req: Mirror) -> Reply:
        return Result(value=await self._mirror(req.dep, req.to, req.token))

    async def _on_adopt(self, req: Adopt) -> Reply:
        tensors = {k: unblob(b) for k, b in req.tensors}
        stored = await self._run(self.sm.adopt, req.dep, req.ranks, req.keys, tensors, req.meta)
        return Result(value=stored)

    async def _on_shutdown(self, req: Shutdown) -> Reply:
        # NOTE: stop a moment later, so that this answer reaches its caller first
        asyncio.get_running_loop().call_later(0.1, self.stop.set)
        return Result(value=True)

    async def _collective(self, req: Collective) -> Reply:
        """Wait for every rank of the deployment on this node, run the move once, answer each."""
        op = type(req).__name__.lower()
        key = (op, req.dep)
        rank, world = req.rank, req.world
        g = self._gathers.get(key)
        if g is None:
            g = self._gathers[key] = _Gather(world, done=asyncio.get_running_loop().create_future())
        if g.world != world:
            raise InvalidCall(f"{req.dep} {op}: rank {rank} says {world} ranks, others {g.world}")
        if rank in g.items or not 0 <= rank < world:
            raise InvalidCall(f"{req.dep} {op}: rank {rank} twice, or not in 0..{world - 1}")
        g.items[rank] = req
        assert g.done is not None
        if len(g.items) == world:
            del self._gathers[key]
            g.full.set()
            moves: dict[type, Callable[[Any], dict[int, Any]]] = {
                Offload: self._offload,
                Bind: self._bind,
                Load: self._load,
            }
            move = moves[type(req)]
            try:
                g.done.set_result(await self._run(move, g.items))
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
                    g.unlink_unmapped()
                missing = sorted(set(range(world)) - set(g.items))
                raise StateError(f"{req.dep} {op}: ranks {missing} never came") from None
        replies = await g.done
        return Result(value=replies[rank])

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
            g.unlink_unmapped()
        return len(gone)

    # ---- data plane (on the one data-plane thread) -----------------------------------------
    @contextlib.contextmanager
    def _mapping(self, op: str) -> Iterator[Mapper]:
        """A call's exports, each mapped by the end of the call; its timings counted."""
        mapper = Mapper()
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

    def _bind_all(self, items: dict[int, Offload | Bind], mapper: Mapper) -> None:
        for rank in sorted(items):
            req = items[rank]
            # what the rank holds: a worker re-exports the memory it was loaded into, and
            # mapping that while the old mapping lives reuses it
            held: dict[StateKey, Any] = {}
            with contextlib.suppress(ConfigError, NotResident, KeyError):
                held = self.sm.tensors(req.dep, rank)
            views = {e.key: mapper(e, hold=held.get(e.key)) for e in req.exports}
            del held
            self.sm.bind(req.dep, rank, req.gpu, views)
        first = items[min(items)]
        if first.meta:
            self.sm.meta(first.dep).update(first.meta)

    def _bind(self, items: dict[int, Bind]) -> dict[int, Any]:
        with self._mapping("bind") as mapper:
            self._bind_all(dict(items), mapper)
        return {r: True for r in items}

    def _offload(self, items: dict[int, Offload]) -> dict[int, Any]:
        with self._mapping("offload") as mapper:
            self._bind_all(dict(items), mapper)
            first = items[min(items)]
            self.sm.use(first.dep, time.monotonic())  # LRU, where no plan says otherwise
            try:
                tier = Tier(first.tier)
            except ValueError:
                raise BadMessage(f"no tier {first.tier!r}") from None
            written = self.sm.offload(first.dep, tier)
            self._sync()
        return {r: {"bytes": written if r == min(items) else 0} for r in items}

    def _load(self, items: dict[int, Load]) -> dict[int, Any]:
        dep = items[min(items)].dep
        if self.sm.is_loaded(dep):
            raise InvalidCall(f"{dep} is loaded here already: its ranks and the sidecar disagree")
        with self._mapping("load") as mapper:
            try:
                for rank in sorted(items):
                    targets = {e.key: mapper(e) for e in items[rank].exports}
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
        from loom.state.sidecar.client import StateClient

        if to in (self.address, self.tcp_address):
            raise InvalidCall("a deployment is mirrored to another node's sidecar, not its own")

        def read() -> Adopt:
            ranks, keys, meta = self.sm.owners(dep)
            tensors = [(k, blob(t.clone())) for k, t in self.sm.offloaded(dep).items()]
            return Adopt(dep=dep, ranks=ranks, keys=keys, meta=meta, tensors=tensors)

        adopt = await self._run(read)

        def send() -> int:
            timeout = self.cfg.collective_timeout_s
            with StateClient(to, bytes.fromhex(token), timeout_s=timeout) as peer:
                return int(peer.request(adopt))

        return await asyncio.get_running_loop().run_in_executor(None, send)


def _device_memory(cfg: SidecarConfig) -> int:
    import torch

    if cfg.device != "cpu" and torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(0).total_memory)
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def serve(address: str, cfg: SidecarConfig, token: bytes) -> None:
    """Run a sidecar until it is told to shut down (the body of `python -m loom.state.sidecar`)."""
    sweep_orphans()  # exports of workers killed before a sidecar mapped them
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
    server = Server(sm, token, cfg, address)
    orphaned = threading.Event()
    try:
        asyncio.run(_main(server, address, cfg, orphaned))
    finally:
        server._plane.shutdown(wait=True)
        if not cfg.disk_dir:
            shutil.rmtree(disk, ignore_errors=True)
        home = os.path.dirname(address)
        if orphaned.is_set() and os.path.basename(home).startswith("loom-sidecar-"):
            shutil.rmtree(home, ignore_errors=True)  # the socket's directory, its starter's
        sweep_orphans()


async def _main(
    server: Server, address: str, cfg: SidecarConfig, orphaned: threading.Event
) -> None:
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
        loop.call_soon_threadsafe(server.stop.set)

    async def reparented() -> None:  # started by hand, not tied: watch the parent's pid
        while os.getppid() == parent:
            await asyncio.sleep(1.0)
        orphan()

    watch = None if watch_parent(orphan) else asyncio.create_task(reparented())
    await server.stop.wait()
    for g in server._gathers.values():  # calls never served: their ranks may be gone too
        g.unlink_unmapped()
    if watch is not None:
        watch.cancel()
    for task in accepting:
        task.cancel()
    for listener in listeners:
        listener.close()
