"""A real sidecar process, met over its socket: a frame that is garbage, a pickle, another
version, an unknown call or a malformed one is refused with `BadMessage` and the sidecar goes on
serving that connection and others; a wrong token is refused as `Unauthenticated`; an error
raised in the server arrives at the client as its own class."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path

import msgspec
import pytest

torch = pytest.importorskip("torch")

from loom.core.errors import ConfigError, NotFound, StorageFull, http_status  # noqa: E402
from loom.state.errors import (  # noqa: E402
    BadMessage,
    InvalidCall,
    StateError,
    TierFull,
    Unauthenticated,
    UnknownDeployment,
)
from loom.state.manager import StateKey  # noqa: E402
from loom.state.sidecar import SidecarConfig, StateClient, StateSidecar, wire  # noqa: E402

pytestmark = [pytest.mark.torch]

KB = 1 << 10


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StateSidecar]:
    disk = tmp_path_factory.mktemp("disk")
    cfg = SidecarConfig(gpus=1, host_bytes=4 * KB, disk_bytes=4 * KB, disk_dir=str(disk))
    with StateSidecar(cfg) as sc:
        yield sc


def authenticated(sc: StateSidecar) -> Connection:
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(sc.address)
    conn = wire.connection(sock, 30)
    wire.join_sidecar(conn, sc.token, sc.address)
    return conn


def stats_over(conn: Connection) -> dict[str, object]:
    conn.send_bytes(wire.encode(wire.Stats()))
    reply = wire.decode(conn.recv_bytes(), wire.Result)
    assert isinstance(reply.value, dict)
    return reply.value


def raw(**fields: object) -> bytes:
    return msgspec.msgpack.encode(fields)


@pytest.mark.parametrize(
    ("frame", "why"),
    [
        (b"\xc1\x00\xff" * 10, "not a sidecar message"),
        (b"cos\nsystem\n(S'touch /tmp/pwned-loom'\ntR.", "not a sidecar message"),
        (raw(type="stats", v=wire.VERSION + 1), f"wire version {wire.VERSION + 1}"),
        (raw(type="transmogrify", v=wire.VERSION), "transmogrify"),
        (raw(type="prefetch", v=wire.VERSION), "missing required field `dep`"),
        (raw(type="keys", v=wire.VERSION, dep="a", rank=[1]), "Expected `int`"),
        (wire.encode(wire.Result(value=1)), "a Result where a Request was due"),
    ],
)
def test_a_bad_frame_is_refused_as_bad_message_and_the_sidecar_serves_on(
    sidecar: StateSidecar, frame: bytes, why: str
) -> None:
    with authenticated(sidecar) as conn:
        conn.send_bytes(frame)
        failure = wire.decode(conn.recv_bytes(), wire.Failure)
        error = wire.raise_failure(failure, "sidecar")
        assert type(error) is BadMessage and why in str(error)
        assert "bytes_by_tier" in stats_over(conn)  # the same connection is still served
    with sidecar.client(timeout_s=30) as c:  # and so are others
        assert "bytes_by_tier" in c.call("stats")
    assert sidecar.alive and not Path("/tmp/pwned-loom").exists()


def test_a_wrong_token_is_refused_and_the_sidecar_serves_on(sidecar: StateSidecar) -> None:
    with pytest.raises(Unauthenticated, match="refused the token") as err:
        StateClient(sidecar.address, b"not the token!!!", timeout_s=10)
    assert http_status(err.value) == 401
    with sidecar.client(timeout_s=30) as c:
        assert "bytes_by_tier" in c.call("stats")


def test_errors_raised_in_the_server_arrive_as_their_classes(sidecar: StateSidecar) -> None:
    big = {StateKey("big", "weights", "w"): torch.ones(4 * KB)}  # 16 KB: no tier has room
    with sidecar.client(timeout_s=30) as c:
        with pytest.raises(TierFull) as full:
            c.offload("big", 0, 1, 0, big)
        assert isinstance(full.value, StorageFull) and http_status(full.value) == 507
        with pytest.raises(UnknownDeployment, match="unknown deployment 'nope'") as missing:
            c.call("prefetch", dep="nope")
        assert isinstance(missing.value, NotFound) and http_status(missing.value) == 404
        with pytest.raises(InvalidCall, match=r"rank 3 twice, or not in 0\.\.1") as invalid:
            c.offload("two", 3, 2, 0, {StateKey("two", "weights", "w"): torch.ones(4)})
        assert isinstance(invalid.value, ConfigError)
        for e in (full.value, missing.value, invalid.value):
            assert isinstance(e, StateError)
        assert "bytes_by_tier" in c.call("stats")  # the refusals left the connection usable
