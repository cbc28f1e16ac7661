"""The engines behind the router: registration (probe, model check, ids), draining, weight
versions, what a lent engine's side reports, health, and what each engine says of its load.
It keeps the engines' state; it never moves a turn. Whoever owns the turns (the driver) hears
of an engine going down, coming back or reporting its load through `EngineEvents`."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

import aiohttp

from loom.core.errors import Conflict, NotFound, UpstreamError
from loom.runtime.rollout.admission import Capacity
from loom.runtime.rollout.config import EngineConfig, EngineKind, RolloutServerConfig
from loom.runtime.rollout.engines import EngineClient, ModelInfo, make_engine, probe_kind
from loom.runtime.rollout.metrics import RouterMetrics
from loom.runtime.rollout.state import EngineState

if TYPE_CHECKING:
    from loom.runtime.rollout.state import Trajectory

__all__ = ["EngineEvents", "EngineRegistry", "UnknownEngine"]

log = logging.getLogger("loom.rollout")

ClientFactory = Callable[[EngineKind, str, aiohttp.ClientSession, float], EngineClient]


class UnknownEngine(NotFound):
    def __str__(self) -> str:
        return f"unknown engine {self.args[0]!r}"


class EngineEvents(Protocol):
    """What the owner of the turns hears from the health checks."""

    def engine_down(self, e: EngineState, reason: str) -> None: ...
    def engine_up(self, e: EngineState) -> None: ...
    def engine_load(self, e: EngineState) -> None: ...


class EngineRegistry:
    def __init__(
        self,
        config: RolloutServerConfig,
        metrics: RouterMetrics,
        trajectories: Mapping[int, Trajectory],
        *,
        client_factory: ClientFactory = make_engine,
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.engines: dict[str, EngineState] = {}
        self.version = 0  # the current weight version: engines behind it take no new turns
        self.model = ""
        self.max_model_len: int | None = None
        self.first: ModelInfo | None = None  # what the first engine said of its model
        self.session: aiohttp.ClientSession | None = None
        self._trajectories = trajectories
        self._live: list[EngineState] | None = None
        self._current: list[EngineState] | None = None
        self._kinds: frozenset[EngineKind] | None = None
        self._idx = itertools.count()
        self._client_factory = client_factory

    # ---- registration --------------------------------------------------------------------

    async def add(self, cfg: EngineConfig) -> EngineState:
        """Probe an engine and register it."""
        assert self.session is not None, "start() the driver first"
        known = self.by_url(cfg.url)
        if known is not None:
            raise Conflict(f"engine {cfg.url} is already registered as {known.id}")
        idx = next(self._idx)
        eid = cfg.id or f"e{idx}"
        if eid in self.engines:
            raise Conflict(f"an engine named {eid!r} exists already")
        kind = cfg.kind
        timeout = self.config.engine_call_timeout_s
        if kind is EngineKind.AUTO:
            kind = await probe_kind(cfg.url, self.session, timeout, cfg.token)
        client = self._client_factory(kind, cfg.url, self.session, timeout)
        client.token = cfg.token
        info = await client.probe()
        if self.model and info.model != self.model and self.live():
            raise Conflict(
                f"engine {cfg.url} serves {info.model!r}, the others serve {self.model!r}"
            )
        self.model = self.model or info.model
        self.first = self.first or info
        if info.max_model_len:
            self.max_model_len = min(self.max_model_len or info.max_model_len, info.max_model_len)
        state = EngineState(
            idx=idx,
            id=eid,
            config=cfg.model_copy(update={"id": eid, "kind": kind}),
            client=client,
            model=info.model,
            trajectories=self._trajectories,
            version=self.version if cfg.version is None else cfg.version,
            capacity=Capacity(
                configured=cfg.max_running, stated=info.max_running, kv_full=self.config.kv_full
            ),
            send_priority=cfg.priority and info.priority is not False,
        )
        self.engines[eid] = state
        self._changed()
        log.info(
            "engine %s (%s, tp %d%s) at %s", eid, kind.value, cfg.tp, ", lent" * cfg.lent, cfg.url
        )
        return state

    def get(self, key: str) -> EngineState:
        """An engine by id, or by the URL it registered with (SGLang's gateway names workers
        by URL)."""
        e = self.engines.get(key) or self.by_url(key)
        if e is None:
            raise UnknownEngine(key)
        return e

    def by_url(self, url: str) -> EngineState | None:
        url = url.rstrip("/")
        if "://" not in url:  # a URL in a path segment loses a slash: http:/host:port
            url = url.replace(":/", "://", 1)
        return next((e for e in self.engines.values() if e.config.url == url), None)

    def forget_if_drained(self, e: EngineState) -> bool:
        """Forget `e` if it is draining and empty; whether it was forgotten now."""
        if e.draining and not e.running and not e.waiting and self.engines.get(e.id) is e:
            del self.engines[e.id]
            self.metrics.engine_removed(e.id)
            self._changed()
            return True
        return False

    # ---- views ---------------------------------------------------------------------------

    def _changed(self) -> None:
        """An engine joined, left, failed, came back, drained or changed weights."""
        self._live = self._current = None
        self._kinds = None

    def live(self) -> list[EngineState]:
        """Routable engines, largest degree first (Heddle's DP expects that order). The
        caller must not change the list."""
        if self._live is None:
            self._live = sorted(
                (e for e in self.engines.values() if e.routable), key=lambda e: (-e.tp, e.idx)
            )
        return self._live

    def current(self) -> list[EngineState]:
        """Routable engines at the current weight version (the caller must not change it)."""
        if self._current is None:
            self._current = [e for e in self.live() if e.version == self.version]
        return self._current

    def kinds(self) -> frozenset[EngineKind]:
        """The dialects of the registered engines."""
        if self._kinds is None:
            self._kinds = frozenset(e.config.kind for e in self.engines.values())
        return self._kinds

    # ---- state ---------------------------------------------------------------------------

    def mark_down(self, e: EngineState, reason: str) -> bool:
        """Take `e` out; whether it was in."""
        if not e.alive:
            return False
        log.warning("engine %s is out: %s", e.id, reason)
        e.alive = False
        self._changed()
        return True

    def mark_up(self, e: EngineState) -> bool:
        if e.alive:
            return False
        log.info("engine %s is back", e.id)
        e.alive = True
        e.failures = 0
        self._changed()
        return True

    def drain(self, e: EngineState) -> None:
        """`e` takes no new turns."""
        e.draining = True
        self._changed()

    def undrain(self, e: EngineState) -> bool:
        """`e` takes turns again; whether it was draining."""
        if not e.draining:
            return False
        log.info("engine %s is taken back", e.id)
        e.draining = False
        self._changed()
        return True

    def set_weights(self, version: int, engines: Sequence[str] = ()) -> list[EngineState]:
        """Weights of `version` are current; `engines` serve them already. Returns the
        engines behind."""
        if version < self.version:
            raise Conflict(f"weight version {version} is older than the current {self.version}")
        for eid in engines:
            if eid not in self.engines:
                raise UnknownEngine(eid)
        self.version = version
        for eid in engines:
            self.engines[eid].version = version
        self._changed()
        return [e for e in self.engines.values() if e.version != version]

    def report(
        self,
        eid: str,
        *,
        version: int | None = None,
        free_tokens: int | None = None,
        slack_s: float | None = None,
    ) -> EngineState:
        """What an engine's side says of it: the weight version it has loaded; for a lent
        engine, the rollout KV tokens it can still take and its serving-SLO slack."""
        e = self.engines.get(eid)
        if e is None:
            raise UnknownEngine(eid)
        if version is not None:
            if version < e.version:
                raise Conflict(f"engine {eid} serves version {e.version}; {version} is older")
            e.version = version
            self._changed()
        if free_tokens is not None:
            if free_tokens < 0:
                raise Conflict(f"free_tokens must be >= 0, got {free_tokens}")
            e.free_tokens = free_tokens
            e.stalled = False
        if slack_s is not None:
            e.reported_slack_s = slack_s
            e.stalled = False
        return e

    # ---- load ----------------------------------------------------------------------------

    async def load_loop(self, events: EngineEvents) -> None:
        """Ask every live engine for its load each `load_interval_s`; an engine that says
        nothing of it is logged once and admitted by its configured and stated limits."""
        mute: set[str] = set()
        while True:
            await asyncio.sleep(self.config.load_interval_s)
            engines = [e for e in self.engines.values() if e.alive]
            results = await asyncio.gather(
                *(e.client.load() for e in engines), return_exceptions=True
            )
            for e, got in zip(engines, results, strict=True):
                if isinstance(got, BaseException):
                    if not isinstance(got, UpstreamError):
                        raise got
                    if e.id not in mute:
                        mute.add(e.id)
                        log.info("engine %s says nothing of its load (%s)", e.id, got)
                    continue
                if self.engines.get(e.id) is not e or not e.alive:
                    continue
                mute.discard(e.id)
                e.reported = got
                e.capacity.observe(got, len(e.running))
                events.engine_load(e)

    # ---- health --------------------------------------------------------------------------

    async def health_loop(self, events: EngineEvents) -> None:
        cfg = self.config
        # NOTE: a busy engine answers /health late (vLLM's CPU build: 1-5 s at load)
        timeout = min(10.0, max(5.0, cfg.health_interval_s * 2))
        while True:
            await asyncio.sleep(cfg.health_interval_s)
            engines = list(self.engines.values())
            results = await asyncio.gather(*(e.client.health(timeout) for e in engines))
            for e, ok in zip(engines, results, strict=True):
                if ok:
                    e.failures = 0
                    if not e.alive:
                        events.engine_up(e)
                else:
                    e.failures += 1
                    if e.alive and e.failures >= cfg.health_failures:
                        events.engine_down(e, f"{e.failures} failed health checks")
