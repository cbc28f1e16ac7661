"""The emulated engine's model: the stand-in's (`standin.next_token`, `token_logprob`: every
token and logprob a function of the context, as greedy decoding is) with a word-level
vocabulary in which token N is the word `tN`, so text-only peers round-trip exactly."""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from loom.core.errors import InvalidRequest
from loom.runtime.rollout.standin import EOS, VOCAB, next_token, token_logprob, top_logprobs

__all__ = [
    "EOS",
    "VOCAB",
    "Generation",
    "detokenize",
    "generate",
    "logprobs_block",
    "piece",
    "prompt_ids",
    "prompt_logprobs",
    "tokenize",
    "word",
]


def word(token: int) -> str:
    return f"t{token}"


_IDS = {word(t): t for t in range(VOCAB)}


def tokenize(text: str) -> list[int]:
    """One token per whitespace-separated word: `tN` is token N, any other word a hash."""
    ids = _IDS
    out = [ids.get(w, -1) for w in text.split()]
    if -1 in out:
        for i, w in enumerate(text.split()):
            if out[i] < 0:
                out[i] = 3 + zlib.crc32(w.encode()) % (VOCAB - 3)
    return out


def detokenize(tokens: Iterable[int]) -> str:
    return " ".join(word(t) for t in tokens)


def piece(tokens: Iterable[int]) -> str:
    """The text of output tokens as a stream carries it: each word after a space. NOTE: EOS
    too (`t2`): this vocabulary has no special tokens in text, so that a text-only client's
    context is the token-id one, token for token."""
    return "".join(" " + word(t) for t in tokens)


@dataclass(frozen=True, slots=True)
class Generation:
    tokens: list[int]
    finish_reason: str  # "stop" or "length"
    stop_reason: int | None  # the stop token matched, None for EOS or length (vLLM's)


def generate(
    prompt: list[int],
    max_tokens: int,
    *,
    min_tokens: int = 0,
    ignore_eos: bool = False,
    stop_token_ids: frozenset[int] = frozenset(),
) -> Generation:
    """The whole output of a request, computed at once: the model is a function of the
    context, so the engine knows a request's length when it admits it."""
    context = list(prompt)
    out: list[int] = []
    while True:
        tok = next_token(context)
        context.append(tok)
        out.append(tok)
        if len(out) >= min_tokens:
            if tok in stop_token_ids:
                return Generation(out, "stop", tok)
            if tok == EOS and not ignore_eos:
                return Generation(out, "stop", None)
        if len(out) >= max_tokens:
            return Generation(out, "length", None)


class _Window(Sequence[int]):
    """`tokens[:end]` without copying: the stand-in model reads a context's length and its
    last 16 tokens only."""

    def __init__(self, tokens: Sequence[int], end: int) -> None:
        self._tokens, self._end = tokens, end

    def __len__(self) -> int:
        return self._end

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice) and i.stop is None and i.step is None and (i.start or 0) < 0:
            return list(self._tokens[max(0, self._end + i.start) : self._end])
        raise TypeError(f"the stand-in model reads only the tail of its context, not {i!r}")


def logprobs_block(
    context: Sequence[int], out: Sequence[int], top: int, as_ids: bool, offset0: int
) -> dict[str, Any]:
    """vLLM's completion `logprobs` for output tokens `out` after `context` (the tokens
    before the first of them): `tokens`, `token_logprobs`, `top_logprobs` (the sampled token
    and the `top` most likely), `text_offset`."""
    name = (lambda t: f"token_id:{t}") if as_ids else (lambda t: " " + word(t))
    full = [*context, *out]
    base = len(context)
    tokens, values, tops, offsets = [], [], [], []
    offset = offset0
    for j, tok in enumerate(out):
        ctx = _Window(full, base + j)
        lp = token_logprob(ctx, tok)  # type: ignore[arg-type]
        tokens.append(name(tok))
        values.append(lp)
        alts = {name(tok): lp}
        for t, v in top_logprobs(ctx, top) if top > 0 else ():  # type: ignore[arg-type]
            alts.setdefault(name(t), v)
        tops.append(alts)
        offsets.append(offset)
        offset += len(word(tok)) + 1
    return {
        "text_offset": offsets,
        "token_logprobs": values,
        "tokens": tokens,
        "top_logprobs": tops,
    }


def prompt_logprobs(prompt: Sequence[int], top: int) -> list[dict[str, Any] | None]:
    """vLLM's `prompt_logprobs`: None for the first token, then per token a dict of token id
    (as a string) to logprob, rank and text, for the prompt's token and the `top` likeliest."""
    rows: list[dict[str, Any] | None] = [None]
    for i in range(1, len(prompt)):
        ctx = _Window(prompt, i)
        tok = prompt[i]
        alts = top_logprobs(ctx, top) if top > 0 else []  # type: ignore[arg-type]
        row = {
            str(t): {"logprob": v, "rank": r, "decoded_token": word(t)}
            for r, (t, v) in enumerate(alts, start=1)
        }
        if str(tok) not in row:
            row[str(tok)] = {
                "logprob": token_logprob(ctx, tok),  # type: ignore[arg-type]
                "rank": len(alts) + 1,
                "decoded_token": word(tok),
            }
        rows.append(row)
    return rows


def prompt_ids(prompt: Any) -> list[int]:
    """A completion's `prompt` as token ids (text is tokenized); InvalidRequest otherwise."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (list, str)):
        prompt = prompt[0]  # one prompt in a batch of one
    if isinstance(prompt, str):
        return tokenize(prompt)
    if isinstance(prompt, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in prompt
    ):
        if any(not 0 <= t < VOCAB for t in prompt):
            raise InvalidRequest(f"token ids must be in [0, {VOCAB})")
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(p, (list, str)) for p in prompt):
        raise InvalidRequest("one prompt per request: batches are not supported")
    raise InvalidRequest("prompt must be a string or a list of token ids")
