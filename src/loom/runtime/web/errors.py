"""One place that turns an error into a response: its status (`http_status`) and its body, in
the shape of the route family it answers (`ErrorShape`), whatever the web framework.

Loom's own routes answer `{"error": <code>, "detail": <message>}`; the OpenAI-compatible routes
(the router, the emulated engine) answer OpenAI's `{"error": {"message", "type", "param",
"code": <status>, "kind": <code>}}`. Both carry the kind's `code`, so a client raises the kind
the service raised (`loom.core.errors.ServiceError.of`)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from loom.core.errors import LoomError, http_status, status_codes

__all__ = [
    "ErrorShape",
    "Rendered",
    "code_for_status",
    "code_of",
    "error_parts",
    "render",
    "render_message",
]


class ErrorShape(enum.Enum):
    """The error body a route family answers with."""

    LOOM = "loom"  # Loom's own services
    OPENAI = "openai"  # what OpenAI, vLLM and SGLang clients parse


@dataclass(frozen=True, slots=True)
class Rendered:
    """An error response: status, JSON body and headers."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


def code_of(exc: BaseException) -> str:
    """The code naming `exc`'s kind in a body (a family's own `CODE` first: the relay's)."""
    code = getattr(exc, "CODE", None) or getattr(exc, "code", None)
    return code if isinstance(code, str) else LoomError.code


def code_for_status(status: int) -> str:
    """The code of the kind `status` stands for, where only a status is known (an engine's
    answer relayed, a framework's own 404 or 405)."""
    return status_codes().get(status, "invalid" if status < 500 else LoomError.code)


def _openai_type(status: int) -> str:
    if status == 401:
        return "authentication_error"
    return "invalid_request_error" if status < 500 else "server_error"


def render_message(
    message: str, status: int, code: str, shape: ErrorShape = ErrorShape.LOOM
) -> Rendered:
    """The response for an error of kind `code` saying `message` with `status`."""
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else {}
    if shape is ErrorShape.OPENAI:
        body: dict[str, Any] = {
            "error": {
                "message": message,
                "type": _openai_type(status),
                "param": None,
                "code": status,
                "kind": code,
            }
        }
    else:
        body = {"error": code, "detail": message}
    return Rendered(status, body, headers)


def render(exc: BaseException, shape: ErrorShape = ErrorShape.LOOM) -> Rendered:
    """The response for `exc`: the status `http_status` maps it to, and its kind's body."""
    return render_message(str(exc), http_status(exc), code_of(exc), shape)


def error_parts(body: Any) -> tuple[str | None, str]:
    """A client's reading of an error body of either shape: the kind's code (None where the
    body names none) and the message. Raises KeyError/TypeError for a body of neither shape."""
    err = body["error"]
    if isinstance(err, dict):  # OpenAI's shape
        kind = err.get("kind")
        return (kind if isinstance(kind, str) else None), str(err["message"])
    detail = body["detail"]
    if isinstance(detail, list):  # FastAPI's own validation errors: where and what
        detail = "; ".join(
            f"{'.'.join(map(str, d.get('loc', [])))}: {d.get('msg')}" for d in detail
        )
    return (err if isinstance(err, str) else None), str(detail)
