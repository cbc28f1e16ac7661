"""The group's side of the conversation, against a scripted rank at the other end of a pipe:
each operation goes out as a typed `Request`, a rank's `Failure` fails the operation with what
the rank said, and an answer that is no answer — garbage, another version — breaks the group,
naming it (its ranks' state is unknown)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from multiprocessing import Pipe
from multiprocessing.connection import Connection

import msgspec
import pytest

from loom.runtime.cluster.models.ref import ModelInfo
from loom.runtime.cluster.wpg import GroupBroken, RankFailed, WorkerGroup, WorkerGroupConfig
from loom.runtime.cluster.wpg.errors import FailureKind
from loom.runtime.cluster.wpg.messages import (
    VERSION,
    Exit,
    Failure,
    Request,
    Result,
    decode_to_rank,
    encode,
)

INFO = ModelInfo(kind="tiny", vocab=128, params=1, bytes=4, tp_split=None)
IDS = {"ids": [[1, 2, 3]]}


def scripted(dp: int) -> tuple[WorkerGroup, list[Connection], list[subprocess.Popen[bytes]]]:
    """A started group whose ranks are the test (their ends of the pipes) and whose
    processes are sleepers (alive, so nothing is taken for a death)."""
    g = WorkerGroup(WorkerGroupConfig(name="scripted", dp=dp, peer_grace_s=0.1))
    ends = [Pipe() for _ in range(dp)]
    procs = [subprocess.Popen(["sleep", "60"]) for _ in range(dp)]
    g._conns, g._procs, g.info = [e[0] for e in ends], list(procs), INFO
    return g, [e[1] for e in ends], procs


@pytest.fixture
def one() -> Iterator[tuple[WorkerGroup, Connection]]:
    g, (rank,), _ = scripted(1)
    yield g, rank
    g.kill()
    g.close()


def test_an_operation_goes_out_as_a_typed_request_and_its_result_comes_back(
    one: tuple[WorkerGroup, Connection],
) -> None:
    g, rank = one
    rank.send_bytes(encode(Result(result={"logprobs": [[-1.0, -2.0]]})))
    assert g.run("forward", IDS, timeout_s=10) == {"logprobs": [[-1.0, -2.0]]}
    assert decode_to_rank(rank.recv_bytes()) == Request(op="forward", payload=IDS)
    for p in g._procs:  # (the sleepers would not end on an exit)
        p.kill()
    g.close()
    assert decode_to_rank(rank.recv_bytes()) == Exit()  # its ranks are told to end


def test_a_ranks_failure_fails_the_operation_with_what_the_rank_said() -> None:
    g, ranks, _ = scripted(2)
    try:
        failure = Failure(kind=FailureKind.RAISED, error="RuntimeError", message="injected")
        ranks[0].send_bytes(encode(failure))  # rank 1 says nothing yet
        with pytest.raises(RankFailed, match=r"rank 0: RuntimeError: injected \(ranks \[1\]") as e:
            g.run("forward", IDS, timeout_s=10)
        assert e.value.pending == {1}
        assert (e.value.error, e.value.kind) == ("RuntimeError", FailureKind.RAISED)
        ranks[1].send_bytes(encode(Result(result={})))  # its late answer lets the group settle
        assert g.settle(5)
    finally:
        g.kill()
        g.close()


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        (b"\x00\xffnot msgpack at all", r"rank 0 answered forward with a malformed message"),
        (
            msgspec.msgpack.encode({"type": "result", "version": VERSION + 1, "result": {}}),
            rf"rank 0 answered forward with a 'result' message of version {VERSION + 1}",
        ),
        (encode(Request(op="load")), r"rank 0 answered forward with not a result or a failure"),
    ],
    ids=["garbage", "another version", "no answer"],
)
def test_an_answer_that_is_no_answer_breaks_the_group_naming_it(
    one: tuple[WorkerGroup, Connection], answer: bytes, says: str
) -> None:
    g, rank = one
    rank.send_bytes(answer)
    with pytest.raises(GroupBroken, match=says):
        g.run("forward", IDS, timeout_s=10)
