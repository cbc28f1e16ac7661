"""The request and response shapes the router speaks: OpenAI completions and chat
completions (vLLM's dialect: `return_token_ids`, `logprobs`, `prompt_logprobs`, `min_tokens`,
`ignore_eos`, ...) and SGLang's native `/generate` (`input_ids` or `text`,
`sampling_params`, `rid`, `return_logprob`, `meta_info`).

Parsing turns a body into a `Call`: a `TurnRequest` (sampling parameters in vLLM's names,
the logprobs it returns, its id and priority), `n`, the prompt (token ids, or what to
tokenize) and how to answer. Every field is looked up in `fields`: it reaches the engine,
the router acts on it, or it is refused with a 400 that names it. Rendering turns finished
turns, or their deltas, back into the dialect they came in: vLLM's and SGLang's own shapes,
logprobs included.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from loom.core.errors import NotFound
from loom.runtime.rollout.config import EngineKind
from loom.runtime.rollout.fields import (
    _UNSET,
    CHAT,
    COMPLETIONS,
    GENERATE,
    SAMPLING_PARAMS,
    BadRequest,
    FieldRule,
    Use,
    structured_support,
)
from loom.runtime.rollout.state import Turn
from loom.runtime.rollout.turn import LogprobSpec, TurnRequest
from loom.runtime.web.errors import ErrorShape, code_for_status, render_message
from loom.runtime.web.limits import json_object

__all__ = [
    "BadRequest",
    "Call",
    "Dialect",
    "TokenTexts",
    "error_body",
    "parse_body",
    "parse_call",
    "render_full",
    "trajectory_key",
]

MAX_KEY = 256
MAX_N = 256
DEFAULT_MAX_TOKENS = {"completions": 16, "generate": 128}  # the engines' own defaults

TokenTexts = Callable[[Sequence[int]], list[str]]
# response ids: unique per router process (a random prefix, then a count), cheaper than uuid4
_ID_PREFIX = uuid.uuid4().hex[:12]
_ids = itertools.count()


class Dialect(StrEnum):
    COMPLETIONS = "completions"
    CHAT = "chat"
    GENERATE = "generate"


@dataclass
class Call:
    dialect: Dialect
    stream: bool
    request: TurnRequest
    n: int = 1
    prompt_ids: list[int] | None = None  # token-in
    tokenize: dict[str, Any] | None = None  # or what the router tokenizes
    max_tokens: int | None = None  # None: what the context leaves after the prompt
    truncate: int | None = None  # keep this many prompt tokens
    truncate_left: bool = True
    return_token_ids: bool = False
    tokens_as_ids: bool = False  # logprob tokens as token_id:N
    text_in_logprobs: bool = False
    return_prompt_ids: bool = False
    include_usage: bool = False
    continuous_usage: bool = False
    body_key: str | None = None  # trajectory id given in the body
    prompt_id: int | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    id: str = field(default_factory=lambda: f"{_ID_PREFIX}{next(_ids):x}")


def _reject_constant(name: str) -> Any:
    raise BadRequest(f"{name} is not a valid JSON number")


parse_body = json_object  # the shared layer's reading of a JSON object body


def trajectory_key(headers: Mapping[str, str], body: Mapping[str, Any]) -> str | None:
    """The trajectory a request belongs to: `X-Trajectory-Id` or `trajectory_id`, else the
    keys other routers use: `X-SMG-Routing-Key` (SGLang's gateway, slime), `x-session-id` or
    `session_id` (vLLM's router). None: a one-request trajectory."""
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
    # NOTE: type() over map, not a generator of isinstance checks: a context of thousands of
    # ids is checked at C speed (bool, an int subclass, is refused as before)
    if set(map(type, value)) != {int} or min(value) < 0:
        raise BadRequest(f"{what} must hold non-negative integers only")
    return value


def _fields(
    body: Mapping[str, Any],
    rules: Mapping[str, FieldRule],
    kinds: frozenset[EngineKind],
    where: str,
    sampling: dict[str, Any],
) -> dict[str, Any]:
    """Check every field of `body` against its table: engine fields go into `sampling` under
    their canonical names; the router's are returned, checked; the rest is refused."""
    mine: dict[str, Any] = {}
    for name, value in body.items():
        rule = rules.get(name)
        if rule is None:
            raise BadRequest(
                f"unknown field '{where}{name}': the router does not know it "
                "(docs: rollout request fields)"
            )
        if value is None:
            continue
        use = rule.use
        if use is Use.ROUTER:
            mine[name] = rule.check(where + name, value)
        elif use is Use.ENGINE:
            missing = kinds - rule.engines
            if missing:
                raise BadRequest(
                    f"{where}{name} is not honoured by {', '.join(sorted(missing))} engines "
                    f"(it needs {', '.join(sorted(rule.engines))}), and one is registered"
                )
            assert rule.canonical is not None
            sampling[rule.canonical] = rule.check(where + name, value)
        elif use is Use.REFUSED and (rule.default is _UNSET or value != rule.default):
            raise BadRequest(f"{where}{name} is not supported: {rule.note}")
    return mine


def _max_tokens(value: Any, name: str, low: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise BadRequest(f"{name} must be an integer >= {low}, got {value!r}")
    return value


def _n(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_N:
        raise BadRequest(f"n must be an integer from 1 to {MAX_N}, got {value!r}")
    return value


def _rid(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_KEY:
        raise BadRequest(
            f"{name} must be a string of 1 to {MAX_KEY} characters (one request per call)"
        )
    return value


def _check_model(mine: Mapping[str, Any], model: str) -> None:
    asked = mine.get("model")
    if asked and model and asked != model:
        raise NotFound(f"The model `{asked}` does not exist (this router serves `{model}`).")


def parse_call(
    dialect: Dialect,
    body: Mapping[str, Any],
    headers: Mapping[str, str],
    kinds: frozenset[EngineKind],
    model: str = "",
) -> Call:
    """A request body as a `Call`; a 400 that names the field for what it cannot honour.
    `kinds` are the registered engines' dialects (a field one of them cannot honour is
    refused)."""
    if dialect is Dialect.GENERATE:
        return _parse_generate(body, headers, kinds)
    rules = COMPLETIONS if dialect is Dialect.COMPLETIONS else CHAT
    sampling: dict[str, Any] = {}
    mine = _fields(body, rules, kinds, "", sampling)
    _check_model(mine, model)
    if "structured_outputs" in sampling:
        structured_support(sampling["structured_outputs"], kinds)
    opts = mine.get("stream_options") or {}
    stream = bool(mine.get("stream", False))
    rid = mine.get("request_id") or headers.get("X-Request-Id")
    call = Call(
        dialect=dialect,
        stream=stream,
        request=TurnRequest(sampling),
        n=_n(mine.get("n", 1)),
        return_token_ids=bool(mine.get("return_token_ids", False)),
        tokens_as_ids=bool(mine.get("return_tokens_as_token_ids", False)),
        include_usage=bool(opts.get("include_usage", False)),
        continuous_usage=bool(opts.get("continuous_usage_stats", False)),
        body_key=None if mine.get("trajectory_id") is None else str(mine["trajectory_id"]),
    )
    truncate = mine.get("truncate_prompt_tokens")
    if truncate is not None and truncate != -1:
        if truncate < 1:
            raise BadRequest("truncate_prompt_tokens must be >= 1 (or -1: the model's context)")
        call.truncate = truncate
    side = mine.get("truncation_side", "left")
    if side not in ("left", "right"):
        raise BadRequest(f"truncation_side must be left or right, got {side!r}")
    call.truncate_left = side == "left"
    logprobs = LogprobSpec()
    if dialect is Dialect.COMPLETIONS:
        call.prompt_ids, call.tokenize = _completion_prompt(body.get("prompt"))
        if call.tokenize is not None:
            call.tokenize["add_special_tokens"] = bool(mine.get("add_special_tokens", True))
        top = mine.get("logprobs")
        prompt_top = mine.get("prompt_logprobs")
        if prompt_top is not None and stream:
            raise BadRequest("prompt_logprobs are not available when streaming (as vLLM)")
        logprobs = LogprobSpec(
            output=top is not None,
            top=top or 0,
            prompt_start=0 if prompt_top is not None else None,
            prompt_top=prompt_top or 0,
        )
        max_tokens = mine.get("max_tokens")
        call.max_tokens = (
            DEFAULT_MAX_TOKENS["completions"]
            if max_tokens is None
            else _max_tokens(max_tokens, "max_tokens")
        )
    else:
        call.tokenize = _chat_prompt(body, mine)
        if mine.get("top_logprobs") and not mine.get("logprobs"):
            raise BadRequest("top_logprobs needs logprobs: true")
        logprobs = LogprobSpec(output=bool(mine.get("logprobs")), top=mine.get("top_logprobs", 0))
        max_tokens = mine.get("max_completion_tokens", mine.get("max_tokens"))
        call.max_tokens = None if max_tokens is None else _max_tokens(max_tokens, "max_tokens")
    call.request = TurnRequest(
        sampling,
        logprobs,
        None if rid is None else _rid(rid, "request_id"),
        int(mine.get("priority", 0)),
        stream=stream,
    )
    return call


def _completion_prompt(prompt: Any) -> tuple[list[int] | None, dict[str, Any] | None]:
    if isinstance(prompt, str):
        if not prompt:
            raise BadRequest("prompt must not be empty")
        return None, {"prompt": prompt}
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        return _token_list(prompt, "prompt"), None
    if isinstance(prompt, list) and len(prompt) == 1:
        inner = prompt[0]
        if isinstance(inner, str) and inner:
            return None, {"prompt": inner}
        return _token_list(inner, "prompt[0]"), None
    raise BadRequest("prompt must be a string or a list of token ids (one prompt per request)")


def _chat_prompt(body: Mapping[str, Any], mine: Mapping[str, Any]) -> dict[str, Any]:
    messages = mine.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list")
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        raise BadRequest("every message must be an object with a role")
    choice = mine.get("tool_choice")
    if choice not in (None, "none"):
        raise BadRequest(
            f"tool_choice {choice!r} is not supported: the router does not parse tool calls "
            "(send tool_choice none, or leave it out, and parse the calls from the text)"
        )
    tok: dict[str, Any] = {"messages": messages}
    for k in (
        "tools",
        "chat_template",
        "chat_template_kwargs",
        "add_generation_prompt",
        "continue_final_message",
        "documents",
    ):
        if mine.get(k) is not None:
            tok[k] = mine[k]
    return tok


def _parse_generate(
    body: Mapping[str, Any], headers: Mapping[str, str], kinds: frozenset[EngineKind]
) -> Call:
    sampling: dict[str, Any] = {}
    mine = _fields(body, GENERATE, kinds, "", sampling)
    params = mine.get("sampling_params") or {}
    own = _fields(params, SAMPLING_PARAMS, kinds, "sampling_params.", sampling)
    if "structured_outputs" in sampling:
        structured_support(sampling["structured_outputs"], kinds)
    rid = mine.get("rid")
    call = Call(
        dialect=Dialect.GENERATE,
        stream=bool(mine.get("stream", False)),
        request=TurnRequest(sampling),
        n=_n(own.get("n", 1)),
        text_in_logprobs=bool(mine.get("return_text_in_logprobs", False)),
        return_prompt_ids=bool(mine.get("return_prompt_token_ids", False)),
        body_key=None if mine.get("trajectory_id") is None else str(mine["trajectory_id"]),
    )
    max_new = own.get("max_new_tokens", _UNSET)
    if max_new is _UNSET:
        call.max_tokens = DEFAULT_MAX_TOKENS["generate"]
    elif max_new is not None:
        call.max_tokens = _max_tokens(max_new, "sampling_params.max_new_tokens", low=0)
    ids = mine.get("input_ids")
    text = mine.get("text")
    if ids is not None and text is not None:
        raise BadRequest("/generate takes input_ids or text, not both")
    if ids is not None:
        if isinstance(ids, list) and ids and isinstance(ids[0], list):
            raise BadRequest("batched input_ids are not supported: one prompt per request")
        call.prompt_ids = _token_list(ids, "input_ids")
    elif isinstance(text, str) and text:
        call.tokenize = {"prompt": text, "add_special_tokens": True}
    elif text is not None:
        raise BadRequest("text must be a non-empty string (one prompt per request)")
    else:
        raise BadRequest("/generate needs input_ids (a list of token ids) or text")
    start = mine.get("logprob_start_len", -1)
    top = mine.get("top_logprobs_num", 0)
    want = bool(mine.get("return_logprob", False))
    logprobs = LogprobSpec(
        output=want,
        top=top if want else 0,
        prompt_start=start if want and start >= 0 else None,
        prompt_top=top if want else 0,
    )
    call.request = TurnRequest(
        sampling,
        logprobs,
        None if rid is None else _rid(rid, "rid"),
        # NOTE: SGLang runs a higher priority value first; the router's classes run lower first
        -int(mine.get("priority", 0)),
        bool(sampling.get("return_routed_experts", False)),
        stream=call.stream,
    )
    return call


def finish_call(call: Call, prompt: list[int], max_model_len: int | None) -> list[int]:
    """After tokenization: truncate the prompt as asked, settle max_tokens against the
    context, and check that the prompt fits (400 otherwise). Returns the prompt."""
    if call.truncate is not None and len(prompt) > call.truncate:
        prompt = prompt[-call.truncate :] if call.truncate_left else prompt[: call.truncate]
    spec = call.request.logprobs
    if spec.prompt_start is not None and spec.prompt_start >= len(prompt):
        raise BadRequest(
            f"logprob_start_len {spec.prompt_start} must be below the prompt's {len(prompt)} tokens"
        )
    limit = max_model_len
    max_tokens = call.max_tokens
    if limit is not None:
        room = limit - len(prompt)
        if room < 1:
            raise BadRequest(f"the prompt has {len(prompt)} tokens; the model's context is {limit}")
        if max_tokens is None:
            max_tokens = room
        elif max_tokens > room:
            raise BadRequest(
                f"max_tokens {max_tokens} exceeds the {room} tokens left in the model's "
                f"context of {limit} after a prompt of {len(prompt)}"
            )
    elif max_tokens is None:
        max_tokens = 4096
    if max_tokens == 0 and spec.prompt_start is None:
        raise BadRequest(
            "max_new_tokens 0 generates nothing: ask for prompt logprobs "
            "(return_logprob, logprob_start_len) to score a prompt"
        )
    call.request.sampling["max_tokens"] = max_tokens
    if call.request.sampling.get("min_tokens", 0) > max_tokens:
        raise BadRequest("min_tokens must not exceed max_tokens")
    return prompt


# ---- rendering ---------------------------------------------------------------------------


class Renderer:
    """Renders one call's turns; `texts` turns token ids into their text (the router's
    tokenizer, else vLLM's `token_id:N`)."""

    def __init__(self, call: Call, model: str, texts: TokenTexts | None) -> None:
        self.call = call
        self.model = model
        self._texts = texts
        self.offsets = [0] * call.n  # completions' text_offset, per choice

    def texts(self, ids: Sequence[int]) -> list[str]:
        if self._texts is None or self.call.tokens_as_ids:
            return [f"token_id:{i}" for i in ids]
        return self._texts(ids)

    def text_or_none(self, ids: Sequence[int]) -> list[str | None]:
        if not self.call.text_in_logprobs:
            return [None] * len(ids)
        return list(self.texts(ids))

    # ---- OpenAI ----

    def _ordered(self, tid: int, lp: Any) -> list[tuple[int, float]]:
        """A position's candidates, vLLM's order: the sampled token, then the others."""
        out = [(tid, lp.logprob)]
        out += [a for a in lp.top if a[0] != tid]
        return out

    def completion_logprobs(self, turn: Turn, start: int, end: int, choice: int) -> dict[str, Any]:
        ids = turn.generated[start:end]
        lps = turn.logprobs[start:end]
        k = turn.request.logprobs.top
        cands = [self._ordered(t, lp)[: k + 1] for t, lp in zip(ids, lps, strict=False)]
        need = set(ids) | {a[0] for c in cands for a in c}
        names = dict(zip(sorted(need), self.texts(sorted(need)), strict=True))
        tokens = [names[t] for t in ids]
        offsets = []
        off = self.offsets[choice]
        for s in tokens:
            offsets.append(off)
            off += len(s)
        self.offsets[choice] = off
        return {
            "text_offset": offsets,
            "token_logprobs": [lp.logprob for lp in lps],
            "tokens": tokens,
            "top_logprobs": [{names[a]: v for a, v in c} for c in cands],
        }

    def chat_logprobs(self, turn: Turn, start: int, end: int) -> dict[str, Any]:
        ids = turn.generated[start:end]
        lps = turn.logprobs[start:end]
        k = turn.request.logprobs.top
        cands = [self._ordered(t, lp)[:k] for t, lp in zip(ids, lps, strict=False)]
        need = sorted(set(ids) | {a[0] for c in cands for a in c})
        names = dict(zip(need, self.texts(need), strict=True))
        return {
            "content": [
                {
                    "token": names[t],
                    "logprob": lp.logprob,
                    "bytes": list(names[t].encode()),
                    "top_logprobs": [
                        {"token": names[a], "logprob": v, "bytes": list(names[a].encode())}
                        for a, v in c
                    ],
                }
                for t, lp, c in zip(ids, lps, cands, strict=False)
            ]
        }

    def vllm_prompt_logprobs(self, turn: Turn) -> list[dict[str, Any] | None] | None:
        rows = turn.prompt_logprobs
        if rows is None:
            return None
        k = turn.request.logprobs.prompt_top
        need = sorted({r.token for r in rows} | {a[0] for r in rows for a in r.top[:k]})
        names = dict(zip(need, self.texts(need), strict=True))
        out: list[dict[str, Any] | None] = []
        for r in rows:
            if r.logprob is None:
                out.append(None)
                continue
            entry = {
                str(r.token): {
                    "logprob": r.logprob,
                    "rank": r.rank,
                    "decoded_token": names[r.token],
                }
            }
            for rank, (a, v) in enumerate(r.top[:k], 1):
                entry.setdefault(str(a), {"logprob": v, "rank": rank, "decoded_token": names[a]})
            out.append(entry)
        return out

    def usage(self, turns: Sequence[Turn]) -> dict[str, Any]:
        p = len(turns[0].prompt)
        c = sum(len(t.generated) for t in turns)
        return {
            "prompt_tokens": p,
            "completion_tokens": c,
            "total_tokens": p + c,
            "prompt_tokens_details": {"cached_tokens": turns[0].cached_tokens},
        }

    def openai_full(self, turns: Sequence[Turn]) -> dict[str, Any]:
        call = self.call
        chat = call.dialect is Dialect.CHAT
        choices = []
        for turn in turns:
            text = "".join(turn.text)
            choice: dict[str, Any] = {"index": turn.choice, "finish_reason": turn.finish_reason}
            if turn.matched_stop is not None:
                choice["stop_reason"] = turn.matched_stop
            want = turn.request.logprobs.output
            if chat:
                choice["message"] = {"role": "assistant", "content": text}
                choice["logprobs"] = (
                    self.chat_logprobs(turn, 0, len(turn.generated)) if want else None
                )
            else:
                choice["text"] = text
                choice["logprobs"] = (
                    self.completion_logprobs(turn, 0, len(turn.generated), turn.choice)
                    if want
                    else None
                )
                if turn.request.logprobs.prompt_start is not None:
                    choice["prompt_logprobs"] = self.vllm_prompt_logprobs(turn)
            if call.return_token_ids:
                choice["token_ids"] = list(turn.generated)
                if not chat:
                    choice["prompt_token_ids"] = list(turn.prompt)
            choices.append(choice)
        out: dict[str, Any] = {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{call.id}",
            "object": "chat.completion" if chat else "text_completion",
            "created": call.created,
            "model": self.model,
            "choices": choices,
            "usage": self.usage(turns),
        }
        if chat and call.return_token_ids:
            out["prompt_token_ids"] = list(turns[0].prompt)
        return out

    def openai_chunk(
        self, turn: Turn, start: int, end: int, text: str, *, first: bool, done: bool
    ) -> dict[str, Any]:
        """A streamed chunk of one choice: tokens [start, end) and their text, or the end."""
        call = self.call
        chat = call.dialect is Dialect.CHAT
        choice: dict[str, Any] = {"index": turn.choice}
        want = turn.request.logprobs.output and end > start
        if chat:
            choice["delta"] = {"content": text} if not done else {}
            choice["logprobs"] = self.chat_logprobs(turn, start, end) if want else None
        else:
            choice["text"] = text
            choice["logprobs"] = (
                self.completion_logprobs(turn, start, end, turn.choice) if want else None
            )
        choice["finish_reason"] = turn.finish_reason if done else None
        if done and turn.matched_stop is not None:
            choice["stop_reason"] = turn.matched_stop
        if call.return_token_ids:
            choice["token_ids"] = turn.generated[start:end]
            if first and not chat:
                choice["prompt_token_ids"] = list(turn.prompt)
        out: dict[str, Any] = {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{call.id}",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": call.created,
            "model": self.model,
            "choices": [choice],
        }
        if call.continuous_usage:
            out["usage"] = self.usage([turn])
        return out

    def chat_role_chunk(self, turn: Turn) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": f"chatcmpl-{self.call.id}",
            "object": "chat.completion.chunk",
            "created": self.call.created,
            "model": self.model,
            "choices": [
                {
                    "index": turn.choice,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ],
        }
        if self.call.return_token_ids:
            out["prompt_token_ids"] = list(turn.prompt)
        return out

    def usage_chunk(self, turns: Sequence[Turn]) -> dict[str, Any]:
        chat = self.call.dialect is Dialect.CHAT
        return {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{self.call.id}",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": self.call.created,
            "model": self.model,
            "choices": [],
            "usage": self.usage(turns),
        }

    # ---- SGLang ----

    def sglang(self, turn: Turn, *, done: bool, version: int) -> dict[str, Any]:
        """SGLang's `/generate` object for `turn` so far (cumulative, as SGLang streams)."""
        call = self.call
        meta: dict[str, Any] = {
            "id": call.request.client_rid or call.id,
            "finish_reason": _sglang_finish(turn) if done else None,
            "prompt_tokens": len(turn.prompt),
            "completion_tokens": len(turn.generated),
            "cached_tokens": turn.cached_tokens,
            "weight_version": str(turn.version if turn.version is not None else version),
            "trajectory_id": turn.traj.key,
        }
        if done:
            meta["e2e_latency"] = (turn.ended_s or 0.0) - turn.arrival_s
        spec = turn.request.logprobs
        if spec.output:
            ids = turn.generated
            texts = self.text_or_none(ids)
            meta["output_token_logprobs"] = [
                [lp.logprob, t, s] for lp, t, s in zip(turn.logprobs, ids, texts, strict=False)
            ]
            if spec.top:
                meta["output_top_logprobs"] = [
                    self._sglang_top(self._ordered(t, lp), spec.top)
                    for t, lp in zip(ids, turn.logprobs, strict=False)
                ]
        if spec.prompt_start is not None and turn.prompt_logprobs is not None:
            rows = turn.prompt_logprobs
            texts = self.text_or_none([r.token for r in rows])
            meta["input_token_logprobs"] = [
                [r.logprob, r.token, s] for r, s in zip(rows, texts, strict=True)
            ]
            if spec.prompt_top:
                meta["input_top_logprobs"] = [
                    self._sglang_top(list(r.top), spec.prompt_top)
                    if r.logprob is not None
                    else None
                    for r in rows
                ]
        if call.request.routed_experts and turn.routed_experts is not None:
            meta["routed_experts"] = turn.routed_experts
        out: dict[str, Any] = {
            "text": "".join(turn.text),
            "output_ids": list(turn.generated),
            "meta_info": meta,
        }
        if call.return_prompt_ids:
            out["prompt_token_ids"] = list(turn.prompt)
        if call.n > 1:
            out["index"] = turn.choice
        return out

    def _sglang_top(self, cands: Sequence[tuple[int, float]], k: int) -> list[list[Any]]:
        best = sorted(dict(cands).items(), key=lambda kv: -kv[1])[:k]
        texts = self.text_or_none([t for t, _ in best])
        return [[v, t, s] for (t, v), s in zip(best, texts, strict=True)]


def _sglang_finish(turn: Turn) -> dict[str, Any]:
    reason = turn.finish_reason or "stop"
    out: dict[str, Any] = {"type": reason}
    if reason == "length":
        out["length"] = len(turn.generated)
    elif reason == "abort":
        out["message"] = turn.abort_message or "aborted"
    elif turn.matched_stop is not None:
        out["matched"] = turn.matched_stop
    return out


def render_full(renderer: Renderer, turns: Sequence[Turn], version: int) -> Any:
    """The non-streamed response of finished turns."""
    if renderer.call.dialect is Dialect.GENERATE:
        if renderer.call.n == 1:
            return renderer.sglang(turns[0], done=True, version=version)
        return [renderer.sglang(t, done=True, version=version) for t in turns]
    return renderer.openai_full(turns)


def error_body(message: str, status: int) -> dict[str, Any]:
    """An error the router answers with a status only (a failed turn, mid-stream): OpenAI's
    shape, rendered by the shared layer."""
    return render_message(message, status, code_for_status(status), ErrorShape.OPENAI).body
