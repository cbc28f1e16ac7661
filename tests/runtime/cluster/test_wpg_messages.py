"""The messages between a worker-process group and its ranks: every message comes back as it
was sent, and whatever is not the message expected there — garbage, a malformed or truncated
message, another version, another kind of message, an unknown operation — is a `BadMessage`
saying so, never a crash or a silently wrong value."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from loom.runtime.cluster.models.ref import ModelInfo
from loom.runtime.cluster.wpg.errors import BadMessage, FailureKind
from loom.runtime.cluster.wpg.messages import (
    OPS,
    VERSION,
    Exit,
    Failure,
    Hello,
    Message,
    Ready,
    Request,
    Result,
    decode_hello,
    decode_reply,
    decode_started,
    decode_to_rank,
    encode,
)

INFO = ModelInfo(kind="tiny", vocab=128, params=10, bytes=40, tp_split=None)
PAYLOAD: dict[str, Any] = {
    "ids": [[1, 5, 9], [4, 4, 8]],
    "advantages": [1.0, -0.5],
    "mask": None,
    "loss": "ppo",
    "relay": {"url": "http://relay", "dense_every": 0},
}

Decoder = Callable[[bytes], Message]

# every message, with the decoder of the point in the conversation where it is sent
MESSAGES: list[tuple[Message, Decoder]] = [
    (Hello(rank=3), decode_hello),
    (Ready(info=INFO), decode_started),
    (Failure(kind=FailureKind.REFUSED, error="ConfigError", message="no model"), decode_started),
    *((Request(op=op, payload=PAYLOAD), decode_to_rank) for op in OPS),
    (Request(op="optim_step"), decode_to_rank),
    (Exit(), decode_to_rank),
    (Result(result={"logprobs": [[-1.5, -2.25]], "ratio": None, "x": float("inf")}), decode_reply),
    *(
        (Failure(kind=kind, error="RuntimeError", message="injected fault"), decode_reply)
        for kind in FailureKind
    ),
]


@pytest.mark.parametrize(("msg", "decode"), MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_comes_back_as_it_was_sent(msg: Message, decode: Decoder) -> None:
    assert decode(encode(msg)) == msg


def test_a_failure_reads_as_the_exception_would_print() -> None:
    failure = Failure.of(RuntimeError("injected fault on rank 1"), FailureKind.RAISED)
    assert failure.text() == "RuntimeError: injected fault on rank 1"


def raw(**fields: Any) -> bytes:
    """A message as another program might write it (the fields given, nothing checked)."""
    return msgspec.msgpack.encode(fields)


BAD: list[tuple[str, bytes, Decoder, str]] = [
    ("unknown op", raw(type="request", version=VERSION, op="rm -rf", payload={}),
     decode_to_rank, r"not a request or an exit: unknown operation 'rm -rf'"),
    ("newer version", raw(type="request", version=VERSION + 1, op="forward", payload={}),
     decode_to_rank, rf"'request' message of version {VERSION + 1} .*speaks version {VERSION}"),
    ("older version", raw(type="result", version=0, result={}), decode_reply, r"version 0"),
    ("no version", raw(type="request", op="forward", payload={}), decode_to_rank,
     r"malformed message .*`version`"),
    ("garbage", b"\xc1\x00garbage", decode_to_rank, r"malformed message"),
    ("truncated", encode(Request(op="forward", payload=PAYLOAD))[:-7], decode_to_rank,
     r"malformed message"),
    ("empty", b"", decode_reply, r"malformed message"),
    ("not a map", msgspec.msgpack.encode([1, 2, 3]), decode_reply, r"malformed message"),
    ("a pickle", b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00", decode_to_rank,
     r"malformed message"),
    ("payload not a map", raw(type="request", version=VERSION, op="forward", payload=[1]),
     decode_to_rank, r"Expected `object`, got `array` - at `\$.payload`"),
    ("unknown kind", raw(type="shutdown", version=VERSION), decode_to_rank,
     r"Invalid value 'shutdown'"),
    ("a reply sent to a rank", encode(Result(result={})), decode_to_rank,
     r"not a request or an exit"),
    ("a request sent back", encode(Request(op="forward")), decode_reply,
     r"not a result or a failure"),
    ("a failure of no kind", raw(type="failure", version=VERSION, kind="meh", error="E",
     message="m"), decode_reply, r"Invalid enum value 'meh'"),
    ("a hello with no rank", raw(type="hello", version=VERSION), decode_hello,
     r"missing required field `rank`"),
    ("a ready without its model", raw(type="ready", version=VERSION, info={"vocab": 3}),
     decode_started, r"not a ready or a failure"),
]  # fmt: skip


@pytest.mark.parametrize(("data", "decode", "says"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_what_is_not_the_expected_message_is_a_bad_message(
    data: bytes, decode: Decoder, says: str
) -> None:
    with pytest.raises(BadMessage, match=says) as err:
        decode(data)
    assert err.value.data == data[:48]  # (what it was, to name in a log)


def test_a_request_for_an_unknown_operation_cannot_be_made() -> None:
    with pytest.raises(ValueError, match="unknown operation 'nope'"):
        Request(op="nope")


def test_a_payload_that_is_not_json_like_is_refused_when_encoded() -> None:
    """A tensor or an array goes as a list (`tolist()`), never as itself."""
    with pytest.raises(TypeError, match="cannot encode a Result"):
        encode(Result(result={"logprobs": object()}))
