"""The sidecar's wire, without a socket: every message survives encoding as itself; garbage,
another version, an unknown call or a malformed one is refused as `BadMessage`; a refusal's code
names its error class at the other end; the handshake admits only a peer with the token."""

from __future__ import annotations

import threading
from multiprocessing.connection import Pipe
from typing import Any

import msgspec
import pytest

from loom.core.errors import (
    Conflict,
    InvalidRequest,
    NotFound,
    StorageFull,
    Unauthorized,
    http_status,
)
from loom.state.errors import (
    BadMessage,
    InvalidCall,
    NotResident,
    StateError,
    TierFull,
    Unauthenticated,
    UnknownDeployment,
)
from loom.state.manager import StateKey
from loom.state.sidecar import wire
from loom.state.weights.params import ParamSpec, ShardRule

KEY = StateKey("m", "weights", "w0", ((0, 4), (0, 2)))
SHM = wire.ShmExport(
    key=KEY, path="/dev/shm/loom-state-1-ab", offset=64, shape=(4, 2), dtype="bfloat16"
)
CUDA = wire.CudaExport(
    key=KEY, shape=(4, 2), stride=(2, 1), offset=0, dtype="float32", device=0, handle=b"h" * 64,
    size_bytes=4096, offset_bytes=512, ref_handle=b"r" * 16, ref_offset=3, event_handle=None,
    event_sync=True,
)  # fmt: skip
BLOB = wire.Blob(shape=(2,), dtype="float32", data=bytearray(b"\x00\x00\x80?\x00\x00\x00@"))

EVERY_MESSAGE: list[wire.Message] = [
    wire.Challenge(nonce=b"n" * 32),
    wire.Proof(mac=b"m" * 32, nonce=b"n" * 32),
    wire.Hello(),
    wire.Offload(
        dep="a", rank=1, world=2, gpu=1, exports=[SHM, CUDA], meta={"step": 3}, tier="disk"
    ),
    wire.Bind(dep="a", rank=0, world=1, gpu=0, exports=[CUDA], meta={}),
    wire.Load(dep="a", rank=0, world=1, exports=[SHM]),
    wire.Plan(upcoming=["b", "a"]),
    wire.Use(dep="a", now=12.5),
    wire.Prefetch(dep="a"),
    wire.Drop(dep="a"),
    wire.Abandon(dep="a"),
    wire.Keys(dep="a", rank=1),
    wire.Stats(),
    wire.Checkpoint(dep="a", path="/tmp/ck.pt"),
    wire.Materialize(
        model="m",
        kind="weights",
        tp=2,
        rank=1,
        params=[ParamSpec(name="w0", shape=(4, 2), rule=ShardRule.COLUMN, layer=0)],
    ),
    wire.Mirror(dep="a", to="tcp://10.0.0.2:4000", token="ab" * 16),
    wire.Adopt(
        dep="a",
        ranks={0: 0, 1: 1},
        keys={0: [KEY], 1: [KEY]},
        meta={"step": 3},
        tensors=[(KEY, BLOB)],
    ),
    wire.Shutdown(),
    wire.Result(value={"bytes": 7, "meta": {"step": 3}, "plan": ["a"]}),
    wire.KeyShapes(entries=[(KEY, (4, 2), "bfloat16")]),
    wire.Shards(tensors={"w0": BLOB}, fetched=8),
    wire.Failure(code="tier_full", message="host tier: 8 bytes asked, 0 free"),
]


def test_every_message_type_is_covered_and_round_trips_as_itself() -> None:
    sent = {type(m) for m in EVERY_MESSAGE}
    assert set(wire.VERBS.values()) <= sent  # every call
    assert {wire.Result, wire.KeyShapes, wire.Shards, wire.Failure} <= sent  # every answer
    for msg in EVERY_MESSAGE:
        assert wire.decode(wire.encode(msg), wire.Message) == msg


def raw(**fields: Any) -> bytes:
    return msgspec.msgpack.encode(fields)


@pytest.mark.parametrize(
    ("frame", "why"),
    [
        (b"\x93\x01\x02", "not a sidecar message"),  # msgpack, but an array
        (b"\xc1garbage", "not a sidecar message"),  # not msgpack at all
        (b"cos\nsystem\n(S'touch /tmp/pwned'\ntR.", "not a sidecar message"),  # a pickle
        (raw(type="stats"), "not a sidecar message"),  # no version
        (raw(type="stats", v=wire.VERSION + 1), f"version {wire.VERSION + 1}"),
        (raw(type="transmogrify", v=wire.VERSION), "transmogrify"),
        (raw(type="drop", v=wire.VERSION), "missing required field `dep`"),
        (raw(type="keys", v=wire.VERSION, dep="a", rank="one"), "Expected `int`"),
        (raw(type="stats", v=wire.VERSION, extra=1), "unknown field `extra`"),
    ],
)
def test_what_is_not_a_message_of_this_version_is_refused_as_bad(frame: bytes, why: str) -> None:
    with pytest.raises(BadMessage, match=why) as err:
        wire.decode(frame, wire.Request)
    assert isinstance(err.value, StateError) and http_status(err.value) == 400


def test_an_answer_where_a_call_is_due_is_refused() -> None:
    with pytest.raises(BadMessage, match="a Result where a Request was due"):
        wire.decode(wire.encode(wire.Result(value=1)), wire.Request)


@pytest.mark.parametrize(
    ("exc", "cls", "kind"),
    [
        (TierFull("host", 8, 0), TierFull, StorageFull),
        (UnknownDeployment("unknown deployment 'x'"), UnknownDeployment, NotFound),
        (NotResident("x is offloaded"), NotResident, Conflict),
        (BadMessage("garbage"), BadMessage, InvalidRequest),
        (InvalidCall("rank 3 twice"), InvalidCall, InvalidCall),
        (Unauthenticated("no"), Unauthenticated, Unauthorized),
        (KeyError("rank 5"), UnknownDeployment, NotFound),
        (RuntimeError("disk on fire"), StateError, StateError),
    ],
)
def test_a_refusal_arrives_as_its_class(exc: Exception, cls: type, kind: type) -> None:
    failure = wire.decode(wire.encode(wire.failure(exc)), wire.Failure)
    got = wire.raise_failure(failure, "sidecar stats")
    assert type(got) is cls and isinstance(got, kind) and isinstance(got, StateError)
    assert str(exc).strip("'") in str(got)


def handshake(server_token: bytes, peer_token: bytes) -> tuple[bool, BaseException | None]:
    sidecar_end, peer_end = Pipe()
    admitted: list[bool] = []
    t = threading.Thread(
        target=lambda: admitted.append(wire.accept_peer(sidecar_end, server_token))
    )
    t.start()
    error = None
    try:
        wire.join_sidecar(peer_end, peer_token, "here")
    except StateError as exc:
        error = exc
    t.join(10)
    return admitted[0], error


def test_the_handshake_admits_the_token_and_refuses_another() -> None:
    assert handshake(b"t" * 16, b"t" * 16) == (True, None)
    admitted, error = handshake(b"t" * 16, b"u" * 16)
    assert not admitted
    assert isinstance(error, Unauthenticated) and "refused the token" in str(error)
