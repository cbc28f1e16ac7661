"""ROSE's preemptive memory sharing (§4.1): one pool of KV pages on a lent serving GPU, shared
by the serving model and the rollout model, serving first.

At each RL step the rollout gets a budget B_r = max(0, P − Û_s − H) of the P pages (Û_s the
serving peak over a recent window, H a headroom kept for serving). Rollout pages are those of
its running requests plus the prefixes of finished turns, leased for L seconds so that the
trajectory's next turn can reuse them. When serving usage crosses a high watermark inside the
headroom the executor enters the pressure state and cuts once: B_r halves, leased prefixes go
oldest first, then running rollout requests are aborted until rollout fits the new budget; the
budget stays frozen until the next step. Serving never waits for memory: whatever it needs
beyond the free pages is reclaimed from the rollout the same way.

A plain object: the caller passes the time and applies what it returns (the pages freed, the
requests aborted). It runs in the simulator here; a GPU engine would map these decisions onto
CUDA VMM page mappings (`cuMemMap`/`cuMemUnmap` of 2 MiB pages between the two models' virtual
KV ranges), which is what ROSE builds on vLLM.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from loom.core.errors import ConfigError

__all__ = [
    "HEADROOM_FRACTION",
    "MEMORY_FRACTION",
    "PAGE_BYTES",
    "Cut",
    "MemoryConfig",
    "MemorySharing",
    "lent_memory",
    "pages_for",
]

PAGE_BYTES = 2 * 1024**2  # §4.1: physical pages of 2 MB
HEADROOM_FRACTION = 0.2  # §4.1: H, e.g. 20% of GPU memory
MEMORY_FRACTION = 0.9  # of HBM for weights + KV (the engines' usual gpu_memory_utilization)


def pages_for(tokens: int, kv_bytes_per_token: int) -> int:
    """Pages that hold `tokens` of a model's KV cache (per GPU: pass the per-GPU bytes)."""
    if tokens < 0 or kv_bytes_per_token <= 0:
        raise ConfigError(
            f"need tokens >= 0 and bytes per token > 0, got {tokens} and {kv_bytes_per_token}"
        )
    return math.ceil(tokens * kv_bytes_per_token / PAGE_BYTES)


@dataclass(frozen=True, kw_only=True)
class MemoryConfig:
    pool_pages: int = field(
        metadata={"help": "P: pages of the GPU left for KV after both models' weights"}
    )
    headroom_pages: int = field(
        metadata={"help": "H: pages kept free for serving (§4.1: e.g. 20% of GPU memory)"}
    )
    watermark: float = field(
        default=0.5,
        metadata={
            "help": "where inside the headroom the pressure state begins, as a fraction of H "
            "above the serving peak (§4.1 names a high watermark within H, not its value; "
            "assumed: halfway)"
        },
    )
    lease_s: float = field(
        default=10.0,
        metadata={"help": "L: a finished turn's prefix stays this long (§4.1, App. C)"},
    )
    cut_factor: float = field(
        default=2.0, metadata={"help": "an emergency cut divides the budget by this (§4.1: 2x)"}
    )
    peak_window_s: float = field(
        default=600.0,
        metadata={
            "help": "Û_s is the serving peak over this window. The paper says 'recent' only; "
            "assumed: ten minutes, about one RL step of its workloads (rollouts of 500-1,000 s, "
            "Table 4) and long enough to hold Fig. 3a's minute-level swings"
        },
    )

    def __post_init__(self) -> None:
        if self.pool_pages < 0 or self.headroom_pages < 0:
            raise ConfigError(
                f"pool and headroom must be >= 0 pages, got {self.pool_pages}, "
                f"{self.headroom_pages}"
            )
        if not 0.0 <= self.watermark <= 1.0:
            raise ConfigError(f"watermark must be in [0, 1], got {self.watermark}")
        if not self.lease_s >= 0 or not self.peak_window_s > 0:
            raise ConfigError("lease_s must be >= 0 and peak_window_s > 0")
        if not self.cut_factor > 1.0:
            raise ConfigError(f"cut_factor must be > 1, got {self.cut_factor}")


@dataclass(frozen=True)
class Cut:
    """What a reclamation freed: the prefixes dropped (by trajectory) and the running rollout
    requests aborted (the caller re-routes them with their partial output)."""

    dropped: tuple[int, ...] = ()
    aborted: tuple[int, ...] = ()
    budget_pages: int = 0  # the budget after it

    def __bool__(self) -> bool:
        return bool(self.dropped or self.aborted)


class MemorySharing:
    """The page pool of one lent serving instance and the rollout's share of it."""

    def __init__(self, config: MemoryConfig) -> None:
        self.cfg = config
        self.serving = 0  # pages serving holds now
        self.running: OrderedDict[int, int] = OrderedDict()  # request -> pages, by admission
        self.leased: OrderedDict[int, tuple[int, float]] = OrderedDict()  # traj -> (pages, expiry)
        self._running_pages = 0
        self._leased_pages = 0
        self.budget = 0
        self.step = -1
        self.pressure = False
        self.cuts = 0
        self.aborted = 0
        self._floor = config.pool_pages  # serving pages where pressure begins (none before a step)
        self._samples: deque[tuple[float, int]] = deque()  # (time, serving pages), max-queue

    # ---- views ---------------------------------------------------------------------------
    @property
    def rollout(self) -> int:
        return self._running_pages + self._leased_pages

    @property
    def free(self) -> int:
        return self.cfg.pool_pages - self.serving - self.rollout

    def serving_peak(self, now: float) -> int:
        self._expire_samples(now)
        return self._samples[0][1] if self._samples else self.serving

    def cached(self, traj_id: int) -> int:
        """Pages of `traj_id`'s leased prefix held here (0 if none)."""
        entry = self.leased.get(traj_id)
        return entry[0] if entry is not None else 0

    # ---- RL steps ------------------------------------------------------------------------
    def begin_step(self, step: int, now: float) -> Cut:
        """Set this step's budget from the recent serving peak and leave the pressure state;
        a rollout above the new budget gives back the difference at once."""
        if step <= self.step:
            raise ConfigError(f"step {step} does not follow step {self.step}")
        self.step = step
        peak = self.serving_peak(now)
        self.budget = max(0, self.cfg.pool_pages - peak - self.cfg.headroom_pages)
        self._floor = peak + math.ceil(self.cfg.watermark * self.cfg.headroom_pages)
        self.pressure = False
        self.expire(now)
        return self._reclaim(self.budget)

    # ---- serving -------------------------------------------------------------------------
    def set_serving(self, pages: int, now: float) -> Cut:
        """Serving holds `pages` now. Entering the pressure state cuts the budget once;
        serving never waits: pages it needs beyond the free ones come from the rollout."""
        if pages < 0:
            raise ConfigError(f"serving pages must be >= 0, got {pages}")
        if pages > self.cfg.pool_pages:
            raise ConfigError(f"serving asks {pages} pages of a pool of {self.cfg.pool_pages}")
        self.serving = pages
        self._record(now, pages)
        self.expire(now)
        target = self.budget
        if pages > self._floor and not self.pressure:
            self.pressure = True
            self.cuts += 1
            self.budget = int(self.budget / self.cfg.cut_factor)
            target = self.budget
        elif pages <= self._floor:
            self.pressure = False
        target = min(target, self.cfg.pool_pages - pages)
        return self._reclaim(target)

    # ---- rollout -------------------------------------------------------------------------
    def room(self, extra_pages: int) -> bool:
        """Whether the rollout may take `extra_pages` more: within its budget, and leaving the
        headroom free for serving."""
        after = self.rollout + extra_pages
        return after <= self.budget and self.cfg.pool_pages - self.serving - after >= (
            self.cfg.headroom_pages
        )

    def admit(self, request: int, pages: int, traj_id: int | None = None) -> bool:
        """Start a rollout request of `pages`, reusing `traj_id`'s leased prefix (its pages
        count towards the request's); False when it does not fit."""
        if request in self.running:
            raise ConfigError(f"rollout request {request} is already running")
        reuse = self.cached(traj_id) if traj_id is not None else 0
        if not self.room(max(0, pages - reuse)):
            return False
        if reuse:
            del self.leased[traj_id]  # type: ignore[arg-type]
            self._leased_pages -= reuse
        self.running[request] = pages
        self._running_pages += pages
        return True

    def grow(self, request: int, pages: int) -> bool:
        """A running request needs `pages` more (its KV grew); False when they do not fit."""
        if request not in self.running:
            raise ConfigError(f"rollout request {request} is not running")
        if not self.room(pages):
            return False
        self.running[request] += pages
        self._running_pages += pages
        return True

    def finish(self, request: int, traj_id: int, now: float, keep: bool = True) -> None:
        """The request's turn ended: its pages become `traj_id`'s prefix, leased until
        now + L (dropped instead when `keep` is False or the lease is zero)."""
        pages = self.running.pop(request)
        self._running_pages -= pages
        old = self.leased.pop(traj_id, None)
        if old is not None:
            self._leased_pages -= old[0]
        if keep and self.cfg.lease_s > 0 and pages:
            self.leased[traj_id] = (pages, now + self.cfg.lease_s)
            self._leased_pages += pages

    def release(self, request: int) -> int:
        """Drop a running request without keeping its prefix (aborted elsewhere, stalled)."""
        pages = self.running.pop(request, 0)
        self._running_pages -= pages
        return pages

    def expire(self, now: float) -> tuple[int, ...]:
        """Drop the prefixes whose lease ran out. Leases all last L and enter in the order
        their turns finished, so they expire oldest first."""
        gone = []
        while self.leased:
            t, (pages, until) = next(iter(self.leased.items()))
            if until > now:
                break
            del self.leased[t]
            self._leased_pages -= pages
            gone.append(t)
        return tuple(gone)

    def next_expiry(self) -> float | None:
        return next(iter(self.leased.values()))[1] if self.leased else None

    # ---- internals -----------------------------------------------------------------------
    def _reclaim(self, target: int) -> Cut:
        """Bring the rollout down to `target` pages: leased prefixes oldest first, then running
        requests newest first (the least work lost)."""
        dropped: list[int] = []
        aborted: list[int] = []
        while self.rollout > target and self.leased:
            t, (pages, _) = self.leased.popitem(last=False)
            self._leased_pages -= pages
            dropped.append(t)
        while self.rollout > target and self.running:
            r, pages = self.running.popitem(last=True)
            self._running_pages -= pages
            aborted.append(r)
        self.aborted += len(aborted)
        assert self.serving + self.rollout <= self.cfg.pool_pages, "page pool over-committed"
        return Cut(tuple(dropped), tuple(aborted), self.budget)

    def _record(self, now: float, pages: int) -> None:
        """Keep the window's serving samples as a decreasing max-queue."""
        while self._samples and self._samples[-1][1] <= pages:
            self._samples.pop()
        self._samples.append((now, pages))
        self._expire_samples(now)

    def _expire_samples(self, now: float) -> None:
        """Serving usage is a step function: the level in force when the window opens counts,
        so the head goes only once a later sample also precedes the window."""
        start = now - self.cfg.peak_window_s
        while len(self._samples) > 1 and self._samples[1][0] <= start:
            self._samples.popleft()


def lent_memory(
    gpu: str, rollout_model: str, serving_model: str, tp: int, lease_s: float
) -> MemoryConfig:
    """A lent TP-`tp` instance of `gpu`s: P, its pages after both models' weight shards; H,
    20% of a GPU's memory; prefixes leased for `lease_s`."""
    from loom.perf.specs import gpu_spec, model_spec

    hbm = gpu_spec(gpu).hbm_gb * 1e9
    weights = (model_spec(rollout_model).weight_bytes + model_spec(serving_model).weight_bytes) / tp
    pool = int((hbm * MEMORY_FRACTION - weights) // PAGE_BYTES)
    if pool <= 0:
        raise ConfigError(f"{rollout_model} and {serving_model} do not fit on TP{tp} of {gpu}")
    return MemoryConfig(
        pool_pages=pool,
        headroom_pages=int(HEADROOM_FRACTION * hbm // PAGE_BYTES),
        lease_s=lease_s,
    )
