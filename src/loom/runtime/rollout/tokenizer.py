"""The router's own tokenizer: text prompts and chat conversations become token ids in the
router, with no call to an engine per request (as sglang-router does), and logprob tokens
become text.

It is the engines' Hugging Face tokenizer, loaded with `transformers` (the `engine` extra)
from the router's `tokenizer` setting, else from where the first engine says it loaded its
model (vLLM's `root`), else from the model's name. Chat follows vLLM's rendering: the
tokenizer's chat template over the messages (a message whose content is a list of text parts
has them joined by newlines), then the rendered text tokenized without special tokens.
Where no tokenizer can be loaded the driver asks an engine's `/tokenize` instead, with a
deadline and failing over to another engine.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from loom.runtime.rollout.fields import BadRequest

__all__ = ["LocalTokenizer", "chat_messages", "load_tokenizer"]

log = logging.getLogger("loom.rollout")

_CHAT_KEYS = (
    "tools",
    "documents",
    "chat_template",
    "add_generation_prompt",
    "continue_final_message",
)


def chat_messages(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """The conversation as a chat template reads it: text parts joined by newlines (vLLM's
    "string" content format); any other part is refused."""
    out = []
    for i, m in enumerate(messages):
        content = m.get("content")
        if isinstance(content, list):
            texts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text":
                    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                    raise BadRequest(
                        f"messages[{i}].content: a {kind!r} part is not supported "
                        "(text parts only: the router serves text models)"
                    )
                texts.append(str(part.get("text", "")))
            m = {**m, "content": "\n".join(texts)}
        out.append(m)
    return out


class LocalTokenizer:
    """A Hugging Face tokenizer, used the way vLLM's server uses it."""

    def __init__(self, tokenizer: Any, source: str) -> None:
        self.tok = tokenizer
        self.source = source
        self._fast = getattr(tokenizer, "backend_tokenizer", None)
        self._marker = _space_marker(tokenizer)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if self._fast is not None:
            ids: list[int] = self._fast.encode(text, add_special_tokens=add_special_tokens).ids
            return ids
        return list(self.tok.encode(text, add_special_tokens=add_special_tokens))

    def chat(self, body: Mapping[str, Any]) -> list[int]:
        """Token ids of a chat request (`messages` and the template fields of vLLM's chat
        request)."""
        kwargs = {k: body[k] for k in _CHAT_KEYS if body.get(k) is not None}
        kwargs.setdefault("add_generation_prompt", True)
        extra = body.get("chat_template_kwargs") or {}
        try:
            text = self.tok.apply_chat_template(
                chat_messages(body["messages"]), tokenize=False, **kwargs, **extra
            )
        except (ValueError, TypeError, KeyError) as exc:
            raise BadRequest(f"the chat template cannot render these messages: {exc}") from None
        except Exception as exc:  # jinja2's TemplateError and friends
            raise BadRequest(f"the chat template failed: {exc}") from None
        if not isinstance(text, str):
            raise BadRequest("the chat template did not render text")
        return self.encode(text, add_special_tokens=False)

    def token_texts(self, ids: Sequence[int]) -> list[str]:
        """Each token as text on its own, as vLLM writes logprob tokens."""
        out = []
        raw = self.tok.convert_ids_to_tokens(list(ids)) if self._marker else None
        for j, tid in enumerate(ids):
            s = self.tok.decode([tid]) or ""
            if raw is not None and raw[j]:
                markers = len(raw[j]) - len(raw[j].lstrip(self._marker))
                missing = markers - (len(s) - len(s.lstrip(" ")))
                if missing > 0:
                    s = " " * missing + s
            out.append(s)
        return out


def _cached(name: str) -> bool:
    """Whether the Hugging Face cache holds a tokenizer of `name` (no network)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    try:
        found = try_to_load_from_cache(name, "tokenizer_config.json")
    except Exception:  # not a repo id
        return False
    return isinstance(found, str)


def _space_marker(tokenizer: Any) -> str | None:
    """SentencePiece (Metaspace) tokenizers drop a token's leading space in `decode`."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    try:
        pre = json.loads(backend.to_str()).get("pre_tokenizer") or {}
    except (ValueError, AttributeError):
        return None
    for sub in [pre, *pre.get("pretokenizers", [])]:
        if sub.get("type") == "Metaspace":
            return str(sub.get("replacement", "▁"))
    return None


def load_tokenizer(candidates: Sequence[str], *, download: bool = False) -> LocalTokenizer | None:
    """The first of `candidates` (paths or model names) that `transformers` loads; None if
    none does or transformers is not installed (the caller then tokenizes at an engine).
    Without `download`, a name is looked up in the local Hugging Face cache only."""
    if not download:  # NOTE: importing transformers costs seconds and hundreds of MB
        candidates = [c for c in candidates if Path(c).is_dir() or _cached(c)]
        if not candidates:
            return None
    try:
        from transformers import AutoTokenizer
    except ImportError:
        log.info("transformers is not installed: text prompts are tokenized by an engine")
        return None
    for source in candidates:
        try:
            local = download or Path(source).is_dir()
            tok = AutoTokenizer.from_pretrained(source, local_files_only=not local)
        except Exception as exc:  # a missing path, no hub access, an unknown format
            log.info("cannot load a tokenizer from %s: %s", source, exc)
            continue
        log.info("tokenizer from %s", source)
        return LocalTokenizer(tok, source)
    return None
