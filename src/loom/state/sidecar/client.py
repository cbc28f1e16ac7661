"""A blocking connection to a sidecar: each call is one typed request, answered once the sidecar
has done it; a refusal is raised as the error class the sidecar named."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Mapping
from typing import Any, NamedTuple

from loom.state.errors import BadMessage, StateError
from loom.state.manager import StateKey
from loom.state.sidecar.shm import alloc_targets, export_tensors, to_dtype, unblob
from loom.state.sidecar.wire import (
    HANDSHAKE_S,
    VERBS,
    Bind,
    Failure,
    Keys,
    KeyShapes,
    Load,
    Offload,
    Reply,
    Request,
    Result,
    Shards,
    connection,
    decode,
    encode,
    join_sidecar,
    raise_failure,
    set_timeouts,
)

__all__ = ["Loaded", "StateClient"]


class Loaded(NamedTuple):
    """A rank's state after a load: its tensors (fresh buffers the sidecar filled), the bytes
    the sidecar read, and the owner's notes kept with the state (a training step)."""

    views: dict[StateKey, Any]
    bytes: int
    meta: dict[str, Any]


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
        self._conn = connection(sock, timeout_s if timeout_s is not None else HANDSHAKE_S)
        self._lock = threading.Lock()
        try:
            join_sidecar(self._conn, token, address)
        except (OSError, EOFError, StateError):
            self._conn.close()
            raise
        if timeout_s is None:
            with socket.socket(fileno=os.dup(self._conn.fileno())) as dup:
                set_timeouts(dup, None)

    def request(self, req: Request) -> Any:
        """Send one call, return its result (tensors as tensors, dtypes as torch dtypes)."""
        reply = self._exchange(req)
        if isinstance(reply, Result):
            return reply.value
        if isinstance(reply, KeyShapes):
            return {k: (shape, to_dtype(dtype)) for k, shape, dtype in reply.entries}
        if isinstance(reply, Shards):
            return {n: unblob(b) for n, b in reply.tensors.items()}, reply.fetched
        raise BadMessage(f"the sidecar answered {type(req).__name__} with {type(reply).__name__}")

    def _exchange(self, req: Request) -> Reply:
        verb = type(req).__name__.lower()
        try:
            frame = encode(req)
        except (TypeError, ValueError) as exc:  # a field msgpack cannot carry (in `meta`)
            raise BadMessage(f"{verb} cannot be sent: {exc}") from None
        with self._lock:
            try:
                self._conn.send_bytes(frame)
                answer = self._conn.recv_bytes()
            except BlockingIOError:  # the descriptor's timeout (SO_RCVTIMEO) ran out
                raise TimeoutError(
                    f"the sidecar at {self.address} did not answer {verb} in {self.timeout_s} s"
                ) from None
            except EOFError:
                raise StateError("the sidecar closed the connection") from None
        reply: Reply = decode(answer, Reply)
        if isinstance(reply, Failure):
            raise raise_failure(reply, f"sidecar {verb}")
        return reply

    def call(self, op: str, **kw: Any) -> Any:
        """`request` by the call's name and fields (`call("drop", dep="a")`)."""
        cls = VERBS.get(op)
        if cls is None:
            raise BadMessage(f"unknown call {op!r}; the sidecar answers {sorted(VERBS)}")
        try:
            req = cls(**kw)
        except TypeError as exc:
            raise BadMessage(f"a malformed {op} call: {exc}") from None
        return self.request(req)

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
        exports, cleanup = export_tensors(tensors)
        try:
            reply = self.request(
                Offload(dep=dep, rank=rank, world=world, gpu=gpu, exports=exports,
                        meta=dict(meta or {}), tier=str(tier))
            )  # fmt: skip
        finally:
            cleanup()
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
        exports, cleanup = export_tensors(tensors)
        try:
            self.request(
                Bind(dep=dep, rank=rank, world=world, gpu=gpu, exports=exports,
                     meta=dict(meta or {}))
            )  # fmt: skip
        finally:
            cleanup()

    def load(self, dep: str, rank: int, world: int, device: str = "cpu") -> Loaded:
        """Rank `rank`'s state, in fresh buffers the sidecar filled."""
        metas = self.request(Keys(dep=dep, rank=rank))
        views, exports, cleanup = alloc_targets(metas, device)
        try:
            reply = self.request(Load(dep=dep, rank=rank, world=world, exports=exports))
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
