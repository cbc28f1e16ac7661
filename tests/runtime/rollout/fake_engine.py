"""An engine in the test's process: the stand-in's tokens and logprobs, a token every
millisecond, faults on demand (dead, hung); shared by the driver's in-process tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

from loom.runtime.rollout.config import EngineKind
from loom.runtime.rollout.engines import (
    NO_LOGPROBS,
    Delta,
    Done,
    EngineClient,
    EngineError,
    EngineUnreachable,
    ModelInfo,
)
from loom.runtime.rollout.standin import EOS, next_token, token_logprob
from loom.runtime.rollout.turn import LogprobSpec, TokenLogprob


class FakeEngine(EngineClient):
    """An engine in the test's process: a token every millisecond, the stand-in's tokens and
    logprobs, faults on demand; it records how many requests ran at once."""

    def __init__(self, url: str, session: Any) -> None:
        super().__init__(url, session)
        self.kind = EngineKind.SGLANG
        self.model = "fake"
        self.dead = False
        self.hung = False
        self.active: set[str] = set()
        self.peak = 0

    async def probe(self) -> ModelInfo:
        if self.dead:
            raise EngineUnreachable(f"{self.url} is dead")
        return ModelInfo("fake", self.kind, 100_000)

    async def health(self, timeout_s: float) -> bool:
        return not (self.dead or self.hung)

    async def abort(self, rid: str) -> None:
        return None

    async def generate(
        self,
        rid: str,
        prompt: list[int],
        sampling: Mapping[str, Any],
        priority: int | None,
        logprobs: LogprobSpec = NO_LOGPROBS,
    ) -> AsyncIterator[Delta | Done]:
        if self.dead:
            raise EngineUnreachable(f"{self.url} refused the connection")
        self.active.add(rid)
        self.peak = max(self.peak, len(self.active))
        try:
            ctx = list(prompt)
            for _ in range(int(sampling["max_tokens"])):
                await asyncio.sleep(0.001)
                while self.hung and not self.dead:
                    await asyncio.sleep(0.005)
                if self.dead:
                    raise EngineError(f"{self.url} broke the stream")
                tok = next_token(ctx)
                lp = [TokenLogprob(token_logprob(ctx, tok))] if logprobs.output else None
                ctx.append(tok)
                yield Delta([tok], f" t{tok}", lp)
                if tok == EOS and not sampling.get("ignore_eos"):
                    yield Done("stop", tok)
                    return
            yield Done("length")
        finally:
            self.active.discard(rid)
