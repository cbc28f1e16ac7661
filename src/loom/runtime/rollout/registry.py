"""The engines behind the router, as the driver meets them over the wire: registration's probe
(dialect, model, limits), and the rounds of health checks and load reports. What it learns
goes to the router's core as events; the core's `Fleet` keeps the engines' state."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp

from loom.core.errors import Conflict, InvalidRequest, Unavailable, UpstreamError
from loom.runtime.rollout import events as ev
from loom.runtime.rollout.admission import Capacity
from loom.runtime.rollout.config import EngineConfig, EngineKind, RolloutServerConfig
from loom.runtime.rollout.engines import (
    EngineClient,
    EngineError,
    EngineUnreachable,
    ModelInfo,
    make_engine,
    probe_kind,
)
from loom.runtime.rollout.state import EngineState, Fleet, UnknownEngine

__all__ = ["ClientFactory", "EngineRegistry", "UnknownEngine"]

log = logging.getLogger("loom.rollout")

ClientFactory = Callable[[EngineKind, str, aiohttp.ClientSession, float], EngineClient]
Send = Callable[[ev.Event], Any]


class EngineRegistry:
    def __init__(
        self,
        config: RolloutServerConfig,
        fleet: Fleet,
        *,
        client_factory: ClientFactory = make_engine,
    ) -> None:
        self.config = config
        self.fleet = fleet
        self.model = ""
        self.max_model_len: int | None = None
        self.first: ModelInfo | None = None  # what the first engine said of its model
        self.session: aiohttp.ClientSession | None = None
        self._client_factory = client_factory

    async def probe(self, cfg: EngineConfig) -> EngineState:
        """Probe an engine: what joins the fleet (`events.EngineAdded`)."""
        assert self.session is not None, "start() the driver first"
        known = self.fleet.by_url(cfg.url)
        if known is not None:
            raise Conflict(f"engine {cfg.url} is already registered as {known.id}")
        idx = self.fleet.next_idx()
        eid = cfg.id or f"e{idx}"
        if eid in self.fleet.engines:
            raise Conflict(f"an engine named {eid!r} exists already")
        kind = cfg.kind
        timeout = self.config.engine_call_timeout_s
        if kind is EngineKind.AUTO:
            kind = await probe_kind(cfg.url, self.session, timeout, cfg.token)
        client = self._client_factory(kind, cfg.url, self.session, timeout)
        client.token = cfg.token
        info = await client.probe()
        if self.model and info.model != self.model and self.fleet.live():
            raise Conflict(
                f"engine {cfg.url} serves {info.model!r}, the others serve {self.model!r}"
            )
        self.model = self.model or info.model
        self.first = self.first or info
        if info.max_model_len:
            self.max_model_len = min(self.max_model_len or info.max_model_len, info.max_model_len)
        log.info(
            "engine %s (%s, tp %d%s) at %s", eid, kind.value, cfg.tp, ", lent" * cfg.lent, cfg.url
        )
        kv = await client.kv_links() if self.config.move_kv else None
        return EngineState(
            idx=idx,
            id=eid,
            config=cfg.model_copy(update={"id": eid, "kind": kind}),
            client=client,
            model=info.model,
            version=self.fleet.version if cfg.version is None else cfg.version,
            capacity=Capacity(
                configured=cfg.max_running, stated=info.max_running, kv_full=self.config.kv_full
            ),
            send_priority=cfg.priority and info.priority is not False,
            high_first=client.high_first,
            kv=kv,
        )

    def kinds(self) -> frozenset[EngineKind]:
        """The dialects of the registered engines."""
        return self.fleet.kinds()

    async def tokenize(self, body: Mapping[str, Any], send: Send) -> list[int]:
        """Token ids by a live engine's `/tokenize`, each engine tried in turn (fewest failed
        health checks, least load first), each call with a deadline; an engine that refuses
        the connection is down, one that fails otherwise is checked now."""
        live = self.fleet.live()
        if "messages" in body:
            live = [e for e in live if e.config.kind is EngineKind.VLLM]
            if not live:
                raise InvalidRequest(
                    "chat needs the router's tokenizer (set `tokenizer`) or a vLLM engine"
                )
        errors = []
        for e in sorted(live, key=lambda e: (e.failures, e.load, e.idx)):
            try:
                return await _client(e).tokenize(body)
            except EngineUnreachable as exc:
                send(ev.EngineDown(e, str(exc)))
                errors.append(str(exc))
            except EngineError as exc:
                errors.append(str(exc))
                send(ev.Suspect(e, str(exc)))
        if not errors:
            raise Unavailable("no live engine: add one with POST /v1/engines")
        raise EngineError(f"no engine could tokenize the prompt: {'; '.join(errors)}")

    async def load_loop(self, send: Send) -> None:
        """Ask every live engine for its load each `load_interval_s`; an engine that says
        nothing of it is logged once and admitted by its configured and stated limits."""
        mute: set[str] = set()
        while True:
            await asyncio.sleep(self.config.load_interval_s)
            engines = [e for e in self.fleet.engines.values() if e.alive]
            results = await asyncio.gather(
                *(_client(e).load() for e in engines), return_exceptions=True
            )
            for e, got in zip(engines, results, strict=True):
                if isinstance(got, BaseException):
                    if not isinstance(got, UpstreamError):
                        raise got
                    if e.id not in mute:
                        mute.add(e.id)
                        log.info("engine %s says nothing of its load (%s)", e.id, got)
                    continue
                mute.discard(e.id)
                send(ev.EngineLoaded(e, got))
            await self._lent_sides(engines, send)

    async def _lent_sides(self, engines: list[EngineState], send: Send) -> None:
        """A lent engine that says its side (Loom's co-serving emulated engines) reports its
        room and serving slack as its co-serving executor would (`PATCH /v1/engines/{id}`)."""
        lent = [e for e in engines if e.lent]
        if not lent:
            return
        sides = await asyncio.gather(*(_client(e).coserve() for e in lent), return_exceptions=True)
        for e, side in zip(lent, sides, strict=True):
            if isinstance(side, UpstreamError) or side is None:
                continue
            if isinstance(side, BaseException):
                raise side
            send(ev.Report(e.id, free_tokens=side[0], slack_s=side[1]))

    async def health_loop(self, send: Send) -> None:
        cfg = self.config
        # NOTE: a busy engine answers /health late (vLLM's CPU build: 1-5 s at load)
        timeout = min(10.0, max(5.0, cfg.health_interval_s * 2))
        while True:
            await asyncio.sleep(cfg.health_interval_s)
            engines = list(self.fleet.engines.values())
            results = await asyncio.gather(*(_client(e).health(timeout) for e in engines))
            send(ev.Health(list(zip(engines, results, strict=True))))


def _client(e: EngineState) -> EngineClient:
    assert e.client is not None, "a served engine has a client"
    return e.client
