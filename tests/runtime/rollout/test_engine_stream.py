"""The router's reading of an engine's streamed answer: whatever the socket holds is taken
in one read, however the engine's writes split or join its events, and what arrived
together goes on as one delta with the same tokens, text and logprobs."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
import orjson
import pytest
from aiohttp import web

from loom.runtime.rollout.engines import (
    NO_LOGPROBS,
    Delta,
    Done,
    EngineError,
    VllmEngine,
)
from loom.runtime.rollout.turn import LogprobSpec

T = TypeVar("T")


def vllm_events(n: int) -> list[bytes]:
    """vLLM's stream of `n` tokens (`return_token_ids`, one logprob each), then usage."""
    events = []
    for i in range(n):
        choice = {
            "index": 0,
            "text": f" w{i}",
            "token_ids": [100 + i],
            "logprobs": {
                "tokens": [f"token_id:{100 + i}"],
                "token_logprobs": [-0.5 - i],
                "top_logprobs": [{f"token_id:{100 + i}": -0.5 - i}],
            },
            "finish_reason": "length" if i == n - 1 else None,
        }
        events.append(orjson.dumps({"choices": [choice]}))
    usage = {"prompt_tokens": 3, "prompt_tokens_details": {"cached_tokens": 2}}
    events.append(orjson.dumps({"choices": [], "usage": usage}))
    return [b"data: " + e for e in events] + [b"data: [DONE]"]


def pieces(events: list[bytes], how: str, sep: bytes = b"\n\n") -> list[bytes]:
    whole = b"".join(e + sep for e in events)
    if how == "one write per event":
        return [e + sep for e in events]
    if how == "all in one write":
        return [whole]
    if how == "split mid-line":  # every write cuts an event (and a line) in two
        return [whole[i : i + 7] for i in range(0, len(whole), 7)]
    raise ValueError(how)


def run(make: Callable[[str], Awaitable[T]], writes: list[bytes]) -> T:
    """Serve `writes` (each flushed, with a pause so that each arrives alone) as an engine's
    streamed answer on loopback, and run `make(url)` against it."""

    async def main() -> T:
        async def stream(request: web.Request) -> web.StreamResponse:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for w in writes:
                await resp.write(w)
                await asyncio.sleep(0.005 if len(writes) < 50 else 0)
            await resp.write_eof()
            return resp

        app = web.Application()
        app.router.add_post("/v1/completions", stream)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            return await make(f"http://127.0.0.1:{port}")
        finally:
            await runner.cleanup()

    return asyncio.run(main())


async def generate(url: str, logprobs: LogprobSpec = NO_LOGPROBS) -> list[Delta | Done]:
    async with aiohttp.ClientSession() as session:
        engine = VllmEngine(url, session)
        engine.model = "m"
        return [
            x async for x in engine.generate("r1", [1, 2, 3], {"max_tokens": 40}, None, logprobs)
        ]


@pytest.mark.parametrize("how", ["one write per event", "all in one write", "split mid-line"])
@pytest.mark.parametrize("sep", [b"\n\n", b"\r\n\r\n"])
def test_the_same_tokens_text_and_logprobs_however_the_stream_is_cut(how: str, sep: bytes) -> None:
    n = 40
    out = run(
        lambda url: generate(url, LogprobSpec(output=True, top=0)),
        pieces(vllm_events(n), how, sep),
    )
    *deltas, done = out
    assert isinstance(done, Done) and done.finish_reason == "length" and done.cached_tokens == 2
    assert all(isinstance(d, Delta) for d in deltas)
    tokens = [t for d in deltas for t in d.tokens]  # type: ignore[union-attr]
    assert tokens == [100 + i for i in range(n)]
    assert "".join(d.text for d in deltas) == "".join(f" w{i}" for i in range(n))  # type: ignore[union-attr]
    lps = [lp.logprob for d in deltas for lp in d.logprobs]  # type: ignore[union-attr]
    assert lps == [-0.5 - i for i in range(n)]
    if how == "all in one write":  # what arrived together goes on as one delta
        assert len(deltas) == 1


def test_a_malformed_chunk_is_an_engine_error() -> None:
    events = vllm_events(3)
    events[1] = b"data: {not json"
    with pytest.raises(EngineError, match="malformed stream chunk"):
        run(generate, pieces(events, "split mid-line"))


def test_a_stream_that_ends_without_a_finish_reason_is_an_engine_error() -> None:
    events = vllm_events(3)[:1]  # one token, then the engine hangs up
    with pytest.raises(EngineError, match="without a finish reason"):
        run(generate, pieces(events, "one write per event"))


def test_an_unterminated_last_line_is_still_read() -> None:
    events = vllm_events(2)[:-1]  # no [DONE], the last event without its newline
    writes: list[Any] = pieces(events, "all in one write")
    writes[-1] = writes[-1].rstrip(b"\n")
    *deltas, done = run(generate, writes)
    assert isinstance(done, Done) and done.cached_tokens == 2
    assert [t for d in deltas for t in d.tokens] == [100, 101]  # type: ignore[union-attr]


class RecordingVllm:
    """A vLLM engine on loopback that answers every completion with `n` tokens streamed and
    records the bodies it was sent."""

    def __init__(self, n: int = 5) -> None:
        self.n = n
        self.bodies: list[dict[str, Any]] = []
        self.url = ""
        self._thread: Any = None

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for event in vllm_events(self.n):
            await resp.write(event + b"\n\n")
        await resp.write_eof()
        return resp

    async def _models(self, _: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "m", "max_model_len": 4096}]})

    async def _health(self, _: web.Request) -> web.Response:
        return web.Response()

    async def _metrics(self, _: web.Request) -> web.Response:
        return web.Response(text="vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n")

    def __enter__(self) -> RecordingVllm:
        import threading

        loop = asyncio.new_event_loop()
        started = threading.Event()
        app = web.Application()
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        runner = web.AppRunner(app)

        def serve() -> None:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, "127.0.0.1", 0)
            loop.run_until_complete(site.start())
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self.url = f"http://127.0.0.1:{port}"
            started.set()
            loop.run_forever()
            loop.run_until_complete(runner.cleanup())
            loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=serve, daemon=True)
        self._thread.start()
        started.wait(30)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)


def test_a_client_that_reads_the_answer_whole_gets_vllm_chunks_of_many_tokens() -> None:
    """The router streams from the engine either way; for a client that does not stream it
    asks vLLM for `stream_interval` tokens a chunk (a streaming client's chunks stay as the
    client asked), and the client's own value wins."""
    import httpx

    from loom.runtime.rollout import BackgroundRouter, EngineConfig, RolloutServerConfig

    with RecordingVllm() as engine:
        cfg = RolloutServerConfig(port=0, engines=(EngineConfig(url=engine.url),))
        with BackgroundRouter(cfg) as router, httpx.Client(base_url=router.url) as http:
            base = {"model": "m", "prompt": [1, 2, 3], "max_tokens": 5}
            whole = http.post("/v1/completions", json=base, timeout=60)
            assert whole.status_code == 200, whole.text
            assert whole.json()["choices"][0]["text"] == " w0 w1 w2 w3 w4"
            with http.stream("POST", "/v1/completions", json={**base, "stream": True}) as s:
                assert s.status_code == 200
                s.read()
            own = http.post("/v1/completions", json={**base, "stream_interval": 3}, timeout=60)
            assert own.status_code == 200, own.text
    sent = [b.get("stream_interval") for b in engine.bodies]
    assert sent == [cfg.stream_interval, None, 3]
    assert all(b["stream"] is True for b in engine.bodies)
