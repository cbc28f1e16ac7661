"""The table of request fields: the docs show exactly what the code does, and every field of
the peers' requests is known to it (nothing is dropped without a word)."""

from __future__ import annotations

from pathlib import Path

from loom.runtime.rollout.fields import (
    CHAT,
    COMPLETIONS,
    GENERATE,
    SAMPLING_PARAMS,
    Use,
    markdown_table,
    sglang_sampling,
    vllm_sampling,
)

DOC = Path(__file__).resolve().parents[3] / "docs" / "rollout-fields.md"


def test_the_docs_table_is_the_codes() -> None:
    assert DOC.read_text() == markdown_table(), (
        "docs/rollout-fields.md is stale: python -m loom.runtime.rollout.fields > "
        "docs/rollout-fields.md"
    )


def test_every_field_the_peers_send_is_in_a_table() -> None:
    # slime's sglang_rollout.py sampling_params and body; SGLang's SamplingParams
    sglang = {
        "temperature",
        "top_p",
        "top_k",
        "max_new_tokens",
        "stop",
        "stop_token_ids",
        "skip_special_tokens",
        "no_stop_trim",
        "spaces_between_special_tokens",
        "custom_params",
        "sampling_seed",
        "min_new_tokens",
        "repetition_penalty",
        "min_p",
        "frequency_penalty",
        "presence_penalty",
        "n",
        "json_schema",
        "regex",
        "ebnf",
        "structural_tag",
        "ignore_eos",
        "logit_bias",
        "stop_regex",
        "stream_interval",
    }
    assert sglang <= set(SAMPLING_PARAMS)
    assert {
        "input_ids",
        "text",
        "sampling_params",
        "return_logprob",
        "return_routed_experts",
        "rid",
        "stream",
        "image_data",
        "logprob_start_len",
        "top_logprobs_num",
        "return_text_in_logprobs",
    } <= set(GENERATE)
    # vLLM 0.32's CompletionRequest and ChatCompletionRequest (the fields clients use)
    common = {
        "model",
        "max_tokens",
        "n",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "stop",
        "stop_token_ids",
        "ignore_eos",
        "min_tokens",
        "logit_bias",
        "allowed_token_ids",
        "bad_words",
        "priority",
        "request_id",
        "stream",
        "stream_options",
        "return_token_ids",
        "structured_outputs",
        "response_format",
        "repetition_penalty",
        "presence_penalty",
        "frequency_penalty",
        "user",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "cache_salt",
        "include_stop_str_in_output",
        "truncate_prompt_tokens",
        "vllm_xargs",
        "kv_transfer_params",
        "guided_json",
        "echo",
        "best_of",
        "use_beam_search",
    }
    assert common | {"prompt", "logprobs", "prompt_logprobs", "suffix"} <= set(COMPLETIONS)
    assert common | {
        "messages",
        "logprobs",
        "top_logprobs",
        "tools",
        "tool_choice",
        "max_completion_tokens",
        "chat_template_kwargs",
    } <= set(CHAT)


def test_fields_renamed_between_dialects_go_both_ways() -> None:
    canonical = {r.canonical: r for r in SAMPLING_PARAMS.values() if r.use is Use.ENGINE}
    assert canonical["seed"].name == "sampling_seed"
    assert canonical["min_tokens"].name == "min_new_tokens"
    assert canonical["include_stop_str_in_output"].name == "no_stop_trim"
    sampling = {
        "max_tokens": 5,
        "min_tokens": 1,
        "seed": 3,
        "include_stop_str_in_output": True,
        "json_schema": '{"type": "object"}',
    }
    assert sglang_sampling(sampling) == {
        "max_new_tokens": 5,
        "min_new_tokens": 1,
        "sampling_seed": 3,
        "no_stop_trim": True,
        "json_schema": '{"type": "object"}',
    }
    assert vllm_sampling(sampling)["structured_outputs"] == {"json": {"type": "object"}}
    assert sglang_sampling({"structured_outputs": {"regex": "a+"}}) == {"regex": "a+"}
