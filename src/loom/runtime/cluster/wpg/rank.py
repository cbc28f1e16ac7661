"""A rank's process: `python -m loom.runtime.cluster.wpg.rank SOCKET RANK PORT SPEC` connects
back to its group, builds its `RankWorker` and answers the group's messages (`messages`) until
it is told to exit or its group's end of the connection closes.

A message the rank cannot decode (garbage, another version, an unknown operation) is answered
with a `Failure` of kind `bad_message`, and the rank goes on serving: it ran nothing."""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback
from multiprocessing.connection import Client, Connection
from typing import Any

from loom.core.errors import ConfigError, StorageFull
from loom.proc.lifeline import watch_parent
from loom.runtime.cluster.wpg.errors import BadMessage, FailureKind
from loom.runtime.cluster.wpg.messages import (
    AUTHKEY_ENV,
    Exit,
    Failure,
    Hello,
    Ready,
    Reply,
    Request,
    Result,
    decode_to_rank,
    encode,
)
from loom.runtime.cluster.wpg.worker import RankWorker
from loom.state.sidecar import TOKEN_ENV

__all__ = ["answer", "main", "serve"]

log = logging.getLogger(__name__)


def answer(worker: RankWorker, request: Request) -> Reply:
    """Run one request on this rank: its result, or what went wrong (a payload the model
    cannot run is `refused`; state its node had no room to hold, `no_room`; anything else it
    raised, `raised`)."""
    try:
        return Result(result=worker.run(request.op, request.payload))
    except ConfigError as exc:
        return Failure.of(exc, FailureKind.REFUSED)
    except StorageFull as exc:
        return Failure.of(exc, FailureKind.NO_ROOM)
    except Exception as exc:
        return Failure.of(exc, FailureKind.RAISED)


def _reply_bytes(reply: Reply, op: str) -> bytes:
    try:
        return encode(reply)
    except TypeError as exc:  # a result that is not JSON-like: say so, not crash
        return encode(
            Failure.of(exc, FailureKind.RAISED, f"the result of {op} cannot be sent: {exc}")
        )


def serve(conn: Connection, worker: RankWorker) -> None:
    """Answer requests until an `Exit` or the end of the connection."""
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):  # the group's end is closed: it is gone
            return
        try:
            msg = decode_to_rank(data)
        except BadMessage as exc:
            log.warning("rank %d: %s", worker.rank, exc)
            conn.send_bytes(encode(Failure.of(exc, FailureKind.BAD_MESSAGE)))
            continue
        if isinstance(msg, Exit):
            return
        conn.send_bytes(_reply_bytes(answer(worker, msg), msg.op))


def _start(spec: dict[str, Any], rank: int, port: int, conn: Connection, token: bytes) -> None:
    conn.send_bytes(encode(Hello(rank=rank)))
    try:
        worker = RankWorker(spec, rank, port, token)
    except ConfigError as exc:  # the model cannot be built as named: the caller's mistake
        conn.send_bytes(encode(Failure.of(exc, FailureKind.REFUSED)))
        return
    except Exception as exc:
        crashed = traceback.format_exc(limit=3)
        conn.send_bytes(encode(Failure.of(exc, FailureKind.RAISED, crashed)))
        return
    conn.send_bytes(encode(Ready(info=worker.info)))
    try:
        serve(conn, worker)
    finally:
        worker.close()


def main(argv: list[str]) -> None:
    """A rank's process: connect back to the group's listener, then serve operations."""
    watch_parent()  # this rank dies with the process that started it, however that dies
    address, rank, port, spec = argv[0], int(argv[1]), int(argv[2]), json.loads(argv[3])
    key = bytes.fromhex(os.environ.pop(AUTHKEY_ENV))
    token = bytes.fromhex(os.environ.pop(TOKEN_ENV))
    conn = Client(address, family="AF_UNIX", authkey=key)
    _start(spec, rank, port, conn, token)


if __name__ == "__main__":
    main(sys.argv[1:])
