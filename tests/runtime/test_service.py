"""What every FastAPI service shares (`loom.runtime.service`): the address it announces takes
connections at once."""

from __future__ import annotations

import socket

from loom.runtime.service import bind


def test_an_announced_address_takes_connections_before_the_server_runs() -> None:
    """A service announces its URL once `bind` returns, before uvicorn has started up: a
    client told the URL must be able to connect then (it waits in the backlog), not be
    refused by a bound socket that does not listen yet."""
    sock, host, port = bind("127.0.0.1", 0)
    with sock, socket.create_connection((host, port), timeout=5) as client:
        accepted, _ = sock.accept()
        accepted.close()
        assert client.getpeername() == (host, port)
