"""A small stand-in for an SGLang engine: SGLang's native routes (`/generate` with
`input_ids`, `rid`, streaming; `/abort_request` by `rid` or `abort_all`; `/get_model_info`;
`/get_server_info`; `/v1/loads` and `/get_load`; `/health`; `/tokenize`) over a deterministic
"model" with continuous batching on a fixed step time: at most `--max-running` requests at
once and, with `--kv-tokens N`, only as many as N tokens of context hold; the rest wait in
its own queue, first come first served or, with `--priority`, by the request's `priority`
(higher first, as SGLang; `--low-priority-first` as vLLM). Its load report is taken after
each step's admissions, as vLLM's and SGLang's are: a request waits there only when the
engine is full. `standin_latency` is its latency model, for the router's cost model.

It exists because vLLM, the engine Loom tests against, has no SGLang dialect; it serves the
tests of that dialect and of what a real engine makes slow to provoke (a hang, a crash
mid-stream). The next token is a function of the whole context, and so is every logprob
(`return_logprob`, `top_logprobs_num`, `logprob_start_len`), so a turn that is aborted and
resumed with its partial output produces exactly the tokens and logprobs an uninterrupted one
would — as greedy decoding does on a real engine.

`GET /debug/requests` lists every request received (rid, prompt length, max_new_tokens);
`POST /debug/fault {"mode": "hang"|"crash"|"unhealthy"|"none"}` injects a fault into every
route it serves (but /debug): `hang` answers nothing until the fault is cleared (as a process
stopped with SIGSTOP), `crash` drops the connection (mid-stream for a generation),
`unhealthy` answers 503.

Run: `python -m loom.runtime.rollout.standin --port 30000 [--step-ms 5] [--max-running 64]`
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from loom.proc.tether import Tethered
from loom.runtime.access import authorized

if TYPE_CHECKING:
    from loom.perf.latency import ProfiledLatencyModel

__all__ = [
    "StandinEngine",
    "StandinProcess",
    "continuation",
    "next_token",
    "standin_latency",
    "write_standin_profile",
]

VOCAB = 32000
EOS = 2
# SGLang's SamplingParams fields (python/sglang/srt/sampling/sampling_params.py)
_SAMPLING = {
    "max_new_tokens",
    "min_new_tokens",
    "stop",
    "stop_token_ids",
    "stop_regex",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "n",
    "json_schema",
    "regex",
    "ebnf",
    "structural_tag",
    "ignore_eos",
    "no_stop_trim",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "custom_params",
    "logit_bias",
    "sampling_seed",
    "stream_interval",
}


def routed_experts(context: list[int], layers: int = 2, topk: int = 2) -> str:
    """The stand-in model's MoE routing of every position but the last, as SGLang returns it:
    base64 of little-endian int32 [positions, layers, topk]."""
    import base64
    import struct

    ids = [(t * 31 + 7 * j) % 8 for t in context[:-1] for j in range(layers * topk)]
    return base64.b64encode(struct.pack(f"<{len(ids)}i", *ids)).decode()


def words(text: str) -> list[int]:
    """The stand-in's tokenizer: one token per whitespace-separated word."""
    return [3 + zlib.crc32(w.encode()) % (VOCAB - 3) for w in text.split()]


def token_logprob(context: list[int], token: int) -> float:
    """The stand-in model's logprob of `token` after `context`: in [-10, 0)."""
    h = zlib.crc32(token.to_bytes(4, "little") + bytes(str(context[-16:]), "ascii"))
    return -((h % 10000) / 1000 + 0.001)


def top_logprobs(context: list[int], k: int) -> list[tuple[int, float]]:
    """The `k` most likely tokens after `context` (the sampled one first), as (id, logprob)."""
    first = next_token(context)
    h = zlib.crc32(len(context).to_bytes(4, "little"))
    alts = [first, *(3 + (h + 7919 * j) % (VOCAB - 3) for j in range(1, k))]
    best = dict.fromkeys(alts)  # unique, in order
    ranked = [(t, token_logprob(context, t)) for t in best]
    return sorted(ranked, key=lambda kv: (kv[0] != first, -kv[1]))[:k]


def next_token(context: list[int]) -> int:
    """The stand-in model: a hash of the last 16 tokens and the length, never EOS unless the
    hash says so (about one token in 200)."""
    h = zlib.crc32(len(context).to_bytes(4, "little") + bytes(str(context[-16:]), "ascii"))
    if h % 200 == 0:
        return EOS
    return 3 + h % (VOCAB - 3)


def continuation(prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    """The `n` tokens the stand-in model generates after `prompt` (EOS ignored) and their
    logprobs: what an uninterrupted turn returns, whatever preemptions, failovers or moves it
    went through."""
    ctx, logprobs = list(prompt), []
    for _ in range(n):
        token = next_token(ctx)
        logprobs.append(token_logprob(ctx, token))
        ctx.append(token)
    return ctx[len(prompt) :], logprobs


@dataclass(eq=False)
class _Request:
    rid: str
    context: list[int]
    prompt_len: int
    max_new: int
    min_new: int
    ignore_eos: bool
    stop_ids: set[int]
    out: asyncio.Queue[dict[str, Any] | None] = field(default_factory=asyncio.Queue)
    generated: list[int] = field(default_factory=list)
    finish: dict[str, Any] | None = None
    cached: int = 0
    prefill_left: float = 0.0
    logprob: bool = False
    experts: bool = False
    top: int = 0
    start: int = -1
    logprobs: list[list[Any]] = field(default_factory=list)
    tops: list[list[list[Any]]] = field(default_factory=list)
    priority: int = 0
    seq: int = 0


class StandinEngine:
    def __init__(
        self,
        step_s: float = 0.005,
        max_running: int = 64,
        prefill_s_per_token: float = 0.0,
        incremental: bool = False,
        model: str = "standin",
        token: str | None = None,
        kv_tokens: int | None = None,
        priority: bool = False,
        low_priority_first: bool = False,
    ) -> None:
        self.token = token  # the bearer token every route but /health wants (vLLM --api-key)
        self.step_s = step_s
        self.max_running = max_running
        self.kv_tokens = kv_tokens  # context tokens its running requests may hold
        self.priority = priority
        self.low_priority_first = low_priority_first
        self.report: dict[str, Any] = {"running": 0, "waiting": 0, "used": 0}
        self.prefill_s_per_token = prefill_s_per_token
        self.incremental = incremental
        self.model = model
        self.running: dict[str, _Request] = {}
        self.waiting: list[_Request] = []
        self.log: list[dict[str, Any]] = []
        self.fault = "none"
        self._cache: OrderedDict[int, int] = OrderedDict()  # hash(prefix) -> length
        self._loop_task: asyncio.Task[None] | None = None
        self.steps = 0
        self.max_seen = 0  # most requests held at once (running + queued)
        self.aborted: list[str] = []

    # -- the model loop --

    def _cached_prefix(self, ids: list[int]) -> int:
        best = 0
        for n in (len(ids), *range(len(ids) - len(ids) % 64, 0, -64)):
            if n and hash(tuple(ids[:n])) in self._cache:
                best = n
                break
        return best

    def _remember(self, ids: list[int]) -> None:
        for n in (len(ids), *range(64, len(ids), 64)):
            self._cache[hash(tuple(ids[:n]))] = n
            self._cache.move_to_end(hash(tuple(ids[:n])))
        while len(self._cache) > 20000:
            self._cache.popitem(last=False)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.step_s)
            if self.fault == "hang":
                continue
            self._admit()
            self.max_seen = max(self.max_seen, len(self.running) + len(self.waiting))
            self.steps += 1
            for r in list(self.running.values()):
                if r.prefill_left > 0:
                    r.prefill_left -= self.step_s
                    continue
                tok = next_token(r.context)
                if r.logprob:
                    r.logprobs.append([token_logprob(r.context, tok), tok, None])
                    r.tops.append([[v, t, None] for t, v in top_logprobs(r.context, r.top)])
                r.context.append(tok)
                r.generated.append(tok)
                n = len(r.generated)
                stop = not r.ignore_eos and n >= r.min_new and (tok == EOS or tok in r.stop_ids)
                if stop:
                    r.finish = {"type": "stop", "matched": tok}
                elif n >= r.max_new:
                    r.finish = {"type": "length", "length": n}
                self._emit(r, [tok])
                if r.finish is not None:
                    self._end(r)

    def _used(self) -> int:
        return sum(len(r.context) for r in self.running.values())

    def _admit(self) -> None:
        """Its queue's head joins the batch while a slot and its context's KV are free (an
        oversized one only into an empty batch); then the load report is taken."""
        used = self._used()
        while self.waiting and len(self.running) < self.max_running:
            head = min(self.waiting, key=self._order)
            need = len(head.context) + 1
            if self.kv_tokens is not None and used + need > self.kv_tokens and self.running:
                break
            self.waiting.remove(head)
            self.running[head.rid] = head
            used += need
        self.report = {"running": len(self.running), "waiting": len(self.waiting), "used": used}

    def _order(self, r: _Request) -> tuple[int, int]:
        if not self.priority:
            return (0, r.seq)
        return (r.priority if self.low_priority_first else -r.priority, r.seq)

    def _emit(self, r: _Request, new: list[int]) -> None:
        ids = new if self.incremental else list(r.generated)
        shown = new if self.incremental else r.generated
        text = " ".join(f"t{t}" for t in shown)
        if self.incremental and shown and len(r.generated) > len(new):
            text = " " + text
        meta: dict[str, Any] = {
            "id": r.rid,
            "finish_reason": r.finish,
            "prompt_tokens": r.prompt_len,
            "completion_tokens": len(r.generated),
            "cached_tokens": r.cached,
        }
        if r.logprob:
            k = len(new) if self.incremental else len(r.logprobs)
            meta["output_token_logprobs"] = r.logprobs[len(r.logprobs) - k :]
            if r.top:
                meta["output_top_logprobs"] = r.tops[len(r.tops) - k :]
            prompt = r.context[: r.prompt_len]
            meta["input_token_logprobs"] = (
                [
                    [None if i == 0 else token_logprob(prompt[:i], prompt[i]), prompt[i], None]
                    for i in range(max(r.start, 0), r.prompt_len)
                ]
                if r.start >= 0
                else []
            )
            if r.top and r.start >= 0:
                meta["input_top_logprobs"] = [
                    None if i == 0 else [[v, t, None] for t, v in top_logprobs(prompt[:i], r.top)]
                    for i in range(r.start, r.prompt_len)
                ]
        if r.experts and r.finish is not None:
            meta["routed_experts"] = routed_experts(r.context)
        r.out.put_nowait({"text": text, "output_ids": ids, "meta_info": meta})

    def _end(self, r: _Request) -> None:
        self.running.pop(r.rid, None)
        if r in self.waiting:
            self.waiting.remove(r)
        self._remember(r.context)
        r.out.put_nowait(None)

    # -- HTTP --

    @web.middleware
    async def _faults(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """The injected fault, on every route but /debug."""
        if request.path.startswith("/debug"):
            return await handler(request)  # type: ignore[no-any-return]
        if (
            self.token
            and request.path != "/health"
            and not authorized(request.headers.get("Authorization"), self.token)
        ):
            return web.json_response({"error": "missing or wrong token"}, status=401)
        if self.fault == "hang":
            while self.fault == "hang":
                await asyncio.sleep(0.05)
        if self.fault == "unhealthy":
            return web.json_response({"error": "unhealthy"}, status=503)
        if self.fault == "crash" and request.path != "/generate":
            assert request.transport is not None
            request.transport.abort()
            raise ConnectionResetError("crash fault")
        return await handler(request)  # type: ignore[no-any-return]

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._faults])
        app.router.add_get("/health", self.health)
        app.router.add_get("/get_model_info", self.model_info)
        app.router.add_get("/get_server_info", self.server_info)
        app.router.add_get("/v1/loads", self.loads)
        app.router.add_get("/get_load", self.get_load)
        app.router.add_post("/generate", self.generate)
        app.router.add_post("/abort_request", self.abort)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_get("/debug/requests", self.requests)
        app.router.add_get("/debug/stats", self.debug_stats)
        app.router.add_post("/debug/fault", self.set_fault)

        async def start(app: web.Application) -> None:
            self._loop_task = asyncio.get_running_loop().create_task(self._run())

        async def stop(app: web.Application) -> None:
            if self._loop_task is not None:
                self._loop_task.cancel()

        app.on_startup.append(start)
        app.on_cleanup.append(stop)
        return app

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response({"model_path": self.model, "is_generation": True})

    async def server_info(self, request: web.Request) -> web.Response:
        """The server arguments SGLang reports that say how it schedules."""
        return web.json_response(
            {
                "model_path": self.model,
                "max_running_requests": self.max_running,
                "max_total_num_tokens": self.kv_tokens,
                "enable_priority_scheduling": self.priority,
                "schedule_low_priority_values_first": self.low_priority_first,
            }
        )

    async def loads(self, request: web.Request) -> web.Response:
        rep = self.report
        usage = rep["used"] / self.kv_tokens if self.kv_tokens else 0.0
        return web.json_response(
            {
                "loads": [
                    {
                        "dp_rank": 0,
                        "num_running_reqs": rep["running"],
                        "num_waiting_reqs": rep["waiting"],
                        "num_used_tokens": rep["used"],
                        "max_total_num_tokens": self.kv_tokens,
                        "token_usage": round(usage, 4),
                        "max_running_requests": self.max_running,
                    }
                ]
            }
        )

    async def get_load(self, request: web.Request) -> web.Response:
        rep = self.report
        return web.json_response(
            [
                {
                    "dp_rank": None,
                    "num_reqs": rep["running"] + rep["waiting"],
                    "num_waiting_reqs": rep["waiting"],
                    "num_tokens": rep["used"],
                }
            ]
        )

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            return web.json_response({"error": "prompt must be a string"}, status=400)
        tokens = words(prompt)
        return web.json_response({"tokens": tokens, "count": len(tokens)})

    async def requests(self, request: web.Request) -> web.Response:
        return web.json_response(self.log)

    async def debug_stats(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "max_seen": self.max_seen,
                "running": len(self.running),
                "waiting": len(self.waiting),
                "aborted": self.aborted,
            }
        )

    async def set_fault(self, request: web.Request) -> web.Response:
        self.fault = (await request.json())["mode"]
        return web.json_response({"fault": self.fault})

    async def abort(self, request: web.Request) -> web.Response:
        """SGLang's abort: one request by `rid`, or every one with `abort_all`."""
        body = await request.json()
        if body.get("abort_all"):
            found = [*self.running.values(), *self.waiting]
        else:
            rid = body.get("rid")
            r = self.running.get(rid) or next((w for w in self.waiting if w.rid == rid), None)
            found = [] if r is None else [r]
        for r in found:
            if r.finish is None:
                self.aborted.append(r.rid)
                r.finish = {"type": "abort", "message": "aborted"}
                self._emit(r, [])
                self._end(r)
        return web.Response(text="")

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        ids = body.get("input_ids")
        if ids is None and isinstance(body.get("text"), str):
            ids = words(body["text"])
        if not isinstance(ids, list) or not ids:
            return web.json_response({"error": "input_ids or text required"}, status=400)
        params = body.get("sampling_params") or {}
        rid = body.get("rid") or f"r{len(self.log)}"
        max_new = int(params.get("max_new_tokens", 128))
        if max_new < 1:
            return web.json_response({"error": "max_new_tokens must be >= 1"}, status=400)
        unknown = set(params) - _SAMPLING
        if unknown:  # SGLang's SamplingParams refuses what it does not know
            return web.json_response(
                {"error": f"unknown sampling parameters {sorted(unknown)}"}, status=400
            )
        r = _Request(
            rid=rid,
            context=list(ids),
            prompt_len=len(ids),
            max_new=max_new,
            min_new=int(params.get("min_new_tokens") or 0),
            ignore_eos=bool(params.get("ignore_eos")),
            stop_ids=set(params.get("stop_token_ids") or ()),
            priority=int(body.get("priority") or 0),
            seq=len(self.log),
        )
        r.experts = bool(body.get("return_routed_experts"))
        if body.get("return_logprob"):
            r.logprob = True
            r.top = int(body.get("top_logprobs_num") or 0)
            r.start = int(body.get("logprob_start_len", -1))
            if r.start >= len(ids):
                return web.json_response(
                    {"error": f"logprob_start_len {r.start} >= the prompt's {len(ids)}"},
                    status=400,
                )
        r.cached = self._cached_prefix(r.context)
        r.prefill_left = (len(ids) - r.cached) * self.prefill_s_per_token
        self.log.append(
            {
                "rid": rid,
                "input_ids": list(ids),
                "max_new_tokens": max_new,
                "min_new_tokens": r.min_new,
                "priority": body.get("priority"),
                "sampling_params": dict(params),
                "return_logprob": bool(body.get("return_logprob")),
            }
        )
        self.waiting.append(r)
        if not body.get("stream"):
            last: dict[str, Any] = {}
            while (item := await r.out.get()) is not None:
                last = item
            last["output_ids"] = list(r.generated)
            return web.json_response(last)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        try:
            await resp.prepare(request)
            while (item := await r.out.get()) is not None:
                if self.fault == "crash":
                    assert request.transport is not None
                    request.transport.abort()
                    return resp
                await resp.write(b"data: " + json.dumps(item).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
        except (asyncio.CancelledError, ConnectionResetError) as exc:
            if r.finish is None:  # the client went away: abort, as SGLang does
                self.aborted.append(r.rid)
                r.finish = {"type": "abort"}
                self._end(r)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return resp  # (a vanished client is no error of the engine's: nothing logged)
        return resp


def standin_latency(
    step_s: float, prefill_s_per_token: float = 0.0, kv_tokens: int = 10_000_000, tp: int = 1
) -> ProfiledLatencyModel:
    """The stand-in's latency model: a decode step of `step_s` whatever the batch, and
    `prefill_s_per_token` for each uncached prompt token."""
    from loom.perf.latency import ProfiledLatencyModel

    return ProfiledLatencyModel(
        coefficients=(step_s, 0.0, 0.0, prefill_s_per_token, 0.0),
        kv_capacity_tokens=kv_tokens,
        tp=tp,
    )


def write_standin_profile(
    path: str | os.PathLike[str],
    step_s: float,
    prefill_s_per_token: float = 0.0,
    kv_tokens: int = 10_000_000,
) -> None:
    """`standin_latency` as a profile CSV (`--profile`), rows sampled from the model."""
    from loom.perf.latency import sample_profile, save_profile

    lat = standin_latency(step_s, prefill_s_per_token, kv_tokens)
    rows = sample_profile(lat)
    note = f"the stand-in engine: step {step_s} s, prefill {prefill_s_per_token} s per token"
    save_profile(Path(path), rows, tp=1, kv_capacity_tokens=kv_tokens, note=note)


class StandinProcess:
    """A stand-in engine in its own process on a free loopback port; a context manager.
    `args` are extra command-line flags (e.g. "--step-ms", "5")."""

    def __init__(self, *args: str) -> None:
        # tethered: it ends with the process that started it (a Ray actor killed with its
        # driver, a test killed by a timeout), SIGKILL included
        self.proc = Tethered(
            [sys.executable, "-m", "loom.runtime.rollout.standin", "--port", "0", *args],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # printed once it listens
        match = re.search(r"http://\S+", line)
        if match is None:
            self.stop()
            raise RuntimeError(f"the stand-in engine did not start: {line!r}")
        self.url = match.group(0)

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)  # the engine and its tether
        self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def __enter__(self) -> StandinProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--step-ms", type=float, default=5.0)
    p.add_argument("--max-running", type=int, default=64)
    p.add_argument("--prefill-us-per-token", type=float, default=0.0)
    p.add_argument("--incremental", action="store_true")
    p.add_argument("--kv-tokens", type=int, default=None, help="context tokens it holds")
    p.add_argument("--priority", action="store_true", help="schedule by request priority")
    p.add_argument(
        "--low-priority-first", action="store_true", help="lower priority values first (vLLM)"
    )
    p.add_argument("--token", default=None, help="bearer token every route but /health wants")
    args = p.parse_args()
    engine = StandinEngine(
        step_s=args.step_ms / 1000,
        max_running=args.max_running,
        prefill_s_per_token=args.prefill_us_per_token / 1e6,
        incremental=args.incremental,
        token=args.token,
        kv_tokens=args.kv_tokens,
        priority=args.priority,
        low_priority_first=args.low_priority_first,
    )
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    sock.listen(1024)  # before the URL is announced: a client may connect at once
    print(f"standin engine on http://{args.host}:{sock.getsockname()[1]}", flush=True)
    web.run_app(engine.app(), sock=sock, print=None, handler_cancellation=True)


if __name__ == "__main__":
    main()
