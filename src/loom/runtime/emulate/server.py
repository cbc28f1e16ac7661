"""The emulated GPU engine's HTTP server: vLLM's OpenAI dialect as Loom's router and other
peers use it, over `EmulatedEngine` on the wall clock.

Routes: `POST /v1/completions` (token-id or text prompts; `stream` with SSE chunks carrying
`token_ids`; `logprobs` with `return_tokens_as_token_ids`; `prompt_logprobs` in a non-streamed
answer; `priority`, `request_id`, `ignore_eos`, `min_tokens`, `stop_token_ids`), `POST
/abort_requests {"request_ids": ["cmpl-{id}-0"]}` (vLLM's dev-mode route), `GET /v1/models`,
`GET /health`, `GET /version`, `POST /tokenize` and `/detokenize` (a word-level vocabulary:
token N is the word `tN`), `GET /metrics` (vLLM's names: `vllm:num_requests_running`,
`vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`, `vllm:num_preemptions_total`, ...),
and `GET /debug/requests` (every ended request's emulated arrival, admission and end).

Run: `loom serve engine --emulate qwen3-14b@h100:tp2 --time-scale 0.1`, or
`python -m loom.runtime.emulate qwen3-14b@h100:tp2 --port 0 --time-scale 0.1`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from loom.core.errors import InvalidRequest, NotFound
from loom.runtime.emulate.clock import WallClock
from loom.runtime.emulate.config import EmulatedEngineConfig
from loom.runtime.emulate.core import EmulatedEngine, Request
from loom.runtime.emulate.coserve import CoServingEngine
from loom.runtime.emulate.kv import KvRoutes
from loom.runtime.emulate.serving import ServingRoutes
from loom.runtime.emulate.tokens import (
    detokenize,
    logprobs_block,
    piece,
    prompt_ids,
    prompt_logprobs,
    tokenize,
)
from loom.runtime.emulate.wire import SHAPE, read_body
from loom.runtime.emulate.wire import bad as _bad
from loom.runtime.emulate.wire import json_response as _json
from loom.runtime.web.aio import auth_middleware, error_middleware, metrics_response
from loom.runtime.web.probes import health
from loom.sim.engine import Engine

__all__ = ["EmulatedServer", "serve"]

log = logging.getLogger("loom.emulate")

VERSION = "0.32.0"  # the vLLM whose dialect it speaks
MAX_BODY_BYTES = 256 * 1024 * 1024  # a request body over this is a 413
# Fields that constrain what a real engine generates and that this model cannot honour.
REFUSED = (
    "structured_outputs",
    "logit_bias",
    "allowed_token_ids",
    "bad_words",
    "logprob_token_ids",
    "prompt_embeds",
    "suffix",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
)


class _Stream:
    """What a streaming client has been shown, and a wake-up when there is more."""

    __slots__ = ("event", "visible")

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.visible = 0


class _Params:
    """A completion request's fields, checked."""

    def __init__(self, body: dict[str, Any], model: str) -> None:
        for name in REFUSED:
            if body.get(name) not in (None, [], {}, ""):
                raise InvalidRequest(f"{name} is not supported by the emulated engine")
        fmt = body.get("response_format")
        if fmt not in (None, {}) and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
            raise InvalidRequest("response_format is not supported by the emulated engine")
        if body.get("model") not in (None, model):
            raise NotFound(f"The model `{body['model']}` does not exist.")
        if body.get("n") not in (None, 1):
            raise InvalidRequest("n > 1 is not supported by the emulated engine")
        if body.get("echo"):
            raise InvalidRequest("echo is not supported by the emulated engine")
        if body.get("use_beam_search"):
            raise InvalidRequest("beam search is not supported by the emulated engine")
        if body.get("stop") not in (None, [], ""):
            raise InvalidRequest("stop strings are not supported by the emulated engine")
        self.prompt = prompt_ids(body.get("prompt"))
        self.text = isinstance(body.get("prompt"), str) or (
            isinstance(body.get("prompt"), list)
            and bool(body["prompt"])
            and isinstance(body["prompt"][0], str)
        )
        max_tokens = body.get("max_tokens")
        self.max_tokens = 16 if max_tokens is None else _int(max_tokens, "max_tokens")
        self.min_tokens = _int(body.get("min_tokens") or 0, "min_tokens")
        self.ignore_eos = bool(body.get("ignore_eos"))
        stop_ids = body.get("stop_token_ids") or []
        if not isinstance(stop_ids, list):
            raise InvalidRequest("stop_token_ids must be a list of token ids")
        self.stop_token_ids = frozenset(_int(t, "stop_token_ids") for t in stop_ids)
        self.priority = _int(body.get("priority") or 0, "priority")
        self.stream = bool(body.get("stream"))
        self.usage = bool((body.get("stream_options") or {}).get("include_usage"))
        lp = body.get("logprobs")
        self.logprobs = None if lp is None else _int(lp, "logprobs")
        if self.logprobs is not None and self.logprobs < 0:
            self.logprobs = 20  # -1: all; the stand-in model ranks 20 at most
        plp = body.get("prompt_logprobs")
        self.prompt_logprobs = None if plp is None else _int(plp, "prompt_logprobs")
        if self.prompt_logprobs is not None and self.prompt_logprobs < 0:
            self.prompt_logprobs = 20
        if self.stream and self.prompt_logprobs is not None:
            raise InvalidRequest("`prompt_logprobs` are not available when `stream=True`.")
        self.as_ids = bool(body.get("return_tokens_as_token_ids"))
        self.token_ids = bool(body.get("return_token_ids"))


def _int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"{name} must be an integer, got {value!r}")
    return value


class _Metrics(Collector):
    """vLLM's metric names, read from the engine when scraped."""

    def __init__(self, server: EmulatedServer) -> None:
        self.server = server

    def collect(self) -> Iterable[Any]:
        s, core = self.server, self.server.core
        s.clock.advance()
        labels = ["engine", "model_name"]
        values = ["0", s.cfg.model_name]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=labels)
            g.add_metric(values, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=labels)
            c.add_metric(values, value)
            return c

        yield gauge("vllm:num_requests_running", "Requests in model execution batches.",
                    core.running)  # fmt: skip
        yield gauge("vllm:num_requests_waiting", "Requests waiting to be processed.",
                    core.waiting)  # fmt: skip
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                    core.kv_usage)  # fmt: skip
        yield counter("vllm:num_preemptions", "Cumulative number of preemptions.",
                      core.worker.preemptions)  # fmt: skip
        yield counter("vllm:prompt_tokens", "Prefill tokens processed.",
                      core.counts["prompt_tokens"])  # fmt: skip
        yield counter("vllm:generation_tokens", "Generation tokens processed.",
                      core.counts["generation_tokens"])  # fmt: skip
        yield counter("vllm:prefix_cache_queries", "Prefix cache queries, in tokens.",
                      core.counts["prefix_queries"])  # fmt: skip
        yield counter("vllm:prefix_cache_hits", "Prefix cache hits, in tokens.",
                      core.counts["prefix_hits"])  # fmt: skip
        success = CounterMetricFamily(
            "vllm:request_success", "Requests finished.", labels=[*labels, "finished_reason"]
        )
        for reason, n in core.finished.items():
            success.add_metric([*values, reason], n)
        yield success


class EmulatedServer:
    """The aiohttp application of one emulated engine; build it inside a running loop."""

    def __init__(self, config: EmulatedEngineConfig) -> None:
        self.cfg = config
        self.core = (
            EmulatedEngine(config, Engine())
            if config.coserve is None
            else CoServingEngine(config, Engine(), config.coserve)
        )
        self.serving = None if config.coserve is None else ServingRoutes(self)
        self.clock: WallClock  # set at startup, on the serving loop
        self.streams: dict[Request, _Stream] = {}
        self._ticker: asyncio.TimerHandle | None = None
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Metrics(self))
        self.created = int(time.time())

    # ---- lifecycle ----------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(
            client_max_size=MAX_BODY_BYTES,
            middlewares=[
                error_middleware(SHAPE, max_bytes=MAX_BODY_BYTES, hint="the engine's"),
                *([] if self.cfg.token is None else [auth_middleware(self.cfg.token, True)]),
            ],
        )
        app.router.add_get("/health", self.health)
        app.router.add_get("/version", self.version)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/abort_requests", self.abort)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/detokenize", self.detokenize)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/debug/requests", self.requests)
        app.router.add_get("/debug/stats", self.debug_stats)
        KvRoutes(self).add(app)
        if self.serving is not None:
            self.serving.add(app)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, app: web.Application) -> None:
        self.clock = WallClock(self.core.eng, self.cfg.time_scale, asyncio.get_running_loop())

    async def _stop(self, app: web.Application) -> None:
        self.clock.close()
        if self._ticker is not None:
            self._ticker.cancel()

    # ---- streaming ----------------------------------------------------------------------
    def _tick(self) -> None:
        """Show every streaming client the tokens produced since the last tick."""
        self._ticker = None
        if not self.streams:
            return
        with self.clock.step():
            for req, n in self.core.progress():
                s = self.streams.get(req)
                if s is not None and n > s.visible:
                    s.visible = n
                    s.event.set()
        self._schedule_tick()

    def _schedule_tick(self) -> None:
        if self._ticker is None and self.cfg.stream_interval_s > 0:
            self._ticker = self.clock.loop.call_later(self.cfg.stream_interval_s, self._tick)

    # ---- routes -------------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return _json(health())

    async def version(self, request: web.Request) -> web.Response:
        return _json({"version": VERSION})

    async def models(self, request: web.Request) -> web.Response:
        data = [
            {
                "id": self.cfg.model_name,
                "object": "model",
                "created": self.created,
                "owned_by": "loom",
                "root": f"emulated:{self.cfg.spec}",
                "parent": None,
                "max_model_len": self.core.max_model_len,
            }
        ]
        if self.serving is not None:  # a lent GPU: its own model after the rollout's
            data.append({**data[0], "id": self.serving.model, "root": "emulated:serving"})
        return _json({"object": "list", "data": data})

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await _body(request)
        if isinstance(body, web.Response):
            return body
        if not isinstance(body.get("prompt"), str):
            return _bad("prompt must be a string (chat messages are not emulated)")
        tokens = tokenize(body["prompt"])
        return _json(
            {
                "count": len(tokens),
                "max_model_len": self.core.max_model_len,
                "tokens": tokens,
                "token_strs": None,
            }
        )

    async def detokenize(self, request: web.Request) -> web.Response:
        body = await _body(request)
        if isinstance(body, web.Response):
            return body
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            return _bad("tokens must be a list of token ids")
        return _json({"prompt": detokenize(tokens)})

    async def metrics(self, request: web.Request) -> web.Response:
        return metrics_response(self.registry)

    async def requests(self, request: web.Request) -> web.Response:
        """Every request received (the latest 200,000): emulated seconds of its arrival,
        admission and end, its prompt, cached and output tokens, priority and finish."""
        return _json(list(self.core.log))

    async def debug_stats(self, request: web.Request) -> web.Response:
        core = self.core
        with self.clock.step():
            now = core.eng.now
        return _json(
            {
                "now_s": now,
                "running": core.running,
                "waiting": core.waiting,
                "kv_usage": core.kv_usage,
                "kv_capacity_tokens": core.capacity,
                "preemptions": core.worker.preemptions,
                "prefill_tokens": core.worker.prefill_tokens,
                "cached_hit_tokens": core.worker.cached_hit_tokens,
                "busy_s": core.worker.busy_s,
                "finished": core.finished,
                "kv_moves": core.kv,
            }
        )

    async def abort(self, request: web.Request) -> web.Response:
        body = await _body(request)
        if isinstance(body, web.Response):
            return body
        ids = body.get("request_ids")
        if ids is not None and not (isinstance(ids, list) and all(isinstance(i, str) for i in ids)):
            return _bad("request_ids must be a list of strings")
        with self.clock.step():
            n = sum(self.core.abort(_rid(i)) for i in ids) if ids else self.core.abort_all()
        return _json({"status": "aborted", "aborted": n})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await _body(request)
        if isinstance(body, web.Response):
            return body
        if self.serving is not None and body.get("model") == self.serving.model:
            return await self.serving.complete(body)
        try:
            p = _Params(body, self.cfg.model_name)
            header = request.headers.get("X-Vllm-Priority")
            if header is not None:
                p.priority = int(header)
        except NotFound as exc:
            return _bad(exc)
        except (InvalidRequest, ValueError) as exc:
            return _bad(str(exc))
        rid = request.headers.get("X-Request-Id") or body.get("request_id") or uuid.uuid4().hex
        if not isinstance(rid, str):
            return _bad("request_id must be a string")
        try:
            with self.clock.step():
                req = self.core.submit(
                    rid,
                    p.prompt,
                    p.max_tokens,
                    min_tokens=p.min_tokens,
                    ignore_eos=p.ignore_eos,
                    stop_token_ids=p.stop_token_ids,
                    priority=p.priority,
                )
        except InvalidRequest as exc:
            return _bad(exc)
        try:
            if p.stream:
                return await self._stream(request, req, p)
            return await self._whole(req, p)
        finally:
            if not req.done:  # the client went away: abort, as vLLM does
                with self.clock.step():
                    self.core.abort_request(req)
            self.streams.pop(req, None)

    async def _whole(self, req: Request, p: _Params) -> web.Response:
        ended = asyncio.Event()
        req.listener = lambda r: ended.set()
        await ended.wait()
        n = req.output_len
        out = req.gen.tokens[:n]
        choice: dict[str, Any] = {
            "index": 0,
            "text": piece(out),
            "logprobs": None,
            "finish_reason": req.finish_reason,
            "stop_reason": req.stop_reason,
            "token_ids": out if p.token_ids else None,
            "prompt_logprobs": None,
            "prompt_token_ids": req.prompt if p.token_ids else None,
        }
        if p.logprobs is not None:
            choice["logprobs"] = logprobs_block(req.prompt, out, p.logprobs, p.as_ids, 0)
        if p.prompt_logprobs is not None:
            choice["prompt_logprobs"] = prompt_logprobs(req.prompt, p.prompt_logprobs)
        return _json(
            {
                "id": f"cmpl-{req.rid}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": self.cfg.model_name,
                "choices": [choice],
                "service_tier": None,
                "system_fingerprint": None,
                "usage": self._usage(req),
                "kv_transfer_params": None,
            }
        )

    async def _stream(self, request: web.Request, req: Request, p: _Params) -> web.StreamResponse:
        s = _Stream()
        self.streams[req] = s

        def ended(r: Request) -> None:
            s.visible = r.output_len
            s.event.set()

        req.listener = ended
        self._schedule_tick()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        head = {
            "id": f"cmpl-{req.rid}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.cfg.model_name,
        }
        sent, first = 0, True
        while True:
            await s.event.wait()
            s.event.clear()
            n, done = s.visible, req.done
            if n <= sent and not done:
                continue
            out = req.gen.tokens[sent:n]
            choice: dict[str, Any] = {
                "index": 0,
                "text": piece(out),
                "logprobs": None,
                "finish_reason": req.finish_reason if done else None,
                "stop_reason": req.stop_reason if done else None,
                "token_ids": out if p.token_ids else None,
            }
            if first and p.token_ids:
                choice["prompt_token_ids"] = req.prompt
            first = False
            if p.logprobs is not None and out:
                context = req.prompt + req.gen.tokens[:sent]
                offset = len(piece(req.gen.tokens[:sent]))
                choice["logprobs"] = logprobs_block(context, out, p.logprobs, p.as_ids, offset)
            await resp.write(b"data: " + orjson.dumps({**head, "choices": [choice]}) + b"\n\n")
            sent = n
            if done:
                break
        if p.usage:
            tail = {**head, "choices": [], "usage": self._usage(req)}
            await resp.write(b"data: " + orjson.dumps(tail) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    def _usage(self, req: Request) -> dict[str, Any]:
        n = req.output_len
        return {
            "prompt_tokens": len(req.prompt),
            "completion_tokens": n,
            "total_tokens": len(req.prompt) + n,
            "prompt_tokens_details": {"cached_tokens": req.cached},
        }


def _rid(name: str) -> str:
    """The request id in vLLM's engine name `cmpl-{id}-0`."""
    if name.startswith("cmpl-") and name.endswith("-0"):
        return name[5:-2]
    return name


async def _body(request: web.Request) -> dict[str, Any] | web.Response:
    try:
        return await read_body(request)
    except InvalidRequest as exc:
        return _bad(exc)


def serve(
    config: EmulatedEngineConfig,
    host: str = "127.0.0.1",
    port: int = 0,
    announce: Callable[[str], None] = print,
) -> None:
    """Serve until SIGINT or SIGTERM; `announce(url)` once it listens."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(4096)  # before the URL is announced: a client may connect at once
    announce(f"http://{host}:{sock.getsockname()[1]}")
    server = EmulatedServer(config)
    with contextlib.suppress(KeyboardInterrupt):
        web.run_app(
            server.app(),
            sock=sock,
            print=None,
            handler_cancellation=True,
            access_log=None,
        )
