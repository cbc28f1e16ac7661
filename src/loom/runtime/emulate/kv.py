"""KV moves between emulated engines over HTTP (Heddle §5.3, on engines that behave like GPUs).

The router asks the engine holding a trajectory's KV to send it: `POST /loom/kv/send
{"tokens": [...], "to": "http://127.0.0.1:PORT"}`. The sender pins its cached context that
begins with `tokens`, asks the receiver for room (`POST /loom/kv/receive`: the blocks are
taken there from now on), waits the copy's time over the link between the two (NVLink on one
node, the network across: `loom.perf.transfer`, on the emulated clock), then tells the
receiver it arrived (`POST /loom/kv/commit`), after which the receiver's next request that
begins with those tokens finds them cached. The answer says how many tokens moved and the
emulated seconds the copy took. A copy that fails frees both ends (the receiver also drops a
reservation that was never committed after its hold); the engines go on serving either way.
`GET /loom/kv` says what an engine's KV moves over and what it has sent and received.

Emulated engines bind loopback only, so the sender only sends to loopback addresses.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from dataclasses import asdict
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from loom.core.errors import ConfigError, InvalidRequest, StorageFull, UpstreamError
from loom.perf.transfer import KvLinks
from loom.runtime.emulate.core import UnknownCopy
from loom.runtime.emulate.wire import bad as _bad
from loom.runtime.emulate.wire import json_response as _json
from loom.runtime.emulate.wire import read_body as _body

if TYPE_CHECKING:
    from loom.runtime.emulate.server import EmulatedServer

__all__ = ["KvRoutes"]

log = logging.getLogger("loom.emulate")

HOLD_SLACK_S = 600.0  # emulated seconds a reservation outlives its copy's longest time
CALL_TIMEOUT_S = 30.0  # wall seconds for each call to the receiver
SEND_FIELDS = frozenset({"tokens", "to"})  # what each route's body may hold
RECEIVE_FIELDS = frozenset({"tokens", "hold_s"})
FINISH_FIELDS = frozenset({"id"})


class KvRoutes:
    """The `/loom/kv` routes of one emulated engine."""

    def __init__(self, server: EmulatedServer) -> None:
        self.server = server
        self.session: aiohttp.ClientSession | None = None

    def add(self, app: web.Application) -> None:
        app.router.add_get("/loom/kv", self.info)
        app.router.add_post("/loom/kv/send", self.send)
        app.router.add_post("/loom/kv/receive", self.receive)
        app.router.add_post("/loom/kv/commit", self.commit)
        app.router.add_post("/loom/kv/cancel", self.cancel)
        app.on_cleanup.append(self._close)

    async def _close(self, app: web.Application) -> None:
        if self.session is not None:
            await self.session.close()

    def _session(self) -> aiohttp.ClientSession:
        if self.session is None:
            token = self.server.cfg.token  # (the engines of one fleet share one)
            self.session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT_S),
                headers={"Authorization": f"Bearer {token}"} if token else None,
            )
        return self.session

    # ---- routes -------------------------------------------------------------------------
    async def info(self, request: web.Request) -> web.Response:
        core = self.server.core
        return _json({"links": asdict(core.links), "moves": dict(core.kv)})

    async def send(self, request: web.Request) -> web.Response:
        """Send the KV cached here that begins with `tokens` to the engine at `to`."""
        server, core = self.server, self.server.core
        try:
            body = await _body(request, SEND_FIELDS)
            tokens = _tokens(body.get("tokens"))
            to = _loopback_url(body.get("to"))
        except InvalidRequest as exc:
            return _bad(exc)
        with server.clock.step():
            tid, n = core.hold_prefix(tokens)
        if n == 0:
            return _json({"tokens": 0, "seconds": 0.0})
        sent, cid = 0, None
        try:
            longest = core.links.transfer_s(n, _across(core.links))
            hold_s = 2 * longest + HOLD_SLACK_S
            got = await self._call(to, "receive", {"tokens": tokens[:n], "hold_s": hold_s})
            cid = got["id"]
            other = KvLinks(**got["links"])
            with server.clock.step():
                start = core.eng.now
            seconds = core.links.transfer_s(n, other)
            wall = server.clock.wall(start + seconds) - server.clock.loop.time()
            await asyncio.sleep(max(0.0, wall))
            await self._call(to, "commit", {"id": cid})
            sent = n
        except _Refused as exc:
            return _bad(UpstreamError(f"engine {to} took no KV copy: {exc}"))
        except (aiohttp.ClientError, TimeoutError, KeyError, TypeError, ConfigError) as exc:
            return _bad(UpstreamError(f"the KV copy to {to} failed: {exc!r}"))
        finally:
            with server.clock.step():
                core.release_prefix(tid, sent)
            if not sent and cid is not None:
                await self._forget(to, cid)
        return _json({"tokens": n, "seconds": seconds})

    async def receive(self, request: web.Request) -> web.Response:
        """Take room for a copy of `tokens`' KV on its way here; 507 where none can be made."""
        server = self.server
        try:
            body = await _body(request, RECEIVE_FIELDS)
            tokens = _tokens(body.get("tokens"))
            hold = body.get("hold_s")
            if isinstance(hold, bool) or not isinstance(hold, (int, float)):
                raise InvalidRequest(f"hold_s must be a number of seconds, got {hold!r}")
            with server.clock.step():
                cid = server.core.reserve_prefix(tokens, float(hold))
        except InvalidRequest as exc:
            return _bad(exc)
        if cid is None:
            return _bad(StorageFull(f"no room for {len(tokens)} tokens of KV"))
        return _json({"id": cid, "links": asdict(server.core.links)})

    async def commit(self, request: web.Request) -> web.Response:
        return await self._finish(request, commit=True)

    async def cancel(self, request: web.Request) -> web.Response:
        return await self._finish(request, commit=False)

    async def _finish(self, request: web.Request, *, commit: bool) -> web.Response:
        server = self.server
        try:
            body = await _body(request, FINISH_FIELDS)
            cid = body.get("id")
            if isinstance(cid, bool) or not isinstance(cid, int):
                raise InvalidRequest(f"id must be the integer /loom/kv/receive gave, got {cid!r}")
            with server.clock.step():
                if commit:
                    return _json({"tokens": server.core.commit_prefix(cid)})
                server.core.cancel_prefix(cid)
                return _json({"cancelled": cid})
        except InvalidRequest as exc:
            return _bad(exc)
        except UnknownCopy as exc:
            return _bad(exc)

    # ---- calls to the receiver ------------------------------------------------------------
    async def _call(self, to: str, what: str, body: dict[str, Any]) -> dict[str, Any]:
        async with self._session().post(f"{to}/loom/kv/{what}", json=body) as resp:
            if resp.status != 200:
                raise _Refused(f"{resp.status} {(await resp.text())[:300]}")
            got = await resp.json()
            if not isinstance(got, dict):
                raise _Refused(f"its answer to /loom/kv/{what} is not a JSON object")
            return got

    async def _forget(self, to: str, cid: int) -> None:
        """Free the receiver's room for a copy that will not arrive (best effort: its hold
        frees it otherwise)."""
        try:
            await self._call(to, "cancel", {"id": cid})
        except (aiohttp.ClientError, TimeoutError, _Refused) as exc:
            log.warning("could not cancel KV copy %s at %s: %r", cid, to, exc)


class _Refused(Exception):
    """The receiver answered, but not with success."""


def _across(links: KvLinks) -> KvLinks:
    """A worker like `links` on another node (the slowest path a copy may take)."""
    return KvLinks(
        node=links.node + 1,
        kv_bytes_per_token=links.kv_bytes_per_token,
        nvlink_gbs=links.nvlink_gbs,
        network_gbs=links.network_gbs,
    )


def _tokens(value: Any) -> list[int]:
    if not isinstance(value, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in value
    ):
        raise InvalidRequest("tokens must be a list of token ids")
    return value


def _loopback_url(value: Any) -> str:
    if not isinstance(value, str):
        raise InvalidRequest(f"to must be an engine's URL, got {value!r}")
    parts = urlsplit(value)
    host = parts.hostname or ""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if parts.scheme != "http" or not loopback or parts.port is None:
        raise InvalidRequest(f"to must be an engine at http://127.0.0.1:PORT, got {value!r}")
    return value.rstrip("/")
