"""The messages between a worker-process group and its ranks: versioned msgspec structs, sent
as msgpack bytes (`Connection.send_bytes`), never pickles.

The conversation: a rank connects and says `Hello`; once it has built its model it answers
`Ready` (or a `Failure`, and ends). The group then sends `Request`s, one at a time; every rank
answers each with a `Result` or a `Failure`. `Exit` ends a rank.

Every message carries `version`, and a side refuses a message of any other version than its
own `VERSION`: both ends run the same Loom, so a change to any message's fields bumps it.
What does not decode to the message expected at that point of the conversation (garbage,
another version, another kind of message, an unknown operation) raises `BadMessage`.
Payloads and results are JSON-like (dicts, lists, strings, numbers, None): a tensor or an
array is converted by whoever puts it in one (`tolist()`), never sent as itself.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from loom.runtime.cluster.models.ref import ModelInfo
from loom.runtime.cluster.payloads import FAULT_OP
from loom.runtime.cluster.wpg.errors import BadMessage, FailureKind

__all__ = [
    "AUTHKEY_ENV",
    "OPS",
    "VERSION",
    "Exit",
    "Failure",
    "Hello",
    "Message",
    "Ready",
    "Reply",
    "Request",
    "Result",
    "Started",
    "ToRank",
    "decode_hello",
    "decode_reply",
    "decode_started",
    "decode_to_rank",
    "encode",
]

VERSION = 1
AUTHKEY_ENV = "LOOM_WPG_AUTHKEY"  # a rank's key to its group's listener (hex), in its environment

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


class Message(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    """What every message carries: the version of the conversation it belongs to."""

    version: int = VERSION


class Hello(Message, frozen=True, tag="hello"):
    """A rank's first words, as soon as it is connected: which rank it is."""

    rank: int


class Ready(Message, frozen=True, tag="ready"):
    """A rank has joined its group and built its model."""

    info: ModelInfo


class Request(Message, frozen=True, tag="request"):
    """Run `op` on `payload` (every rank gets the same request)."""

    op: str
    payload: dict[str, Any] = {}

    def __post_init__(self) -> None:
        # (a ValueError here is a `msgspec.ValidationError` when it is decoded)
        if self.op not in OPS:
            raise ValueError(f"unknown operation {self.op!r}; known: {', '.join(OPS)}")


class Result(Message, frozen=True, tag="result"):
    """What an operation returned on one rank."""

    result: dict[str, Any]


class Failure(Message, frozen=True, tag="failure"):
    """An operation (or a rank's start) failed: how, the exception's class name and its
    message (a start that crashed: the traceback)."""

    kind: FailureKind
    error: str
    message: str

    @classmethod
    def of(cls, exc: BaseException, kind: FailureKind, message: str | None = None) -> Failure:
        text = str(exc) if message is None else message
        return cls(kind=kind, error=type(exc).__name__, message=text)

    def text(self) -> str:
        """`Error: message`, as the exception would print."""
        return f"{self.error}: {self.message}"


class Exit(Message, frozen=True, tag="exit"):
    """The rank's last message: it closes its model and ends."""


ToRank = Request | Exit  # what a rank is sent
Started = Ready | Failure  # a rank's answer to its start
Reply = Result | Failure  # a rank's answer to a request

_encoder = msgspec.msgpack.Encoder()


class _Head(msgspec.Struct):
    """The two fields read before the rest: which message, of which version."""

    type: str
    version: int


_head = msgspec.msgpack.Decoder(_Head)
_to_rank = msgspec.msgpack.Decoder(ToRank)
_hello = msgspec.msgpack.Decoder(Hello)
_started = msgspec.msgpack.Decoder(Started)
_reply = msgspec.msgpack.Decoder(Reply)

T = TypeVar("T")


def encode(msg: Message) -> bytes:
    """A message's bytes; `TypeError` if it holds what is not JSON-like (a tensor, an array)."""
    try:
        return _encoder.encode(msg)
    except (msgspec.EncodeError, TypeError, OverflowError) as exc:  # (2**64: an overflow)
        raise TypeError(f"cannot encode a {type(msg).__name__}: {exc}") from None


def _shown(data: bytes) -> str:
    return repr(data[:48]) + (f" (+{len(data) - 48} bytes)" if len(data) > 48 else "")


def _decode(data: bytes, decoder: msgspec.msgpack.Decoder[T], expected: str) -> T:
    try:
        head = _head.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise BadMessage(f"a malformed message ({exc}): {_shown(data)}", data[:48]) from None
    if head.version != VERSION:
        raise BadMessage(
            f"a {head.type!r} message of version {head.version} (this side speaks version "
            f"{VERSION}): {_shown(data)}",
            data[:48],
        )
    try:
        return decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise BadMessage(f"not {expected}: {exc} ({_shown(data)})", data[:48]) from None


def decode_to_rank(data: bytes) -> Request | Exit:
    """What a rank was sent (`BadMessage` if it is no request or exit of this version)."""
    return _decode(data, _to_rank, "a request or an exit")


def decode_hello(data: bytes) -> Hello:
    """A rank's hello, as it connects."""
    return _decode(data, _hello, "a hello")


def decode_started(data: bytes) -> Ready | Failure:
    """A rank's answer to its start."""
    return _decode(data, _started, "a ready or a failure")


def decode_reply(data: bytes) -> Result | Failure:
    """A rank's answer to a request."""
    return _decode(data, _reply, "a result or a failure")
