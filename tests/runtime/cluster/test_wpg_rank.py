"""A rank's side of the conversation: a message it cannot decode (garbage, another version, an
unknown operation) is answered with a typed failure and the rank goes on serving; an operation
that raises is answered with what it raised, a bad payload as refused; an exit or the group's
end closing ends it. First against a stand-in worker, then a real rank process."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from multiprocessing import Pipe
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import msgspec
import pytest

from loom.core.errors import ConfigError
from loom.runtime.cluster.wpg import WorkerGroup, WorkerGroupConfig
from loom.runtime.cluster.wpg.errors import FailureKind
from loom.runtime.cluster.wpg.messages import (
    VERSION,
    Exit,
    Failure,
    Request,
    Result,
    decode_reply,
    encode,
)
from loom.runtime.cluster.wpg.rank import serve
from loom.state.errors import TierFull

BAD: list[tuple[str, bytes, str]] = [
    ("garbage", b"\xc1 no message", "malformed message"),
    ("a pickle", b"\x80\x04\x95\x05\x00\x00\x00\x00\x00\x00\x00(op)", "malformed message"),
    (
        "another version",
        msgspec.msgpack.encode(
            {"type": "request", "version": VERSION + 1, "op": "forward", "payload": {}}
        ),
        f"version {VERSION + 1}",
    ),
    (
        "unknown op",
        msgspec.msgpack.encode(
            {"type": "request", "version": VERSION, "op": "format_disk", "payload": {}}
        ),
        "unknown operation 'format_disk'",
    ),
    ("no request", encode(Result(result={})), "not a request or an exit"),
]


class StandIn:
    """A rank's worker that echoes `forward`, refuses `generate`, returns what cannot be
    sent for `sync_weights`, has no room to `offload` and raises on anything else."""

    rank = 0

    def run(self, op: str, payload: dict[str, Any]) -> dict[str, Any]:
        if op == "forward":
            return {"echo": payload}
        if op == "generate":
            raise ConfigError("token id 500 is outside the model's vocabulary")
        if op == "sync_weights":
            return {"digest": object()}
        if op == "offload":
            raise TierFull("host", need=1 << 20, free=0)
        raise RuntimeError(f"{op} failed")


def ask(conn: Connection, data: bytes) -> Result | Failure:
    conn.send_bytes(data)
    assert conn.poll(10), "the rank did not answer"
    return decode_reply(conn.recv_bytes())


@pytest.fixture
def served() -> Iterator[tuple[Connection, threading.Thread]]:
    group_end, rank_end = Pipe()
    t = threading.Thread(target=serve, args=(rank_end, StandIn()), daemon=True)
    t.start()
    yield group_end, t
    group_end.close()
    t.join(10)


def test_a_bad_message_is_answered_with_a_typed_failure_and_serving_goes_on(
    served: tuple[Connection, threading.Thread],
) -> None:
    conn, t = served
    for _, data, says in BAD:
        reply = ask(conn, data)
        assert isinstance(reply, Failure) and reply.kind is FailureKind.BAD_MESSAGE
        assert reply.error == "BadMessage" and says in reply.message
    reply = ask(conn, encode(Request(op="forward", payload={"ids": [[1, 2]]})))
    assert reply == Result(result={"echo": {"ids": [[1, 2]]}})
    assert t.is_alive()


def test_what_an_operation_raised_is_answered_with_its_kind(
    served: tuple[Connection, threading.Thread],
) -> None:
    conn, _ = served
    assert ask(conn, encode(Request(op="optim_step"))) == Failure(
        kind=FailureKind.RAISED, error="RuntimeError", message="optim_step failed"
    )
    refused = ask(conn, encode(Request(op="generate")))
    assert isinstance(refused, Failure) and refused.kind is FailureKind.REFUSED
    assert refused.text() == "ConfigError: token id 500 is outside the model's vocabulary"
    unsendable = ask(conn, encode(Request(op="sync_weights")))
    assert isinstance(unsendable, Failure) and unsendable.kind is FailureKind.RAISED
    assert "the result of sync_weights cannot be sent" in unsendable.message
    no_room = ask(conn, encode(Request(op="offload", payload={"tier": "host"})))
    assert isinstance(no_room, Failure) and no_room.kind is FailureKind.NO_ROOM
    assert no_room.error == "TierFull"


def test_an_exit_or_the_groups_end_closing_ends_the_rank(
    served: tuple[Connection, threading.Thread],
) -> None:
    conn, t = served
    conn.send_bytes(encode(Exit()))
    t.join(10)
    assert not t.is_alive()
    group_end, rank_end = Pipe()
    t = threading.Thread(target=serve, args=(rank_end, StandIn()), daemon=True)
    t.start()
    group_end.close()
    t.join(10)
    assert not t.is_alive()


@pytest.mark.torch
@pytest.mark.slow
def test_a_real_rank_answers_bad_messages_with_typed_failures_then_runs_an_operation(
    tmp_path: Path,
) -> None:
    pytest.importorskip("torch")
    cfg = WorkerGroupConfig(name="bad-messages", dp=1, state_dir=tmp_path)
    with WorkerGroup(cfg) as g:
        (conn,) = g._conns
        for _, data, says in BAD:
            reply = ask(conn, data)
            assert isinstance(reply, Failure) and reply.kind is FailureKind.BAD_MESSAGE
            assert says in reply.message
        assert g.death() is None  # the rank is still there, serving
        logprobs = g.run("forward", {"ids": [[1, 5, 9], [4, 4, 8]]})["logprobs"]
        assert len(logprobs) == 2 and all(len(row) == 2 for row in logprobs)
        assert g.run("optim_step")["step"] == 1
