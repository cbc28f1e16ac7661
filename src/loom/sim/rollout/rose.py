"""ROSE's rollout on dedicated rollout GPUs plus lent serving instances (§4.3), simulated.

The driver owns time and the trajectories; ROSE's `ElasticRouter` decides where each turn
goes and may hold it in its central queue; dedicated workers are the rollout simulator's
`Worker`s, lent instances `CoServingWorker`s that also serve a slice of the online traffic.
Lent workers join when the step's weights land on them (the transfer runs beside the
dedicated rollouts) and leave their turns to the router when a memory cut aborts them, when
they stall, or when they fail; such a turn is re-routed with its partial output. Three ways to
feed trajectories: a fixed batch (GRPO), groups launched until enough groups are valid (DAPO's
redundant sampling), and a stream that keeps a fixed number alive (AReaL).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from loom.core.errors import ConfigError
from loom.core.trajectory import TrajectorySpec, TrajectoryStatus
from loom.perf.latency import LatencyModel
from loom.rollout.baselines import FcfsScheduler
from loom.rollout.rose.admission import Role
from loom.rollout.rose.memory import MemorySharing
from loom.rollout.rose.scheduler import ElasticRouter, WorkerKind
from loom.sim.engine import Engine
from loom.sim.rollout.coserve import CoServeConfig, CoServingWorker, ServingRequest
from loom.sim.rollout.state import TrajState
from loom.sim.rollout.worker import Worker
from loom.sim.workloads.serving import ServingTrace

__all__ = ["ElasticPool", "LentInstance", "RoseRollout", "RoseRolloutResult"]


@dataclass
class LentInstance:
    """A serving instance lent to the job, kept across RL steps (its memory policy remembers
    the serving peaks)."""

    config: CoServeConfig
    memory: MemorySharing
    tp: int


@dataclass
class ElasticPool:
    """Rollout GPUs that come and go (the elastic baselines of §6.1, Fig. 8): RLBoost+'s spot
    instances follow a trace of available GPUs; λRL's serverless GPUs all lose their lease
    together every `lease_s`. A GPU that appears serves after `recovery_s` (acquire, load,
    initialise, pull weights); a preempted one gives its turns back — with their partial
    output (RLBoost migrates generated tokens) or from the turn's start (`restart`: a killed
    serverless function loses its generation). Kept across steps; times are absolute."""

    changes: tuple[tuple[float, int], ...]  # (t, GPUs available from t), t = 0 first
    tp: int
    recovery_s: float
    restart: bool = False
    preempted_gpu_s: float = 0.0  # the paper's "preempted GPU time": GPUs x recovery
    held_gpu_s: float = 0.0  # GPU-seconds the pool held (serving or recovering)
    seen_until: float = 0.0  # changes up to here are accounted

    def account_drops(self, until: float) -> None:
        """Charge the preemptions in (seen_until, until] (those between rollouts too)."""
        prev = self.available(self.seen_until)
        for at, k in self.changes:
            if self.seen_until < at <= until:
                self.preempted_gpu_s += max(0, prev - k) * self.recovery_s
            if at <= until:
                prev = k
        self.seen_until = max(self.seen_until, until)

    def ready_at(self, gpu_slot: int, t: float) -> float | None:
        """When instance `gpu_slot` (0-based) serves at time `t`: None if not held at t,
        else the time it appeared plus the recovery (0 for GPUs held from the start)."""
        since: float | None = None
        for at, k in self.changes:
            if at > t:
                break
            held = k // self.tp > gpu_slot
            if not held:
                since = None
            elif since is None:
                since = at
        if since is None:
            return None
        return since + self.recovery_s if since > 0 else 0.0

    def available(self, t: float) -> int:
        n = self.changes[0][1]
        for at, k in self.changes:
            if at > t:
                break
            n = k
        return n

    @property
    def max_gpus(self) -> int:
        return max(k for _, k in self.changes)


@dataclass(frozen=True, kw_only=True)
class RoseRolloutResult:
    makespan_s: float
    output_tokens: int
    prefill_tokens: int  # prefilled, recomputation included
    input_tokens: int  # Fig. 1's prefill tokens: each turn's whole context
    finish_s: np.ndarray  # per trajectory (relative to the step's start)
    ttft_s: np.ndarray  # serving requests prefilled on lent instances
    tpot_s: np.ndarray
    stalls: int
    aborts: int
    cuts: int
    launched: int  # trajectories started (DAPO launches more than it keeps)
    kept: int  # trajectories the step trains on
    kept_tokens: int  # their sequences' tokens (prompt, outputs, tool outputs): what trains
    kept_tokens_by_finish: tuple[int, ...]  # each kept trajectory's, in finishing order
    events: int
    lent_busy_s: float  # rollout seconds on lent instances
    # (t from the step's start, trajectories alive, turns in the central queue, turns on
    # dedicated workers, turns on lent ones), every `timeline_s` (empty: not sampled)
    timeline: tuple[tuple[float, int, int, int, int], ...] = ()


@dataclass
class _Feed:
    """How trajectories enter: all at once, by validity-checked groups, or as a stream."""

    specs: Sequence[TrajectorySpec]
    initial: int  # how many start at t0
    refill: Callable[[RoseRollout, TrajState], int] | None = None  # more to start on a finish
    done: Callable[[RoseRollout], bool] | None = None  # the step's batch is complete
    keep: Callable[[TrajState], bool] | None = None  # what trains (default: every finished)
    stats: dict[str, int] | None = None  # the feed's own counters, for its caller


class _View:
    """What the router reads of a worker; a dedicated worker is always at `version`."""

    __slots__ = ("_w", "dedicated_version", "gpus", "idx", "kind")

    def __init__(self, w: Worker, kind: WorkerKind, version: int) -> None:
        self._w, self.kind, self.idx, self.gpus = w, kind, w.idx, w.tp
        self.dedicated_version = version

    @property
    def running(self) -> int:
        return self._w.load

    @property
    def alive(self) -> bool:
        return getattr(self._w, "alive", True)

    @property
    def activated(self) -> bool:
        return getattr(self._w, "activated", True)

    @property
    def version(self) -> int:
        return getattr(self._w, "version", self.dedicated_version)

    @property
    def free_pages(self) -> int:
        return getattr(self._w, "free_pages", 1 << 30)

    @property
    def slack_s(self) -> float:
        return getattr(self._w, "slack_s", math.inf)

    def holds_prefix(self, traj_id: int) -> bool:
        return self._w.cached_tokens(traj_id) > 0


class RoseRollout:
    """One RL step's rollout (or an AReaL stream) over dedicated and lent workers."""

    def __init__(
        self,
        trajectories: Sequence[TrajectorySpec],
        *,
        router: ElasticRouter,
        dedicated_tp: Sequence[int],
        rollout_latency: Callable[[int], LatencyModel],
        serving_latency: Callable[[int], LatencyModel],
        rollout_kv_bytes: int,
        serving_kv_bytes: int,
        lent: Sequence[LentInstance] = (),
        serving: ServingTrace | None = None,
        serving_offset_s: float = 0.0,
        start_s: float = 0.0,
        step: int = 0,
        version: int = 0,
        weights_delay_s: float = 0.0,
        cap_per_gpu: int = 16,
        chunk_tokens: int = 8192,
        feed: _Feed | None = None,
        tokens_per_page: int | None = None,
        serving_horizon_s: float | None = None,
        elastic: ElasticPool | None = None,
        timeline_s: float | None = None,
    ) -> None:
        if timeline_s is not None and not timeline_s > 0:
            raise ConfigError(f"timeline_s must be > 0 s, got {timeline_s}")
        if not trajectories and (serving is None or serving_horizon_s is None):
            raise ConfigError(
                "a rollout needs at least one trajectory (or serving traffic and a horizon)"
            )
        if not dedicated_tp and not lent:
            raise ConfigError("a rollout needs at least one worker")
        self.eng = Engine(start=start_s)
        self.step = step
        self._drain_due = False
        self._elastic_ready: dict[int, int] = {}  # elastic worker -> its pending ready event
        self._elastic_since = start_s
        self.t0 = start_s
        self.router = router
        self.router.set_version(max(router.version, version))
        self.version = version
        self.specs = list(trajectories)  # may be empty: serving alone
        self.trajs: dict[int, TrajState] = {}
        sched = FcfsScheduler()
        self.workers: list[Worker] = []
        self.views: list[_View] = []
        for tp in dedicated_tp:
            w = Worker(
                idx=len(self.workers),
                tp=tp,
                node=0,
                latency=rollout_latency(tp),
                scheduler=sched,
                engine=self.eng,
                max_running=cap_per_gpu * tp,
                chunk_tokens=chunk_tokens,
                decode_reserve=0,
                on_turn_done=self._turn_done,
            )
            self.workers.append(w)
            self.views.append(_View(w, WorkerKind.DEDICATED, version))
        self.elastic = elastic
        self.elastic_workers: list[Worker] = []
        for _ in range((elastic.max_gpus // elastic.tp) if elastic else 0):
            assert elastic is not None
            w = Worker(
                idx=len(self.workers),
                tp=elastic.tp,
                node=2,
                latency=rollout_latency(elastic.tp),
                scheduler=sched,
                engine=self.eng,
                max_running=cap_per_gpu * elastic.tp,
                chunk_tokens=chunk_tokens,
                decode_reserve=0,
                on_turn_done=self._turn_done,
            )
            w.alive = False
            self.workers.append(w)
            self.elastic_workers.append(w)
            self.views.append(_View(w, WorkerKind.DEDICATED, version))
        self.lent: list[CoServingWorker] = []
        for inst in lent:
            w = CoServingWorker(
                idx=len(self.workers),
                tp=inst.tp,
                node=1,
                latency=rollout_latency(inst.tp),
                serving_latency=serving_latency(inst.tp),
                rollout_kv_bytes=rollout_kv_bytes,
                serving_kv_bytes=serving_kv_bytes,
                config=inst.config,
                memory=inst.memory,
                scheduler=sched,
                engine=self.eng,
                max_running=cap_per_gpu * inst.tp,
                on_turn_done=self._turn_done,
                on_abort=self._aborted,
                on_prefilled=self._prefilled,
                on_capacity=lambda _w: self._schedule_drain(),
            )
            self.workers.append(w)
            self.lent.append(w)
            self.views.append(_View(w, WorkerKind.LENT, version))
        self.prefillers = [w for w in self.lent if w.cfg.role == Role.PREFILL]
        self.decoders = [w for w in self.lent if w.cfg.role == Role.DECODE]
        if self.lent and (not self.prefillers or not self.decoders) and serving is not None:
            raise ConfigError("serving traffic needs at least one prefiller and one decoder")
        self.tpp = tokens_per_page or (self.lent[0].r_tpp if self.lent else 1)
        self.serving = serving
        self.serving_offset = serving_offset_s
        self.horizon = serving_horizon_s  # serving arrivals stop after this (serving alone)
        self.weights_delay_s = weights_delay_s
        self.feed = feed or _Feed(self.specs, len(self.specs))
        self._next_spec = 0
        self._pending_launch = 0
        self._launched = 0
        self._active = 0
        self._finished: list[TrajState] = []
        self._drain_due = False
        self._done = False
        self._ran = False
        self._serving_idx = 0
        self._sreq = 0
        self.timeline_s = timeline_s
        self._timeline: list[tuple[float, int, int, int, int]] = []

    # ---- run -----------------------------------------------------------------------------
    def run(self) -> RoseRolloutResult:
        if self._ran:
            raise RuntimeError("a RoseRollout runs once; build a new one")
        self._ran = True
        for w in self.lent:
            w.begin_step(self.step)
        if self.lent:
            if self.weights_delay_s > 0:
                self.eng.after(self.weights_delay_s, self._weights_landed, priority=0)
            else:
                self._weights_landed()
        self._start_serving()
        self._start_elastic()
        for _ in range(min(self.feed.initial, len(self.feed.specs))):
            self._launch()
        if self.timeline_s is not None:
            self.eng.after(0.0, self._sample, priority=4)  # after the launches have landed
        self.eng.run()
        return self._result()

    @property
    def active(self) -> int:
        """Trajectories launched and not finished."""
        return self._active

    @property
    def finished(self) -> int:
        return len(self._finished)

    def _launch(self) -> None:
        if self._pending_launch:
            self._pending_launch -= 1
        spec = self.feed.specs[self._next_spec]
        self._next_spec += 1
        t = TrajState(spec, ())
        t.first_arrival_s = self.eng.now
        self.trajs[spec.traj_id] = t
        self._launched += 1
        self._active += 1
        self._submit(t)

    def _weights_landed(self) -> None:
        for w in self.lent:
            w.set_version(self.version)
        self._schedule_drain()

    # ---- routing -------------------------------------------------------------------------
    def _pages(self, tokens: int) -> int:
        return -(-tokens // self.tpp)

    def _submit(self, t: TrajState) -> None:
        ctx = t.full_context()
        affine = self.router.affine(t.traj_id)
        cached = self.workers[affine].cached_tokens(t.traj_id) if affine is not None else 0
        t.status = TrajectoryStatus.PENDING
        t.turn_arrival_s = self.eng.now
        # A page beyond the context: room for the turn's next token where it lands.
        target = self.router.submit(
            t.traj_id, self._pages(ctx - cached) + 1, self._pages(ctx) + 1, self.views
        )
        if target is not None:
            self.workers[target].enqueue(t)

    def _schedule_drain(self) -> None:
        if not self._drain_due and self.router.queued:
            self._drain_due = True
            self.eng.after(0.0, self._drain, priority=3)

    def _drain(self) -> None:
        self._drain_due = False
        touched = set()
        for traj_id, target in self.router.drain(self.views):
            t = self.trajs[traj_id]
            t.queue_delay_s += self.eng.now - t.turn_arrival_s
            self.workers[target].enqueue(t, poke=False)
            touched.add(target)
        for w in sorted(touched):
            self.workers[w].poke()

    # ---- worker callbacks ----------------------------------------------------------------
    def _turn_done(self, t: TrajState, w: Worker) -> None:
        turn = t.spec.turns[t.steps_done]
        self._schedule_drain()
        if t.end_turn(self.eng.now):
            self._active -= 1
            self.router.finish(t.traj_id)
            self._finished.append(t)
            self._on_finish(t)
            return
        t.host = w.idx
        w.put_idle(t, t.context)
        assert turn.tool_latency_s is not None
        self.eng.after(turn.tool_latency_s, self._submit, t, priority=0)

    def _aborted(self, t: TrajState, w: CoServingWorker, why: str) -> None:
        """A lent worker gave the turn back (memory cut, stall, failure): re-route it with
        its partial output; it prefills its context again wherever it lands."""
        self.router.release(t.traj_id)
        self.eng.after(0.0, self._submit, t, priority=1)

    def _on_finish(self, t: TrajState) -> None:
        feed = self.feed
        if feed.done is not None and feed.done(self):
            self._stop()
            return
        more = feed.refill(self, t) if feed.refill is not None else 0
        for _ in range(min(more, len(feed.specs) - self._next_spec - self._pending_launch)):
            self._pending_launch += 1
            # after the worker that called back has settled
            self.eng.after(0.0, self._launch, priority=1)
        if self._active == 0 and not self._pending_launch:
            self._stop()

    def _stop(self) -> None:
        """The step's batch is complete: trajectories still running are dropped (DAPO's
        surplus, AReaL's next batch); the serving stream stops feeding."""
        self._done = True
        self.eng.stop()

    def _sample(self) -> None:
        """One point of the step's timeline; the next while trajectories are alive."""
        if self._done:
            return
        lent = sum(w.load for w in self.lent)
        dedicated = sum(w.load for w in self.workers) - lent  # the elastic ones count here
        self._timeline.append(
            (self.eng.now - self.t0, self._active, self.router.queued, dedicated, lent)
        )
        if self._active or self._pending_launch:
            assert self.timeline_s is not None
            self.eng.after(self.timeline_s, self._sample, priority=4)

    # ---- elastic GPUs (baselines) ---------------------------------------------------------
    def _start_elastic(self) -> None:
        pool = self.elastic
        if pool is None:
            return
        now = self.eng.now
        self._elastic_since = now
        pool.account_drops(now)
        for i, w in enumerate(self.elastic_workers):
            ready = pool.ready_at(i, now)
            w.alive = ready is not None and ready <= now
            if ready is not None and ready > now:
                self._elastic_ready[i] = self.eng.schedule(ready, self._elastic_up, i)
        for at, _ in pool.changes:
            if at > now:
                self.eng.schedule(at, self._elastic_change, priority=0)

    def _elastic_change(self) -> None:
        pool = self.elastic
        assert pool is not None
        if self._done:
            return
        now = self.eng.now
        pool.account_drops(now)
        n = pool.available(now) // pool.tp
        for i, w in enumerate(self.elastic_workers):
            ready = self._elastic_ready.get(i)
            if i >= n and (w.alive or ready is not None):  # preempted
                if ready is not None:
                    self.eng.cancel(ready)
                    del self._elastic_ready[i]
                w.alive = False
                for t in w.evict_all():
                    if pool.restart:
                        t.turn_generated = 0
                    self.router.release(t.traj_id)
                    self.eng.after(0.0, self._submit, t, priority=1)
            elif i < n and not w.alive and ready is None:  # provisioned: serves after recovery
                self._elastic_ready[i] = self.eng.after(
                    pool.recovery_s, self._elastic_up, i, priority=0
                )

    def _elastic_up(self, i: int) -> None:
        self._elastic_ready.pop(i, None)
        self.elastic_workers[i].alive = True
        self._schedule_drain()

    # ---- serving -------------------------------------------------------------------------
    def _start_serving(self) -> None:
        if self.serving is None or not self.lent:
            return
        arr = self.serving.arrival_s
        self._serving_idx = int(np.searchsorted(arr, self.serving_offset, side="left"))
        self._next_arrival()

    def _next_arrival(self) -> None:
        arr = self.serving
        assert arr is not None
        i = self._serving_idx
        if self._done or i >= len(arr.arrival_s):
            return
        at = self.t0 + float(arr.arrival_s[i]) - self.serving_offset
        if self.horizon is not None and at > self.t0 + self.horizon:
            return
        self.eng.schedule(max(at, self.eng.now), self._arrive, i, priority=0)

    def _arrive(self, i: int) -> None:
        assert self.serving is not None
        self._serving_idx = i + 1
        if self._done:
            return
        self._sreq += 1
        req = ServingRequest(
            req_id=self._sreq,
            arrival_s=self.eng.now,
            prompt=max(1, int(self.serving.prompt_tokens[i])),
            output=max(1, int(self.serving.output_tokens[i])),
        )
        now = self.eng.now
        # least-loaded serving (§6: "a load-balancing policy"), ties to the least used
        w = min(_alive(self.prefillers), key=lambda p: (p.serving_load(now), p.served, p.idx))
        w.serve_prefill(req)
        self._next_arrival()

    def _prefilled(self, req: ServingRequest, _w: CoServingWorker) -> None:
        now = self.eng.now
        w = min(_alive(self.decoders), key=lambda d: (d.serving_load(now), d.served, d.idx))
        w.serve_decode(req)

    # ---- result --------------------------------------------------------------------------
    def _result(self) -> RoseRolloutResult:
        if self.elastic is not None:  # GPU-seconds the pool held over the step
            pool, t0, t1 = self.elastic, self._elastic_since, self.eng.now
            grid = sorted({t0, t1, *(t for t, _ in pool.changes if t0 < t < t1)})
            pool.held_gpu_s += sum(pool.available(a) * (b - a) for a, b in itertools.pairwise(grid))
        kept = self._kept()
        lost = [t for t in kept if t.status != TrajectoryStatus.FINISHED]
        assert not lost, f"trajectories never finished: {[t.traj_id for t in lost[:10]]}"
        finish = np.array([t.finish_s - self.t0 for t in kept])
        makespan = float(finish.max()) if len(finish) else 0.0
        ttft = [x for w in self.lent for x in w.stats.ttft]
        tpot = [x for w in self.lent for x in w.stats.tpot]
        return RoseRolloutResult(
            makespan_s=makespan,
            output_tokens=sum(t.generated for t in self.trajs.values()),
            prefill_tokens=sum(w.prefill_tokens for w in self.workers),
            input_tokens=sum(_input_tokens(t) for t in self.trajs.values()),
            finish_s=finish,
            ttft_s=np.array(ttft),
            tpot_s=np.array(tpot),
            stalls=sum(w.stalls for w in self.lent),
            aborts=sum(w.aborts for w in self.lent),
            cuts=sum(w.mem.cuts for w in self.lent),
            launched=self._launched,
            kept=len(kept),
            kept_tokens=sum(t.context for t in kept),
            kept_tokens_by_finish=tuple(
                t.context for t in sorted(kept, key=lambda t: (t.finish_s, t.traj_id))
            ),
            events=self.eng.events_run,
            lent_busy_s=sum(w.rollout_busy_s for w in self.lent),
            timeline=tuple(self._timeline),
        )

    def _kept(self) -> list[TrajState]:
        if not self.specs:
            return []
        if self.feed.done is None:
            return list(self.trajs.values())
        keep = self.feed.keep
        return [t for t in self._finished if keep is None or keep(t)]


def _alive(workers: list[CoServingWorker]) -> list[CoServingWorker]:
    """Instances that serve: the live ones (all, if every one failed: traffic is not lost)."""
    return [w for w in workers if w.alive] or workers


def _input_tokens(t: TrajState) -> int:
    """Fig. 1's prefill tokens of the turns done: each turn reads its whole context."""
    total, ctx = 0, 0
    for turn in t.spec.turns[: t.steps_done]:
        total += ctx + turn.input_tokens
        ctx += turn.input_tokens + turn.output_tokens
    return total
