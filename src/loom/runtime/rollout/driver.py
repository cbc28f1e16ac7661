"""The rollout router's asyncio driver: it owns the policy objects the simulator runs (a
`TurnScheduler`, a `Router`, the progressive predictor) and drives them over real engines.

Admission: engines schedule, the router places. A turn is forwarded at once while its engine
has room by what the engine says of itself (`admission.Capacity`: the cap configured, the
limit it states, its load reports), with the scheduler's key as the request's `priority`.
Only a turn the engine would queue anyway waits in the router, in that engine's queue,
ordered by the client's priority class, then by whether it has waited `max_wait_s` (aged: it
runs next, oldest first), then by the scheduler's key; and any engine that frees a slot with
nothing of its own waiting takes the best turn waiting elsewhere (late binding) where that
pays for prefilling its context there. A preemptive scheduler (PPS) follows Algorithm 1: a
turn that outranks the lowest-priority running turn of a full engine evicts it (the engine
aborts that request; its tokens so far are kept) and is promoted at once, but only where
the wait it saves exceeds the victim's prefill again (the engine's latency model) and the
victim has been preempted fewer than `max_preemptions` times; the evicted turn waits and
later resumes with prompt + generated tokens, asking only for the tokens still missing.
Tokens prefilled again are counted by why (`reprefill_tokens` in `/v1/stats`). The same resume
carries a turn across a failed or stalled engine to another one, so accepted work is never
lost while one engine lives. An engine's own deliberate abort, and `abort`, end a turn with
what it generated, marked abort.

A turn's lifecycle is `state.Turn`'s state machine (`turn.TRANSITIONS`); `_end` is the one
place a turn ends.
Engines (registration, versions, health) are `EngineRegistry`'s.

Placement: the router picks each turn's engine (`route`); at the end of a turn, while the
trajectory is in its tool call, `migrate` may move its home, and `stale` names trajectories
the router would now place elsewhere. A migration here is routing the next turn elsewhere:
its prefix is recomputed there (neither vLLM nor SGLang receives KV over HTTP; Loom does not
ship KV between engines). A trajectory may have several turns in flight (agents branch; the
n samples of one request are siblings).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import itertools
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import aiohttp

from loom.core.errors import (
    ConfigError,
    Conflict,
    InvalidRequest,
    NotFound,
    Unavailable,
    http_status,
)
from loom.core.trajectory import TrajectorySpec
from loom.perf.latency import LatencyModel
from loom.rollout.heddle.planner import DegreeCostModel, decode_context
from loom.rollout.heddle.router import HeddleRouter
from loom.rollout.moves import decode_step_s, move_pays, pace_gain_s, prefill_s, slot_wait_s
from loom.rollout.policy import ROUTERS, SCHEDULERS, PlacementKind, Router, TurnScheduler
from loom.runtime.rollout.admission import engine_priority
from loom.runtime.rollout.config import EngineConfig, EngineKind, RolloutServerConfig
from loom.runtime.rollout.engines import (
    Delta,
    Done,
    EngineError,
    EngineRejected,
    EngineUnreachable,
    make_engine,
)
from loom.runtime.rollout.metrics import RouterMetrics
from loom.runtime.rollout.prediction import OnlinePredictor, pending_spec
from loom.runtime.rollout.registry import ClientFactory, EngineRegistry, UnknownEngine
from loom.runtime.rollout.state import EngineState, Trajectory, Turn, TurnRecord
from loom.runtime.rollout.tokenizer import LocalTokenizer, load_tokenizer
from loom.runtime.rollout.turn import Key, TurnRequest, TurnState

__all__ = [
    "BatchEntry",
    "RolloutDriver",
    "UnknownEngine",
    "UnknownTrajectory",
    "check_config",
    "stable_id",
]

log = logging.getLogger("loom.rollout")

MAX_ATTEMPTS = 8  # failovers before a turn is given up as failed
LATE_LOOK = 8  # waiting turns of each other engine a free engine considers (best first)
REPREFILL_REASONS = ("placement", "migration", "late_binding", "preemption", "failover")
ABORTED_BY_REQUEST = "aborted by request"


class UnknownTrajectory(NotFound):
    def __str__(self) -> str:
        return f"unknown trajectory {self.args[0]!r}"


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
    running = min((e.max_running for e in config.engines if e.max_running), default=64)
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


def latency_models(config: RolloutServerConfig) -> Callable[[int], LatencyModel | None]:
    """The engines' latency model by tensor-parallel degree, what a prefill again costs: the
    profile of that degree where `profiles` are given, else the roofline model of `model`
    on `gpu` (None where neither fits the degree)."""
    from loom.perf.latency import ProfiledLatencyModel, RooflineLatencyModel

    profiled: dict[int, LatencyModel] = {}
    for path in config.profiles:
        try:
            lat = ProfiledLatencyModel.load(path)
        except OSError as exc:
            raise ConfigError(
                f"cannot read engine profile {exc.filename}: {exc.strerror}"
            ) from None
        profiled[lat.tp] = lat
    cache: dict[int, LatencyModel | None] = {}

    def model(tp: int) -> LatencyModel | None:
        if tp not in cache:
            if profiled:
                cache[tp] = profiled.get(tp)
            else:
                try:
                    cache[tp] = RooflineLatencyModel(config.gpu, config.model, tp)
                except ConfigError:
                    cache[tp] = None
        return cache[tp]

    return model


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
        client_factory: ClientFactory = make_engine,
    ) -> None:
        self.config = config
        self.scheduler: TurnScheduler = scheduler or SCHEDULERS.get(config.scheduler)()
        self.predictor = OnlinePredictor(config.state_dir, config.history_limit)
        self.router: Router = router or make_router(config, history=self.predictor.history)
        self.router.move_pays = self._move_pays
        self._latency = latency_models(config)
        self.clock = clock
        self._t0 = clock()
        self.trajectories: dict[str, Trajectory] = {}
        self._by_tid: dict[int, Trajectory] = {}
        self.metrics = RouterMetrics(lambda: list(self.engines.values()))
        self.registry = EngineRegistry(
            config, self.metrics, self._by_tid, client_factory=client_factory
        )
        self.engines = self.registry.engines
        # turns no engine can take now, by trajectory id, in arrival order; the placement
        # holds (in its central queue) the trajectories in `_router_held`, the others wait
        # for an engine at the current weights
        self._held: dict[int, deque[Turn]] = {}
        self._router_held: set[int] = set()
        self._offering = False
        self._by_rid: dict[str, list[Turn]] = {}  # client request ids of turns in flight
        self._tids = itertools.count()
        self._anon = itertools.count()
        self.tokenizer: LocalTokenizer | None = None
        self._tokenizer_tried = False
        self._probing: set[str] = set()  # engines whose health is being checked now
        self._offer_again = False  # capacity changed while held turns were being placed
        self._to_predict: dict[int, Trajectory] = {}  # in a tool call, wanting a prediction
        self._predict_wanted = asyncio.Event()
        self._loop_time: Callable[[], float] = time.monotonic
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
            "aborted": 0,  # turns ended by an abort (the client's or the engine's)
            "abandoned": 0,  # turns whose client went away
            "engine_tokenized": 0,  # text prompts tokenized by an engine (no local tokenizer)
            "late_bindings": 0,  # waiting turns a freed engine took from another's queue
            "aged": 0,  # turns that waited `max_wait_s` and so ran next
            "preemptions_declined": 0,  # outranked, but not worth a prefill again (or capped)
            "migrations_declined": 0,  # placed elsewhere, but not worth a prefill again
            "priority_refused": 0,  # engines that refused the `priority` field
            "removed": 0,  # engines drained and forgotten (a deregistration, DELETE)
            "moved": 0,  # turns resumed elsewhere because their draining engine left
        }
        # tokens an engine had computed that a turn's attempt prefills again, by why it went
        # where it went (as the router predicts them: an engine's prefix cache may keep some)
        self.reprefill = dict.fromkeys(REPREFILL_REASONS, 0)
        # summed over finished turns: router queueing, time to first token, decoding
        self.timing = {"turns": 0, "queue_s": 0.0, "first_token_s": 0.0, "decode_s": 0.0}
        self.timing["longest_wait_s"] = 0.0  # the most one turn waited in the router
        self._session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._fitting = False
        self._closing = False
        # turns are being ended together (an abort): the slots they free stay empty until
        # all have ended, so that none of them starts at an engine only to be aborted there
        self._ending = False

    # ---- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        cfg = self.config
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=cfg.connect_timeout_s),
            # NOTE: idle connections closed before the engines' servers close them (uvicorn's
            # keep-alive, vLLM's 5 s): a request sent as the server closes fails to write
            connector=aiohttp.TCPConnector(limit=0, force_close=False, keepalive_timeout=4.0),
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),  # engines set none; skip the jar per request
        )
        self.registry.session = self._session
        try:
            for e in cfg.engines:
                await self.add_engine(e)
        except BaseException:
            await self._session.close()
            raise
        self._loop_time = asyncio.get_running_loop().time
        self._spawn(self.registry.health_loop(self))
        self._spawn(self.registry.load_loop(self))
        self._spawn(self._age_loop())
        self._spawn(self._idle_loop())
        self._spawn(self._watchdog())
        self._spawn(self._predict_loop())
        if self.predictor.due(cfg.refit_every):
            self._spawn(self._refit())

    async def close(self) -> None:
        """Stop: every held, queued and running turn ends (with an error for the client),
        every engine request is aborted."""
        self._closing = True
        for task in list(self._tasks):
            task.cancel()
        closing = Unavailable("the router is shutting down")
        for t in list(self.trajectories.values()):
            for turn in list(t.active.values()):
                self._end(turn, error=closing)
        await asyncio.gather(*self._tasks, return_exceptions=True)
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

    @property
    def model(self) -> str:
        return self.registry.model

    @property
    def max_model_len(self) -> int | None:
        return self.registry.max_model_len

    @property
    def version(self) -> int:
        return self.registry.version

    def live(self) -> list[EngineState]:
        return self.registry.live()

    def current(self) -> list[EngineState]:
        return self.registry.current()

    async def add_engine(self, cfg: EngineConfig) -> EngineState:
        """Probe and add an engine; the placement re-plans over the new set."""
        e = await self.registry.add(cfg)
        if not self._tokenizer_tried:
            self._tokenizer_tried = True
            await self._load_tokenizer()
        self._workers_changed()
        return e

    async def _load_tokenizer(self) -> None:
        source = self.config.tokenizer
        if source == "engine":
            return
        info = self.registry.first
        candidates = (
            [source] if source else [c for c in (info.root, info.model) if c] if info else []
        )
        if candidates:
            self.tokenizer = await asyncio.get_running_loop().run_in_executor(
                None, functools.partial(load_tokenizer, candidates, download=bool(source))
            )
        if self.tokenizer is None:
            log.warning(
                "no local tokenizer (%s): text prompts cost a /tokenize call to an engine",
                ", ".join(candidates) or "none given",
            )

    def remove_engine(self, eid: str, *, force: bool = False, leaving: bool = False) -> EngineState:
        """Drain an engine: it takes no new turns, its waiting turns go elsewhere at once, its
        running ones finish there (`force`: they are aborted and resumed elsewhere now); it is
        forgotten once empty. An engine that goes away while draining is no failure: its
        turns resume elsewhere with what they generated (`engine_down`). `leaving`: its
        launcher deregisters it and stops it next, whatever the answer (SGLang's gateway
        routes), so even the last live engine is let go; a turn it has not finished when it
        goes then ends 503, as any turn no live engine can take."""
        e = self.registry.get(eid)
        others = [o for o in self.live() if o is not e]
        if not others and e.load and not leaving:
            raise Conflict(
                f"engine {e.id} is the last live engine and holds {e.load} turns; "
                "add another engine before draining it"
            )
        self.registry.drain(e)
        self._move_waiting(e)
        if force:
            for turn in list(e.running.values()):
                self._requeue(turn, e, failed=False)
        self._forget_if_drained(e)
        self._workers_changed()
        return e

    def take_back(self, e: EngineState) -> None:
        """`e` registered again while draining (its launcher restarted it at the same url):
        it takes turns again."""
        if self.registry.undrain(e):
            self._workers_changed()

    def _forget_if_drained(self, e: EngineState) -> None:
        if self.registry.forget_if_drained(e):
            self.counts["removed"] += 1
            log.info("engine %s is drained and removed", e.id)

    def _workers_changed(self) -> None:
        current = self.current()
        if current:
            self.router.start([], current)
            self._handle_stale()
        self._offer_held()

    def engine_down(self, e: EngineState, reason: str) -> None:
        """`e` failed (its health checks, a refused connection, a broken stream): its turns
        go elsewhere, those running resume with what they generated. A draining engine that
        goes has not failed: it was asked to leave (its launcher stops it right after
        deregistering it), so its turns move and it is removed."""
        if e.draining:
            self._left(e, reason)
            return
        if not self.registry.mark_down(e, reason):
            return
        self._move_waiting(e)
        for turn in list(e.running.values()):
            self._requeue(turn, e, failed=True)
        self._forget_if_drained(e)
        self._workers_changed()

    def _left(self, e: EngineState, reason: str) -> None:
        """A draining engine went away: its running turns resume elsewhere, none counted as
        a failover, and it is forgotten."""
        if self.engines.get(e.id) is not e:
            return
        running = list(e.running.values())
        if running:
            log.info(
                "draining engine %s left (%s): %d turns resume elsewhere",
                e.id,
                reason,
                len(running),
            )
        for turn in running:
            self._move_off(turn, e)
        self._forget_if_drained(e)
        self._workers_changed()

    def _move_off(self, turn: Turn, e: EngineState) -> None:
        self._requeue(turn, e, failed=False, left=True)
        if not turn.ended:  # it waits for or runs on another engine (none left: a 503)
            self.counts["moved"] += 1

    def _suspect(self, e: EngineState, reason: str) -> None:
        """A call to `e` failed: check its health now rather than at the next round, and take
        it out if it does not answer (a hung engine must not collect turns meanwhile)."""
        if e.alive and e.id not in self._probing:
            self._probing.add(e.id)
            self._spawn(self._probe_health(e, reason))

    async def _probe_health(self, e: EngineState, reason: str) -> None:
        try:
            if not await e.client.health(self.config.engine_call_timeout_s):
                self.engine_down(e, f"{reason}; and its health check failed")
            else:  # it stays in: turns held while it was suspect may go there again
                self._offer_held()
        finally:
            self._probing.discard(e.id)

    def engine_up(self, e: EngineState) -> None:
        if self.registry.mark_up(e):
            self._workers_changed()

    def engine_load(self, e: EngineState) -> None:
        """`e` reported its load (its `capacity` has taken it in): fill the room it has."""
        if not self._closing:
            self._pump(e)

    def set_weights(self, version: int, engines: Sequence[str] = ()) -> list[str]:
        """Weights of `version` are current; `engines` serve them already (others report
        theirs with `report` when they have loaded them). Turns waiting at an engine behind
        the version go elsewhere; its running ones finish there. Returns the engines behind."""
        behind = self.registry.set_weights(version, engines)
        self.router.set_version(version)
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
        e = self.registry.report(eid, version=version, free_tokens=free_tokens, slack_s=slack_s)
        if e.version != self.version:
            self._move_waiting(e)
        self._workers_changed()
        return e

    def _move_waiting(self, e: EngineState) -> None:
        for turn in list(e.waiting):
            e.waiting.remove(turn)
            self._place(turn, avoid=e)

    # ---- placement ---------------------------------------------------------------------

    def _place(self, turn: Turn, avoid: EngineState | None = None) -> None:
        """Send `turn` to the engine the router picks, or hold it."""
        live = self.live()
        if avoid is not None and len(live) > 1:
            live = [e for e in live if e is not avoid]
        if not live:
            self._end(turn, error=Unavailable("no live engine can take the turn"))
            return
        current = [e for e in live if e.version == self.version]
        choice: int | None = None
        tid = turn.traj.traj_id
        replaced = False
        if current:
            choice = self.router.route(turn.traj, current, self.now())
            self.counts["decisions"] += 1
            if choice is None:
                self._router_held.add(tid)
            elif tid in self._router_held:
                # NOTE: a router holds one turn per trajectory: routing this one took the
                # trajectory's held turn out of the router's queue; those ask again below
                self._router_held.discard(tid)
                replaced = True
        if choice is None:
            self._hold(turn)  # no engine can take it now: it waits for capacity or weights
            return
        engine = next((e for e in current if e.idx == choice), None)
        if engine is None:
            self.counts["fallbacks"] += 1
            engine = min(current, key=lambda e: (e.load, e.idx))
        self._enqueue(engine, turn)
        if replaced:
            self._offer_held()

    def _hold(self, turn: Turn) -> None:
        turn.hold(self.now())
        self._held.setdefault(turn.traj.traj_id, deque()).append(turn)
        self.counts["held"] += 1

    def _unhold(self, turn: Turn) -> None:
        tid = turn.traj.traj_id
        q = self._held.get(tid)
        if q is None or turn not in q:
            return
        q.remove(turn)
        if not q:
            del self._held[tid]
            if tid in self._router_held:
                self._router_held.discard(tid)
                self.router.withdraw(tid)

    def _offer_held(self) -> None:
        """Capacity changed: place the held turns that now fit. A change while they are
        being placed (a turn ends, an engine goes) offers them again once this pass ends."""
        if not self._held or self._closing or self._ending:
            return
        if self._offering:
            self._offer_again = True
            return
        self._offering = True
        try:
            for _ in range(8):  # (a pass only repeats when something changed during it)
                self._offer_again = False
                current = self.current()
                if not current or not self._held:
                    return
                self._offer_pass(current)
                if not self._offer_again:
                    return
        finally:
            self._offering = False

    def _offer_pass(self, current: list[EngineState]) -> None:
        by_idx = {e.idx: e for e in current}
        again: list[Turn] = []
        for tid, idx in self.router.drain(current, self.now()):
            self._router_held.discard(tid)
            q = self._held.pop(tid, None)
            if not q:
                continue
            self._enqueue(by_idx[idx], q.popleft())
            again += q  # its other held turns ask the router again
        for tid in [t for t in self._held if t not in self._router_held]:
            again += self._held.pop(tid)
        for turn in again:
            self._place(turn)

    def _key(self, turn: Turn, now: float) -> Key:
        """Its rank while it waits: the client's class, aged turns first (oldest first),
        then the scheduler's key."""
        if turn.aged:
            return (turn.request.priority, 0, turn.arrival_s)
        return (turn.request.priority, 1, self.scheduler.key(turn.traj, now))

    def _wait_at(self, e: EngineState, turn: Turn) -> None:
        now = self.now()
        turn.queue(e, self._key(turn, now), now)
        e.waiting.add(turn)

    def _enqueue(self, e: EngineState, turn: Turn) -> None:
        self._wait_at(e, turn)
        if not e.has_slot() and self.scheduler.preemptive and e.running:
            self._maybe_preempt(e)
        self._pump(e)
        if turn.state is TurnState.QUEUED and not self.router.central_queue:
            self._bind_free()

    def _maybe_preempt(self, e: EngineState) -> None:
        """Algorithm 1, lines 6-10: evict r_min, move it to Q, promote Q.top; only a victim
        preempted fewer than `max_preemptions` times, and only where the wait the head saves
        exceeds the victim's prefill again."""
        cap = self.config.max_preemptions
        victims = [r for r in e.running.values() if r.preemptions < cap]
        head = e.waiting[0]
        if not victims:
            if any(self._outranks(head.key, r.key) for r in e.running.values()):
                self.counts["preemptions_declined"] += 1
            return
        victim = max(victims, key=lambda r: (r.key, r.seq))
        if not self._outranks(head.key, victim.key):
            return
        saved = slot_wait_s(len(e.running), e.pace.turn_s)
        cost = self._prefill_s(e, victim.traj, len(victim.prompt) + len(victim.generated), 0)
        if not saved > cost:
            self.counts["preemptions_declined"] += 1
            return
        self.counts["preemptions"] += 1
        self.metrics.preemptions.inc()
        e.preempted += 1
        victim.preemptions += 1
        victim.bound = "preemption"
        self._requeue(victim, e, failed=False, here=True)

    def _outranks(self, waiting: Key, running: Key) -> bool:
        if waiting[0] != running[0]:  # the clients' priority classes decide first
            return waiting[0] < running[0]
        if waiting[1] != running[1] or waiting[1] == 0:
            return False  # an aged turn runs next, but preempts nobody and is not preempted
        return self.scheduler.outranks(waiting[2], running[2])

    def _pump(self, e: EngineState) -> None:
        if self._ending:
            return
        while e.alive and e.waiting and e.has_slot():
            self._run(e, e.waiting.pop(0))
        if e.has_slot() and e.routable and not self.router.central_queue:
            self._bind_late(e)

    # ---- late binding and what a move costs ------------------------------------------

    def _prefill_s(self, e: EngineState, t: Trajectory, tokens: int, cached: int) -> float:
        """Seconds prefilling `tokens` of `t`'s sequence, `cached` of them in its prefix
        cache, adds to a step of `e`'s (`moves.prefill_s`)."""
        return prefill_s(self._latency(e.tp), tokens, cached)

    def _computed(self, turn: Turn) -> int:
        """Tokens of `turn`'s sequence some engine has computed already."""
        seq = len(turn.prompt) + len(turn.generated)
        prior = max(turn.traj.prefix.values(), default=0)
        return min(seq, max(turn.computed, prior))

    def _extra_prefill_s(self, turn: Turn, src: EngineState, dst: EngineState) -> float:
        """What prefilling `turn` at `dst` costs beyond prefilling it at `src`."""
        t = turn.traj
        seq = len(turn.prompt) + len(turn.generated)
        there = self._prefill_s(dst, t, seq, t.prefix.get(dst.idx, 0))
        here = self._prefill_s(src, t, seq, t.prefix.get(src.idx, 0))
        return there - here

    def _bind_free(self) -> None:
        """Engines with room and nothing of their own waiting take turns waiting elsewhere."""
        for f in self.current():
            if f.has_slot() and not f.waiting and f.routable:
                self._bind_late(f)

    def _bind_late(self, f: EngineState) -> None:
        """`f` has a slot and nothing of its own waiting: it takes the best turn waiting at
        another engine (at the current weights) whose wait there exceeds what prefilling it
        at `f` costs beyond prefilling it there; an aged turn moves whatever it costs."""
        if f.version != self.version or f.waiting or self._ending:
            return
        while f.has_slot() and not f.waiting:
            pick = self._late_pick(f)
            if pick is None:
                return
            src, turn = pick
            src.waiting.remove(turn)
            self.counts["late_bindings"] += 1
            turn.bound = "late_binding"
            self._wait_at(f, turn)
            self._run(f, f.waiting.pop(0))

    def _late_pick(self, f: EngineState) -> tuple[EngineState, Turn] | None:
        candidates: list[tuple[Key, int, EngineState, Turn]] = []
        for e in self.live():
            if e is f or not e.waiting:
                continue
            for ahead, turn in enumerate(e.waiting.islice(0, LATE_LOOK)):
                if turn.aged or slot_wait_s(
                    len(e.running), e.pace.turn_s, ahead
                ) > self._extra_prefill_s(turn, e, f):
                    candidates.append((turn.key, turn.seq, e, turn))
                    break  # the best of this engine's queue that pays
        if not candidates:
            return None
        _, _, e, turn = min(candidates, key=lambda c: (c[0], c[1]))
        return e, turn

    def _move_pays(self, traj: Any, src_idx: int, dst_idx: int) -> bool:
        """Heddle's migration of a trajectory between its turns: the wait its next turn saves
        at `dst`, with the time its remaining tokens (as predicted) save decoding at `dst`'s
        step rather than `src`'s, must exceed what prefilling its context there costs beyond
        at `src` (`loom.rollout.moves`)."""
        src = next((e for e in self.live() if e.idx == src_idx), None)
        dst = next((e for e in self.live() if e.idx == dst_idx), None)
        t = self._by_tid.get(traj.traj_id)
        if src is None or dst is None or t is None:
            return True  # its home is gone: it must move anyway
        seq = t.pending_context
        cost = self._prefill_s(dst, t, seq, t.prefix.get(dst.idx, 0)) - self._prefill_s(
            src, t, seq, t.prefix.get(src.idx, 0)
        )
        gain = pace_gain_s(
            float(t.predicted_total) - t.generated, self._step_s(src, seq), self._step_s(dst, seq)
        )
        if move_pays(cost, self._slot_wait(src), self._slot_wait(dst), gain):
            return True
        self.counts["migrations_declined"] += 1
        return False

    def _step_s(self, e: EngineState, context: int) -> float | None:
        """A decode step of `e`'s with one more sequence of `context` tokens among its
        running turns, by its latency model (None where it has none)."""
        held = sum(len(r.prompt) + len(r.generated) for r in e.running.values())
        return decode_step_s(self._latency(e.tp), len(e.running) + 1, held + context)

    def _slot_wait(self, e: EngineState) -> float:
        """Seconds a turn placed at `e` now would wait for a slot there."""
        if e.has_slot() and not e.waiting:
            return 0.0
        return slot_wait_s(len(e.running), e.pace.turn_s, len(e.waiting))

    async def _age_loop(self) -> None:
        """Turns that have waited `max_wait_s` in the router are aged: they run next."""
        bound = self.config.max_wait_s
        while True:
            await asyncio.sleep(max(0.05, min(1.0, bound / 10)))
            self._age(bound)

    def _age(self, bound: float) -> None:
        now = self.now()
        touched = []
        for e in self.live():
            old = [turn for turn in e.waiting if not turn.aged and turn.waited(now) >= bound]
            for turn in old:
                e.waiting.remove(turn)
                turn.aged = True
                turn.key = self._key(turn, now)
                e.waiting.add(turn)
                self.counts["aged"] += 1
            if old:
                touched.append(e)
        if touched and not self.router.central_queue:
            self._bind_free()

    def _run(self, e: EngineState, turn: Turn) -> None:
        if turn.remaining <= 0 and turn.attempt_logprobs().prompt_start is None:
            turn.finish_reason = turn.finish_reason or "length"
            self._end(turn)
            return
        self._count_reprefill(e, turn)
        attempt = turn.run(self.now())
        turn.progress_t = self._loop_time()
        turn.attempt_chunks = 0
        e.running[turn.seq] = turn
        e.admitted += 1
        turn.traj.host = e.idx
        if attempt == 0 and turn.preemptions == 0 and turn.failovers == 0:
            self.metrics.queueing.observe(self.now() - turn.arrival_s)
        turn.task = self._spawn(self._attempt(e, turn, attempt))

    def _count_reprefill(self, e: EngineState, turn: Turn) -> None:
        t = turn.traj
        seq = len(turn.prompt) + len(turn.generated)
        again = self._computed(turn) - min(seq, t.prefix.get(e.idx, 0))
        reason = turn.bound
        if reason == "placement" and t.migrated:
            reason = "migration"
        t.migrated = False
        turn.bound = "placement"
        if again > 0:
            self.reprefill[reason] += again

    def _computed_at(self, e: EngineState, turn: Turn, kept: bool = True) -> None:
        """`turn`'s attempt at `e` stopped: `e` computed its sequence so far (`kept`: and
        holds it in its prefix cache, as far as the router knows)."""
        seq = len(turn.prompt) + len(turn.generated)
        turn.computed = max(turn.computed, seq)
        if kept:
            turn.traj.prefix[e.idx] = seq
        else:
            turn.traj.prefix.pop(e.idx, None)

    def _priority(self, e: EngineState, turn: Turn) -> int | None:
        if not e.send_priority:
            return None
        return engine_priority(turn.key, e.client.high_first)

    # ---- attempts ----------------------------------------------------------------------

    async def _attempt(self, e: EngineState, turn: Turn, attempt: int) -> None:
        sampling = turn.attempt_sampling()
        if (
            not turn.request.stream
            and e.client.kind is EngineKind.VLLM
            and "stream_interval" not in sampling
        ):
            # NOTE: the router streams from the engine to keep what a turn generated; a client
            # that reads the answer whole needs no chunk per token, whose cost (the engine's
            # API server and this router, per chunk) took CPU from two-core vLLM engines
            sampling["stream_interval"] = self.config.stream_interval
        if sampling["max_tokens"] < 1:  # scoring a prompt: engines generate at least one
            sampling["max_tokens"] = 1
            sampling.pop("min_tokens", None)
        done: Done | None = None
        while True:
            priority = self._priority(e, turn)
            stream = e.client.generate(
                turn.rid(),
                turn.prompt + turn.generated,
                sampling,
                priority,
                turn.attempt_logprobs(),
            )
            try:
                async for item in stream:
                    if turn.attempt != attempt:  # superseded (defensive: we were cancelled)
                        return
                    if isinstance(item, Delta):
                        self._receive(e, turn, item)
                    else:
                        done = item
            except EngineRejected as exc:
                if priority is not None and _refuses_priority(exc) and not turn.attempt_chunks:
                    # NOTE: vLLM without --scheduling-policy priority refuses the field: the
                    # engine gets none from now on, and the turn goes again without it
                    e.send_priority = False
                    self.counts["priority_refused"] += 1
                    log.warning("engine %s schedules without priorities: %s", e.id, exc.detail)
                    continue
                if turn.attempt == attempt:
                    self._end(turn, error=exc, engine_done=True)
                return
            except EngineError as exc:
                # NOTE: a refused connection is a dead engine; anything else (a 5xx, a broken
                # stream, a connect that timed out on loaded cores) may be this request's
                # alone: the turn moves and the engine's health decides whether it stays in
                down = isinstance(exc, EngineUnreachable)
                self._on_failure(e, turn, attempt, str(exc), down=down)
                return
            finally:
                await stream.aclose()  # type: ignore[attr-defined]
            break
        if turn.attempt != attempt or done is None:
            return
        turn.cached_tokens += done.cached_tokens
        if done.routed_experts is not None:
            turn.routed_experts = done.routed_experts
        if done.finish_reason == "abort":
            # the engine aborted it itself (we stop our stream before we abort one): the
            # client hears an abort, with what was generated
            self.counts["aborted"] += 1
            turn.abort_message = done.message or "aborted by the engine"
        reason = done.finish_reason
        if reason == "abort" and turn.remaining <= 0:
            reason = "length"  # it had generated everything it asked for anyway
        turn.finish_reason = reason
        turn.matched_stop = done.matched_stop
        self._end(turn, engine_done=True)

    async def _watchdog(self) -> None:
        """Running turns that make no progress: no first token in `first_token_timeout_s`,
        or no new token in `stall_timeout_s` (`lent_stall_timeout_s` on a lent engine).
        NOTE: one periodic scan instead of a timer per turn, rescheduled per chunk: a chunk
        costs a timestamp."""
        cfg = self.config
        period = max(0.02, min(cfg.stall_timeout_s, cfg.lent_stall_timeout_s) / 4)
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(period)
            now = loop.time()
            for e in list(self.engines.values()):
                stall = cfg.lent_stall_timeout_s if e.lent else cfg.stall_timeout_s
                for turn in list(e.running.values()):
                    limit = stall if turn.attempt_chunks else cfg.first_token_timeout_s
                    if now - turn.progress_t > limit and turn.engine is e:
                        self._stalled(e, turn, limit)

    def _stalled(self, e: EngineState, turn: Turn, limit: float) -> None:
        # NOTE: a lent engine that stops a rollout is serving first, not broken (§4.1): the
        # turn moves, the engine stays in (its health checks judge it) but takes no rollout
        # turn until its side reports room or slack again.
        if e.lent:
            self.counts["stalls"] += 1
            e.stalled = True
        self._on_failure(
            e, turn, turn.attempt, f"no token for {limit:g} s", down=not e.lent, probe=False
        )

    def _receive(self, e: EngineState, turn: Turn, item: Delta) -> None:
        """A chunk of the running attempt: tokens, text and logprobs join the turn."""
        turn.progress_t = self._loop_time()
        turn.attempt_chunks += 1
        tokens = item.tokens
        if len(tokens) > turn.remaining:  # a scoring attempt's token, or an overshoot
            tokens = tokens[: max(0, turn.remaining)]
        if item.prompt_logprobs is not None and turn.prompt_logprobs is None:
            turn.prompt_logprobs = item.prompt_logprobs[
                : len(turn.prompt) - (turn.request.logprobs.prompt_start or 0)
            ]
        if not tokens:
            if item.tokens:
                return
            turn.text.append(item.text)
            if turn.updates is not None:
                turn.updates.put_nowait(item)
            return
        if turn.first_token_s is None:
            turn.first_token_s = self.now()
        turn.generated.extend(tokens)
        if turn.request.logprobs.output and item.logprobs is not None:
            turn.logprobs.extend(item.logprobs[: len(tokens)])
        turn.version = e.version
        e.tokens += len(tokens)
        self.metrics.engine_tokens(e.id).inc(len(tokens))
        turn.text.append(item.text)
        if turn.updates is not None:
            turn.updates.put_nowait(item)

    def _on_failure(
        self,
        e: EngineState,
        turn: Turn,
        attempt: int,
        reason: str,
        *,
        down: bool = True,
        probe: bool = True,
    ) -> None:
        """The attempt at `e` failed: `e` is out (`down`), or its health is checked now
        (`probe`), and the turn moves."""
        if turn.attempt != attempt or turn.state is not TurnState.RUNNING:
            return
        turn.error = reason
        if e.draining:  # it is going away (deregistered): the turn moves, nothing failed
            self._move_off(turn, e)
            if down:
                self._left(e, reason)
                return
            self._forget_if_drained(e)
            if probe and self.engines.get(e.id) is e:
                self._suspect(e, reason)  # its other turns move at once if it is gone
            return
        if down:
            self.engine_down(e, reason)  # moves this turn (and all others) elsewhere
        elif probe:
            self._suspect(e, reason)
        if turn.state is TurnState.RUNNING and turn.engine is e:
            self._requeue(turn, e, failed=True)

    def _interrupt(self, turn: Turn, e: EngineState) -> None:
        """End the running attempt at `e`: the stream closes (engines abort on disconnect)
        and the engine is told by id; the tokens received so far stay with the turn."""
        e.running.pop(turn.seq, None)
        self._computed_at(e, turn, kept=turn.bound != "preemption")
        rid = turn.interrupt()
        task = turn.task
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()
        if e.alive:
            self._spawn(self._abort_quietly(e, rid))

    async def _abort_quietly(self, e: EngineState, rid: str) -> None:
        with contextlib.suppress(Exception):
            await e.client.abort(rid)

    def _requeue(
        self, turn: Turn, e: EngineState, *, failed: bool, here: bool = False, left: bool = False
    ) -> None:
        """Stop `turn`'s attempt at `e` and queue it again: at `e` (`here`, a preemption) or
        wherever the router sends it, avoiding `e`. `failed` or `left`: `e` is gone, and
        with it the trajectory's home there."""
        self._interrupt(turn, e)
        if failed or left:
            turn.traj.prefix.pop(e.idx, None)
            self.router.release(turn.traj.traj_id)
        if failed:  # its engine failed, stalled or was taken out: counted once, here
            turn.bound = "failover"
            self.counts["failovers"] += 1
            self.metrics.failovers.inc()
            e.failed_turns += 1
            turn.failovers += 1
        if turn.failovers > MAX_ATTEMPTS:
            msg = f"gave up after {turn.failovers} failed attempts: {turn.error}"
            self._end(turn, error=EngineError(msg))
            return
        if failed:
            log.info("turn %s resumes elsewhere after %d tokens", turn.rid(), len(turn.generated))
        if here and e.routable:
            self._wait_at(e, turn)
        else:
            self._place(turn, avoid=e)
        self._pump(e)

    # ---- the end of a turn -------------------------------------------------------------

    def _end(
        self, turn: Turn, *, error: Exception | None = None, engine_done: bool = False
    ) -> None:
        """The one place a turn ends: it leaves wherever it is (a running attempt is
        aborted at its engine, unless the engine ended it: `engine_done`), the trajectory
        learns what it generated, and whoever waits on it is woken. FINISHED with
        `turn.finish_reason`, or FAILED with `error`."""
        if turn.ended:
            return
        e = turn.engine
        was = turn.state
        if was is TurnState.HELD:
            self._unhold(turn)
        elif was is TurnState.QUEUED and e is not None:
            if turn in e.waiting:
                e.waiting.remove(turn)
        elif was is TurnState.RUNNING and e is not None:
            if engine_done:
                e.running.pop(turn.seq, None)
            else:
                self._interrupt(turn, e)
        now = self.now()
        if error is None:
            turn.end(now)
        else:
            turn.end(now, error=str(error), status=http_status(error))
        if error is None and was is TurnState.RUNNING and e is not None:
            e.completed += 1
            if engine_done:
                self._computed_at(e, turn)
                first = turn.first_token_s
                e.pace.observe(
                    start_s=first - turn.attempt_s
                    if first is not None and first >= turn.attempt_s
                    else None,
                    decode_s=now - first if first is not None else 0.0,
                    tokens=len(turn.generated),
                    turn_s=now - turn.attempt_s,
                )
        t = turn.traj
        t.active.pop(turn.seq, None)
        self._forget_rid(turn)
        n = len(turn.generated)
        if n and error is None:
            t.records.append(TurnRecord(max(0, len(turn.prompt) - t.context), n, None))
            t.steps_done += 1
            t.generated += n
            t.context = max(t.context, len(turn.prompt) + n)
        t.last_end_s = now
        t.last_seen_s = now
        self.metrics.turn_done(now - turn.arrival_s)
        self.timing["longest_wait_s"] = max(self.timing["longest_wait_s"], turn.waited_s)
        if turn.started_s is not None and turn.first_token_s is not None:
            self.timing["turns"] += 1
            self.timing["queue_s"] += turn.started_s - turn.arrival_s
            self.timing["first_token_s"] += turn.first_token_s - turn.started_s
            self.timing["decode_s"] += now - turn.first_token_s
        if e is not None:
            self._pump(e)
            self._forget_if_drained(e)
        if not t.active and (t.one_turn or t.ended):
            self._finish(t)
        elif n and error is None and not t.one_turn:
            self._to_predict[t.traj_id] = t  # during its tool call (the newest ask wins)
            self._predict_wanted.set()
        if not self._closing:
            self._handle_stale()
            self._offer_held()

    def _forget_rid(self, turn: Turn) -> None:
        rid = turn.request.client_rid
        if rid is None:
            return
        turns = self._by_rid.get(rid)
        if turns is not None and turn in turns:
            turns.remove(turn)
            if not turns:
                del self._by_rid[rid]

    def abort(self, rids: Iterable[str] = (), *, everything: bool = False) -> int:
        """`POST /abort_request`: end the turns of these client request ids (or every turn
        in flight) with what they generated, marked abort. Returns how many ended."""
        if everything:
            turns = [turn for t in self.trajectories.values() for turn in t.active.values()]
        else:
            turns = [turn for rid in rids for turn in self._by_rid.get(rid, ())]
        self._end_aborted(turns, ABORTED_BY_REQUEST, "aborted")
        return len(turns)

    def abandon(self, turns: Iterable[Turn]) -> None:
        """The client went away: stop its turns wherever they are and keep what they
        generated."""
        self._end_aborted(list(turns), "the client went away", "abandoned")

    def _end_aborted(self, turns: Sequence[Turn], message: str, counter: str) -> None:
        """End `turns` wherever they are with what they generated, marked abort; only then
        do the slots they freed take other turns. NOTE: ending a running turn fills its slot
        at once (`_end` pumps its engine, late binding, held turns): filled from the same
        batch, a waiting turn would start an attempt (an admission, an abort sent to its
        engine) only to be ended a moment later."""
        self._ending = True
        try:
            for turn in turns:
                if not turn.ended:
                    turn.finish_reason = "abort"
                    turn.abort_message = message
                    self.counts[counter] += 1
                    self._end(turn)
        finally:
            self._ending = False
        if not self._closing:
            for e in self.live():
                self._pump(e)
            self._offer_held()

    async def _predict_loop(self) -> None:
        """Predict anew the trajectories that finished a turn (during their tool call), then
        let the router move their homes. NOTE: one batch at a time off the event loop, the
        newest ask per trajectory: when turns end faster than the model predicts, asks
        coalesce instead of queueing without bound."""
        while True:
            await self._predict_wanted.wait()
            self._predict_wanted.clear()
            while self._to_predict:
                batch = list(self._to_predict.values())[:256]
                for t in batch:
                    del self._to_predict[t.traj_id]
                asked = [(t, t.steps_done) for t in batch]
                specs = [pending_spec(t) for t in batch]
                gen = [t.generated for t in batch]
                if self.predictor.model is not None:
                    preds = await asyncio.get_running_loop().run_in_executor(
                        None, self.predictor.predict_many, specs, gen
                    )
                else:
                    preds = [self.predictor.fallback(t.prompt_id, t.generated) for t in batch]
                for (t, steps), pred in zip(asked, preds, strict=True):
                    if self._by_tid.get(t.traj_id) is not t or t.steps_done != steps:
                        continue  # ended, or a newer turn ended: a newer prediction follows
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
        t.migrated = True
        dest = next((e for e in live if e.idx == target), None)
        if dest is None:
            return
        for turn in list(t.active.values()):
            src = turn.engine
            if turn.state is TurnState.QUEUED and src is not None and src is not dest:
                src.waiting.remove(turn)
                turn.bound = "migration"
                self._enqueue(dest, turn)

    def _handle_stale(self) -> None:
        for tid in self.router.stale():
            t = self._by_tid.get(tid)
            if t is None:
                continue
            if all(turn.state is TurnState.QUEUED for turn in t.active.values()):
                self._migrate(t)

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
        plans over it. Returns each trajectory's planned engine ("" where the placement
        places turns only when they are ready)."""
        if not self.live():
            raise Unavailable("no live engine: add one with POST /v1/engines")
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
            specs = [pending_spec(t) for t in fresh]
            preds = await asyncio.get_running_loop().run_in_executor(
                None, self.predictor.predict_many, specs, [0] * len(specs)
            )
            for t, p in zip(fresh, preds, strict=True):
                t.predicted_total = p
        self.counts["declared"] += len(fresh)
        if not self.live():  # engines may have changed while predicting
            raise Unavailable("no live engine: add one with POST /v1/engines")
        # NOTE: while new weights load, no engine is current: the batch is planned over the
        # live ones (they serve it once current), as a trajectory that joins is
        current = self.current() or self.live()
        self.router.start(fresh, current)
        self._handle_stale()
        ids = {e.idx: e.id for e in current}
        homes = {t.key: self.router.home(t.traj_id) for t in fresh}
        return {key: "" if home is None else ids.get(home, "") for key, home in homes.items()}

    def end_trajectory(self, key: str) -> Trajectory:
        t = self.trajectories.get(key)
        if t is None:
            raise UnknownTrajectory(key)
        t.ended = True
        if not t.active:
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
        if not self._closing:
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
                if not t.active and t.last_seen_s < cutoff:
                    log.info("trajectory %s idle for %.0f s: ended", t.key, idle)
                    self.end_trajectory(t.key)

    # ---- turns -------------------------------------------------------------------------

    def submit(
        self,
        key: str | None,
        prompt: list[int],
        request: TurnRequest,
        *,
        n: int = 1,
        prompt_id: int | None = None,
    ) -> list[Turn]:
        """A request of trajectory `key` (None: a one-request trajectory of its own): `n`
        turns that share the prompt, sample `i` seeded `seed + i` where a seed is given."""
        if self._closing:
            raise Unavailable("the router is shutting down")
        if not self.live():
            raise Unavailable("no live engine: add one with POST /v1/engines")
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
        if not t.started:
            t.started = True
            t.prompt_tokens = t.prompt_tokens or len(prompt)
            if not t.declared:
                self.router.join(t, self.current() or self.live())
        elif not t.active and t.last_end_s is not None and t.records:
            last = t.records[-1]
            t.records[-1] = TurnRecord(last.input_tokens, last.output_tokens, now - t.last_end_s)
        t.turn_arrival_s = now
        t.last_seen_s = now
        turns = []
        for i in range(n):
            req = request
            if n > 1 and request.sampling.get("seed") is not None:
                req = replace(
                    request,
                    sampling={**request.sampling, "seed": int(request.sampling["seed"]) + i},
                )
            turn = Turn(
                traj=t, index=t.steps_done, prompt=prompt, request=req, arrival_s=now, choice=i
            )
            t.active[turn.seq] = turn
            if req.client_rid is not None:
                self._by_rid.setdefault(req.client_rid, []).append(turn)
            turns.append(turn)
        self.counts["turns"] += n
        for turn in turns:
            self._place(turn)
        return turns

    async def tokenize(self, body: Mapping[str, Any]) -> list[int]:
        """Token ids of a text prompt ({"prompt", "add_special_tokens"}) or a chat request
        ({"messages", ...}): by the router's tokenizer, else by a live engine's `/tokenize`
        (each engine tried in turn, each call with a deadline)."""
        if self.tokenizer is not None:
            if "messages" in body:
                return self.tokenizer.chat(body)
            return self.tokenizer.encode(body["prompt"], bool(body.get("add_special_tokens", True)))
        live = self.live()
        if "messages" in body:
            live = [e for e in live if e.config.kind is EngineKind.VLLM]
            if not live:
                raise InvalidRequest(
                    "chat needs the router's tokenizer (set `tokenizer`) or a vLLM engine"
                )
        errors = []
        for e in sorted(live, key=lambda e: (e.failures, e.load, e.idx)):
            try:
                ids = await e.client.tokenize(body)
            except EngineUnreachable as exc:
                self.engine_down(e, str(exc))
                errors.append(str(exc))
                continue
            except EngineError as exc:
                errors.append(str(exc))
                self._suspect(e, str(exc))
                continue
            self.counts["engine_tokenized"] += 1
            return ids
        if not errors:
            raise Unavailable("no live engine: add one with POST /v1/engines")
        raise EngineError(f"no engine could tokenize the prompt: {'; '.join(errors)}")

    # ---- views -------------------------------------------------------------------------

    def load(self) -> int:
        """Turns in flight: held, queued and running."""
        return sum(len(t.active) for t in self.trajectories.values())

    def held(self) -> int:
        return sum(len(q) for q in self._held.values())

    def engine_view(self, e: EngineState) -> dict[str, Any]:
        return {
            "url": e.config.url,
            "kind": e.config.kind.value,
            "tp": e.tp,
            "alive": e.alive,
            "draining": e.draining,
            "max_running": e.max_running,
            "limit": e.limit if math.isfinite(e.limit) else None,
            "priority": e.send_priority,
            "reported": None
            if e.reported is None
            else {
                "running": e.reported.running,
                "waiting": e.reported.waiting,
                "kv_usage": e.reported.kv_usage,
            },
            "turn_s": e.pace.turn_s,  # its measured pace (moving averages; None: not yet)
            "start_s": e.pace.start_s,  # an attempt's start to its first token
            "token_s": e.pace.token_s,  # per decoded token after the first
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

    def stats(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "placement": self.config.placement.value,
            "scheduler": self.config.scheduler.value,
            "tokenizer": self.tokenizer.source if self.tokenizer is not None else None,
            "engines": {e.id: self.engine_view(e) for e in self.engines.values()},
            "weights_version": self.version,
            "held": self.held(),
            "policy": dict(self.counts),
            "reprefill_tokens": dict(self.reprefill),
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


def _refuses_priority(exc: EngineRejected) -> bool:
    """vLLM's answer to a `priority` without --scheduling-policy priority."""
    return "priorit" in exc.detail.lower()


def _prompt_hash(prompt: list[int]) -> int:
    """A prompt's id from its first 256 tokens, the same in every process (the hash of a
    tuple of ints does not depend on PYTHONHASHSEED)."""
    return hash(tuple(prompt[:256])) & (2**56 - 1)


def check_config(config: RolloutServerConfig) -> None:
    """Fail early on settings the driver cannot use."""
    ids = [e.id for e in config.engines if e.id is not None]
    if len(ids) != len(set(ids)):
        raise ConfigError(f"engine ids must be unique, got {ids}")
    urls = [e.url for e in config.engines]
    if len(urls) != len(set(urls)):
        raise ConfigError(f"engine urls must be unique, got {urls}")
