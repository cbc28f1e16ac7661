"""Talking to inference engines, token in and token out, with request ids the router chooses.

Two dialects cover the engines RL frameworks run:

* `VllmEngine`: vLLM's OpenAI server. A turn is `POST /v1/completions` with the prompt as
  token ids, `return_token_ids` (every stream chunk carries the new ids) and `request_id`
  (the engine names the request `cmpl-{request_id}-0`). An abort closes the stream (vLLM
  aborts a request whose client went away) and also names it at `POST /abort_requests`,
  served with `VLLM_SERVER_DEV_MODE=1`; that route answers 200 whether or not it aborted
  anything, so the router never trusts the answer: the tokens it counts are the ones the
  stream delivered.
* `SglangEngine`: SGLang's native `POST /generate` with `input_ids`, `rid` and
  `sampling_params`; `POST /abort_request {"rid"}` aborts. Stream chunks carry `output_ids`
  either cumulatively (SGLang's default) or incrementally (`--incremental-streaming-output`);
  the client tells them apart by `meta_info.completion_tokens`.

Both yield `Delta`s (new token ids and their text) and end with one `Done` (the finish reason
and the engine's usage), or raise `EngineError` when the engine fails (refused connection,
5xx, broken stream). Sampling parameters travel in OpenAI names (`max_tokens`, `min_tokens`,
`stop`, `temperature`, ...) and are renamed for SGLang.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from loom.runtime.rollout.config import EngineKind

__all__ = [
    "Delta",
    "Done",
    "EngineClient",
    "EngineError",
    "EngineRejected",
    "ModelInfo",
    "SglangEngine",
    "VllmEngine",
    "make_engine",
    "probe_kind",
]

_SGLANG_NAMES = {"max_tokens": "max_new_tokens", "min_tokens": "min_new_tokens"}


class EngineError(Exception):
    """The engine failed (unreachable, 5xx, a broken stream): the turn goes elsewhere."""


class EngineRejected(Exception):
    """The engine refused the request itself (4xx): the client's request is at fault."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


@dataclass(frozen=True, slots=True)
class Delta:
    tokens: list[int]
    text: str


@dataclass(frozen=True, slots=True)
class Done:
    finish_reason: str  # "stop", "length" or "abort"
    matched_stop: int | str | None = None
    cached_tokens: int = 0


@dataclass(frozen=True)
class ModelInfo:
    model: str
    kind: EngineKind
    max_model_len: int | None = None


@dataclass
class EngineClient:
    """One engine's HTTP client; `session` is the router's shared connection pool."""

    url: str
    session: aiohttp.ClientSession
    model: str = ""
    kind: EngineKind = field(init=False)

    async def probe(self) -> ModelInfo:
        raise NotImplementedError

    async def health(self, timeout_s: float) -> bool:
        try:
            async with self.session.get(
                f"{self.url}/health", timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, TimeoutError, OSError):
            return False

    def generate(
        self,
        rid: str,
        prompt: list[int],
        sampling: Mapping[str, Any],
        priority: int | None,
    ) -> AsyncIterator[Delta | Done]:
        raise NotImplementedError

    async def abort(self, rid: str) -> None:
        raise NotImplementedError

    async def tokenize(self, body: Mapping[str, Any]) -> list[int]:
        """`body` is vLLM's `/tokenize` request: {"prompt"} or {"messages", ...}."""
        data = await self._post_json("/tokenize", {"model": self.model, **body})
        tokens = data.get("tokens") if isinstance(data, dict) else None
        if not isinstance(tokens, list):
            raise EngineError(f"{self.url}/tokenize answered without tokens: {str(data)[:200]}")
        return [int(t) for t in tokens]

    async def _post_json(self, path: str, body: Mapping[str, Any]) -> Any:
        try:
            async with self.session.post(f"{self.url}{path}", json=body) as resp:
                text = await resp.text()
                _raise_for(resp.status, text, self.url + path)
                return json.loads(text)
        except (aiohttp.ClientError, OSError, json.JSONDecodeError) as exc:
            raise EngineError(f"{self.url}{path}: {exc!r}") from exc

    async def _get_json(self, path: str, timeout_s: float = 10.0) -> Any:
        async with self.session.get(
            f"{self.url}{path}", timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as resp:
            text = await resp.text()
            _raise_for(resp.status, text, self.url + path)
            return json.loads(text)

    async def _chunks(self, path: str, body: Mapping[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """The chunks of a streamed POST; any failure of the engine is an `EngineError`."""
        where = f"{self.url}{path}"
        try:
            async with self.session.post(where, json=body) as resp:
                if resp.status >= 400:
                    _raise_for(resp.status, await resp.text(), where)
                async for chunk in _sse(resp):
                    if "error" in chunk:
                        raise EngineError(f"engine error mid-stream: {chunk['error']}")
                    yield chunk
        except (aiohttp.ClientError, OSError) as exc:
            raise EngineError(f"{where}: {exc!r}") from exc

    async def _post_quietly(self, path: str, body: Mapping[str, Any]) -> None:
        try:
            async with self.session.post(
                f"{self.url}{path}", json=body, timeout=aiohttp.ClientTimeout(total=5.0)
            ) as resp:
                await resp.read()
        except (aiohttp.ClientError, OSError, TimeoutError):
            pass  # the stream's close already stops the request at most engines


def _raise_for(status: int, text: str, where: str) -> None:
    if status < 400:
        return
    detail = text[:500]
    try:
        body = json.loads(text)
        if isinstance(body, dict):
            err = body.get("error", body.get("detail", body.get("message", detail)))
            detail = err.get("message", str(err)) if isinstance(err, dict) else str(err)
    except json.JSONDecodeError:
        pass
    if 400 <= status < 500 and status not in (404, 408, 429):
        raise EngineRejected(status, f"engine refused the request: {detail}")
    raise EngineError(f"{where} answered {status}: {detail}")


async def _sse(resp: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
    """The JSON objects of a server-sent-event stream, up to `[DONE]`."""
    async for raw in resp.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            return
        try:
            yield json.loads(payload)
        except json.JSONDecodeError as exc:
            raise EngineError(f"malformed stream chunk {payload[:200]!r}") from exc


@dataclass
class VllmEngine(EngineClient):
    def __post_init__(self) -> None:
        self.kind = EngineKind.VLLM

    async def probe(self) -> ModelInfo:
        data = await self._get_json("/v1/models")
        models = data.get("data") or []
        if not models:
            raise EngineError(f"{self.url}/v1/models lists no model")
        self.model = str(models[0]["id"])
        return ModelInfo(self.model, self.kind, models[0].get("max_model_len"))

    async def generate(
        self,
        rid: str,
        prompt: list[int],
        sampling: Mapping[str, Any],
        priority: int | None,
    ) -> AsyncIterator[Delta | Done]:
        body: dict[str, Any] = {
            **sampling,
            "model": self.model,
            "prompt": prompt,
            "stream": True,
            "return_token_ids": True,
            "request_id": rid,
            "stream_options": {"include_usage": True},
        }
        if priority is not None:
            body["priority"] = priority
        finish: str | None = None
        stop: int | str | None = None
        cached = 0
        async for chunk in self._chunks("/v1/completions", body):
            usage = chunk.get("usage") or {}
            details = usage.get("prompt_tokens_details") or {}
            cached = int(details.get("cached_tokens") or cached)
            for choice in chunk.get("choices") or ():
                ids = choice.get("token_ids") or []
                text = choice.get("text") or ""
                if ids or text:
                    yield Delta([int(t) for t in ids], text)
                if choice.get("finish_reason"):
                    finish = choice["finish_reason"]
                    stop = choice.get("stop_reason")
        if finish is None:
            raise EngineError(f"{self.url}: the stream of {rid} ended without a finish reason")
        yield Done(finish, stop, cached)

    async def abort(self, rid: str) -> None:
        await self._post_quietly("/abort_requests", {"request_ids": [f"cmpl-{rid}-0"]})


@dataclass
class SglangEngine(EngineClient):
    def __post_init__(self) -> None:
        self.kind = EngineKind.SGLANG

    async def probe(self) -> ModelInfo:
        data = await self._get_json("/get_model_info")
        self.model = str(data.get("model_path") or data.get("served_model_name") or "model")
        return ModelInfo(self.model, self.kind, data.get("max_total_num_tokens"))

    async def generate(
        self,
        rid: str,
        prompt: list[int],
        sampling: Mapping[str, Any],
        priority: int | None,
    ) -> AsyncIterator[Delta | Done]:
        params = {_SGLANG_NAMES.get(k, k): v for k, v in sampling.items() if k != "n"}
        body: dict[str, Any] = {
            "input_ids": prompt,
            "sampling_params": params,
            "rid": rid,
            "stream": True,
        }
        if priority is not None:
            body["priority"] = priority
        seen_ids = 0
        seen_text = 0
        done: Done | None = None
        async for chunk in self._chunks("/generate", body):
            meta = chunk.get("meta_info") or {}
            ids = [int(t) for t in chunk.get("output_ids") or ()]
            total = int(meta.get("completion_tokens", seen_ids + len(ids)))
            cumulative = len(ids) == total and total > 0  # SGLang's default stream
            if cumulative:  # keep only what is new, of the ids and of the text
                ids = ids[seen_ids:]
            seen_ids = total
            text = chunk.get("text") or ""
            if cumulative:
                new_text, seen_text = text[seen_text:], len(text)
            else:
                new_text = text
            if ids or new_text:
                yield Delta(ids, new_text)
            reason = meta.get("finish_reason")
            if reason:
                kind = reason.get("type") if isinstance(reason, dict) else str(reason)
                matched = reason.get("matched") if isinstance(reason, dict) else None
                done = Done(str(kind), matched, int(meta.get("cached_tokens") or 0))
        if done is None:
            raise EngineError(f"{self.url}: the stream of {rid} ended without a finish reason")
        yield done

    async def abort(self, rid: str) -> None:
        await self._post_quietly("/abort_request", {"rid": rid})


async def probe_kind(url: str, session: aiohttp.ClientSession) -> EngineKind:
    """SGLang answers `/get_model_info`; vLLM and other OpenAI servers `/v1/models`."""
    for path, kind in (("/get_model_info", EngineKind.SGLANG), ("/v1/models", EngineKind.VLLM)):
        try:
            async with session.get(f"{url}{path}", timeout=aiohttp.ClientTimeout(total=10)) as r:
                if r.status == 200:
                    return kind
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise EngineError(f"engine {url} is unreachable: {exc}") from exc
    raise EngineError(f"engine {url} answers neither /get_model_info (SGLang) nor /v1/models")


def make_engine(kind: EngineKind, url: str, session: aiohttp.ClientSession) -> EngineClient:
    if kind is EngineKind.SGLANG:
        return SglangEngine(url, session)
    if kind is EngineKind.VLLM:
        return VllmEngine(url, session)
    raise ValueError(f"probe the engine kind first, got {kind}")
