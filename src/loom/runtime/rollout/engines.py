"""Talking to inference engines, token in and token out, with request ids the router chooses.

Two dialects cover the engines RL frameworks run:

* `VllmEngine`: vLLM's OpenAI server. A turn is `POST /v1/completions` with the prompt as
  token ids, `return_token_ids` (every stream chunk carries the new ids) and `request_id`
  (the engine names the request `cmpl-{request_id}-0`). Logprobs are asked with
  `return_tokens_as_token_ids`, so that every alternative comes back as a token id. Prompt
  logprobs exist only in vLLM's non-streamed answer: an attempt that needs them is not
  streamed. An abort closes the stream (vLLM aborts a request whose client went away) and
  also names it at `POST /abort_requests`, served with `VLLM_SERVER_DEV_MODE=1`; that route
  answers 200 whether or not it aborted anything, so the router never trusts the answer: the
  tokens it counts are the ones the stream delivered.
* `SglangEngine`: SGLang's native `POST /generate` with `input_ids`, `rid`,
  `sampling_params` and `return_logprob`; `POST /abort_request {"rid"}` aborts. Stream chunks
  carry `output_ids` (and the output logprobs) either cumulatively (SGLang's default) or
  incrementally (`--incremental-streaming-output`); the client tells them apart by
  `meta_info.completion_tokens`.

Both yield `Delta`s (new token ids, their text and logprobs) and end with one `Done` (the
finish reason and the engine's usage), or raise `EngineError` when the engine fails (refused
connection, 5xx, a broken stream). Every call but a stream's body has a deadline
(`call_timeout_s`); a stream's progress is the driver's to time.

Each engine also says how loaded it is (`load`, an `EngineLoad`): vLLM in its Prometheus
`/metrics` (`vllm:num_requests_running`, `vllm:num_requests_waiting`,
`vllm:kv_cache_usage_perc`), SGLang at `/v1/loads` (`num_running_reqs`, `num_waiting_reqs`,
`token_usage`, `max_running_requests`; older releases: `/get_load`). The router forwards a
turn at once while its engine has room by these words, and passes its scheduler's key as the
request's `priority`: vLLM runs lower values first, SGLang higher ones (unless started with
`--schedule-low-priority-values-first`, which its `/get_server_info` says).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from yarl import URL

from loom.core.errors import ConfigError, UpstreamError
from loom.perf.transfer import KvLinks
from loom.runtime.rollout.config import EngineKind
from loom.runtime.rollout.fields import sglang_sampling, vllm_sampling
from loom.runtime.rollout.turn import (
    Delta,
    Done,
    EngineLoad,
    LogprobSpec,
    PromptLogprob,
    TokenLogprob,
)

__all__ = [
    "Delta",
    "Done",
    "EngineClient",
    "EngineError",
    "EngineLoad",
    "EngineRejected",
    "EngineUnreachable",
    "ModelInfo",
    "NoSuchRoute",
    "PriorityRefused",
    "SglangEngine",
    "VllmEngine",
    "make_engine",
    "probe_kind",
]

_loads = orjson.loads
_dumps = orjson.dumps
_JSON = {"Content-Type": "application/json"}
log = logging.getLogger("loom.rollout")

STORE_GBS = 0.2
"""GB/s a KV store moves at where its engines do not say: a save of 48 MB took 0.24 s, its
decode step included, on tmpfs with vLLM's CPU build (`benchmarks/bench_vllm_kv_move.py`)."""
NO_LOGPROBS = LogprobSpec()


class EngineError(UpstreamError):
    """The engine failed (unreachable, 5xx, a broken stream, a deadline): the turn goes
    elsewhere."""


class EngineUnreachable(EngineError):
    """The engine refused the connection: it is down."""


class NoSuchRoute(EngineError):
    """The engine answered 404: it has no such route (an older version of it)."""


class EngineRejected(UpstreamError):
    """The engine refused the request itself (a 4xx, relayed): the client's request is at
    fault."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail, status)
        self.detail = detail


class PriorityRefused(EngineRejected):
    """The engine refused the request's `priority` field (vLLM without
    `--scheduling-policy priority`): it schedules first come, first served."""


@dataclass(frozen=True)
class ModelInfo:
    model: str
    kind: EngineKind
    max_model_len: int | None = None
    root: str | None = None  # where the engine loaded the model from, if it says
    max_running: int | None = None  # requests it runs at once, where it says (SGLang)
    # whether it schedules by the request's priority, where it says (SGLang); None: unknown
    priority: bool | None = None


@dataclass
class EngineClient:
    """One engine's HTTP client; `session` is the router's shared connection pool."""

    url: str
    session: aiohttp.ClientSession
    call_timeout_s: float = 10.0
    model: str = ""
    kind: EngineKind = field(init=False)
    # the engine runs higher `priority` values first (SGLang's default); vLLM: lower first
    high_first: bool = field(default=False, init=False)
    _urls: dict[str, URL] = field(default_factory=dict, init=False, repr=False)
    _headers: dict[str, str] = field(default_factory=lambda: dict(_JSON), init=False, repr=False)
    _no_coserve: bool = field(default=False, init=False, repr=False)  # no /loom/coserve there

    @property
    def token(self) -> str | None:
        auth = self._headers.get("Authorization")
        return auth[7:] if auth else None

    @token.setter
    def token(self, token: str | None) -> None:
        """The engine's bearer token (vLLM --api-key), sent with every call."""
        self._headers = {**_JSON, **({"Authorization": f"Bearer {token}"} if token else {})}

    async def probe(self) -> ModelInfo:
        raise NotImplementedError

    async def health(self, timeout_s: float) -> bool:
        try:
            async with self.session.get(
                f"{self.url}/health",
                timeout=aiohttp.ClientTimeout(total=timeout_s),
                headers=self._headers,
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
        logprobs: LogprobSpec = NO_LOGPROBS,
    ) -> AsyncIterator[Delta | Done]:
        raise NotImplementedError

    async def abort(self, rid: str) -> None:
        raise NotImplementedError

    async def kv_links(self) -> KvLinks | None:
        """What the engine's KV moves over, where it moves KV to other engines; None: it
        does not."""
        return None

    async def send_kv(self, tokens: list[int], to: str) -> tuple[int, float]:
        """Copy the KV it holds of `tokens` to the engine at `to`: the tokens that arrived
        and the engine's seconds the copy took."""
        raise EngineError(f"{self.url} moves no KV to other engines")

    async def coserve(self) -> tuple[int, float] | None:
        """A lent engine's side (ROSE): the rollout KV tokens it can still take and its
        serving-SLO slack, where it says them at `GET /loom/coserve` (Loom's emulated
        co-serving engines); None where it does not (its side reports to the router)."""
        if self._no_coserve:
            return None
        try:
            data = await self._get_json("/loom/coserve")
            slack = data["slack_s"]
            return int(data["free_tokens"]), math.inf if slack is None else float(slack)
        except NoSuchRoute:
            self._no_coserve = True
            return None
        except (KeyError, TypeError, ValueError) as exc:
            raise EngineError(f"{self.url}/loom/coserve answered oddly: {exc!r}") from exc

    async def load(self) -> EngineLoad:
        """What the engine says of its load now (`EngineError` where it says nothing)."""
        raise EngineError(f"{self.url}: this kind of engine says nothing of its load")

    async def tokenize(self, body: Mapping[str, Any]) -> list[int]:
        """`body` is vLLM's `/tokenize` request: {"prompt"} or {"messages", ...}."""
        data = await self._post_json("/tokenize", {"model": self.model, **body})
        tokens = data.get("tokens") if isinstance(data, dict) else None
        if not isinstance(tokens, list):
            raise EngineError(f"{self.url}/tokenize answered without tokens: {str(data)[:200]}")
        return [int(t) for t in tokens]

    def _timeout(self) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(total=self.call_timeout_s)

    async def _post_json(self, path: str, body: Mapping[str, Any]) -> Any:
        return self._decode(path, await self._call("POST", path, _dumps(body)))

    async def _get_json(self, path: str) -> Any:
        return self._decode(path, await self._call("GET", path, None))

    async def _get(self, path: str) -> bytes:
        return await self._call("GET", path, None)

    def _decode(self, path: str, raw: bytes) -> Any:
        try:
            return _loads(raw)
        except ValueError as exc:
            raise EngineError(f"{self.url}{path} answered no JSON: {raw[:200]!r}") from exc

    async def _call(self, method: str, path: str, data: bytes | None) -> bytes:
        """A call with the engine's deadline; any failure is an `EngineError`."""
        where = f"{self.url}{path}"
        try:
            async with self.session.request(
                method, where, data=data, headers=self._headers, timeout=self._timeout()
            ) as resp:
                raw = await resp.read()
                _raise_for(resp.status, raw, where)
                return raw
        except aiohttp.ClientConnectorError as exc:
            raise EngineUnreachable(f"engine {self.url} is unreachable: {exc}") from exc
        except TimeoutError as exc:
            raise EngineError(f"{where}: no answer in {self.call_timeout_s:g} s") from exc
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            raise EngineError(f"{where}: {exc!r}") from exc

    def _url(self, path: str) -> URL:
        url = self._urls.get(path)
        if url is None:
            url = self._urls[path] = URL(f"{self.url}{path}")
        return url

    async def _chunks(
        self, path: str, body: Mapping[str, Any]
    ) -> AsyncIterator[list[dict[str, Any]]]:
        """The chunks of a streamed POST, as many at a time as have arrived; any failure of
        the engine is an `EngineError`."""
        where = self._url(path)
        try:
            async with self.session.post(where, data=_dumps(body), headers=self._headers) as resp:
                if resp.status >= 400:
                    _raise_for(resp.status, await resp.read(), str(where))
                async for batch in _sse(resp):
                    for chunk in batch:
                        if "error" in chunk:
                            raise EngineError(f"engine error mid-stream: {chunk['error']}")
                    yield batch
        except aiohttp.ClientConnectorError as exc:
            raise EngineUnreachable(f"{where}: {exc}") from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise EngineError(f"{where}: {exc!r}") from exc

    async def _post_quietly(self, path: str, body: Mapping[str, Any]) -> None:
        try:
            async with self.session.post(
                f"{self.url}{path}",
                data=_dumps(body),
                headers=self._headers,
                timeout=aiohttp.ClientTimeout(total=5.0),
            ) as resp:
                await resp.read()
        except (aiohttp.ClientError, OSError, TimeoutError):
            pass  # the stream's close already stops the request at most engines


def _raise_for(status: int, raw: bytes, where: str) -> None:
    if status < 400:
        return
    text = raw.decode(errors="replace")
    detail = text[:500]
    try:
        body = json.loads(text)
        if isinstance(body, dict):
            err = body.get("error", body.get("detail", body.get("message", detail)))
            detail = err.get("message", str(err)) if isinstance(err, dict) else str(err)
    except json.JSONDecodeError:
        pass
    if 400 <= status < 500 and status not in (404, 408, 429):
        # NOTE: vLLM names the field in its answer and gives no code: the message is the
        # one place the refusal can be told apart, here where the engine's answer is read
        kind = PriorityRefused if "priorit" in detail.lower() else EngineRejected
        raise kind(status, f"engine refused the request: {detail}")
    if status == 404:
        raise NoSuchRoute(f"{where} answered 404: {detail}")
    raise EngineError(f"{where} answered {status}: {detail}")


async def _sse(resp: aiohttp.ClientResponse) -> AsyncIterator[list[dict[str, Any]]]:
    """The JSON objects of a server-sent-event stream, up to `[DONE]`, as many at a time as
    have arrived. NOTE: one read of whatever the socket holds, not a readline per line: a
    router behind on its reads takes a backlog of chunks in one pass (and hands it on as one
    delta), so that its cost per token falls as its load rises."""
    partial: list[bytes] = []  # a line not yet ended
    async for data in resp.content.iter_any():
        if b"\n" not in data:
            partial.append(data)
            continue
        if partial:
            partial.append(data)
            data = b"".join(partial)
            partial.clear()
        lines = data.split(b"\n")
        tail = lines.pop()
        if tail:
            partial.append(tail)
        batch: list[dict[str, Any]] = []
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                if batch:
                    yield batch
                # NOTE: read the stream to its end, so that the connection goes back to the
                # pool (a response left unread closes it: a new connection per turn)
                await resp.read()
                return
            try:
                batch.append(_loads(payload))
            except ValueError as exc:
                raise EngineError(f"malformed stream chunk {payload[:200]!r}") from exc
        if batch:
            yield batch
    tail = b"".join(partial)
    if tail.startswith(b"data:") and tail[5:].strip() != b"[DONE]":
        try:
            yield [_loads(tail[5:].strip())]
        except ValueError as exc:
            raise EngineError(f"malformed stream chunk {tail[:200]!r}") from exc


def _coalesce(deltas: list[Delta]) -> list[Delta]:
    """Consecutive deltas as one where they are alike (logprobs on all or none, prompt
    logprobs only on the first): what arrived in one read goes on in one piece."""
    runs: list[list[Delta]] = []
    for d in deltas:
        last = runs[-1][-1] if runs else None
        if (
            last is None
            or d.prompt_logprobs is not None
            or (last.logprobs is None) != (d.logprobs is None)
        ):
            runs.append([d])
        else:
            runs[-1].append(d)
    return [
        run[0]
        if len(run) == 1
        else Delta(
            [t for d in run for t in d.tokens],
            "".join(d.text for d in run),
            None if run[0].logprobs is None else [x for d in run for x in d.logprobs or ()],
            run[0].prompt_logprobs,
        )
        for run in runs
    ]


# ---- vLLM ----------------------------------------------------------------------------------


def _token_id(name: str) -> int:
    """vLLM's `token_id:N` (return_tokens_as_token_ids) as N."""
    if name.startswith("token_id:"):
        return int(name[9:])
    raise EngineError(f"expected a token_id:N logprob token, got {name!r}")


def _vllm_logprobs(ids: Sequence[int], lp: Mapping[str, Any]) -> list[TokenLogprob]:
    values = lp.get("token_logprobs") or []
    tops = lp.get("top_logprobs") or []
    out = []
    for j in range(len(ids)):
        value = values[j] if j < len(values) else None
        top = tops[j] if j < len(tops) and tops[j] else {}
        alts = tuple((_token_id(k), float(v)) for k, v in top.items())
        # NOTE: vLLM's order: the sampled token first, then by rank
        out.append(TokenLogprob(float(value) if value is not None else float("nan"), alts))
    return out


def _vllm_prompt_logprobs(prompt: Sequence[int], rows: Sequence[Any]) -> list[PromptLogprob]:
    out = []
    for i, tid in enumerate(prompt):
        row = rows[i] if i < len(rows) else None
        if not row:
            out.append(PromptLogprob(tid, None))
            continue
        entries = sorted(
            ((int(k), v) for k, v in row.items()), key=lambda kv: kv[1].get("rank") or 0
        )
        own = row.get(str(tid)) or {}
        out.append(
            PromptLogprob(
                tid,
                float(own["logprob"]) if "logprob" in own else None,
                own.get("rank"),
                tuple((k, float(v["logprob"])) for k, v in entries),
            )
        )
    return out


@dataclass
class VllmEngine(EngineClient):
    def __post_init__(self) -> None:
        self.kind = EngineKind.VLLM
        self.kv_store: str | None = None  # the store its KV moves through (`kv_links`)

    async def probe(self) -> ModelInfo:
        data = await self._get_json("/v1/models")
        models = data.get("data") or []
        if not models:
            raise EngineError(f"{self.url}/v1/models lists no model")
        self.model = str(models[0]["id"])
        return ModelInfo(
            self.model, self.kind, models[0].get("max_model_len"), models[0].get("root")
        )

    def _body(
        self,
        rid: str,
        prompt: list[int],
        sampling: Mapping[str, Any],
        priority: int | None,
        logprobs: LogprobSpec,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            **vllm_sampling(sampling),
            "model": self.model,
            "prompt": prompt,
            "return_token_ids": True,
            "request_id": rid,
        }
        if logprobs.output:
            body["logprobs"] = logprobs.top
            body["return_tokens_as_token_ids"] = True
        if logprobs.prompt_start is not None:
            body["prompt_logprobs"] = logprobs.prompt_top
        if priority is not None:
            body["priority"] = priority
        return body

    async def generate(
        self,
        rid: str,
        prompt: list[int],
        sampling: Mapping[str, Any],
        priority: int | None,
        logprobs: LogprobSpec = NO_LOGPROBS,
    ) -> AsyncIterator[Delta | Done]:
        body = self._body(rid, prompt, sampling, priority, logprobs)
        if logprobs.prompt_start is not None:
            # NOTE: vLLM returns prompt logprobs only in its non-streamed answer
            async for item in self._whole(rid, prompt, body, logprobs.prompt_start):
                yield item
            return
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        finish: str | None = None
        stop: int | str | None = None
        cached = 0
        async for batch in self._chunks("/v1/completions", body):
            deltas: list[Delta] = []
            for chunk in batch:
                usage = chunk.get("usage")
                if usage:
                    details = usage.get("prompt_tokens_details") or {}
                    cached = int(details.get("cached_tokens") or cached)
                for choice in chunk.get("choices") or ():
                    ids = choice.get("token_ids") or []
                    text = choice.get("text") or ""
                    if ids or text:
                        lp = choice.get("logprobs")
                        deltas.append(
                            Delta(ids, text, _vllm_logprobs(ids, lp) if lp and ids else None)
                        )
                    if choice.get("finish_reason"):
                        finish = choice["finish_reason"]
                        stop = choice.get("stop_reason")
            for delta in _coalesce(deltas):
                yield delta
        if finish is None:
            raise EngineError(f"{self.url}: the stream of {rid} ended without a finish reason")
        yield Done(finish, stop, cached)

    async def _whole(
        self, rid: str, prompt: list[int], body: dict[str, Any], start: int
    ) -> AsyncIterator[Delta | Done]:
        where = f"{self.url}/v1/completions"
        try:
            async with self.session.post(where, data=_dumps(body), headers=self._headers) as resp:
                raw = await resp.read()
                _raise_for(resp.status, raw, where)
                data = _loads(raw)
        except aiohttp.ClientConnectorError as exc:
            raise EngineUnreachable(f"{where}: {exc}") from exc
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            raise EngineError(f"{where}: {exc!r}") from exc
        choices = data.get("choices") or []
        if not choices:
            raise EngineError(f"{where}: the answer to {rid} has no choice")
        choice = choices[0]
        ids = choice.get("token_ids") or []
        lp = choice.get("logprobs")
        usage = data.get("usage") or {}
        cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        yield Delta(
            ids,
            choice.get("text") or "",
            _vllm_logprobs(ids, lp) if lp and ids else None,
            _vllm_prompt_logprobs(prompt, choice.get("prompt_logprobs") or [])[start:],
        )
        yield Done(choice.get("finish_reason") or "stop", choice.get("stop_reason"), cached)

    async def abort(self, rid: str) -> None:
        await self._post_quietly("/abort_requests", {"request_ids": [f"cmpl-{rid}-0"]})

    async def kv_links(self) -> KvLinks | None:
        """Loom's emulated engines say it at `/loom/kv`; a vLLM engine with Loom's KV
        connector (`loom.runtime.engine.kv_connector`) in its configuration, which dev mode
        serves at `/server_info`, moves KV through its store."""
        try:
            data = await self._get_json("/loom/kv")
            self.kv_store = None
            return KvLinks(**data["links"])
        except (EngineError, EngineRejected, KeyError, TypeError, ConfigError):
            pass
        try:
            info = await self._get_json("/server_info?config_format=json")
            transfer = info["vllm_config"]["kv_transfer_config"] or {}
        except (EngineError, EngineRejected, KeyError, TypeError):
            return None
        if transfer.get("kv_connector") != "LoomKVConnector":
            return None
        extra = transfer.get("kv_connector_extra_config") or {}
        try:
            links = KvLinks(
                node=int(extra.get("node", 0)),
                kv_bytes_per_token=int(extra["kv_bytes_per_token"]),
                nvlink_gbs=float(extra.get("store_gbs", STORE_GBS)),
                network_gbs=float(extra.get("store_gbs", STORE_GBS)),
                store=str(extra["path"]),
            )
        except (KeyError, TypeError, ValueError, ConfigError) as exc:
            log.warning("%s: Loom's KV connector without what the router needs (%s)", self.url, exc)
            return None
        self.kv_store = links.store
        return links

    async def send_kv(self, tokens: list[int], to: str) -> tuple[int, float]:
        if self.kv_store is not None:
            return await self._save_kv(tokens)
        data = await self._post_json("/loom/kv/send", {"tokens": tokens, "to": to})
        try:
            return int(data["tokens"]), float(data["seconds"])
        except (KeyError, TypeError, ValueError) as exc:
            raise EngineError(f"{self.url}/loom/kv/send answered {str(data)[:200]}") from exc

    async def _save_kv(self, tokens: list[int]) -> tuple[int, float]:
        """Into the store the engines share: one token generated over `tokens` (a hit in
        the engine's prefix cache) with `loom_save`, so that its connector writes their full
        blocks; the engine they move to loads them with its next turn's prefill."""
        body = {
            "model": self.model,
            "prompt": tokens,
            "max_tokens": 1,
            "temperature": 0.0,
            "kv_transfer_params": {"loom_save": True},
        }
        start = time.monotonic()
        data = await self._post_json("/v1/completions", body)
        seconds = time.monotonic() - start
        try:
            return int(data["kv_transfer_params"]["loom_saved_tokens"]), seconds
        except (KeyError, TypeError, ValueError) as exc:
            raise EngineError(f"{self.url}: the save answered {str(data)[:200]}") from exc

    async def load(self) -> EngineLoad:
        return vllm_load(await self._get("/metrics"), self.model)


# ---- SGLang ----------------------------------------------------------------------------------


def _sglang_top(rows: Any) -> tuple[tuple[int, float], ...]:
    return tuple((int(r[1]), float(r[0])) for r in rows or () if r and r[0] is not None)


@dataclass
class SglangEngine(EngineClient):
    def __post_init__(self) -> None:
        self.kind = EngineKind.SGLANG

    async def probe(self) -> ModelInfo:
        data = await self._get_json("/get_model_info")
        self.model = str(data.get("model_path") or data.get("served_model_name") or "model")
        # NOTE: its server arguments say how it schedules; an engine without the route (or
        # an older one) leaves them unknown
        try:
            args = await self._get_json("/get_server_info")
        except (EngineError, EngineRejected):
            args = {}
        args = args if isinstance(args, dict) else {}
        self.high_first = not args.get("schedule_low_priority_values_first", False)
        priority = args.get("enable_priority_scheduling")
        max_running = args.get("max_running_requests")
        return ModelInfo(
            self.model,
            self.kind,
            data.get("max_total_num_tokens"),
            data.get("model_path"),
            max_running=int(max_running) if isinstance(max_running, int) else None,
            priority=bool(priority) if priority is not None else None,
        )

    async def load(self) -> EngineLoad:
        try:
            return sglang_load(await self._get_json("/v1/loads"))
        except NoSuchRoute:
            pass
        return sglang_load(await self._get_json("/get_load"))  # before /v1/loads

    async def generate(
        self,
        rid: str,
        prompt: list[int],
        sampling: Mapping[str, Any],
        priority: int | None,
        logprobs: LogprobSpec = NO_LOGPROBS,
    ) -> AsyncIterator[Delta | Done]:
        params = sglang_sampling(sampling)
        experts = params.pop("return_routed_experts", None)
        start = params.pop("routed_experts_start_len", None)
        extra_key = params.pop("extra_key", None)
        salt = params.pop("cache_salt", None)
        body: dict[str, Any] = {
            "input_ids": prompt,
            "sampling_params": params,
            "rid": rid,
            "stream": True,
        }
        for name, value in (
            ("return_routed_experts", experts),
            ("routed_experts_start_len", start),
            ("extra_key", extra_key),
            ("cache_salt", salt),
        ):
            if value is not None:
                body[name] = value
        if logprobs.any:
            body["return_logprob"] = True
            body["top_logprobs_num"] = max(logprobs.top, logprobs.prompt_top)
            body["logprob_start_len"] = (
                logprobs.prompt_start if logprobs.prompt_start is not None else -1
            )
        if priority is not None:
            body["priority"] = priority
        seen_ids = seen_text = seen_lp = 0
        prompt_done = logprobs.prompt_start is None
        done: Done | None = None
        async for batch in self._chunks("/generate", body):
            deltas: list[Delta] = []
            for chunk in batch:
                meta = chunk.get("meta_info") or {}
                ids = chunk.get("output_ids") or []
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
                lps: list[TokenLogprob] | None = None
                if logprobs.output:
                    rows = meta.get("output_token_logprobs") or []
                    tops = meta.get("output_top_logprobs") or []
                    if len(rows) == total:  # cumulative
                        rows, tops = rows[seen_lp:], tops[seen_lp:]
                    seen_lp = total
                    lps = [
                        TokenLogprob(float(r[0]), _sglang_top(tops[j] if j < len(tops) else ()))
                        for j, r in enumerate(rows)
                    ]
                plp = None
                if not prompt_done and meta.get("input_token_logprobs") is not None:
                    prompt_done = True
                    tops_in = meta.get("input_top_logprobs") or []
                    plp = [
                        PromptLogprob(
                            int(r[1]),
                            None if r[0] is None else float(r[0]),
                            None,
                            _sglang_top(tops_in[j] if j < len(tops_in) else ()),
                        )
                        for j, r in enumerate(meta["input_token_logprobs"])
                    ]
                if ids or new_text or plp is not None:
                    deltas.append(Delta(ids, new_text, lps, plp))
                reason = meta.get("finish_reason")
                if reason:
                    kind = reason.get("type") if isinstance(reason, dict) else str(reason)
                    matched = reason.get("matched") if isinstance(reason, dict) else None
                    message = reason.get("message") if isinstance(reason, dict) else None
                    done = Done(
                        str(kind),
                        matched,
                        int(meta.get("cached_tokens") or 0),
                        message,
                        meta.get("routed_experts"),
                    )
            for delta in _coalesce(deltas):
                yield delta
        if done is None:
            raise EngineError(f"{self.url}: the stream of {rid} ended without a finish reason")
        yield done

    async def abort(self, rid: str) -> None:
        await self._post_quietly("/abort_request", {"rid": rid})


_VLLM_LOAD = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")


def vllm_load(metrics: bytes, model: str = "") -> EngineLoad:
    """vLLM's load from its Prometheus text: running and waiting requests summed over its
    engine cores, the fullest core's KV-cache use; the samples labelled `model` where any
    are."""
    from prometheus_client.parser import text_string_to_metric_families

    # NOTE: only the three gauges' samples are parsed: the whole text is tens of kB
    heads = tuple((name + "{").encode() for name in _VLLM_LOAD) + tuple(
        (name + " ").encode() for name in _VLLM_LOAD
    )
    wanted = b"\n".join(ln for ln in metrics.split(b"\n") if ln.startswith(heads))
    try:
        families = list(text_string_to_metric_families(wanted.decode(errors="replace") + "\n"))
    except ValueError as exc:
        raise EngineError(f"malformed vLLM metrics: {exc}") from exc
    samples = [x for family in families for x in family.samples]
    mine = [x for x in samples if x.labels.get("model_name") == model]
    values: dict[str, list[float]] = {}
    for sample in mine or samples:
        values.setdefault(sample.name, []).append(sample.value)
    if _VLLM_LOAD[0] not in values or _VLLM_LOAD[1] not in values:
        raise EngineError("the engine's /metrics has no vllm:num_requests_running/waiting")
    kv = values.get(_VLLM_LOAD[2])
    return EngineLoad(
        running=round(sum(values[_VLLM_LOAD[0]])),
        waiting=round(sum(values[_VLLM_LOAD[1]])),
        kv_usage=max(kv) if kv else None,
    )


def sglang_load(data: Any) -> EngineLoad:
    """SGLang's load, summed over its data-parallel ranks: `/v1/loads` ({"loads": [...]} with
    `num_running_reqs`, `num_waiting_reqs`, `token_usage`, `max_running_requests`) or the
    older `/get_load` ([{"num_reqs" (running + waiting), "num_waiting_reqs"}])."""
    ranks = data.get("loads") if isinstance(data, dict) else data
    if not isinstance(ranks, list) or not ranks or not all(isinstance(r, dict) for r in ranks):
        raise EngineError(f"an SGLang load report without loads: {str(data)[:200]}")
    try:
        waiting = sum(int(r["num_waiting_reqs"]) for r in ranks)
        if all("num_running_reqs" in r for r in ranks):
            running = sum(int(r["num_running_reqs"]) for r in ranks)
        else:
            running = sum(int(r["num_reqs"]) for r in ranks) - waiting
        usage = [float(r["token_usage"]) for r in ranks if r.get("token_usage") is not None]
        caps = [int(r["max_running_requests"]) for r in ranks if r.get("max_running_requests")]
    except (KeyError, TypeError, ValueError) as exc:
        raise EngineError(f"a malformed SGLang load report: {str(data)[:200]}") from exc
    return EngineLoad(
        running=running,
        waiting=waiting,
        kv_usage=max(usage) if usage else None,
        max_running=sum(caps) if len(caps) == len(ranks) else None,
    )


async def probe_kind(
    url: str, session: aiohttp.ClientSession, timeout_s: float = 10.0, token: str | None = None
) -> EngineKind:
    """SGLang answers `/get_model_info`; vLLM and other OpenAI servers `/v1/models`."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    for path, kind in (("/get_model_info", EngineKind.SGLANG), ("/v1/models", EngineKind.VLLM)):
        try:
            async with session.get(
                f"{url}{path}", timeout=aiohttp.ClientTimeout(total=timeout_s), headers=headers
            ) as r:
                if r.status == 200:
                    return kind
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise EngineUnreachable(f"engine {url} is unreachable: {exc!r}") from exc
    raise EngineError(f"engine {url} answers neither /get_model_info (SGLang) nor /v1/models")


def make_engine(
    kind: EngineKind, url: str, session: aiohttp.ClientSession, call_timeout_s: float = 10.0
) -> EngineClient:
    if kind is EngineKind.SGLANG:
        return SglangEngine(url, session, call_timeout_s)
    if kind is EngineKind.VLLM:
        return VllmEngine(url, session, call_timeout_s)
    raise ValueError(f"probe the engine kind first, got {kind}")
