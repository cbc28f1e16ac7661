"""The sidecar's wire: typed, versioned messages (msgspec structs in msgpack, one per call and
per answer) framed by `multiprocessing.connection`, after a handshake in which each side proves
it knows the sidecar's token (HMAC over the other's nonce) without sending it.

Version rule: every message carries `v`; a peer answers only messages of its own `VERSION` and
refuses any other with `BadMessage`. Bump `VERSION` whenever a message changes.
"""

from __future__ import annotations

import hmac
import os
import socket
import struct
from multiprocessing.connection import Connection
from typing import Any, TypeVar, overload

import msgspec

from loom.state.errors import BadMessage, StateError, Unauthenticated, error_class, error_code
from loom.state.manager import StateKey
from loom.state.weights.params import ParamSpec

__all__ = [
    "HANDSHAKE_S",
    "TOKEN_ENV",
    "VERBS",
    "VERSION",
    "Abandon",
    "Adopt",
    "Bind",
    "Blob",
    "Challenge",
    "Checkpoint",
    "CudaExport",
    "Drop",
    "Export",
    "Failure",
    "Hello",
    "KeyShapes",
    "Keys",
    "Load",
    "Materialize",
    "Mirror",
    "Offload",
    "Plan",
    "Prefetch",
    "Proof",
    "Reply",
    "Request",
    "Result",
    "Shards",
    "ShmExport",
    "Shutdown",
    "Stats",
    "Use",
    "accept_peer",
    "connection",
    "decode",
    "encode",
    "failure",
    "join_sidecar",
    "raise_failure",
    "set_timeouts",
]

VERSION = 1
TOKEN_ENV = "LOOM_STATE_TOKEN"
HANDSHAKE_S = 10.0  # a peer has this long to prove itself
_HANDSHAKE_MAX = 4096  # bytes: a handshake message longer than this is not one
_NONCE = 32


class _Part(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A piece of a message (no version of its own)."""


class Message(_Part, tag=str.lower, kw_only=True):
    """What one side sends the other in one frame; `type` (its class, lower case) names it."""

    v: int = VERSION


# ---- the handshake ----------------------------------------------------------------------------


class Challenge(Message):
    """The sidecar's first message: prove you know the token by a MAC over `nonce`."""

    nonce: bytes


class Proof(Message):
    """A MAC over the other side's nonce; the peer's carries its own `nonce` for the sidecar."""

    mac: bytes
    nonce: bytes = b""


# ---- the memory a call carries ---------------------------------------------------------------


class ShmExport(_Part, tag="shm"):
    """A CPU tensor in a shared-memory file, at `offset`."""

    key: StateKey
    path: str
    offset: int
    shape: tuple[int, ...]
    dtype: str


class CudaExport(_Part, tag="cuda"):
    """A CUDA tensor as its CUDA IPC handle (the fields of torch's `rebuild_cuda_tensor`)."""

    key: StateKey
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: str
    device: int
    handle: bytes
    size_bytes: int
    offset_bytes: int
    ref_handle: bytes
    ref_offset: int
    event_handle: bytes | None
    event_sync: bool


Export = ShmExport | CudaExport


class Blob(_Part):
    """A tensor's bytes inline (to another node, where no memory is shared)."""

    shape: tuple[int, ...]
    dtype: str
    data: bytearray


# ---- the calls -----------------------------------------------------------------------------


class Request(Message):
    """A call on the sidecar."""


class Hello(Request):
    """Its pid and TCP address (a started sidecar answers)."""


class Offload(Request):
    """Rank `rank` of `world` hands its tensors to the sidecar (collective over the ranks)."""

    dep: str
    rank: int
    world: int
    gpu: int
    exports: list[Export]
    meta: dict[str, Any] = {}
    tier: str = "host"


class Bind(Request):
    """Rank `rank` shows its tensors as they are now, without offloading them (collective)."""

    dep: str
    rank: int
    world: int
    gpu: int
    exports: list[Export]
    meta: dict[str, Any] = {}


class Load(Request):
    """Rank `rank` asks for its state in the buffers it exports (collective)."""

    dep: str
    rank: int
    world: int
    exports: list[Export]


class Plan(Request):
    """The scheduler's upcoming deployments, soonest first (eviction reads it)."""

    upcoming: list[str]


class Use(Request):
    dep: str
    now: float


class Prefetch(Request):
    dep: str


class Drop(Request):
    dep: str


class Abandon(Request):
    """End the deployment's collective calls still waiting for ranks."""

    dep: str


class Keys(Request):
    """Rank `rank`'s keys with their shapes and dtypes (what a load fills)."""

    dep: str
    rank: int


class Stats(Request):
    pass


class Checkpoint(Request):
    dep: str
    path: str


class Materialize(Request):
    """Rank `rank`'s shards of a tensor-parallel layout of degree `tp`."""

    model: str
    kind: str
    params: list[ParamSpec]
    tp: int
    rank: int


class Mirror(Request):
    """Send a deployment's offloaded state to the sidecar at `to` (its token in hex)."""

    dep: str
    to: str
    token: str


class Adopt(Request):
    """Take in a deployment migrated from another node's sidecar, offloaded."""

    dep: str
    ranks: dict[int, int]
    keys: dict[int, list[StateKey]]
    meta: dict[str, Any]
    tensors: list[tuple[StateKey, Blob]]


class Shutdown(Request):
    pass


# ---- the answers -----------------------------------------------------------------------------


class Reply(Message):
    """The sidecar's answer to one call."""


class Result(Reply):
    """A call's result, in msgpack's own types."""

    value: Any = None


class KeyShapes(Reply):
    """The answer to `Keys`: each key's shape and dtype."""

    entries: list[tuple[StateKey, tuple[int, ...], str]]


class Shards(Reply):
    """The answer to `Materialize`: the shards and the bytes read for them."""

    tensors: dict[str, Blob]
    fetched: int


class Failure(Reply):
    """A refusal: the error's `code` (its class in `loom.state.errors`) and message."""

    code: str
    message: str


_ANY = (
    Challenge | Proof | Hello | Offload | Bind | Load | Plan | Use | Prefetch | Drop | Abandon
    | Keys | Stats | Checkpoint | Materialize | Mirror | Adopt | Shutdown
    | Result | KeyShapes | Shards | Failure
)  # fmt: skip
VERBS: dict[str, type[Request]] = {
    cls.__struct_config__.tag: cls  # type: ignore[misc]
    for cls in (
        Hello,
        Offload,
        Bind,
        Load,
        Plan,
        Use,
        Prefetch,
        Drop,
        Abandon,
        Keys,
        Stats,
        Checkpoint,
        Materialize,
        Mirror,
        Adopt,
        Shutdown,
    )
}


class _Header(msgspec.Struct):
    v: int


_encoder = msgspec.msgpack.Encoder()
_header = msgspec.msgpack.Decoder(_Header)
_decoder = msgspec.msgpack.Decoder(_ANY)  # type: ignore[var-annotated]
M = TypeVar("M", bound=Message)


def encode(msg: Message) -> bytes:
    return _encoder.encode(msg)


@overload
def decode(frame: bytes, expect: type[M]) -> M: ...
@overload
def decode(frame: bytes, expect: Any) -> Any: ...
def decode(frame: bytes, expect: Any) -> Any:
    """The message in `frame`, of the kind `expect` (a class or a union of classes);
    `BadMessage` for garbage, another version, an unknown or malformed message."""
    try:
        v = _header.decode(frame).v
    except msgspec.MsgspecError:
        raise BadMessage(f"not a sidecar message ({len(frame)} bytes)") from None
    if v != VERSION:
        raise BadMessage(f"wire version {v}; this side speaks version {VERSION}")
    try:
        msg = _decoder.decode(frame)
    except msgspec.MsgspecError as exc:
        raise BadMessage(f"a malformed message: {exc}; calls are {sorted(VERBS)}") from None
    if not isinstance(msg, expect):
        raise BadMessage(f"a {type(msg).__name__} where a {_names(expect)} was due")
    return msg


def _names(kind: Any) -> str:
    return getattr(kind, "__name__", None) or " or ".join(t.__name__ for t in kind.__args__)


def failure(exc: BaseException) -> Failure:
    """`exc` as the sidecar answers it: its code in the state's error family, its message."""
    return Failure(code=error_code(exc), message=str(exc) or type(exc).__name__)


def raise_failure(f: Failure, context: str) -> StateError:
    """The error a client raises for `f`: the class its code names."""
    return error_class(f.code).from_wire(f"{context}: {f.message}")


# ---- the connection ------------------------------------------------------------------------


def set_timeouts(sock: socket.socket, seconds: float | None) -> None:
    """Reads and writes on `sock`'s descriptor give up after `seconds` (None: never), also
    once it is a `Connection` (whose reads are os.read on the blocking descriptor)."""
    whole = int(seconds or 0)
    tv = struct.pack("ll", whole, int(((seconds or 0) - whole) * 1e6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)


def connection(sock: socket.socket, timeout_s: float | None) -> Connection:
    sock.setblocking(True)
    set_timeouts(sock, timeout_s)
    return Connection(sock.detach())


def _mac(token: bytes, side: bytes, nonce: bytes) -> bytes:
    # NOTE: each side MACs under its own label, so one side's proof is never the other's
    return hmac.new(token, side + nonce, "sha256").digest()


def accept_peer(conn: Connection, token: bytes) -> bool:
    """The sidecar's side of the handshake: challenge the peer, then prove itself to a peer
    that proved it knows the token. False: a stranger (refused, nothing more of it read)."""
    nonce = os.urandom(_NONCE)
    conn.send_bytes(encode(Challenge(nonce=nonce)))
    try:
        proof = decode(conn.recv_bytes(_HANDSHAKE_MAX), Proof)
    except BadMessage as exc:
        conn.send_bytes(encode(failure(exc)))
        return False
    if len(proof.nonce) < 16 or not hmac.compare_digest(proof.mac, _mac(token, b"peer", nonce)):
        conn.send_bytes(encode(failure(Unauthenticated("the token was refused"))))
        return False
    conn.send_bytes(encode(Proof(mac=_mac(token, b"sidecar", proof.nonce))))
    return True


def join_sidecar(conn: Connection, token: bytes, address: str) -> None:
    """The peer's side of the handshake; `Unauthenticated` unless both proofs hold."""
    try:
        challenge = decode(conn.recv_bytes(_HANDSHAKE_MAX), Challenge)
    except (BadMessage, OSError) as exc:
        raise Unauthenticated(f"{address} is not a Loom sidecar (no challenge: {exc})") from None
    nonce = os.urandom(_NONCE)
    conn.send_bytes(encode(Proof(mac=_mac(token, b"peer", challenge.nonce), nonce=nonce)))
    try:
        answer: Proof | Failure | None = decode(conn.recv_bytes(_HANDSHAKE_MAX), Proof | Failure)
    except (BadMessage, OSError, EOFError):
        answer = None
    if isinstance(answer, Failure):
        raise Unauthenticated(f"the sidecar at {address} refused the token")
    if answer is None or not hmac.compare_digest(answer.mac, _mac(token, b"sidecar", nonce)):
        raise Unauthenticated(f"the sidecar at {address} did not prove it knows the token")
