"""The floor of a router on Loom's HTTP stack: a bare aiohttp proxy that forwards each POST's
body to one engine, unread, and answers with the engine's bytes — no parsing, no policy, no
state. The router's overhead benchmark measures it beside Loom's router and sglang-router,
on the same event loop as Loom's (uvloop where installed), so that what Loom adds beyond the
stack itself is seen apart from the stack.

Run: python -m loom.bench.proxy --port PORT --engine URL
"""

from __future__ import annotations

import argparse
import asyncio

import aiohttp
from aiohttp import web

from loom.runtime.rollout.server import new_loop

__all__ = ["proxy_app"]

_HOP = {"content-length", "transfer-encoding", "connection", "keep-alive", "host"}


def proxy_app(engine: str) -> web.Application:
    """An app that sends every POST to the same path at `engine` and relays its answer
    (streamed answers chunk by chunk), and answers GET /health itself."""
    engine = engine.rstrip("/")
    app = web.Application()
    session: list[aiohttp.ClientSession] = []

    async def start(_: web.Application) -> None:
        session.append(
            aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0),
                auto_decompress=False,
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        )

    async def stop(_: web.Application) -> None:
        await session[0].close()

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
        async with session[0].post(engine + request.path, data=body, headers=headers) as up:
            kind = up.headers.get("Content-Type", "application/json")
            if not kind.startswith("text/event-stream"):
                return web.Response(body=await up.read(), status=up.status, content_type=None,
                                    headers={"Content-Type": kind})  # fmt: skip
            resp = web.StreamResponse(status=up.status, headers={"Content-Type": kind})
            await resp.prepare(request)
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp

    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    app.router.add_get("/health", health)
    app.router.add_post("/{path:.*}", forward)
    return app


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, required=True, help="port to serve on (127.0.0.1)")
    ap.add_argument("--engine", required=True, help="the engine's base URL")
    args = ap.parse_args(argv)
    loop = new_loop()
    asyncio.set_event_loop(loop)
    web.run_app(
        proxy_app(args.engine), host="127.0.0.1", port=args.port, access_log=None, loop=loop,
        print=None,
    )  # fmt: skip


if __name__ == "__main__":
    main()
