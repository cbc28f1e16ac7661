"""A co-serving emulated engine's serving side over HTTP (ROSE §4.1, `coserve.py`): the
serving model's requests, the RL step that resets the memory budget, and what serving saw.

`POST /v1/completions` with `model` the serving model (`GET /v1/models` lists both) is a
serving request: its prompt (token ids or text) and `max_tokens` are its lengths. A
prefiller answers once the prompt is prefilled, with the first token; a decoder (the request
arrives prefilled, as PD disaggregation hands it over) once its last token is out. Each
answer's `loom_serving` gives the emulated seconds it arrived, had its first token and
finished, its TTFT (a prefiller's) or TPOT (a decoder's), and the instance's role. A
serving request runs to its end even if its client goes away (the simulator's serving side
has no abort). Streaming is refused.

`POST /loom/coserve/step {"step": N}`: a new RL step (the memory policy sets the rollout's
budget from recent serving usage). `GET /loom/coserve`: the instance's role, serving
requests served and ended, the share within the SLO of its role, its serving load, pages
and the rollout's budget, the rollout requests it took off the GPU (pages reclaimed for
serving, or stalled), and what the router's ROSE placement reads: the rollout tokens it can
still take (`free_tokens`) and its serving-SLO slack (`slack_s`; null: nothing binds)."""

from __future__ import annotations

import asyncio
import math
import time
from typing import TYPE_CHECKING, Any

from aiohttp import web

from loom.core.errors import InvalidRequest
from loom.rollout.rose.admission import Role
from loom.runtime.emulate.coserve import CoServingEngine
from loom.runtime.emulate.tokens import generate, piece, prompt_ids
from loom.runtime.emulate.wire import bad as _bad
from loom.runtime.emulate.wire import json_response as _json
from loom.runtime.emulate.wire import read_body as _body

if TYPE_CHECKING:
    from loom.runtime.emulate.server import EmulatedServer
    from loom.sim.rollout.coserve import ServingRequest

__all__ = ["ServingRoutes"]

STEP_FIELDS = frozenset({"step"})
SERVING_FIELDS = frozenset(
    {"model", "prompt", "max_tokens", "stream", "temperature", "request_id", "ignore_eos"}
)


class ServingRoutes:
    """The serving routes of one co-serving emulated engine."""

    def __init__(self, server: EmulatedServer) -> None:
        self.server = server
        assert isinstance(server.core, CoServingEngine)
        self.core: CoServingEngine = server.core

    @property
    def model(self) -> str:
        return self.core.coserve.serving_model

    def add(self, app: web.Application) -> None:
        app.router.add_get("/loom/coserve", self.info)
        app.router.add_post("/loom/coserve/step", self.step)

    async def info(self, request: web.Request) -> web.Response:
        with self.server.clock.step():
            stats: dict[str, Any] = dict(self.core.serving_stats())
        if stats["slack_s"] == math.inf:
            stats["slack_s"] = None  # (JSON has no infinity): nothing binds
        return _json({"role": self.core.coserve.role.value, "serving_model": self.model, **stats})

    async def step(self, request: web.Request) -> web.Response:
        try:
            body = await _body(request, STEP_FIELDS)
            step = body.get("step")
            if isinstance(step, bool) or not isinstance(step, int) or step < 0:
                raise InvalidRequest("step must be an integer >= 0")
        except InvalidRequest as exc:
            return _bad(exc)
        with self.server.clock.step():
            self.core.begin_step(step)
        return _json({"step": step})

    async def complete(self, body: dict[str, Any]) -> web.Response:
        """A serving request (`body["model"]` is the serving model)."""
        unknown = body.keys() - SERVING_FIELDS
        if unknown:
            return _bad(
                f"a serving request takes {', '.join(sorted(SERVING_FIELDS))}; "
                f"not {', '.join(sorted(unknown))}"
            )
        if body.get("stream"):
            return _bad("a serving request cannot stream here (the emulated serving side)")
        try:
            prompt = prompt_ids(body.get("prompt"))
            n = body.get("max_tokens", 16)
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise InvalidRequest("max_tokens must be an integer >= 1")
            ended = asyncio.Event()
            with self.server.clock.step():
                req = self.core.serve(len(prompt), n, lambda _r: ended.set())
        except InvalidRequest as exc:
            return _bad(exc)
        await ended.wait()
        prefill = self.core.coserve.role == Role.PREFILL
        out = generate(prompt, 1 if prefill else n, ignore_eos=True).tokens
        return _json(
            {
                "id": f"cmpl-{body.get('request_id') or req.req_id}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": self.model,
                "choices": [
                    {
                        "index": 0,
                        "text": piece(out),
                        "token_ids": out,
                        "finish_reason": "length",
                        "logprobs": None,
                    }
                ],
                "usage": {
                    "prompt_tokens": len(prompt),
                    "completion_tokens": len(out),
                    "total_tokens": len(prompt) + len(out),
                },
                "loom_serving": _timing(req, prefill),
            }
        )


def _timing(req: ServingRequest, prefill: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "role": "prefill" if prefill else "decode",
        "arrival_s": req.arrival_s,
        "first_token_s": req.first_token_s,
    }
    if prefill:
        out["ttft_s"] = req.first_token_s - req.arrival_s
    else:
        out["finish_s"] = req.finish_s
        out["tpot_s"] = (
            (req.finish_s - req.first_token_s) / (req.output - 1) if req.output > 1 else 0.0
        )
    return out
