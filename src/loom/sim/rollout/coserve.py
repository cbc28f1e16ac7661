"""A lent serving instance that co-serves (ROSE §4.1): a serving engine and a rollout engine on
one GPU, one workload at a time, serving first, on one pool of KV pages.

The rollout side is the rollout simulator's `Worker` (same sequences, segments and prefix
cache), with chunked prefill of 512 tokens. The serving side is a PD-disaggregated instance:

* a **prefiller** runs serving prefills FCFS, one at a time. Under an admission policy that
  enforces TTFT (`dual_slo`, `ttft_only`) a rollout iteration runs only while no serving prefill
  waits, so an arriving prefill waits at most for the rollout iteration in flight. Otherwise
  (`tpot_only`, `none`) the two alternate: one rollout iteration before each serving prefill.
* a **decoder** advances all its serving decodes by one token per *cycle*: one serving step
  T_dec(b) plus the rollout iterations that fit. Under TPOT enforcement (`dual_slo`,
  `tpot_only`) that is m = floor((B_TPOT − T_dec) / r) iterations of predicted time r (Eq. 2 with
  t_last at the cycle's start): a rollout iteration takes r + T_dec / m of wall time, and a
  serving token c = T_dec + m·r. Without it (`ttft_only`, `none`) nothing bounds m: a decoder's
  serving work is a standing batch, not an arrival, and what hands the GPU back to it is its
  tokens falling due (t_last + B_TPOT), which only Eq. 2 checks. The slack is then unbounded
  (`admission.slack_s` is +inf) and every ready rollout iteration is admitted: serving decodes
  advance only while the rollout has no iteration to run (every turn here in a tool call, or
  no room to grow).

Between batch changes of either side the cycle is constant, so both sides fast-forward: events
grow with serving requests and rollout turns, not with tokens. Serving decodes progress as a
fluid (tokens = elapsed / c); a request's TPOT is (finish − first token) / (tokens − 1), its
TTFT the end of its prefill less its arrival.

Memory: `MemorySharing` (the policy object) sets the rollout budget at each RL step and decides
the pressure state and its cut from the serving pages; the worker holds the rollout's pages in
tokens and reclaims in the policy's order (leased prefixes oldest first, then running requests
newest first), re-routing what it aborts with its partial output. Prefixes are leased for L
seconds. Serving reserves its request's whole KV (prompt + output) when it arrives; it never
waits for rollout pages, only (with a static partition) for its own half of the pool. A rollout
request without progress for 2 s is dropped and reported as stalled.

Table 1's ServerlessLLM baseline (`swap`) shares the GPU by bidirectional autoscaling instead:
one model is resident at a time. After the serving side has been idle for a keep-alive, the
serving model is evicted and the rollout model loaded; a serving request arriving while the
rollout model is resident (or loading) evicts it — its requests are aborted and re-routed with
their partial output — and waits for the serving model to load again.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from loom.core.errors import ConfigError
from loom.rollout.rose.admission import (
    ADMISSION_POLICIES,
    ROLLOUT_CHUNK_TOKENS,
    AdmissionKind,
    Role,
    ServingSlo,
)
from loom.rollout.rose.memory import PAGE_BYTES, MemoryConfig, MemorySharing
from loom.sim.engine import Engine
from loom.sim.rollout.state import TrajState
from loom.sim.rollout.worker import Worker

if TYPE_CHECKING:
    from loom.perf.latency import LatencyModel
    from loom.rollout.policy import TurnScheduler

ENGINE_CHUNK_TOKENS = 8192  # an engine's default chunked-prefill size (verl's, vLLM's)

__all__ = [
    "CoServeConfig",
    "CoServingWorker",
    "Resident",
    "ServingRequest",
    "ServingStats",
    "SwapConfig",
]


@dataclass(frozen=True, kw_only=True)
class SwapConfig:
    """Bidirectional autoscaling (ServerlessLLM, Table 1): one model resident at a time."""

    serving_load_s: float = field(metadata={"help": "seconds to load the serving model"})
    rollout_load_s: float = field(metadata={"help": "seconds to load the rollout model"})
    keep_alive_s: float | None = field(
        default=None,
        metadata={
            "help": "serving idle this long: its model is evicted and the rollout's loaded. "
            "Neither paper gives ServerlessLLM's setting here; None: the serving model's load "
            "time, the rent-or-buy break-even (keep a model as long as reloading it costs)"
        },
    )

    @property
    def keep_alive(self) -> float:
        return self.serving_load_s if self.keep_alive_s is None else self.keep_alive_s

    def __post_init__(self) -> None:
        if min(self.serving_load_s, self.rollout_load_s, self.keep_alive) < 0:
            raise ConfigError("load times and keep-alive must be >= 0 seconds")


class Resident(StrEnum):
    """Which model a swapping instance holds."""

    SERVING = "serving"
    LOADING_ROLLOUT = "loading_rollout"
    ROLLOUT = "rollout"
    LOADING_SERVING = "loading_serving"


@dataclass(frozen=True, kw_only=True)
class CoServeConfig:
    """How a lent instance shares itself between serving and the rollout."""

    role: Role
    slo: ServingSlo
    admission: AdmissionKind = AdmissionKind.DUAL_SLO
    memory: MemoryConfig = field(metadata={"help": "pool, headroom, watermark and lease"})
    preemptive: bool = field(
        default=True,
        metadata={
            "help": "ROSE's preemptive sharing; False: Table 2's static partition, half of the "
            "pool to each model, no cut"
        },
    )
    prefix_cache: bool = field(
        default=True, metadata={"help": "keep finished turns' prefixes (leased); Prism: no"}
    )
    stall_s: float = field(default=2.0, metadata={"help": "§4.1: no progress this long = stall"})
    chunk_tokens: int | None = field(
        default=None,
        metadata={
            "help": "rollout prefill tokens per iteration; None: §4.1's 512 where an SLO is "
            "enforced, else the engine's own 8,192 (no executor bounds the rollout's steps)"
        },
    )
    swap: SwapConfig | None = field(
        default=None,
        metadata={"help": "None: co-serve (ROSE); else swap the models (ServerlessLLM)"},
    )

    @property
    def rollout_chunk(self) -> int:
        if self.chunk_tokens is not None:
            return self.chunk_tokens
        enforced = any(ADMISSION_POLICIES.get(self.admission))
        return ROLLOUT_CHUNK_TOKENS if enforced else ENGINE_CHUNK_TOKENS

    def __post_init__(self) -> None:
        if self.role == Role.COLOCATED:
            raise ConfigError("the co-serving simulator models PD-disaggregated instances only")
        if not self.stall_s > 0 or (self.chunk_tokens is not None and self.chunk_tokens < 1):
            raise ConfigError("stall_s must be > 0 and chunk_tokens >= 1")


@dataclass(slots=True)
class ServingRequest:
    req_id: int
    arrival_s: float
    prompt: int
    output: int
    first_token_s: float = math.nan  # end of its prefill
    finish_s: float = math.nan
    left: float = 0.0  # decode tokens still to produce (fluid)

    @property
    def kv_tokens(self) -> int:
        return self.prompt + self.output


@dataclass
class ServingStats:
    """Serving latencies measured on one instance (seconds)."""

    ttft: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)


class CoServingWorker(Worker):
    """A lent serving instance running the rollout model beside the serving model."""

    def __init__(
        self,
        *,
        idx: int,
        tp: int,
        node: int,
        latency: LatencyModel,
        serving_latency: LatencyModel,
        rollout_kv_bytes: int,
        serving_kv_bytes: int,
        config: CoServeConfig,
        memory: MemorySharing,
        scheduler: TurnScheduler,
        engine: Engine,
        max_running: int,
        on_turn_done: Callable[[TrajState, Worker], None],
        on_abort: Callable[[TrajState, CoServingWorker, str], None],
        on_prefilled: Callable[[ServingRequest, CoServingWorker], None] | None = None,
        on_capacity: Callable[[CoServingWorker], None] | None = None,
        on_served: Callable[[ServingRequest, CoServingWorker], None] | None = None,
        **worker: Any,
    ) -> None:
        """`on_served`: a serving request's last token is out (a decoder's). `worker`: more
        of `Worker`'s settings (the emulated engine's `on_admit`, `requeue_in_place`)."""
        super().__init__(
            idx=idx,
            tp=tp,
            node=node,
            latency=latency,
            scheduler=scheduler,
            engine=engine,
            max_running=max_running,
            chunk_tokens=config.rollout_chunk,
            decode_reserve=0,
            on_turn_done=on_turn_done,
            **worker,
        )
        self._on_served = on_served
        self.cfg = config
        self.mem = memory
        self.slat = serving_latency
        # tokens of each model per 2 MiB page of one GPU (the pool is per GPU, layouts alike)
        self.r_tpp = max(1, PAGE_BYTES * tp // rollout_kv_bytes)
        self.s_tpp = max(1, PAGE_BYTES * tp // serving_kv_bytes)
        self._on_abort = on_abort
        self._on_prefilled = on_prefilled
        self._on_capacity = on_capacity
        self.version = -1
        self._weights = False  # the rollout weights of `version` are here
        self.resident = Resident.SERVING if config.swap is not None else None
        self._swap_event: int | None = None
        self.swaps = 0  # rollout model evictions (swap mode)
        self.alive = True
        self.stats = ServingStats()
        self.stalls = 0
        self.served = 0  # serving requests routed here
        self.aborts = 0
        self.rollout_busy_s = 0.0
        # serving state
        self.s_queue: deque[ServingRequest] = deque()  # prefiller: waiting prefills
        self.s_active: list[ServingRequest] = []  # decoder: decoding
        self.s_wait: deque[ServingRequest] = deque()  # decoder: waiting for serving memory
        self.s_tokens = 0  # serving KV tokens held (reserved whole)
        self._s_busy_until = -math.inf  # prefiller: end of the serving prefill in flight
        self._s_event: int | None = None
        self._cycle = math.inf  # decoder: seconds per serving token now
        self._s_last = engine.now  # decoder: last fluid update
        self._interleave_due = False  # prefiller without TTFT control: rollout goes next
        self._progress_s = engine.now
        self._stall_event: int | None = None
        self._lease_event: int | None = None
        self._expiry: dict[int, float] = {}
        self.capacity = 0

    # ---- views for the router ------------------------------------------------------------
    @property
    def activated(self) -> bool:
        """The rollout model is resident with its weights (swap mode: only while loaded)."""
        return self._weights and self.resident in (None, Resident.ROLLOUT)

    @property
    def free_pages(self) -> int:
        return max(0, self._free()) // self.r_tpp

    def serving_load(self, now: float) -> int:
        """Serving requests here: queued or in flight (prefiller), decoding or waiting
        (decoder)."""
        if self.cfg.role == Role.PREFILL:
            return len(self.s_queue) + (now < self._s_busy_until)
        return len(self.s_active) + len(self.s_wait)

    @property
    def serving_pages(self) -> int:
        return -(-self.s_tokens // self.s_tpp)

    @property
    def slack_s(self) -> float:
        """Serving-SLO slack left for a rollout iteration now (+inf when nothing binds)."""
        ttft_on, tpot_on = ADMISSION_POLICIES.get(self.cfg.admission)
        if self.cfg.role == Role.PREFILL and ttft_on and self.s_queue:
            head = self.s_queue[0]
            return head.arrival_s + self.cfg.slo.ttft_s - self.eng.now - self._prefill_s(head)
        if self.cfg.role == Role.DECODE and tpot_on and self.s_active:
            return self.cfg.slo.tpot_s - self._decode_s()
        return math.inf

    # ---- RL steps and weights ------------------------------------------------------------
    def begin_step(self, step: int) -> None:
        """A new RL step: the policy sets the rollout budget from recent serving usage."""
        self.mem.begin_step(step, self.eng.now)
        self._memory_changed()

    def set_version(self, version: int) -> None:
        self.version = version
        self._weights = True
        self._serving_idle()

    def fail(self) -> None:
        """The instance died: every rollout request on it goes back to the router."""
        self.alive = False
        self._abort_all("failed")

    # ---- serving traffic -----------------------------------------------------------------
    def serve_prefill(self, req: ServingRequest) -> None:
        """A serving request arrives at this prefiller."""
        assert self.cfg.role == Role.PREFILL
        self.served += 1
        self.s_queue.append(req)
        self.s_tokens += req.prompt
        self._serving_needed()
        self._memory_changed()
        if self.eng.now >= self._s_busy_until:
            self.poke()  # the rollout iteration in flight ends, then serving runs

    def serve_decode(self, req: ServingRequest) -> None:
        """A prefilled serving request arrives at this decoder."""
        assert self.cfg.role == Role.DECODE
        self.served += 1
        self._serving_needed()
        self._advance_serving()
        self.s_wait.append(req)
        self._admit_serving()
        self.poke()

    # ---- worker hooks --------------------------------------------------------------------
    def put_idle(self, traj: TrajState, tokens: int) -> bool:
        if not self.cfg.prefix_cache or self.mem.cfg.lease_s <= 0:
            return False
        if not super().put_idle(traj, tokens):
            return False
        self._expiry[traj.traj_id] = self.eng.now + self.mem.cfg.lease_s
        self._arm_lease()
        return True

    def drop_idle(self, traj_id: int) -> int:
        self._expiry.pop(traj_id, None)
        return super().drop_idle(traj_id)

    def _apply(self, iters: int, dt: float) -> None:
        if iters > 0:
            self._progress_s = self.eng.now
            self.rollout_busy_s += iters * dt
        super()._apply(iters, dt)

    def _plan(self, start: float) -> None:
        """Plan the next rollout segment around serving; never preempts (a rollout that cannot
        run stalls and is re-routed instead)."""
        self._advance_serving()
        self._seg = None
        self.reserved = 0
        if self.resident in (Resident.LOADING_SERVING, Resident.LOADING_ROLLOUT):
            self._cycle = math.inf  # a model is loading: neither side runs
            self._arm_serving()
            return
        if self.cfg.role == Role.PREFILL:
            self._plan_prefiller(start)
        else:
            self._plan_decoder(start)
        if self._seg is not None or not (self.running or self.waiting):
            self._progress_s = self.eng.now
        else:  # turns here that cannot run: given back after the stall timeout
            self._arm_stall()

    def _plan_prefiller(self, start: float) -> None:
        if self.eng.now < self._s_busy_until:
            return  # serving runs; its end re-plans
        ttft_on, _ = ADMISSION_POLICIES.get(self.cfg.admission)
        if self.s_queue and (ttft_on or not self.running or not self._interleave_due):
            self._start_prefill(start)
            return
        if not self.running or not self.alive:
            return
        k, r, growth = self._rollout_segment()
        if k <= 0:
            return
        if self.s_queue:  # no TTFT control: one rollout iteration, then the next prefill
            k, growth = 1, growth // max(k, 1)
            self._interleave_due = False
        self._schedule_segment(start, k, r, growth)

    def _plan_decoder(self, start: float) -> None:
        r = 0.0
        k, growth = 0, 0
        if self.running and self.alive:
            k, r, growth = self._rollout_segment()
        t_dec = self._decode_s() if self.s_active else 0.0
        _, tpot_on = ADMISSION_POLICIES.get(self.cfg.admission)
        if k > 0 and not tpot_on:  # unbounded slack: the rollout runs, serving waits
            self._cycle = math.inf
            self._schedule_segment(start, k, r, growth)
            self._arm_serving()
            return
        m = 0
        if k > 0 and not self.s_active:
            m = 1
        elif k > 0:
            m = int((self.cfg.slo.tpot_s - t_dec) // r) if r > 0 else 1
        if m > 0:
            dt = r + t_dec / m
            self._cycle = t_dec + m * r if self.s_active else math.inf
            self._schedule_segment(start, k, dt, growth)
        else:
            self._cycle = t_dec if self.s_active else math.inf
        self._arm_serving()

    def _rollout_segment(self) -> tuple[int, float, int]:
        """The next rollout segment; where the rollout's pages cannot hold one more token
        for its running requests, the newest are aborted (and re-routed) until they can."""
        while True:
            k, r, growth = self._segment()
            if k > 0 or len(self.running) <= 1:
                return k, r, growth
            newest = self.running[-1]
            self._drop_seq(newest)
            self.aborts += 1
            self._on_abort(newest.traj, self, "memory")

    def _schedule_segment(self, start: float, k: int, dt: float, growth: int) -> None:
        self.reserved = growth
        ev = self.eng.schedule(start + k * dt, self._on_segment_end, priority=1)
        self._seg = (start, dt, k, ev)

    # ---- serving internals ---------------------------------------------------------------
    def _prefill_s(self, req: ServingRequest) -> float:
        return self.slat.prefill_time(req.prompt)

    def _decode_s(self) -> float:
        ctx = sum(r.prompt + r.output - int(r.left) for r in self.s_active)
        return self.slat.decode_step_time(len(self.s_active), ctx)

    def _start_prefill(self, start: float) -> None:
        req = self.s_queue.popleft()
        end = start + self._prefill_s(req)
        self._s_busy_until = end
        self._interleave_due = True
        self._s_event = self.eng.schedule(end, self._prefill_done, req, priority=0)

    def _prefill_done(self, req: ServingRequest) -> None:
        self._s_event = None
        req.first_token_s = self.eng.now
        self.stats.ttft.append(self.eng.now - req.arrival_s)
        self.s_tokens -= req.prompt
        self._memory_changed()
        if self._on_prefilled is not None:
            self._on_prefilled(req, self)
        self._serving_idle()
        self.poke()

    def _advance_serving(self) -> None:
        """Decoder: move the fluid serving decodes to now at the cycle in force."""
        now = self.eng.now
        if self.s_active and math.isfinite(self._cycle) and self._cycle > 0:
            done = (now - self._s_last) / self._cycle
            for r in self.s_active:
                r.left -= done
        self._s_last = now

    def _admit_serving(self) -> None:
        limit = self._serving_limit()
        changed = False
        while self.s_wait and self.s_tokens + self.s_wait[0].kv_tokens <= limit:
            req = self.s_wait.popleft()
            req.left = max(0, req.output - 1)
            self.s_tokens += req.kv_tokens
            if req.left <= 0:
                self._finish_serving(req)
            else:
                self.s_active.append(req)
            changed = True
        if changed:
            self._memory_changed()

    def _serving_limit(self) -> int:
        """Serving KV tokens this instance may hold."""
        pool = self.mem.cfg.pool_pages * self.s_tpp
        return pool // 2 if not self.cfg.preemptive else pool

    def _finish_serving(self, req: ServingRequest) -> None:
        req.finish_s = self.eng.now
        if req.output > 1:
            self.stats.tpot.append((req.finish_s - req.first_token_s) / (req.output - 1))
        if self._on_served is not None:
            self._on_served(req, self)

    def _arm_serving(self) -> None:
        if self._s_event is not None:
            self.eng.cancel(self._s_event)
            self._s_event = None
        if not self.s_active or not math.isfinite(self._cycle):
            return
        left = min(r.left for r in self.s_active)
        self._s_event = self.eng.schedule(
            self.eng.now + max(0.0, left) * self._cycle, self._decodes_done, priority=0
        )

    def _decodes_done(self) -> None:
        self._s_event = None
        self._advance_serving()
        still = []
        for r in self.s_active:
            if r.left <= 1e-6:
                self.s_tokens -= r.kv_tokens
                self._finish_serving(r)
            else:
                still.append(r)
        self.s_active = still
        self._admit_serving()
        self._memory_changed()
        self._serving_idle()
        self.poke()

    # ---- memory --------------------------------------------------------------------------
    def _memory_changed(self) -> None:
        """Serving usage or the budget moved: ask the policy, reclaim in its order, and set
        how far the rollout may grow."""
        pool = self.mem.cfg.pool_pages
        if self.resident is not None:  # swap: the whole pool to whichever model is resident
            hard = grow = pool if self.resident == Resident.ROLLOUT else 0
        elif self.cfg.preemptive:
            self.mem.set_serving(min(self.serving_pages, pool), self.eng.now)
            hard = min(self.mem.budget, pool - self.serving_pages)
            grow = min(self.mem.budget, pool - self.serving_pages - self.mem.cfg.headroom_pages)
        else:
            hard = grow = pool // 2
        before = self.capacity
        capacity = max(0, grow) * self.r_tpp
        if self.used + self.idle_used + self.reserved > capacity:
            self._halt()  # the segment in flight counted on room that is gone
        if self.used + self.idle_used > hard * self.r_tpp:
            self._reclaim(max(0, hard) * self.r_tpp)
        self.capacity = capacity
        if self.capacity > before and self._on_capacity is not None:
            self._on_capacity(self)

    def _reclaim(self, target_tokens: int) -> None:
        self._halt()
        for t in list(self.idle):  # leased prefixes, oldest first
            if self.used + self.idle_used <= target_tokens:
                break
            self.drop_idle(t)
        aborted = []
        while self.used + self.idle_used > target_tokens and self.running:
            aborted.append(self.running[-1])  # newest first
            self._drop_seq(self.running[-1])
        for s in aborted:
            self._on_abort(s.traj, self, "memory")
        self.aborts += len(aborted)

    # ---- swapping (ServerlessLLM) ----------------------------------------------------------
    def _serving_needed(self) -> None:
        """A serving request arrived: with the rollout model in (or coming), evict it and
        load the serving model; the request waits for it."""
        if self.resident is None:
            return
        if self.resident == Resident.SERVING:
            self._cancel_swap()  # no longer idle
            return
        if self.resident == Resident.LOADING_SERVING:
            return
        self._cancel_swap()
        self.swaps += 1
        self.resident = Resident.LOADING_SERVING  # before the aborts: nothing routes here
        self._abort_all("evicted")
        for t in list(self.idle):
            self.drop_idle(t)
        self._memory_changed()
        assert self.cfg.swap is not None
        self._swap_event = self.eng.after(
            self.cfg.swap.serving_load_s, self._loaded, Resident.SERVING, priority=0
        )

    def _serving_idle(self) -> None:
        """Serving may have gone idle: after the keep-alive, the rollout model comes in."""
        if self.resident != Resident.SERVING or not self._weights or not self.alive:
            return
        if self.s_queue or self.s_active or self.s_wait or self.eng.now < self._s_busy_until:
            return
        self._cancel_swap()
        assert self.cfg.swap is not None
        self._swap_event = self.eng.after(self.cfg.swap.keep_alive, self._load_rollout)

    def _load_rollout(self) -> None:
        self._swap_event = None
        assert self.cfg.swap is not None
        self.resident = Resident.LOADING_ROLLOUT
        self._swap_event = self.eng.after(
            self.cfg.swap.rollout_load_s, self._loaded, Resident.ROLLOUT, priority=0
        )

    def _loaded(self, model: Resident) -> None:
        self._swap_event = None
        self.resident = model
        self._memory_changed()  # the rollout's capacity comes (and the router hears of it)
        if model == Resident.SERVING:
            self._serving_idle()
        if model == Resident.ROLLOUT and self._on_capacity is not None:
            self._on_capacity(self)
        self.poke()

    def _cancel_swap(self) -> None:
        if self._swap_event is not None:
            self.eng.cancel(self._swap_event)
            self._swap_event = None

    # ---- leases and stalls ---------------------------------------------------------------
    def _arm_lease(self) -> None:
        if self._lease_event is None and self._expiry:
            self._lease_event = self.eng.schedule(
                min(self._expiry.values()), self._expire, priority=2
            )

    def _expire(self) -> None:
        self._lease_event = None
        now = self.eng.now
        for t, until in list(self._expiry.items()):
            if until <= now:
                self.drop_idle(t)
        self._arm_lease()
        self.mem.expire(now)
        if self._on_capacity is not None:
            self._on_capacity(self)

    def _arm_stall(self) -> None:
        if self._stall_event is None:
            at = max(self.eng.now, self._progress_s + self.cfg.stall_s)
            self._stall_event = self.eng.schedule(at, self._check_stall, priority=2)

    def _check_stall(self) -> None:
        self._stall_event = None
        if not self.running and not self.waiting:
            return
        if self._seg is not None or self.eng.now - self._progress_s < self.cfg.stall_s - 1e-9:
            if self._seg is None:
                self._arm_stall()
            return
        self.stalls += 1
        self._abort_all("stalled")

    def _abort_all(self, why: str) -> None:
        gone = self.evict_all()
        self.aborts += len(gone)
        for traj in gone:
            self._on_abort(traj, self, why)
        self._progress_s = self.eng.now
