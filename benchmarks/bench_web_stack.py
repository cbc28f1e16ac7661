"""Which web stack costs a Loom service less server CPU per request (the rollout router's
budget): the same trivial authenticated JSON route, `POST /v1/echo` behind the shared layer's
token check and error handling (`loom.runtime.web`), served by aiohttp (on uvloop, as the router
runs) and by FastAPI under uvicorn (as the control-plane services run), each in its own process
on loopback, driven by one keep-alive client, one request at a time.

    python benchmarks/bench_web_stack.py [--n 2000] [--rounds 5] [--json PATH]

Per stack and round: the server process's CPU seconds (user + system, from `/proc/PID/stat`)
over the round's requests, per request, and the client's p50 latency; the record holds the
medians over rounds. `--json PATH` writes one results document (`loom.bench.results`): a record
`"stack"` per stack.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import httpx
from pydantic import BaseModel

from loom.bench.script import add_json_option, write_json

STACKS = ("aiohttp", "fastapi")
TOKEN = "bench-web-stack-token-0123456789"
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


class Echo(BaseModel):
    """The route's body (FastAPI's side; aiohttp reads the same JSON object)."""

    x: int | None = None


def _serve_aiohttp(sock: Any) -> None:
    import asyncio

    from aiohttp import web

    from loom.runtime.rollout.server import new_loop
    from loom.runtime.web.aio import auth_middleware, error_middleware, json_object, json_response
    from loom.runtime.web.errors import ErrorShape

    async def echo(request: web.Request) -> web.Response:
        body = json_object(await request.read())
        return json_response({"echo": body.get("x")})

    middlewares = [
        error_middleware(ErrorShape.OPENAI, max_bytes=1 << 20, hint="bench"),
        auth_middleware(TOKEN, open_health=True),
    ]
    app = web.Application(client_max_size=1 << 20, middlewares=middlewares)
    app.router.add_post("/v1/echo", echo)

    async def run() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.SockSite(runner, sock).start()
        print("ready", flush=True)
        await asyncio.Event().wait()

    loop = new_loop()
    asyncio.set_event_loop(loop)
    loop.run_until_complete(run())


def _serve_fastapi(sock: Any) -> None:
    import asyncio

    import uvicorn
    from fastapi import FastAPI

    from loom.runtime.rollout.server import new_loop
    from loom.runtime.service import BearerToken, BodyLimit, add_error_handlers

    app = FastAPI()
    add_error_handlers(app)

    @app.post("/v1/echo")
    async def echo(body: Echo) -> dict[str, Any]:
        return {"echo": body.x}

    app.add_middleware(BodyLimit, max_bytes=1 << 20)
    app.add_middleware(BearerToken, token=TOKEN)
    config = uvicorn.Config(app, log_level="warning", lifespan="off", ws="none")
    server = uvicorn.Server(config)

    async def started() -> None:  # say so once uvicorn serves (its startup has run)
        while not server.started:
            await asyncio.sleep(0.01)
        print("ready", flush=True)

    async def run() -> None:
        await asyncio.gather(server.serve(sockets=[sock]), started())

    loop = new_loop()  # uvloop, as for aiohttp (uvicorn's own choice where it is installed)
    asyncio.set_event_loop(loop)
    loop.run_until_complete(run())


def serve(stack: str) -> None:
    """The server side: bind a free loopback port, print it, serve until killed."""
    from loom.runtime.service import bind

    sock, host, port = bind("127.0.0.1", 0)
    print(f"http://{host}:{port}", flush=True)
    (_serve_aiohttp if stack == "aiohttp" else _serve_fastapi)(sock)


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * _TICK_S  # utime, stime (fields 14, 15)


def _round(http: httpx.Client, n: int) -> list[float]:
    lat = []
    for i in range(n):
        t0 = time.perf_counter()
        resp = http.post("/v1/echo", json={"x": i})
        lat.append(time.perf_counter() - t0)
        assert resp.status_code == 200, resp.text
    return lat


def measure(stack: str, n: int, rounds: int) -> dict[str, Any]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", stack],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert proc.stdout.readline().strip() == "ready", f"the {stack} server did not start"
        headers = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(base_url=url, headers=headers, timeout=30) as http:
            refused = http.post("/v1/echo", json={"x": 0}, headers={"Authorization": "no"})
            assert refused.status_code == 401, refused.text
            _round(http, max(100, n // 10))  # warm up: imports, caches, the connection
            cpu, p50 = [], []
            for _ in range(rounds):
                before = _cpu_s(proc.pid)
                lat = _round(http, n)
                cpu.append((_cpu_s(proc.pid) - before) / n)
                p50.append(statistics.median(lat))
    finally:
        proc.kill()
        proc.wait()
    return {
        "record": "stack",
        "stack": stack,
        "n": n,
        "rounds": rounds,
        "server_cpu_us_per_request": statistics.median(cpu) * 1e6,
        "p50_ms": statistics.median(p50) * 1e3,
        "server_cpu_us_per_request_runs": [c * 1e6 for c in cpu],
        "p50_runs_ms": [p * 1e3 for p in p50],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--n", type=int, default=2000, help="requests per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--serve", choices=STACKS, help=argparse.SUPPRESS)
    add_json_option(ap)
    args = ap.parse_args()
    if args.serve:
        serve(args.serve)
        return
    records = [measure(stack, args.n, args.rounds) for stack in STACKS]
    for r in records:
        print(
            f"{r['stack']:8s} server CPU {r['server_cpu_us_per_request']:.0f} us/request, "
            f"p50 {r['p50_ms']:.2f} ms (median of {r['rounds']} rounds of {r['n']})"
        )
    if out := write_json(args.json, "bench_web_stack", records, seed=0):
        print(f"wrote {len(records)} records to {out}")


if __name__ == "__main__":
    main()
