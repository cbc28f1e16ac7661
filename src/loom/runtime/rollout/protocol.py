"""The request and response shapes the router speaks: OpenAI completions and chat
completions (vLLM's dialect: `return_token_ids`, `min_tokens`, `ignore_eos`, ...) and SGLang's
native `/generate` (`input_ids` or `text`, `sampling_params`, `rid`, `meta_info`).

Parsing turns a body into a `Call` (prompt, sampling parameters in OpenAI names, stream or
not); rendering turns a finished `Turn` or its deltas back into the dialect it came in.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from loom.runtime.rollout.state import Turn

__all__ = ["BadRequest", "Call", "Dialect", "parse_body", "parse_call", "trajectory_key"]

MAX_KEY = 256
DEFAULT_MAX_TOKENS = {"completions": 16, "generate": 128}  # the engines' own defaults

# sampling parameters passed through in OpenAI/vLLM names; values checked to be finite
_NUMERIC = {
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "seed",
}
_OTHER = {
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "include_stop_str_in_output",
}
_SGLANG_RENAME = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens"}
_UNSUPPORTED = ("logprobs", "top_logprobs", "echo", "best_of", "prompt_logprobs")


class BadRequest(ValueError):
    """A 4xx with this message."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class Dialect(StrEnum):
    COMPLETIONS = "completions"
    CHAT = "chat"
    GENERATE = "generate"


@dataclass
class Call:
    dialect: Dialect
    stream: bool
    sampling: dict[str, Any]
    prompt_ids: list[int] | None = None  # token-in
    tokenize: dict[str, Any] | None = None  # or an engine /tokenize body
    client_rid: str | None = None
    return_token_ids: bool = False
    include_usage: bool = False
    body_key: str | None = None  # trajectory id given in the body
    prompt_id: int | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    id: str = field(default_factory=lambda: uuid.uuid4().hex)


def _reject_constant(name: str) -> Any:
    raise BadRequest(f"{name} is not a valid JSON number")


def parse_body(raw: bytes) -> dict[str, Any]:
    if not raw:
        raise BadRequest("the request needs a JSON body")
    try:
        body = json.loads(raw, parse_constant=_reject_constant)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


def trajectory_key(headers: Any, body: dict[str, Any]) -> str | None:
    """The trajectory a request belongs to: `X-Trajectory-Id` or `trajectory_id`, else the
    keys other routers use: `X-SMG-Routing-Key` (SGLang's gateway, slime), `x-session-id` or
    `session_id` (vLLM's router). None: a one-turn trajectory."""
    for value in (
        headers.get("X-Trajectory-Id"),
        body.get("trajectory_id"),
        headers.get("X-SMG-Routing-Key"),
        headers.get("x-session-id"),
        body.get("session_id"),
    ):
        if value is None:
            continue
        if not isinstance(value, str | int) or isinstance(value, bool):
            raise BadRequest(f"a trajectory id must be a string, got {value!r}")
        key = str(value)
        if not key or len(key) > MAX_KEY:
            raise BadRequest(f"a trajectory id must have 1 to {MAX_KEY} characters")
        return key
    return None


def _token_list(value: Any, what: str) -> list[int]:
    if not isinstance(value, list) or not value:
        raise BadRequest(f"{what} must be a non-empty list of token ids")
    if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value):
        raise BadRequest(f"{what} must hold non-negative integers only")
    return value


def _count(value: Any, what: str, low: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise BadRequest(f"{what} must be an integer >= {low}, got {value!r}")
    return value


def _sampling(src: dict[str, Any], default_max: int, max_key: str = "max_tokens") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in src.items():
        if k in _NUMERIC:
            if v is None:
                continue
            if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v):
                raise BadRequest(f"{k} must be a finite number, got {v!r}")
            out[k] = v
        elif k in _OTHER and v is not None:
            out[k] = v
    max_tokens = src.get(max_key)
    out["max_tokens"] = default_max if max_tokens is None else _count(max_tokens, max_key, 1)
    if src.get("min_tokens") is not None:
        out["min_tokens"] = _count(src["min_tokens"], "min_tokens", 0)
        if out["min_tokens"] > out["max_tokens"]:
            raise BadRequest("min_tokens must not exceed max_tokens")
    return out


def _check_common(body: dict[str, Any]) -> None:
    n = body.get("n", 1)
    if n != 1:
        raise BadRequest("n > 1 is not supported: send one request per sample (one trajectory)")
    for k in _UNSUPPORTED:
        if body.get(k) not in (None, False, 0):
            raise BadRequest(f"{k} is not supported by the router")
    if not isinstance(body.get("stream", False), bool):
        raise BadRequest("stream must be true or false")


def parse_call(dialect: Dialect, body: dict[str, Any], default_max: int | None) -> Call:
    if dialect is Dialect.GENERATE:
        return _parse_generate(body, default_max)
    _check_common(body)
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise BadRequest("stream_options must be an object")
    key = body.get("trajectory_id")
    call = Call(
        dialect=dialect,
        stream=bool(body.get("stream", False)),
        sampling={},
        return_token_ids=bool(body.get("return_token_ids", False)),
        include_usage=bool(opts.get("include_usage", False)),
        body_key=None if key is None else str(key),
    )
    if dialect is Dialect.COMPLETIONS:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            if not prompt:
                raise BadRequest("prompt must not be empty")
            call.tokenize = {"prompt": prompt}
        elif isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
            call.prompt_ids = _token_list(prompt, "prompt")
        elif isinstance(prompt, list) and len(prompt) == 1:
            inner = prompt[0]
            if isinstance(inner, str) and inner:
                call.tokenize = {"prompt": inner}
            else:
                call.prompt_ids = _token_list(inner, "prompt[0]")
        else:
            raise BadRequest(
                "prompt must be a string or a list of token ids (one prompt per request)"
            )
        call.sampling = _sampling(body, default_max or DEFAULT_MAX_TOKENS["completions"])
    else:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list")
        if not all(isinstance(m, dict) and "role" in m for m in messages):
            raise BadRequest("every message needs a role")
        tok: dict[str, Any] = {"messages": messages, "add_generation_prompt": True}
        for k in ("tools", "chat_template", "chat_template_kwargs", "add_generation_prompt"):
            if body.get(k) is not None:
                tok[k] = body[k]
        call.tokenize = tok
        src = dict(body)
        if src.get("max_completion_tokens") is not None:
            src["max_tokens"] = src["max_completion_tokens"]
        call.sampling = _sampling(src, default_max or 4096)
    return call


def _parse_generate(body: dict[str, Any], default_max: int | None) -> Call:
    if body.get("return_logprob"):
        raise BadRequest("return_logprob is not supported by the router")
    params = body.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise BadRequest("sampling_params must be an object")
    if params.get("n", 1) != 1:
        raise BadRequest("n > 1 is not supported: send one request per sample")
    src: dict[str, Any] = {_SGLANG_RENAME.get(str(k), str(k)): v for k, v in params.items()}
    rid = body.get("rid")
    if rid is not None and not isinstance(rid, str):
        raise BadRequest("rid must be a string (one request per call)")
    if not isinstance(body.get("stream", False), bool):
        raise BadRequest("stream must be true or false")
    key = body.get("trajectory_id")
    call = Call(
        dialect=Dialect.GENERATE,
        stream=bool(body.get("stream", False)),
        sampling=_sampling(src, DEFAULT_MAX_TOKENS["generate"]),
        client_rid=rid,
        body_key=None if key is None else str(key),
    )
    if body.get("input_ids") is not None:
        ids = body["input_ids"]
        if isinstance(ids, list) and ids and isinstance(ids[0], list):
            raise BadRequest("batched input_ids are not supported: one request per sample")
        call.prompt_ids = _token_list(ids, "input_ids")
    elif isinstance(body.get("text"), str) and body["text"]:
        call.tokenize = {"prompt": body["text"]}
    else:
        raise BadRequest("/generate needs input_ids (a list of token ids) or text")
    return call


# ---- rendering ---------------------------------------------------------------------------


def _usage(turn: Turn) -> dict[str, Any]:
    p, c = len(turn.prompt), len(turn.generated)
    return {
        "prompt_tokens": p,
        "completion_tokens": c,
        "total_tokens": p + c,
        "prompt_tokens_details": {"cached_tokens": turn.cached_tokens},
    }


def _sglang_finish(turn: Turn) -> dict[str, Any]:
    reason = turn.finish_reason or "stop"
    out: dict[str, Any] = {"type": reason}
    if reason == "length":
        out["length"] = len(turn.generated)
    elif turn.matched_stop is not None:
        out["matched"] = turn.matched_stop
    return out


def _meta(call: Call, turn: Turn, done: bool, model: str) -> dict[str, Any]:
    return {
        "id": call.client_rid or call.id,
        "finish_reason": _sglang_finish(turn) if done else None,
        "prompt_tokens": len(turn.prompt),
        "completion_tokens": len(turn.generated),
        "cached_tokens": turn.cached_tokens,
        "e2e_latency": turn.traj.last_end_s - turn.arrival_s
        if done and turn.traj.last_end_s
        else 0,
        "trajectory_id": turn.traj.key,
    }


def render_full(call: Call, turn: Turn, model: str) -> dict[str, Any]:
    """The non-streamed response of a finished turn."""
    text = "".join(turn.text)
    if call.dialect is Dialect.GENERATE:
        return {
            "text": text,
            "output_ids": list(turn.generated),
            "meta_info": _meta(call, turn, True, model),
        }
    choice: dict[str, Any] = {"index": 0, "finish_reason": turn.finish_reason}
    if turn.matched_stop is not None:
        choice["stop_reason"] = turn.matched_stop
    if call.dialect is Dialect.CHAT:
        choice["message"] = {"role": "assistant", "content": text}
        obj = "chat.completion"
    else:
        choice["text"] = text
        choice["logprobs"] = None
        obj = "text_completion"
    if call.return_token_ids:
        choice["token_ids"] = list(turn.generated)
        choice["prompt_token_ids"] = list(turn.prompt)
    return {
        "id": f"{'chatcmpl' if call.dialect is Dialect.CHAT else 'cmpl'}-{call.id}",
        "object": obj,
        "created": call.created,
        "model": model,
        "choices": [choice],
        "usage": _usage(turn),
    }


def render_chunk(
    call: Call, turn: Turn, tokens: list[int], text: str, model: str, *, first: bool, done: bool
) -> dict[str, Any] | None:
    """One streamed chunk: new tokens and text, or (`done`) the finish."""
    if call.dialect is Dialect.GENERATE:
        # SGLang's default stream: cumulative text and ids in every chunk
        return {
            "text": "".join(turn.text),
            "output_ids": list(turn.generated),
            "meta_info": _meta(call, turn, done, model),
        }
    choice: dict[str, Any] = {"index": 0, "finish_reason": turn.finish_reason if done else None}
    if call.dialect is Dialect.CHAT:
        delta: dict[str, Any] = {"content": text}
        if first:
            delta["role"] = "assistant"
        choice["delta"] = delta
        obj, prefix = "chat.completion.chunk", "chatcmpl"
    else:
        choice["text"] = text
        choice["logprobs"] = None
        obj, prefix = "text_completion", "cmpl"
    if done and turn.matched_stop is not None:
        choice["stop_reason"] = turn.matched_stop
    if call.return_token_ids:
        choice["token_ids"] = tokens
        if first:
            choice["prompt_token_ids"] = list(turn.prompt)
    return {
        "id": f"{prefix}-{call.id}",
        "object": obj,
        "created": call.created,
        "model": model,
        "choices": [choice],
    }


def render_usage_chunk(call: Call, turn: Turn, model: str) -> dict[str, Any]:
    obj = "chat.completion.chunk" if call.dialect is Dialect.CHAT else "text_completion"
    prefix = "chatcmpl" if call.dialect is Dialect.CHAT else "cmpl"
    return {
        "id": f"{prefix}-{call.id}",
        "object": obj,
        "created": call.created,
        "model": model,
        "choices": [],
        "usage": _usage(turn),
    }


def error_body(message: str, status: int) -> dict[str, Any]:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "code": status}}
