"""Every request field of the dialects the router speaks, and what the router does with it.

One table per place a field can appear: OpenAI completions and chat completions (vLLM's
dialect: OpenAI's fields plus vLLM's extras), SGLang's `/generate` (top level) and its
`sampling_params`. A field

* reaches the engine (`ENGINE`), under its canonical name — vLLM's, which the SGLang client
  renames back (`sampling_seed` <-> `seed`, `max_new_tokens` <-> `max_tokens`, ...) — when every
  registered engine's dialect can honour it, and is refused with a 400 that names it otherwise;
* is acted on by the router (`ROUTER`): the prompt, `n`, logprobs, ids, priority, streaming;
* changes nothing in generation (`NO_EFFECT`), as in the engines themselves (`user`);
* or is refused with a 400 that names it (`REFUSED`) unless it carries its default value.

A field in no table is refused by name too: nothing is dropped without a word. `python -m
loom.runtime.rollout.fields` prints the table the docs show (docs/rollout-fields.md).
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from loom.core.errors import InvalidRequest
from loom.runtime.rollout.config import EngineKind

__all__ = [
    "CHAT",
    "COMPLETIONS",
    "GENERATE",
    "SAMPLING_PARAMS",
    "BadRequest",
    "FieldRule",
    "Use",
    "markdown_table",
    "sglang_sampling",
    "vllm_sampling",
]


class BadRequest(InvalidRequest):
    """The request is malformed or asks what the router cannot honour (400)."""


class Use(StrEnum):
    ENGINE = "engine"
    ROUTER = "router"
    NO_EFFECT = "no effect"
    REFUSED = "refused"


BOTH = frozenset({EngineKind.VLLM, EngineKind.SGLANG})
VLLM = frozenset({EngineKind.VLLM})
SGLANG = frozenset({EngineKind.SGLANG})
_UNSET = object()

Check = Callable[[str, Any], Any]


# ---- value checks: each returns the value to use, or raises BadRequest ----------------------


def finite(name: str, v: Any) -> float | int:
    if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v):
        raise BadRequest(f"{name} must be a finite number, got {v!r}")
    return v


def integer(low: int | None = None) -> Check:
    def check(name: str, v: Any) -> int:
        if not isinstance(v, int) or isinstance(v, bool) or (low is not None and v < low):
            bound = f" >= {low}" if low is not None else ""
            raise BadRequest(f"{name} must be an integer{bound}, got {v!r}")
        return v

    return check


def boolean(name: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise BadRequest(f"{name} must be true or false, got {v!r}")
    return v


def text(name: str, v: Any) -> str:
    if not isinstance(v, str):
        raise BadRequest(f"{name} must be a string, got {type(v).__name__}")
    return v


def obj(name: str, v: Any) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise BadRequest(f"{name} must be an object, got {type(v).__name__}")
    return v


def token_ids(name: str, v: Any) -> list[int]:
    if not isinstance(v, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in v
    ):
        raise BadRequest(f"{name} must be a list of token ids (non-negative integers)")
    return v


def stops(name: str, v: Any) -> str | list[str]:
    if isinstance(v, str) or (isinstance(v, list) and all(isinstance(s, str) for s in v)):
        return v
    raise BadRequest(f"{name} must be a string or a list of strings")


def words(name: str, v: Any) -> list[str]:
    if isinstance(v, list) and all(isinstance(s, str) for s in v):
        return v
    raise BadRequest(f"{name} must be a list of strings")


def bias(name: str, v: Any) -> dict[str, float]:
    if not isinstance(v, dict):
        raise BadRequest(f"{name} must map token ids to biases")
    out: dict[str, float] = {}
    for k, b in v.items():
        try:
            tid = int(k)
        except (TypeError, ValueError):
            raise BadRequest(f"{name}: {k!r} is not a token id") from None
        if tid < 0:
            raise BadRequest(f"{name}: {k!r} is not a token id")
        out[str(tid)] = float(finite(f"{name}[{k}]", b))
    return out


def anything(name: str, v: Any) -> Any:
    return v


@dataclass(frozen=True, slots=True)
class FieldRule:
    name: str
    use: Use
    note: str
    check: Check = anything
    canonical: str | None = None  # ENGINE: its name among a turn's sampling parameters
    engines: frozenset[EngineKind] = BOTH  # ENGINE: the engine dialects that honour it
    default: Any = _UNSET  # REFUSED: a value accepted as meaning "not asked"

    def row(self) -> tuple[str, str, str]:
        if self.use is Use.ENGINE:
            names = self.canonical if self.canonical and self.canonical != self.name else ""
            where = " + ".join(sorted(k.value for k in self.engines))
            use = f"engine ({where})" + (f" as `{names}`" if names else "")
        else:
            use = self.use.value
        return self.name, use, self.note


def _engine(
    name: str, check: Check, note: str, canonical: str | None = None, **kw: Any
) -> FieldRule:
    return FieldRule(name, Use.ENGINE, note, check, canonical or name, **kw)


def _router(name: str, note: str, check: Check = anything) -> FieldRule:
    return FieldRule(name, Use.ROUTER, note, check)


def _refused(name: str, note: str, default: Any = _UNSET) -> FieldRule:
    return FieldRule(name, Use.REFUSED, note, default=default)


def _table(*rules: FieldRule) -> Mapping[str, FieldRule]:
    return {r.name: r for r in rules}


# Sampling parameters shared by the OpenAI dialects (vLLM's names are the canonical ones).
_SAMPLING = (
    _engine("temperature", finite, "sampling temperature"),
    _engine("top_p", finite, "nucleus sampling"),
    _engine("top_k", integer(-1), "top-k sampling (-1 or 0: all)"),
    _engine("min_p", finite, "min-p sampling"),
    _engine("presence_penalty", finite, "presence penalty"),
    _engine("frequency_penalty", finite, "frequency penalty"),
    _engine("repetition_penalty", finite, "repetition penalty"),
    _engine("seed", integer(), "per-request seed; sample i of n uses seed + i (as vLLM)"),
    _engine("stop", stops, "stop strings"),
    _engine("stop_token_ids", token_ids, "stop token ids"),
    _engine("ignore_eos", boolean, "keep generating past EOS"),
    _engine(
        "min_tokens",
        integer(0),
        "tokens before a stop may end the turn (counts the tokens of every attempt)",
    ),
    _engine("skip_special_tokens", boolean, "detokenization"),
    _engine("spaces_between_special_tokens", boolean, "detokenization"),
    _engine("include_stop_str_in_output", boolean, "keep the matched stop string"),
    _engine("logit_bias", bias, "token id -> bias"),
    _engine("allowed_token_ids", token_ids, "restrict sampling to these ids", engines=VLLM),
    _engine("bad_words", words, "words never generated", engines=VLLM),
    _engine(
        "structured_outputs",
        obj,
        "json / regex / grammar / choice / structural_tag "
        "(SGLang engines: json, regex, grammar as ebnf, structural_tag)",
    ),
    _engine(
        "response_format", obj, "json_object / json_schema / text (SGLang engines: as json_schema)"
    ),
    _engine("cache_salt", text, "prefix-cache isolation"),
    _engine("stream_interval", integer(1), "tokens per engine stream chunk"),
    _engine("vllm_xargs", obj, "vLLM's extra sampling arguments", engines=VLLM),
    _engine("repetition_detection", obj, "vLLM's repetition detection", engines=VLLM),
    _engine("thinking_token_budget", integer(0), "reasoning token budget", engines=VLLM),
)

_OPENAI = (
    *_SAMPLING,
    _router("model", "must name the served model (404 otherwise), as vLLM", text),
    _router("max_tokens", "tokens to generate (default: 16 completions; the context chat)"),
    _router("n", "samples per prompt: n turns scheduled as siblings sharing the prompt"),
    _router("stream", "server-sent events, as vLLM", boolean),
    _router("stream_options", "include_usage; continuous_usage_stats", obj),
    _router("priority", "the client's priority class: lower runs first (vLLM)", integer()),
    _router("request_id", "the request's id: `POST /abort_request {rid}` aborts it"),
    _router("session_id", "the trajectory id (vLLM router's key)"),
    _router("trajectory_id", "the trajectory id (Loom)"),
    _router("return_token_ids", "token_ids / prompt_token_ids in the response", boolean),
    _router("return_tokens_as_token_ids", "logprob tokens as `token_id:N`", boolean),
    _router("truncate_prompt_tokens", "keep the prompt's last N tokens", integer(-1)),
    _router("truncation_side", "left (default) or right", text),
    _router("add_special_tokens", "tokenization of the prompt", boolean),
    FieldRule("user", Use.NO_EFFECT, "OpenAI end-user id: logged by nobody, as vLLM"),
    _refused("best_of", "beam search and best-of are not supported", default=1),
    _refused("use_beam_search", "beam search is not supported", default=False),
    _refused("length_penalty", "beam search only", default=1.0),
    _refused(
        "echo", "echo is not supported: the response holds the completion only", default=False
    ),
    _refused("logprob_token_ids", "logprobs of chosen token ids are not supported"),
    _refused("prompt_embeds", "prompt embeddings are not supported: send token ids or text"),
    _refused("kv_transfer_params", "disaggregated prefill is not supported"),
    _refused("ec_transfer_params", "disaggregated encoding is not supported"),
    _refused(
        "routed_experts_prompt_start",
        "routed experts need SGLang engines (/generate return_routed_experts)",
    ),
    _refused("return_token_offsets", "render-only field"),
    _refused("mm_payload", "multimodal input is not supported"),
    _refused("return_mm_kwargs", "multimodal input is not supported"),
    _refused("watermarking", "not supported"),
    *(
        _refused(name, "removed from vLLM (it ignores it); use structured_outputs")
        for name in (
            "guided_json",
            "guided_regex",
            "guided_choice",
            "guided_grammar",
            "guided_decoding_backend",
            "guided_whitespace_pattern",
        )
    ),
)

COMPLETIONS = _table(
    *_OPENAI,
    _router("prompt", "a string (tokenized by the router) or token ids; one prompt per request"),
    _router("logprobs", "logprobs of each token and its N most likely alternatives", integer(0)),
    _router("prompt_logprobs", "logprobs of the prompt's tokens (not with stream)", integer(-1)),
    _refused("suffix", "insertion (suffix) is not supported"),
)

CHAT = _table(
    *_OPENAI,
    _router("messages", "rendered with the model's chat template by the router"),
    _router("max_completion_tokens", "tokens to generate (OpenAI's newer name)"),
    _router("logprobs", "logprobs of each output token", boolean),
    _router("top_logprobs", "alternatives per token (needs logprobs)", integer(0)),
    _router("tools", "rendered into the chat template; calls stay in the message text"),
    _router("tool_choice", "`none` (the default) only: the router does not parse tool calls"),
    _router("chat_template", "a template of the request's own"),
    _router("chat_template_kwargs", "extra template variables", obj),
    _router("add_generation_prompt", "chat template", boolean),
    _router("continue_final_message", "chat template", boolean),
    _router("documents", "chat template (RAG documents)"),
    FieldRule("parallel_tool_calls", Use.NO_EFFECT, "tool calls are not parsed"),
    FieldRule(
        "include_reasoning", Use.NO_EFFECT, "no reasoning parser: reasoning stays in the content"
    ),
    _refused("reasoning_effort", "not supported (render it with chat_template_kwargs)"),
    _refused("echo", "echo is not supported", default=False),
    _refused("media_io_kwargs", "multimodal input is not supported"),
    _refused("mm_processor_kwargs", "multimodal input is not supported"),
    _refused("return_prompt_text", "not supported", default=False),
    _refused("functions", "legacy function calling is not supported"),
    _refused("function_call", "legacy function calling is not supported"),
)

GENERATE = _table(
    _router("input_ids", "the prompt as token ids (one prompt per request)"),
    _router("text", "the prompt as text, tokenized by the router"),
    _router("sampling_params", "see the sampling_params table", obj),
    _router("rid", "the request's id: `POST /abort_request {rid}` aborts it", text),
    _router(
        "stream", "server-sent events with cumulative text, ids and logprobs, as SGLang", boolean
    ),
    _router("return_logprob", "meta_info.output_token_logprobs (and input ones)", boolean),
    _router("logprob_start_len", "prompt logprobs from this position (-1: none)", integer(-1)),
    _router("top_logprobs_num", "alternatives per position", integer(0)),
    _router(
        "return_text_in_logprobs",
        "token text in the logprob tuples (needs the router's tokenizer)",
        boolean,
    ),
    _router("return_prompt_token_ids", "prompt_token_ids in the response", boolean),
    _router("priority", "the client's priority: higher runs first (SGLang)", integer()),
    _router("trajectory_id", "the trajectory id (Loom)"),
    _router("session_id", "the trajectory id"),
    _engine(
        "return_routed_experts",
        boolean,
        "meta_info.routed_experts of the last attempt",
        engines=SGLANG,
    ),
    _engine("routed_experts_start_len", integer(0), "with return_routed_experts", engines=SGLANG),
    _engine("cache_salt", text, "prefix-cache isolation"),
    _engine("extra_key", text, "prefix-cache isolation", engines=SGLANG),
    FieldRule("log_metrics", Use.NO_EFFECT, "engine-side logging"),
    FieldRule("no_logs", Use.NO_EFFECT, "engine-side logging"),
    FieldRule("custom_labels", Use.NO_EFFECT, "engine-side metric labels"),
    _refused("token_ids_logprob", "logprobs of chosen token ids are not supported"),
    _refused("input_embeds", "embeddings are not supported: send input_ids or text"),
    _refused("image_data", "multimodal input is not supported"),
    _refused("video_data", "multimodal input is not supported"),
    _refused("audio_data", "multimodal input is not supported"),
    _refused("modalities", "multimodal input is not supported"),
    _refused("return_hidden_states", "hidden states are not supported", default=False),
    _refused("session_params", "SGLang sessions are not supported: use trajectory ids"),
    _refused("lora_path", "LoRA adapters are not supported"),
    _refused("lora_id", "LoRA adapters are not supported"),
    _refused("custom_logit_processor", "custom logit processors are not supported"),
    _refused("return_bytes", "not supported", default=False),
    _refused("return_entropy", "not supported", default=False),
    *(
        _refused(name, "prefill/decode disaggregation is not supported")
        for name in (
            "bootstrap_host",
            "bootstrap_port",
            "bootstrap_room",
            "bootstrap_pair_key",
            "decode_tp_size",
        )
    ),
    _refused("routed_dp_rank", "data-parallel rank pinning is not supported"),
    _refused("data_parallel_rank", "data-parallel rank pinning is not supported"),
    _refused("background", "background requests are not supported", default=False),
    _refused("max_thinking_tokens", "not supported"),
)

SAMPLING_PARAMS = _table(
    _router("max_new_tokens", "tokens to generate (default 128, as SGLang)"),
    _router("n", "samples: n turns scheduled as siblings sharing the prompt"),
    _engine("min_new_tokens", integer(0), "as min_tokens", canonical="min_tokens"),
    _engine("temperature", finite, "sampling temperature"),
    _engine("top_p", finite, "nucleus sampling"),
    _engine("top_k", integer(-1), "top-k sampling (-1: all)"),
    _engine("min_p", finite, "min-p sampling"),
    _engine("presence_penalty", finite, "presence penalty"),
    _engine("frequency_penalty", finite, "frequency penalty"),
    _engine("repetition_penalty", finite, "repetition penalty"),
    _engine("stop", stops, "stop strings"),
    _engine("stop_token_ids", token_ids, "stop token ids"),
    _engine("stop_regex", stops, "stop regexes", engines=SGLANG),
    _engine("ignore_eos", boolean, "keep generating past EOS"),
    _engine(
        "no_stop_trim", boolean, "keep the matched stop", canonical="include_stop_str_in_output"
    ),
    _engine("skip_special_tokens", boolean, "detokenization"),
    _engine("spaces_between_special_tokens", boolean, "detokenization"),
    _engine("logit_bias", bias, "token id -> bias"),
    _engine("sampling_seed", integer(), "as seed", canonical="seed"),
    _engine("json_schema", text, "structured output", canonical="json_schema"),
    _engine("regex", text, "structured output", canonical="regex"),
    _engine("ebnf", text, "structured output", canonical="ebnf"),
    _engine("structural_tag", text, "structured output", canonical="structural_tag"),
    _engine("custom_params", obj, "custom logit processors' parameters", engines=SGLANG),
    _engine("stream_interval", integer(1), "tokens per engine stream chunk"),
)


# ---- canonical sampling -> an engine's request ------------------------------------------------

# SGLang's structured-output fields are collected into vLLM's `structured_outputs`
STRUCTURED_FROM_SGLANG = {
    "json_schema": "json",
    "regex": "regex",
    "ebnf": "grammar",
    "structural_tag": "structural_tag",
}
# canonical fields SGLang spells otherwise
_TO_SGLANG = {
    "max_tokens": "max_new_tokens",
    "min_tokens": "min_new_tokens",
    "seed": "sampling_seed",
    "include_stop_str_in_output": "no_stop_trim",
}
_SGLANG_STRUCTURED = {
    "json": "json_schema",
    "regex": "regex",
    "grammar": "ebnf",
    "structural_tag": "structural_tag",
}


def engine_support(rules: Mapping[str, FieldRule]) -> dict[str, frozenset[EngineKind]]:
    """Canonical sampling name -> the engines that honour it, from a table."""
    return {r.canonical: r.engines for r in rules.values() if r.use is Use.ENGINE and r.canonical}


def structured_support(value: Mapping[str, Any], kinds: frozenset[EngineKind]) -> None:
    """Refuse structured-output forms an SGLang engine cannot take."""
    if EngineKind.SGLANG not in kinds:
        return
    forms = [k for k, v in value.items() if v not in (None, False)]
    for form in forms:
        if form not in _SGLANG_STRUCTURED:
            raise BadRequest(
                f"structured_outputs.{form} is not supported by SGLang engines "
                f"(they take {', '.join(sorted(_SGLANG_STRUCTURED))})"
            )


def vllm_sampling(sampling: Mapping[str, Any]) -> dict[str, Any]:
    """A turn's sampling parameters as vLLM's OpenAI server takes them."""
    out = dict(sampling)
    structured = {
        STRUCTURED_FROM_SGLANG[k]: out.pop(k) for k in list(out) if k in STRUCTURED_FROM_SGLANG
    }
    if structured:
        if "json" in structured:
            # vLLM takes a schema as a string too
            with contextlib.suppress(TypeError, json.JSONDecodeError):
                structured["json"] = json.loads(structured["json"])
        out["structured_outputs"] = {**out.get("structured_outputs", {}), **structured}
    return out


def sglang_sampling(sampling: Mapping[str, Any]) -> dict[str, Any]:
    """A turn's sampling parameters as SGLang's `sampling_params`."""
    out: dict[str, Any] = {}
    for k, v in sampling.items():
        if k == "structured_outputs":
            for form, value in v.items():
                if value in (None, False):
                    continue
                name = _SGLANG_STRUCTURED[form]
                out[name] = (
                    json.dumps(value) if form == "json" and not isinstance(value, str) else value
                )
        elif k == "response_format":
            kind = v.get("type")
            if kind == "json_schema":
                schema = (v.get("json_schema") or {}).get("schema", {})
                out["json_schema"] = json.dumps(schema)
            elif kind == "json_object":
                out["json_schema"] = json.dumps({"type": "object"})
        else:
            out[_TO_SGLANG.get(k, k)] = v
    return out


# ---- the docs table -------------------------------------------------------------------------


def markdown_table() -> str:
    parts = [
        "# Request fields and what the rollout router does with them",
        "",
        "Generated by `python -m loom.runtime.rollout.fields`; a test keeps it in step with "
        "the code. *engine (vllm + sglang)*: passed to the engine, renamed for its dialect "
        "(the name after *as*); a field only one dialect honours is refused with a 400 while "
        "an engine of the other dialect is registered. *router*: the router acts on it. "
        "*refused*: a 400 that names the field unless it carries its default. A field in no "
        "table is refused by name.",
    ]
    for title, rules in (
        ("OpenAI completions (`POST /v1/completions`)", COMPLETIONS),
        ("OpenAI chat completions (`POST /v1/chat/completions`)", CHAT),
        ("SGLang `POST /generate`", GENERATE),
        ("SGLang `sampling_params`", SAMPLING_PARAMS),
    ):
        parts += ["", f"## {title}", "", "| field | what the router does | note |", "|---|---|---|"]
        for r in sorted(rules.values(), key=lambda r: r.name):
            name, use, note = r.row()
            parts.append(f"| `{name}` | {use} | {note} |")
    return "\n".join(parts) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
