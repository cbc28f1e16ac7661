"""The rollout router's asyncio driver: it owns the policy objects the simulator runs (a
`TurnScheduler`, a `Router`, the progressive predictor) and drives them over real engines.

Admission is the router's: each engine runs at most `max_running` turns from it, and the
rest wait in that engine's queue, ordered by the scheduler's key. A preemptive scheduler
(PPS) follows Algorithm 1: a turn that outranks the lowest-priority running turn of a full
engine evicts it (the engine aborts that request; its tokens so far are kept) and is promoted
at once; the evicted turn waits and later resumes with prompt + generated tokens, asking only
for the tokens still missing. The same resume carries a turn across a failed or stalled engine
to another one, so accepted work is never lost while one engine lives.

Placement: the router picks each turn's engine (`route`); at the end of a turn, while the
trajectory is in its tool call, `migrate` may move its home, and `stale` names trajectories
the router would now place elsewhere. A migration here is routing the next turn elsewhere:
its prefix is recomputed there (neither vLLM nor SGLang receives KV over HTTP; Loom does not
ship KV between engines).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from loom.core.errors import ConfigError
from loom.core.trajectory import TrajectorySpec
from loom.rollout.heddle.planner import DegreeCostModel, decode_context
from loom.rollout.heddle.router import HeddleRouter
from loom.rollout.policy import (
    ROUTERS,
    SCHEDULERS,
    PlacementKind,
    QueueingRouter,
    Router,
    TurnScheduler,
)
from loom.runtime.rollout.config import EngineConfig, EngineKind, RolloutServerConfig
from loom.runtime.rollout.engines import (
    Delta,
    Done,
    EngineError,
    EngineRejected,
    make_engine,
    probe_kind,
)
from loom.runtime.rollout.metrics import RouterMetrics
from loom.runtime.rollout.prediction import OnlinePredictor, trajectory_spec
from loom.runtime.rollout.state import EngineState, Trajectory, Turn, TurnPhase, TurnRecord

__all__ = [
    "BatchEntry",
    "Conflict",
    "NoEngine",
    "RolloutDriver",
    "UnknownEngine",
    "UnknownTrajectory",
]

log = logging.getLogger("loom.rollout")

MAX_ATTEMPTS = 8  # failovers and engine-side aborts before a turn is given up as failed
_PRIORITY_BOUND = 2**62


class NoEngine(Exception):
    """No live engine can take the turn (503)."""


class UnknownTrajectory(KeyError):
    def __str__(self) -> str:
        return f"unknown trajectory {self.args[0]!r}"


class UnknownEngine(KeyError):
    def __str__(self) -> str:
        return f"unknown engine {self.args[0]!r}"


class Conflict(Exception):
    """The request contradicts the router's state (409)."""


class _Stalled(Exception):
    pass


@dataclass(frozen=True)
class BatchEntry:
    """One trajectory of a declared batch."""

    id: str
    prompt_id: int
    prompt_tokens: int = 0
    group: str | None = None


def stable_id(value: str) -> int:
    """A prompt's id from its text or name, the same in every process."""
    return int.from_bytes(hashlib.blake2b(value.encode(), digest_size=7).digest(), "big")


def default_cost(
    config: RolloutServerConfig, history: Sequence[TrajectorySpec] = ()
) -> Callable[[int], Any]:
    """Heddle's placement cost per degree: from measured engine profiles where given, else
    the roofline model of `config.model` on `config.gpu`. F counts the router's admission:
    beyond the engines' `max_running` turns queue. The typical resident context is the
    history's (`decode_context`); with none, 8k tokens is assumed."""
    context = decode_context(history) if history else 8192
    running = min((e.max_running for e in config.engines), default=64)
    if config.profiles:
        from loom.runtime.rollout.cost import ProfiledDegreeCost

        try:
            return ProfiledDegreeCost.load(
                config.profiles, context_per_seq=context, max_group=4096, max_running=running
            )
        except OSError as exc:
            msg = f"cannot read engine profile {exc.filename}: {exc.strerror}"
            raise ConfigError(msg) from None
    from loom.core.topology import GpuType

    return DegreeCostModel(
        gpu=GpuType(config.gpu),
        model=config.model,
        context_per_seq=context,
        max_group=4096,
        max_running=running,
    )


def make_router(
    config: RolloutServerConfig,
    cost: Callable[[int], Any] | None = None,
    history: Sequence[TrajectorySpec] = (),
) -> Router:
    if config.placement is PlacementKind.HEDDLE:
        return HeddleRouter(cost or default_cost(config, history))
    if config.placement is PlacementKind.ROSE:
        rose: Router = ROUTERS.get(config.placement)(
            cap_per_gpu=config.rose_cap_per_gpu, lease_s=config.rose_lease_s
        )
        return rose
    router: Router = ROUTERS.get(config.placement)()
    return router


class RolloutDriver:
    """Everything the HTTP app calls; all methods run on one event loop."""

    def __init__(
        self,
        config: RolloutServerConfig,
        *,
        router: Router | None = None,
        scheduler: TurnScheduler | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.scheduler: TurnScheduler = scheduler or SCHEDULERS.get(config.scheduler)()
        self.predictor = OnlinePredictor(config.state_dir, config.history_limit)
        self.router: Router = router or make_router(config, history=self.predictor.history)
        self.clock = clock
        self._t0 = clock()
        self.engines: dict[str, EngineState] = {}
        self.version = 0  # the current weight version: engines behind it take no new turns
        # turns no engine can take now (the router's central queue, or no engine at the
        # current weight version), by trajectory id; offered again when capacity changes
        self._held: dict[int, Turn] = {}
        self._offering = False
        self.trajectories: dict[str, Trajectory] = {}
        self._by_tid: dict[int, Trajectory] = {}
        self._tids = itertools.count()
        self._idx = itertools.count()
        self._anon = itertools.count()
        self.metrics = RouterMetrics()
        self.counts = {
            "decisions": 0,
            "fallbacks": 0,  # the router named a dead or draining engine
            "preemptions": 0,
            "migrations": 0,
            "failovers": 0,
            "stalls": 0,  # turns a lent engine stopped advancing (moved elsewhere)
            "held": 0,  # turns that waited in the central queue
            "declared": 0,
            "finished": 0,
            "turns": 0,
        }
        # summed over finished turns: router queueing, time to first token, decoding
        self.timing = {"turns": 0, "queue_s": 0.0, "first_token_s": 0.0, "decode_s": 0.0}
        self.model = ""
        self.max_model_len: int | None = None
        self._session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._fitting = False
        self._closing = False
        self._started = False

    # ---- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        cfg = self.config
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=cfg.connect_timeout_s),
            connector=aiohttp.TCPConnector(limit=0, force_close=False),
            auto_decompress=False,
        )
        try:
            for e in cfg.engines:
                await self.add_engine(e)
        except BaseException:
            await self._session.close()
            raise
        self._spawn(self._health_loop())
        self._spawn(self._idle_loop())
        if self.predictor.due(cfg.refit_every):
            self._spawn(self._refit())
        self._started = True

    async def close(self) -> None:
        """Stop: every waiting and running turn ends (with an error for the client), every
        engine request is aborted."""
        self._closing = True
        for task in list(self._tasks):
            task.cancel()
        aborts = [
            e.client.abort(turn.rid()) for e in self.engines.values() for turn in e.running.values()
        ]
        for e in self.engines.values():
            for turn in [*e.running.values(), *e.waiting]:
                self._fail(turn, "the router is shutting down", 503)
        for turn in list(self._held.values()):
            self._fail(turn, "the router is shutting down", 503)
        await asyncio.gather(*aborts, return_exceptions=True)
        turn_tasks = [
            turn.task for e in self.engines.values() for turn in e.running.values() if turn.task
        ]
        await asyncio.gather(*self._tasks, *turn_tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            await asyncio.sleep(0)  # let the closed connections' transports finish closing

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def now(self) -> float:
        return self.clock() - self._t0

    # ---- engines -----------------------------------------------------------------------

    async def add_engine(self, cfg: EngineConfig) -> EngineState:
        """Probe and add an engine; the placement re-plans over the new set."""
        assert self._session is not None, "start() the driver first"
        if any(e.config.url == cfg.url for e in self.engines.values()):
            raise Conflict(f"engine {cfg.url} is already registered")
        idx = next(self._idx)
        eid = cfg.id or f"e{idx}"
        if eid in self.engines:
            raise Conflict(f"an engine named {eid!r} exists already")
        kind = cfg.kind
        if kind is EngineKind.AUTO:
            kind = await probe_kind(cfg.url, self._session)
        client = make_engine(kind, cfg.url, self._session)
        info = await client.probe()
        if self.model and info.model != self.model and self.live():
            raise Conflict(
                f"engine {cfg.url} serves {info.model!r}, the others serve {self.model!r}"
            )
        self.model = self.model or info.model
        if info.max_model_len:
            self.max_model_len = min(self.max_model_len or info.max_model_len, info.max_model_len)
        state = EngineState(
            idx=idx,
            id=eid,
            config=cfg.model_copy(update={"id": eid, "kind": kind}),
            client=client,
            model=info.model,
            trajectories=self._by_tid,
            version=self.version if cfg.version is None else cfg.version,
        )
        self.engines[eid] = state
        self.metrics.engine_added(eid)
        log.info(
            "engine %s (%s, tp %d%s) at %s", eid, kind.value, cfg.tp, ", lent" * cfg.lent, cfg.url
        )
        self._workers_changed()
        return state

    def remove_engine(self, eid: str, *, force: bool = False) -> EngineState:
        """Drain an engine: it takes no new turns, its waiting turns go elsewhere at once, its
        running ones finish there (`force`: they are aborted and resumed elsewhere now); it is
        forgotten once empty."""
        e = self.engines.get(eid)
        if e is None:
            raise UnknownEngine(eid)
        others = [o for o in self.live() if o is not e]
        if not others and e.load:
            raise Conflict(
                f"engine {eid} is the last live engine and holds {e.load} turns; "
                "add another engine before draining it"
            )
        e.draining = True
        for turn in list(e.waiting):
            e.waiting.remove(turn)
            self._dispatch(turn, avoid=e)
        if force:
            for turn in list(e.running.values()):
                self._requeue(turn, e, failed=False)
        self._forget_if_drained(e)
        self._workers_changed()
        return e

    def _forget_if_drained(self, e: EngineState) -> None:
        if e.draining and not e.running and not e.waiting and self.engines.get(e.id) is e:
            del self.engines[e.id]
            self.metrics.engine_removed(e.id)

    def live(self) -> list[EngineState]:
        """Routable engines, largest degree first (Heddle's DP expects that order)."""
        return sorted(
            (e for e in self.engines.values() if e.routable), key=lambda e: (-e.tp, e.idx)
        )

    def current(self) -> list[EngineState]:
        """Routable engines at the current weight version."""
        return [e for e in self.live() if e.version == self.version]

    def _workers_changed(self) -> None:
        current = self.current()
        if current:
            self.router.start([], current)
            self._handle_stale()
        self._offer_held()

    # ---- weights and lending -------------------------------------------------------------

    def set_weights(self, version: int, engines: Sequence[str] = ()) -> list[str]:
        """Weights of `version` are current; `engines` serve them already (others report
        theirs with `report` when they have loaded them). Turns waiting at an engine behind
        the version go elsewhere; its running ones finish there. Returns the engines behind."""
        if version < self.version:
            raise Conflict(f"weight version {version} is older than the current {self.version}")
        for eid in engines:
            if eid not in self.engines:
                raise UnknownEngine(eid)
        self.version = version
        for eid in engines:
            self.engines[eid].version = version
        if isinstance(self.router, QueueingRouter):
            self.router.set_version(version)
        behind = [e for e in self.engines.values() if e.version != version]
        for e in behind:
            self._move_waiting(e)
        self._workers_changed()
        return [e.id for e in behind]

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
        if free_tokens is not None:
            if free_tokens < 0:
                raise Conflict(f"free_tokens must be >= 0, got {free_tokens}")
            e.free_tokens = free_tokens
            e.stalled = False
        if slack_s is not None:
            e.reported_slack_s = slack_s
            e.stalled = False
        if e.version != self.version:
            self._move_waiting(e)
        self._workers_changed()
        return e

    def _move_waiting(self, e: EngineState) -> None:
        for turn in list(e.waiting):
            e.waiting.remove(turn)
            self._dispatch(turn, avoid=e)

    def _hold(self, turn: Turn) -> None:
        turn.engine = None
        turn.phase = TurnPhase.WAITING
        self._held[turn.traj.traj_id] = turn
        self.counts["held"] += 1

    def _unhold(self, turn: Turn) -> None:
        if self._held.pop(turn.traj.traj_id, None) is not None and isinstance(
            self.router, QueueingRouter
        ):
            self.router.withdraw(turn.traj.traj_id)

    def _offer_held(self) -> None:
        """Capacity changed: place the held turns that now fit."""
        if not self._held or self._offering or self._closing:
            return
        current = self.current()
        if not current:
            return
        self._offering = True
        try:
            if isinstance(self.router, QueueingRouter):
                by_idx = {e.idx: e for e in current}
                for tid, idx in self.router.drain(current, self.now()):
                    turn = self._held.pop(tid, None)
                    if turn is not None:
                        self._enqueue(by_idx[idx], turn)
            else:
                held, self._held = list(self._held.values()), {}
                for turn in held:
                    self._dispatch(turn)
        finally:
            self._offering = False

    def _engine_down(self, e: EngineState, reason: str) -> None:
        if not e.alive:
            return
        log.warning("engine %s is out: %s", e.id, reason)
        e.alive = False
        self.metrics.engine_state(e.id, alive=False)
        for turn in list(e.waiting):
            e.waiting.remove(turn)
            self._dispatch(turn, avoid=e)
        for turn in list(e.running.values()):
            self._requeue(turn, e, failed=True)
        self._forget_if_drained(e)
        self._workers_changed()

    async def _health_loop(self) -> None:
        cfg = self.config
        while True:
            await asyncio.sleep(cfg.health_interval_s)
            engines = list(self.engines.values())
            results = await asyncio.gather(
                # NOTE: a busy engine answers /health late (vLLM's CPU build: 1-5 s at load)
                *(e.client.health(min(10.0, max(5.0, cfg.health_interval_s * 2))) for e in engines)
            )
            for e, ok in zip(engines, results, strict=True):
                if ok:
                    e.failures = 0
                    if not e.alive:
                        log.info("engine %s is back", e.id)
                        e.alive = True
                        self.metrics.engine_state(e.id, alive=True)
                        self._workers_changed()
                else:
                    e.failures += 1
                    if e.alive and e.failures >= cfg.health_failures:
                        self._engine_down(e, f"{e.failures} failed health checks")

    # ---- trajectories ------------------------------------------------------------------

    def _new_trajectory(
        self,
        key: str,
        prompt_id: int,
        *,
        declared: bool,
        prompt_tokens: int = 0,
        group: str | None = None,
    ) -> Trajectory:
        tid = next(self._tids)
        now = self.now()
        t = Trajectory(
            traj_id=tid,
            key=key,
            prompt_id=prompt_id,
            group=group,
            declared=declared,
            first_arrival_s=now,
            turn_arrival_s=now,
            prompt_tokens=prompt_tokens,
            last_seen_s=now,
        )
        t.predicted_total = self.predictor.fallback(prompt_id, 0)
        self.trajectories[key] = t
        self._by_tid[tid] = t
        return t

    async def declare(self, entries: Sequence[BatchEntry]) -> dict[str, str]:
        """A batch before it starts: predictions for its first turns, then the placement
        plans over it. Returns each trajectory's planned engine."""
        live = self.live()
        if not live:
            raise NoEngine("no live engine: add one with POST /v1/engines")
        seen: set[str] = set()
        for b in entries:
            if b.id in seen:
                raise Conflict(f"trajectory {b.id!r} appears twice in the batch")
            seen.add(b.id)
            if b.id in self.trajectories:
                raise Conflict(f"trajectory {b.id!r} exists already")
        fresh = [
            self._new_trajectory(
                b.id, b.prompt_id, declared=True, prompt_tokens=b.prompt_tokens, group=b.group
            )
            for b in entries
        ]
        if self.predictor.model is not None and fresh:
            specs = [trajectory_spec(t, pending=True) for t in fresh]
            preds = await asyncio.get_running_loop().run_in_executor(
                None, self._predict_many, specs
            )
            for t, p in zip(fresh, preds, strict=True):
                t.predicted_total = p
        self.counts["declared"] += len(fresh)
        live = self.live()  # engines may have changed while predicting
        if not live:
            raise NoEngine("no live engine: add one with POST /v1/engines")
        current = self.current()
        plan = {}
        if isinstance(self.router, QueueingRouter) or not current:
            return {t.key: "" for t in fresh}  # placed turn by turn, when each is ready
        self.router.start(fresh, current)
        self._handle_stale()
        now = self.now()
        by_idx = {e.idx: e for e in current}
        for t in fresh:
            w = by_idx.get(self.router.route(t, current, now))
            plan[t.key] = w.id if w is not None else ""
        return plan

    def _predict_many(self, specs: Iterable[Any]) -> list[float]:
        return [self.predictor.predict(s, 0) for s in specs]

    def end_trajectory(self, key: str) -> Trajectory:
        t = self.trajectories.get(key)
        if t is None:
            raise UnknownTrajectory(key)
        t.ended = True
        if t.active is None:
            self._finish(t)
        return t

    def _finish(self, t: Trajectory) -> None:
        """`t` has ended and has no turn in flight."""
        if self.trajectories.get(t.key) is not t:
            return
        del self.trajectories[t.key]
        del self._by_tid[t.traj_id]
        if t.started or t.declared:
            self.router.finish(t)
        self.counts["finished"] += 1
        # NOTE: a request without a trajectory id is not an agentic trajectory: the predictor
        # learns from named ones only (and one-turn traffic would refit it without end).
        if t.records and not t.one_turn:
            self.predictor.record(t)
            if self.predictor.due(self.config.refit_every) and not self._fitting:
                self._spawn(self._refit())
        self._handle_stale()

    async def _refit(self) -> None:
        self._fitting = True
        try:
            history = list(self.predictor.history)
            model = await asyncio.get_running_loop().run_in_executor(
                None, self.predictor.fit, history
            )
            self.predictor.install(model)
            log.info("predictor refitted on %d trajectories", len(history))
        except Exception:
            log.exception("predictor refit failed; keeping the previous model")
        finally:
            self._fitting = False

    async def _idle_loop(self) -> None:
        idle = self.config.idle_trajectory_s
        while True:
            await asyncio.sleep(min(60.0, idle / 4))
            cutoff = self.now() - idle
            for t in list(self.trajectories.values()):
                if t.active is None and t.last_seen_s < cutoff:
                    log.info("trajectory %s idle for %.0f s: ended", t.key, idle)
                    self.end_trajectory(t.key)

    # ---- turns -------------------------------------------------------------------------

    def submit(
        self,
        key: str | None,
        prompt: list[int],
        sampling: dict[str, Any],
        *,
        prompt_id: int | None = None,
    ) -> Turn:
        """A turn of trajectory `key` (None: a one-turn trajectory of its own)."""
        if self._closing:
            raise NoEngine("the router is shutting down")
        if not self.live():
            raise NoEngine("no live engine: add one with POST /v1/engines")
        now = self.now()
        if key is None:
            t = self._new_trajectory(
                f"~anon-{next(self._anon)}",
                prompt_id if prompt_id is not None else _prompt_hash(prompt),
                declared=False,
                prompt_tokens=len(prompt),
            )
            t.one_turn = True
        else:
            existing = self.trajectories.get(key)
            if existing is None:
                pid = prompt_id if prompt_id is not None else _prompt_hash(prompt)
                t = self._new_trajectory(key, pid, declared=False, prompt_tokens=len(prompt))
            else:
                t = existing
            if t.active is not None:
                raise Conflict(
                    f"trajectory {key!r} has a turn in flight; send its turns one at a time"
                )
        if not t.started:
            t.started = True
            t.prompt_tokens = t.prompt_tokens or len(prompt)
            if not t.declared:
                self.router.join(t, self.current() or self.live())
        elif t.last_end_s is not None and t.records:
            last = t.records[-1]
            t.records[-1] = TurnRecord(last.input_tokens, last.output_tokens, now - t.last_end_s)
        t.turn_arrival_s = now
        t.last_seen_s = now
        turn = Turn(traj=t, index=t.steps_done, prompt=prompt, sampling=sampling, arrival_s=now)
        t.active = turn
        self.counts["turns"] += 1
        self._dispatch(turn)
        return turn

    async def tokenize(self, body: dict[str, Any]) -> list[int]:
        """Tokens of a text prompt or a chat conversation, from the least-loaded engine (for
        chat, one that applies a chat template: vLLM's `/tokenize` takes `messages`)."""
        live = self.live()
        if not live:
            raise NoEngine("no live engine: add one with POST /v1/engines")
        if "messages" in body:
            live = [e for e in live if e.config.kind is EngineKind.VLLM] or live
        e = min(live, key=lambda e: (e.load, e.idx))
        return await e.client.tokenize(body)

    def abandon(self, turn: Turn) -> None:
        """The client went away: stop the turn and keep what it generated."""
        if turn.phase is TurnPhase.DONE:
            return
        e = turn.engine
        turn.abandoned = True
        if e is None:
            self._unhold(turn)
        else:
            if turn.phase is TurnPhase.WAITING and turn in e.waiting:
                e.waiting.remove(turn)
            elif turn.phase is TurnPhase.RUNNING:
                self._stop_attempt(turn, e)
        turn.finish_reason = "abort"
        self._complete(turn, e)

    def _dispatch(self, turn: Turn, avoid: EngineState | None = None) -> None:
        live = self.live()
        if avoid is not None and len(live) > 1:
            live = [e for e in live if e is not avoid]
        if not live:
            self._fail(turn, "no live engine can take the turn", 503)
            return
        current = [e for e in live if e.version == self.version]
        queueing = isinstance(self.router, QueueingRouter)
        choice: int | None = None
        if current or queueing:
            choice = self.router.route(turn.traj, current, self.now())
            self.counts["decisions"] += 1
        if choice is None and (queueing or not current):
            self._hold(turn)  # no engine can take it now: it waits for capacity or weights
            return
        engine = next((e for e in current if e.idx == choice), None)
        if engine is None:
            self.counts["fallbacks"] += 1
            engine = min(current, key=lambda e: (e.load, e.idx))
        self._enqueue(engine, turn)

    def _enqueue(self, e: EngineState, turn: Turn) -> None:
        turn.engine = e
        turn.phase = TurnPhase.WAITING
        turn.key = self.scheduler.key(turn.traj, self.now())
        e.waiting.add(turn)
        if not e.has_slot() and self.scheduler.preemptive and e.running:
            victim = max(e.running.values(), key=lambda r: (r.key, r.seq))
            head = e.waiting[0]
            if self.scheduler.outranks(head.key, victim.key):
                # Algorithm 1, lines 6-10: evict r_min, move it to Q, promote Q.top.
                self.counts["preemptions"] += 1
                self.metrics.preemptions.inc()
                e.preempted += 1
                victim.preemptions += 1
                self._requeue(victim, e, failed=False, here=True)
        self._pump(e)
        self.metrics.engine_load(e)

    def _pump(self, e: EngineState) -> None:
        while e.alive and e.waiting and e.has_slot():
            turn = e.waiting.pop(0)
            self._run(e, turn)

    def _run(self, e: EngineState, turn: Turn) -> None:
        if turn.remaining <= 0:  # everything was generated before an abort landed
            turn.finish_reason = turn.finish_reason or "length"
            self._complete(turn, None)
            return
        turn.phase = TurnPhase.RUNNING
        turn.engine = e
        e.running[turn.seq] = turn
        e.admitted += 1
        turn.traj.host = e.idx
        now = self.now()
        if turn.started_s is None:
            turn.started_s = now
            self.metrics.queueing.observe(now - turn.arrival_s)
        turn.task = asyncio.get_running_loop().create_task(self._attempt(e, turn, turn.attempt))

    def _priority(self, e: EngineState, turn: Turn) -> int | None:
        if not e.config.priority:
            return None
        return max(-_PRIORITY_BOUND, min(_PRIORITY_BOUND, int(turn.key * 1000)))

    async def _attempt(self, e: EngineState, turn: Turn, attempt: int) -> None:
        cfg = self.config
        rid = turn.rid()
        stream = e.client.generate(
            rid, turn.prompt + turn.generated, turn.attempt_sampling(), self._priority(e, turn)
        )
        loop = asyncio.get_running_loop()
        done: Done | None = None
        stall_s = cfg.lent_stall_timeout_s if e.lent else cfg.stall_timeout_s
        try:
            async with asyncio.timeout(cfg.first_token_timeout_s) as deadline:
                async for item in stream:
                    if turn.attempt != attempt:  # superseded (defensive: we were cancelled)
                        return
                    if isinstance(item, Delta):
                        deadline.reschedule(loop.time() + stall_s)
                        if item.tokens:
                            if turn.first_token_s is None:
                                turn.first_token_s = self.now()
                            turn.generated.extend(item.tokens)
                            e.tokens += len(item.tokens)
                            self.metrics.tokens.labels(e.id).inc(len(item.tokens))
                        turn.text.append(item.text)
                        turn.updates.put_nowait(item)
                    else:
                        done = item
        except TimeoutError:
            # NOTE: a lent engine that stops a rollout is serving first, not broken (§4.1):
            # the turn moves, the engine stays in (its health checks judge it) but takes no
            # rollout turn until its side reports room or slack again.
            if e.lent and turn.attempt == attempt:
                self.counts["stalls"] += 1
                e.stalled = True  # no more turns there until its side reports again
            self._on_failure(e, turn, attempt, f"no token for {stall_s:g} s", down=not e.lent)
            return
        except EngineRejected as exc:
            if turn.attempt == attempt:
                self._fail(turn, exc.detail, exc.status)
            return
        except EngineError as exc:
            self._on_failure(e, turn, attempt, str(exc))
            return
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
        if turn.attempt != attempt or done is None:
            return
        turn.cached_tokens += done.cached_tokens
        if done.finish_reason == "abort" and turn.remaining > 0:
            # aborted by the engine, not by us (we cancel before aborting): resume
            self._on_failure(e, turn, attempt, "the engine aborted the request", down=False)
            return
        turn.finish_reason = done.finish_reason
        turn.matched_stop = done.matched_stop
        self._complete(turn, e)

    def _on_failure(
        self, e: EngineState, turn: Turn, attempt: int, reason: str, *, down: bool = True
    ) -> None:
        if turn.attempt != attempt or turn.phase is not TurnPhase.RUNNING:
            return
        turn.error = reason
        if down:
            self._engine_down(e, reason)  # moves this turn (and all others) elsewhere
        if turn.phase is TurnPhase.RUNNING and turn.engine is e:
            self._requeue(turn, e, failed=True)

    def _stop_attempt(self, turn: Turn, e: EngineState) -> None:
        """End the current attempt at `e`: the stream closes (vLLM aborts on disconnect) and
        the engine is told by id; the tokens received so far stay with the turn."""
        e.running.pop(turn.seq, None)
        rid = turn.rid()
        turn.attempt += 1
        task = turn.task
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()
        if e.alive and not self._closing:
            self._spawn(self._abort_quietly(e, rid))

    async def _abort_quietly(self, e: EngineState, rid: str) -> None:
        with contextlib.suppress(Exception):
            await e.client.abort(rid)

    def _requeue(self, turn: Turn, e: EngineState, *, failed: bool, here: bool = False) -> None:
        """Stop `turn`'s attempt at `e` and queue it again: at `e` (`here`, a preemption) or
        wherever the router sends it, avoiding `e`."""
        self._stop_attempt(turn, e)
        if failed:  # its engine failed, stalled or was taken out: counted once, here
            if isinstance(self.router, QueueingRouter):
                self.router.release(turn.traj.traj_id)
            self.counts["failovers"] += 1
            self.metrics.failovers.inc()
            e.failed_turns += 1
            turn.failovers += 1
        if turn.attempt > MAX_ATTEMPTS + turn.preemptions:
            self._fail(turn, f"gave up after {turn.attempt} attempts: {turn.error}", 502)
            return
        if failed:
            log.info("turn %s resumes elsewhere after %d tokens", turn.rid(), len(turn.generated))
        if here and e.routable:
            turn.phase = TurnPhase.WAITING
            turn.key = self.scheduler.key(turn.traj, self.now())
            e.waiting.add(turn)
        else:
            self._dispatch(turn, avoid=e)
        self._pump(e)

    def _complete(self, turn: Turn, e: EngineState | None) -> None:
        if turn.phase is TurnPhase.DONE:
            return
        if e is not None:
            e.running.pop(turn.seq, None)
            e.completed += 1
        turn.phase = TurnPhase.DONE
        t = turn.traj
        now = self.now()
        turn.ended_s = now
        n = len(turn.generated)
        if n:
            t.records.append(TurnRecord(max(0, len(turn.prompt) - t.context), n, None))
            t.steps_done += 1
            t.generated += n
            t.context = len(turn.prompt) + n
        t.last_end_s = now
        t.last_seen_s = now
        t.active = None
        self.metrics.turn_done(now - turn.arrival_s)
        if turn.started_s is not None and turn.first_token_s is not None:
            self.timing["turns"] += 1
            self.timing["queue_s"] += turn.started_s - turn.arrival_s
            self.timing["first_token_s"] += turn.first_token_s - turn.started_s
            self.timing["decode_s"] += now - turn.first_token_s
        turn.updates.put_nowait(None)
        turn.finished.set()
        if e is not None:
            self._pump(e)
            self.metrics.engine_load(e)
            self._forget_if_drained(e)
        if t.one_turn or t.ended:
            self._finish(t)
        elif n:
            self._spawn(self._after_turn(t, t.steps_done))
        self._handle_stale()
        self._offer_held()

    def _fail(self, turn: Turn, reason: str, status: int) -> None:
        """The turn cannot be served: the client gets `status` with `reason`."""
        if turn.phase is TurnPhase.DONE:
            return
        e = turn.engine
        if e is None:
            self._unhold(turn)
        else:
            if turn.phase is TurnPhase.RUNNING:
                self._stop_attempt(turn, e)
            elif turn in e.waiting:
                e.waiting.remove(turn)
        turn.error = reason
        turn.error_status = status
        turn.finish_reason = "error"
        turn.phase = TurnPhase.DONE
        turn.ended_s = self.now()
        t = turn.traj
        t.active = None
        turn.updates.put_nowait(None)
        turn.finished.set()
        if t.one_turn or t.ended:
            self._finish(t)
        if e is not None and not self._closing:
            self._pump(e)
            self._offer_held()

    async def _after_turn(self, t: Trajectory, steps: int) -> None:
        """During the tool call: predict anew (off the loop), then let the router move the
        trajectory's home."""
        spec = trajectory_spec(t, pending=True)
        assert spec is not None, "a pending turn always makes a spec"
        if self.predictor.model is not None:
            pred = await asyncio.get_running_loop().run_in_executor(
                None, self.predictor.predict, spec, t.generated
            )
        else:
            pred = self.predictor.fallback(t.prompt_id, t.generated)
        if self._by_tid.get(t.traj_id) is not t or t.steps_done != steps:
            return  # ended, or its next turn already finished: a newer prediction follows
        t.predicted_total = pred
        self._migrate(t)

    def _migrate(self, t: Trajectory) -> None:
        live = self.current()
        if not live:
            return
        target = self.router.migrate(t, live, self.now())
        if target is None:
            return
        self.counts["migrations"] += 1
        self.metrics.migrations.inc()
        turn = t.active
        if turn is not None and turn.phase is TurnPhase.WAITING and turn.engine is not None:
            dest = next((e for e in live if e.idx == target), None)
            if dest is not None and dest is not turn.engine and turn in turn.engine.waiting:
                turn.engine.waiting.remove(turn)
                self._enqueue(dest, turn)

    def _handle_stale(self) -> None:
        for tid in self.router.stale():
            t = self._by_tid.get(tid)
            if t is None:
                continue
            if t.active is None or t.active.phase is TurnPhase.WAITING:
                self._migrate(t)

    # ---- views -------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        engines = {
            e.id: {
                "url": e.config.url,
                "kind": e.config.kind.value,
                "tp": e.tp,
                "alive": e.alive,
                "draining": e.draining,
                "max_running": e.max_running,
                "running": len(e.running),
                "waiting": len(e.waiting),
                "load": e.load,
                "admitted": e.admitted,
                "completed": e.completed,
                "preempted": e.preempted,
                "failed_turns": e.failed_turns,
                "tokens": e.tokens,
                "lent": e.lent,
                "version": e.version,
                "free_tokens": e.free_tokens,
                "slack_s": e.reported_slack_s if math.isfinite(e.reported_slack_s) else None,
                "stalled": e.stalled,
            }
            for e in self.engines.values()
        }
        return {
            "model": self.model,
            "placement": self.config.placement.value,
            "scheduler": self.config.scheduler.value,
            "engines": engines,
            "weights_version": self.version,
            "held": len(self._held),
            "policy": dict(self.counts),
            "timing": dict(self.timing),
            "trajectories": {
                "active": len(self.trajectories),
                "in_flight": sum(1 for t in self.trajectories.values() if t.active),
            },
            "predictor": {
                "history": len(self.predictor.history),
                "fitted": self.predictor.model is not None,
                "fits": self.predictor.fits,
            },
        }


def _prompt_hash(prompt: list[int]) -> int:
    head = ",".join(map(str, prompt[:256]))
    return stable_id(head)


def check_config(config: RolloutServerConfig) -> None:
    """Fail early on settings the driver cannot use."""
    ids = [e.id for e in config.engines if e.id is not None]
    if len(ids) != len(set(ids)):
        raise ConfigError(f"engine ids must be unique, got {ids}")
    urls = [e.url for e in config.engines]
    if len(urls) != len(set(urls)):
        raise ConfigError(f"engine urls must be unique, got {urls}")
