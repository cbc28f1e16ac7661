"""Rollout-level simulator: trajectories alternate LLM turns on workers with tool calls.

The driver owns time and state; a `TurnScheduler`, a `Router` and a worker layout (from a
`ResourcePlanner`) decide. Events grow with turns, not tokens: workers fast-forward decode
between batch changes. KV migrations run on the links between workers, scheduled by Heddle's
transmission scheduler, while the trajectory is in its tool call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from loom.core.errors import ConfigError
from loom.core.topology import GpuType
from loom.core.trajectory import TrajectorySpec, TrajectoryStatus
from loom.perf.latency import LatencyModel, RooflineLatencyModel
from loom.perf.transfer import INTER_NODE_GBS, KvLinks
from loom.rollout.heddle.transmission import MigrationRequest, select_batch
from loom.rollout.policy import Router, TurnScheduler, WorkerLayout
from loom.sim.engine import Engine
from loom.sim.rollout.state import TrajState
from loom.sim.rollout.worker import Worker

__all__ = ["RolloutConfig", "RolloutResult", "RolloutSimulator"]


@dataclass(frozen=True, kw_only=True)
class RolloutConfig:
    """Hardware and engine settings of a simulated rollout cluster."""

    model: str = field(default="qwen3-14b", metadata={"help": "model key in perf/data/models.toml"})
    gpu: GpuType = field(default=GpuType.H100, metadata={"help": "GPU type of every worker"})
    gpus_per_node: int = field(default=8, metadata={"help": "GPUs per node (NVLink domain)"})
    max_running: int = field(
        default=1024,
        metadata={
            "help": "max running turns per worker: verl's rollout default (max_num_seqs 1024, "
            "beside max_num_batched_tokens 8192; SGLang's own default is larger). Workers of "
            "one or two GPUs run out of KV memory long before this"
        },
    )
    chunk_tokens: int = field(
        default=8192, metadata={"help": "chunked-prefill tokens/iteration (verl's default)"}
    )
    decode_reserve: int = field(
        default=2048, metadata={"help": "KV tokens reserved per running turn at admission"}
    )
    inter_node_gbs: float = field(
        default=INTER_NODE_GBS, metadata={"help": "GB/s between nodes (400 Gb/s IB)"}
    )
    migrate_kv: bool = field(default=True, metadata={"help": "move KV caches when routers migrate"})
    requeue_in_place: bool = field(
        default=False,
        metadata={
            "help": "a preempted turn keeps its place in its worker's queue (vLLM's order); "
            "False: it queues anew (SGLang's retraction)"
        },
    )
    dispatch_delay_s: float = field(
        default=0.0,
        metadata={
            "help": "seconds from a turn being ready (the batch's start, a tool's return) to "
            "its worker's queue: a router's decision and the HTTP round trips of a served "
            "rollout (agent to router to engine and back). 0: the policies run inside the "
            "workers, as in the papers' simulations"
        },
    )
    router_decision_s: float = field(
        default=0.0,
        metadata={
            "help": "seconds a served router spends on each turn, one turn at a time (its "
            "event loop is one thread): turns ready at once wait for each other's decisions, "
            "as the batch's first turns do. 0: decisions take no time"
        },
    )

    def __post_init__(self) -> None:
        if self.gpus_per_node < 1 or self.max_running < 1 or self.chunk_tokens < 1:
            raise ConfigError("gpus_per_node, max_running and chunk_tokens must be >= 1")
        for name in ("dispatch_delay_s", "router_decision_s"):
            value = getattr(self, name)
            if not 0 <= value < float("inf"):
                raise ConfigError(f"{name} must be a finite number >= 0, got {value}")


@dataclass(frozen=True, kw_only=True)
class RolloutResult:
    """Outcome of one simulated rollout batch."""

    makespan_s: float
    output_tokens: int
    finish_s: np.ndarray  # per trajectory, by traj_id
    queue_delay_s: np.ndarray  # per trajectory: sum over its turns
    prefill_tokens: int  # prefilled, recomputation included
    cache_hit_tokens: int
    preemptions: int
    migrations: int
    migration_stall_s: float  # tool calls that returned before their migration finished
    events: int
    active_series: tuple[tuple[float, int], ...]  # (time, trajectories not yet finished)

    @property
    def throughput_tok_s(self) -> float:
        return self.output_tokens / self.makespan_s if self.makespan_s > 0 else 0.0

    @property
    def mean_active(self) -> float:
        """Trajectories not yet finished, averaged over the rollout's time: how many share the
        workers at once. Every trajectory is alive from 0 to its finish, so this is the sum of
        finish times over the makespan."""
        n = len(self.finish_s)
        return float(self.finish_s.sum() / self.makespan_s) if self.makespan_s > 0 else float(n)

    @property
    def longest_queue_delay_s(self) -> float:
        """Total queueing delay of the trajectory that finished last (Heddle Fig. 14)."""
        return float(self.queue_delay_s[int(np.argmax(self.finish_s))])


class _WorkerView:
    """Read-only face of a Worker handed to policies."""

    __slots__ = ("_w",)

    def __init__(self, w: Worker) -> None:
        self._w = w

    idx = property(lambda self: self._w.idx)
    tp = property(lambda self: self._w.tp)
    node = property(lambda self: self._w.node)
    load = property(lambda self: self._w.load)

    def cached_tokens(self, traj_id: int) -> int:
        return self._w.cached_tokens(traj_id)


LatencyFactory = Callable[[int], LatencyModel]


class RolloutSimulator:
    """Simulates one rollout batch; `run()` returns a RolloutResult. One use per instance."""

    def __init__(
        self,
        trajectories: Sequence[TrajectorySpec],
        layout: WorkerLayout,
        scheduler: TurnScheduler,
        router: Router,
        config: RolloutConfig,
        *,
        predictions: Sequence[Sequence[float]] | None = None,
        latency: LatencyFactory | None = None,
    ) -> None:
        if not trajectories:
            raise ConfigError("a rollout needs at least one trajectory")
        if not layout.degrees:
            raise ConfigError("a rollout needs at least one worker")
        ids = [t.traj_id for t in trajectories]
        if sorted(ids) != list(range(len(ids))):
            raise ConfigError("trajectory ids must be 0..n-1")
        if predictions is not None and len(predictions) != len(trajectories):
            raise ConfigError("need one prediction sequence per trajectory")
        self.cfg = config
        self.eng = Engine()
        self.router = router
        make_lat = latency or (lambda tp: RooflineLatencyModel(config.gpu, config.model, tp=tp))
        self.trajs = [
            TrajState(t, tuple(predictions[t.traj_id]) if predictions is not None else ())
            for t in sorted(trajectories, key=lambda t: t.traj_id)
        ]
        self.workers = self._build_workers(layout, scheduler, make_lat)
        self.views = [_WorkerView(w) for w in self.workers]
        self.links = [
            KvLinks.of(config.model, config.gpu, w.node, config.inter_node_gbs)
            for w in self.workers
        ]
        self._pending_mig: list[MigrationRequest] = []
        self._busy: set[int] = set()
        self.migrations = 0
        self.migration_stall_s = 0.0
        self._stall_since: dict[int, float] = {}
        self._active = len(self.trajs)
        self._rebalance_due = False
        self._series: list[tuple[float, int]] = [(0.0, self._active)]
        self._router_free = 0.0  # when the served router has decided every turn it holds
        self._ran = False

    def _build_workers(
        self, layout: WorkerLayout, scheduler: TurnScheduler, make_lat: LatencyFactory
    ) -> list[Worker]:
        workers, gpu_cursor = [], 0
        lat_cache: dict[int, LatencyModel] = {}
        for i, tp in enumerate(layout.degrees):
            if tp < 1:
                raise ConfigError(f"worker {i}: model-parallel degree must be >= 1, got {tp}")
            node = gpu_cursor // self.cfg.gpus_per_node
            if (gpu_cursor + tp - 1) // self.cfg.gpus_per_node != node:
                raise ConfigError(f"worker {i} (tp={tp}) would straddle two nodes")
            gpu_cursor += tp
            if tp not in lat_cache:
                lat_cache[tp] = make_lat(tp)
            workers.append(
                Worker(
                    idx=i,
                    tp=tp,
                    node=node,
                    latency=lat_cache[tp],
                    scheduler=scheduler,
                    engine=self.eng,
                    max_running=self.cfg.max_running,
                    chunk_tokens=self.cfg.chunk_tokens,
                    decode_reserve=self.cfg.decode_reserve,
                    on_turn_done=self._turn_done,
                    requeue_in_place=self.cfg.requeue_in_place,
                )
            )
        return workers

    # ---- run ---------------------------------------------------------------------------
    def run(self) -> RolloutResult:
        if self._ran:
            raise RuntimeError("a RolloutSimulator runs once; build a new one")
        self._ran = True
        if self.cfg.dispatch_delay_s > 0:  # the first turns reach the workers after the router
            self.eng.after(self.cfg.dispatch_delay_s, self._start)
        else:
            self._start()
        self.eng.run()
        return self._result()

    def _start(self) -> None:
        self.router.start(self.trajs, self.views)
        if self.cfg.router_decision_s > 0:  # one first turn after another through the router
            for t in self.trajs:
                self.eng.after(self._router_wait(), self._enqueue, t)
            return
        touched = set()
        for t in self.trajs:
            w = self._route(t)
            self.workers[w].enqueue(t, poke=False)
            touched.add(w)
        for w in sorted(touched):
            self.workers[w].poke()

    def _route(self, t: TrajState) -> int:
        w = self.router.route(t, self.views, self.eng.now)
        if w is None or not 0 <= w < len(self.workers):
            raise ConfigError(f"router returned worker {w}; there are {len(self.workers)}")
        return w

    # ---- callbacks ---------------------------------------------------------------------
    def _turn_done(self, t: TrajState, w: Worker) -> None:
        turn = t.spec.turns[t.steps_done]
        finished = t.end_turn(self.eng.now)
        if finished:
            self._active -= 1
            self._series.append((self.eng.now, self._active))
            self.router.finish(t)
            self._schedule_rebalance()
            return
        t.host = w.idx
        t.tool_returned = False
        w.put_idle(t, t.context)
        assert turn.tool_latency_s is not None
        # the reply reaches the agent, the tool runs, the next turn reaches the router
        delay = turn.tool_latency_s + self.cfg.dispatch_delay_s
        self.eng.after(delay, self._tool_return, t, priority=0)
        self._send_ahead(t, w.idx)
        self._schedule_rebalance()

    def _send_ahead(self, t: TrajState, src: int) -> None:
        """`t` is in a tool call with its KV cache on `src`: move it where the router says."""
        target = self.router.migrate(t, self.views, self.eng.now)
        if target is not None and target != src and self.cfg.migrate_kv:
            self._request_migration(t, src, target)

    def _schedule_rebalance(self) -> None:
        # After the worker that called back has settled, once per instant.
        if not self._rebalance_due:
            self._rebalance_due = True
            self.eng.after(0.0, self._rebalance, priority=2)

    def _rebalance(self) -> None:
        """Move the waiting trajectories that the router now places elsewhere (running ones
        are asked at the end of their turn): one in a tool call sends its KV cache ahead, one
        in a queue leaves it and joins the target's queue when its KV cache lands."""
        self._rebalance_due = False
        for traj_id in self.router.stale():
            t = self.trajs[traj_id]
            if t.migrating_to >= 0 or t.status not in (
                TrajectoryStatus.IN_TOOL,
                TrajectoryStatus.QUEUED,
            ):
                continue
            if t.status == TrajectoryStatus.IN_TOOL:
                self._send_ahead(t, t.host)
                continue
            target = self.router.migrate(t, self.views, self.eng.now)
            if target is None or target == t.queued_on:
                continue
            self.workers[t.queued_on].withdraw(t)
            src = t.host  # the KV cache, if any, is where its last turn ran
            kv_elsewhere = src >= 0 and src != target and self.workers[src].cached_tokens(traj_id)
            if not (self.cfg.migrate_kv and kv_elsewhere):
                self._enqueue(t)
                continue
            t.tool_returned = True  # joins the target's queue when the KV lands
            self._stall_since[traj_id] = self.eng.now
            self._request_migration(t, src, target)

    def _router_wait(self) -> float:
        """Seconds from now until the served router has decided a turn that reaches it now:
        the turns before it, then its own decision."""
        self._router_free = max(self.eng.now, self._router_free) + self.cfg.router_decision_s
        return self._router_free - self.eng.now

    def _tool_return(self, t: TrajState) -> None:
        if self.cfg.router_decision_s > 0:
            self.eng.after(self._router_wait(), self._decided, t)
            return
        self._decided(t)

    def _decided(self, t: TrajState) -> None:
        t.tool_returned = True
        if t.migrating_to >= 0:
            self._stall_since[t.traj_id] = self.eng.now  # wait for the KV to land
            return
        self._enqueue(t)

    def _enqueue(self, t: TrajState) -> None:
        w, host = self._route(t), t.host
        self.workers[w].enqueue(t)
        if 0 <= host != w:
            self.workers[host].moved_away(t)

    # ---- migration ---------------------------------------------------------------------
    def _request_migration(self, t: TrajState, src: int, dst: int) -> None:
        t.migrating_to = dst
        self._pending_mig.append(
            MigrationRequest(t.traj_id, src, dst, t.context, t.predicted_total)
        )
        self._start_migrations()

    def _start_migrations(self) -> None:
        batch = select_batch(self._pending_mig, self._busy)
        if not batch:
            return
        chosen = {r.traj_id for r in batch}
        self._pending_mig = [r for r in self._pending_mig if r.traj_id not in chosen]
        for r in batch:
            tokens = self.workers[r.src].cached_tokens(r.traj_id)
            self._busy.update((r.src, r.dst))
            seconds = self.links[r.src].transfer_s(tokens, self.links[r.dst])
            self.eng.after(seconds, self._migration_done, r, tokens)

    def _migration_done(self, r: MigrationRequest, tokens: int) -> None:
        self._busy.difference_update((r.src, r.dst))
        t = self.trajs[r.traj_id]
        src, dst = self.workers[r.src], self.workers[r.dst]
        moved = min(tokens, src.drop_idle(r.traj_id))
        if moved > 0 and dst.put_idle(t, moved):
            self.migrations += 1
        t.migrating_to = -1
        t.host = r.dst
        if t.tool_returned:
            self.migration_stall_s += self.eng.now - self._stall_since.pop(r.traj_id)
            self._enqueue(t)
        src.poke()  # the KV it sent freed room there
        self._start_migrations()

    # ---- result ------------------------------------------------------------------------
    def _result(self) -> RolloutResult:
        lost = [t.traj_id for t in self.trajs if t.status != TrajectoryStatus.FINISHED]
        assert not lost, f"trajectories never finished: {lost[:10]}"
        finish = np.array([t.finish_s for t in self.trajs])
        return RolloutResult(
            makespan_s=float(finish.max()),
            output_tokens=sum(t.generated for t in self.trajs),
            finish_s=finish,
            queue_delay_s=np.array([t.queue_delay_s for t in self.trajs]),
            prefill_tokens=sum(w.prefill_tokens for w in self.workers),
            cache_hit_tokens=sum(w.cached_hit_tokens for w in self.workers),
            preemptions=sum(w.preemptions for w in self.workers),
            migrations=self.migrations,
            migration_stall_s=self.migration_stall_s,
            events=self.eng.events_run,
            active_series=tuple(self._series),
        )
