"""One inference worker under continuous batching, fast-forwarded between batch changes.

Each iteration decodes one token for every decoding sequence and prefills up to
`chunk_tokens` of one prefilling sequence (chunked prefill). Between batch changes the
iterations are identical but for slowly growing context, so the worker plans a *segment* of
k iterations at once (until the next prefill or turn finishes, or KV space runs out) and
schedules a single event at its end; an arrival mid-segment completes the iteration in flight
and re-plans. KV-cache capacity covers running sequences plus a prefix cache of idle
trajectories (in tool calls or preempted); running out evicts idle prefixes first, then
preempts the running turn with the highest scheduler key. The prefix cache evicts least
recently used first or, under a scheduler with `priority_eviction`, in the scheduler's order.

Two drivers run it: the rollout simulator, on the discrete-event `Engine`, and the emulated GPU
engine (`loom serve engine --emulate`), on an `Engine` advanced by the wall clock; the latter
also reads progress mid-segment (`progress`) and aborts turns (`abort`).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from sortedcontainers import SortedList

from loom.core.trajectory import TrajectoryStatus
from loom.sim.engine import Clock
from loom.sim.rollout.state import TrajState

if TYPE_CHECKING:
    from loom.perf.latency import LatencyModel
    from loom.rollout.policy import TurnScheduler

__all__ = ["Seq", "Worker"]


class Seq:
    """A turn admitted to a worker: `prefill_left` tokens still to prefill; `order` is its
    place in the waiting queue it came from (ties of `key` ran in that order)."""

    __slots__ = ("key", "order", "prefill_left", "traj")

    def __init__(self, traj: TrajState, key: float, prefill_left: int, order: int = 0) -> None:
        self.traj = traj
        self.key = key
        self.prefill_left = prefill_left
        self.order = order

    @property
    def decode_left(self) -> int:
        return self.traj.turn_output - self.traj.turn_generated


class Worker:
    """Simulated inference worker (an SGLang/vLLM engine on `tp` GPUs)."""

    alive = True  # False: preempted or not yet provisioned (elastic pools); routers skip it

    def __init__(
        self,
        *,
        idx: int,
        tp: int,
        node: int,
        latency: LatencyModel,
        scheduler: TurnScheduler,
        engine: Clock,
        max_running: int,
        chunk_tokens: int,
        decode_reserve: int,
        on_turn_done: Callable[[TrajState, Worker], None],
        on_admit: Callable[[TrajState, int], None] | None = None,
        requeue_in_place: bool = False,
    ) -> None:
        """`on_admit(traj, cached_tokens)` hears every admission. `requeue_in_place`: a
        preempted turn goes back to its place in the queue and, of running turns with equal
        keys, the one queued last is preempted first (vLLM's (priority, arrival) order);
        otherwise it queues anew (SGLang's retraction)."""
        self.idx, self.tp, self.node = idx, tp, node
        self.lat = latency
        self.capacity = int(latency.kv_capacity_tokens)
        self.sched = scheduler
        self.eng = engine
        self.max_running = max_running
        self.chunk = chunk_tokens
        self.decode_reserve = decode_reserve
        self._on_turn_done = on_turn_done
        self._on_admit = on_admit
        self.requeue_in_place = requeue_in_place
        self.running: list[Seq] = []
        self.waiting: SortedList = SortedList()  # (key, seq_no, traj)
        self._queued: dict[int, tuple[float, int, TrajState]] = {}  # traj_id -> its entry
        self._wseq = 0
        self.idle: OrderedDict[int, int] = OrderedDict()  # traj_id -> cached tokens (LRU)
        self._owner: dict[int, TrajState] = {}  # traj_id -> trajectory of an idle prefix
        self.used = 0  # tokens held by running sequences
        self.idle_used = 0
        self.reserved = 0  # KV growth promised to the segment in flight
        self.peak_used = 0
        self._seg: tuple[float, float, int, int] | None = None  # start, dt, k, event id
        self.busy_s = 0.0
        self.prefill_tokens = 0  # tokens actually prefilled (recomputation included)
        self.cached_hit_tokens = 0
        self.preemptions = 0
        # prefixes of turns preempted in this admission pass -> the turn they were preempted for
        self._persist: dict[int, int] = {}
        self.pinned: set[int] = set()  # idle prefixes a KV move copies now: never evicted

    # ---- views -------------------------------------------------------------------------
    @property
    def load(self) -> int:
        return len(self.running) + len(self.waiting)

    def cached_tokens(self, traj_id: int) -> int:
        return self.idle.get(traj_id, 0)

    # ---- prefix cache ------------------------------------------------------------------
    def put_idle(self, traj: TrajState, tokens: int) -> bool:
        """Keep `tokens` of a trajectory's KV cached here; False if it cannot fit."""
        self.drop_idle(traj.traj_id)
        if tokens <= 0 or not self._make_room(tokens, keep=traj.traj_id, rank=self._key(traj)):
            return False
        self.idle[traj.traj_id] = tokens
        self._owner[traj.traj_id] = traj
        self.idle_used += tokens
        return True

    def drop_idle(self, traj_id: int) -> int:
        tokens = self.idle.pop(traj_id, 0)
        self._owner.pop(traj_id, None)
        self.idle_used -= tokens
        return tokens

    def _free(self) -> int:
        return self.capacity - self.used - self.idle_used - self.reserved

    def _make_room(self, tokens: int, keep: int = -1, rank: float = -math.inf) -> bool:
        """Evict idle prefixes (never `keep`) until `tokens` fit, for a turn of key `rank`."""
        while self._free() < tokens:
            victim = self._eviction_victim(keep, rank)
            if victim is None:
                return False
            self.drop_idle(victim)
        return True

    def _can_fit(self, tokens: int, keep: int, rank: float) -> bool:
        """Whether `_make_room(tokens, keep, rank)` would succeed; evicts nothing."""
        free = self._free()
        if free >= tokens:
            return True
        keep_ids = {keep, *self._protected(keep)}
        if free + self.idle_used - sum(self.idle.get(k, 0) for k in keep_ids) < tokens:
            return False
        if not self.sched.priority_eviction:
            return True
        evictable = sum(
            n for t, n in self.idle.items() if t not in keep_ids and self._evictable(t, rank)
        )
        return free + evictable >= tokens

    def _protected(self, keep: int) -> set[int]:
        """Prefixes of turns preempted in this admission pass, but for `keep`'s own victims
        (only the turn that outranked them may take their room), and those a move copies."""
        return {t for t, head in self._persist.items() if head != keep} | self.pinned

    def _evictable(self, traj_id: int, rank: float) -> bool:
        """Under `priority_eviction`: a prefix that its trajectory will read again here is
        spared for a turn that the trajectory outranks (key below `rank`)."""
        owner = self._owner[traj_id]
        return not (self._returns_here(owner) and self._key(owner) < rank)

    def _eviction_victim(self, keep: int, rank: float) -> int | None:
        """The idle prefix to evict next, or None: least recently used first; under
        `priority_eviction`, stale prefixes (whose trajectory will not read them here) first,
        then the lowest-priority ones, never one that `_evictable` spares. NOTE: this is
        Algorithm 1's "persist KV cache": a long-tail trajectory keeps its KV through a tool
        call or a preemption instead of losing it to turns that rank below it and prefilling
        its whole context again when it returns."""
        protected = self._protected(keep)
        if not self.sched.priority_eviction:
            return next((t for t in self.idle if t != keep and t not in protected), None)
        victim, best = None, None
        for t in self.idle:  # least recently used first: ties keep that order
            if t == keep or t in protected or not self._evictable(t, rank):
                continue
            order = (self._returns_here(self._owner[t]), -self._key(self._owner[t]))
            if best is None or order < best:
                victim, best = t, order
        return victim

    def _returns_here(self, owner: TrajState) -> bool:
        """Whether an idle prefix may be read again here: its trajectory waits in this queue,
        or is in a tool call with its latest KV here (a migration reads it until it lands).
        NOTE: the driver pokes this worker when such a trajectory goes elsewhere instead."""
        if owner.status == TrajectoryStatus.IN_TOOL:
            return owner.host == self.idx
        return owner.traj_id in self._queued

    def _key(self, traj: TrajState) -> float:
        return self.sched.key(traj, self.eng.now)

    # ---- driver entry points -----------------------------------------------------------
    def enqueue(self, traj: TrajState, poke: bool = True) -> None:
        """A turn of `traj` arrives here (`poke=False` to batch several arrivals)."""
        traj.status = TrajectoryStatus.QUEUED
        traj.turn_arrival_s = self.eng.now
        traj.queued_on = self.idx
        self._push_waiting(traj)
        if poke:
            self.poke()

    def moved_away(self, traj: TrajState) -> None:
        """`traj`, whose KV is cached here, went to another worker: under priority eviction
        that prefix no longer blocks admission here, so re-plan."""
        if self.sched.priority_eviction and traj.traj_id in self.idle:
            self.poke()

    def withdraw(self, traj: TrajState) -> None:
        """Take `traj`'s waiting turn out of the queue (the router moves it elsewhere); its
        cached prefix stays until moved or evicted."""
        entry = self._queued.pop(traj.traj_id)
        self.waiting.remove(entry)
        traj.queue_delay_s += self.eng.now - traj.turn_arrival_s
        traj.turn_arrival_s = self.eng.now
        self.poke()  # the queue head may have changed

    def poke(self) -> None:
        """Re-plan after a change: finish the iteration in flight, admit, plan a segment."""
        start = self._settle()
        if start is None:  # the segment ends within this iteration; its end event re-plans
            return
        self._admit()
        self._plan(start)

    # ---- giving turns back (lent, spot and serverless workers) -------------------------
    def evict_all(self) -> list[TrajState]:
        """Take every turn off this worker, running or queued, with the progress made so
        far applied: each trajectory keeps its partial output (its KV here is dropped) and
        is returned PENDING for the caller to route again."""
        self._halt()
        gone = [s.traj for s in self.running]
        for s in list(self.running):
            self._drop_seq(s)
        for _, _, traj in list(self.waiting):
            self.waiting.remove(self._queued.pop(traj.traj_id))
            traj.status = TrajectoryStatus.PENDING
            gone.append(traj)
        return gone

    # ---- the emulated engine's entry points ------------------------------------------------
    def abort(self, traj: TrajState) -> bool:
        """Take `traj`'s turn off this worker before it ends (its client went away), with the
        progress made so far applied; the KV it computed stays as a cached prefix. False when
        the turn is not here (it finished, perhaps in the iteration just completed)."""
        if traj.traj_id in self._queued:
            self.withdraw(traj)
            traj.status = TrajectoryStatus.PENDING
            return True
        seq = next((s for s in self.running if s.traj is traj), None)
        if seq is None:
            return False
        if self._seg is None:
            self.eng.after(0.0, self.poke, priority=2)
        self._halt()  # re-plans once the turn is gone
        if seq not in self.running:  # it finished with the iteration in flight
            return False
        self.running.remove(seq)
        tokens = traj.full_context() - seq.prefill_left
        self.used -= tokens
        traj.status = TrajectoryStatus.PENDING
        self.put_idle(traj, tokens)
        return True

    def progress(self) -> Iterator[tuple[TrajState, int]]:
        """Each running turn with its output tokens done by now: the segment in flight
        counted by the iterations it has completed. A read: nothing changes."""
        seg, now = self._seg, self.eng.now
        extra = 0
        if seg is not None and now > seg[0]:
            start, dt, k, _ = seg
            extra = min(k, int((now - start) / dt))
        for s in self.running:
            yield s.traj, s.traj.turn_generated + (extra if s.prefill_left == 0 else 0)

    def _halt(self) -> None:
        """Stop the rollout segment in flight, its progress applied (the iteration in flight
        counted as done), and re-plan once the caller's change is made."""
        if self._seg is None:
            return
        if self._settle() is None:  # the segment ends within this iteration: end it now
            assert self._seg is not None
            _, dt, k, ev = self._seg
            self.eng.cancel(ev)
            self._seg = None
            self.reserved = 0
            self._apply(k, dt)
            self._finish_turns()
        self.eng.after(0.0, self.poke, priority=2)

    def _drop_seq(self, s: Seq) -> None:
        self.running.remove(s)
        self.used -= s.traj.full_context() - s.prefill_left
        s.traj.status = TrajectoryStatus.PENDING

    # ---- internals ---------------------------------------------------------------------
    def _push_waiting(self, traj: TrajState, order: int | None = None) -> None:
        assert traj.traj_id not in self._queued, f"worker {self.idx}: {traj.traj_id} queued twice"
        if order is None:
            self._wseq += 1
            order = self._wseq
        entry = (self.sched.key(traj, self.eng.now), order, traj)
        self.waiting.add(entry)
        self._queued[traj.traj_id] = entry

    def _settle(self) -> float | None:
        """Apply the progress of the current segment up to the next iteration boundary and
        return that boundary; None when the segment ends there anyway."""
        seg = self._seg
        if seg is None:
            return self.eng.now
        start, dt, k, ev = seg
        now = self.eng.now
        done = 0 if now <= start else int((now - start) / dt) + 1
        if done >= k:
            return None
        self.eng.cancel(ev)
        self._seg = None
        self.reserved = 0
        self._apply(done, dt)
        return start + done * dt

    def _apply(self, iters: int, dt: float) -> None:
        if iters <= 0:
            return
        self.busy_s += iters * dt
        prefill_done = False
        for s in self.running:
            if s.prefill_left > 0:
                if not prefill_done:  # only the first prefilling sequence gets the chunk
                    n = min(s.prefill_left, iters * self.chunk)
                    s.prefill_left -= n
                    self.used += n
                    self.prefill_tokens += n
                    prefill_done = True
            else:
                s.traj.turn_generated += iters
                self.used += iters
        self.peak_used = max(self.peak_used, self.used + self.idle_used)
        assert self.used + self.idle_used <= self.capacity, (
            f"worker {self.idx}: KV over capacity ({self.used}+{self.idle_used}>{self.capacity})"
        )

    def _on_segment_end(self) -> None:
        assert self._seg is not None
        _, dt, k, _ = self._seg
        self._seg = None
        self.reserved = 0
        self._apply(k, dt)
        self._finish_turns()
        self._admit()
        self._plan(self.eng.now)

    def _finish_turns(self) -> None:
        still: list[Seq] = []
        for s in self.running:
            if s.prefill_left == 0 and s.decode_left <= 0:
                traj = s.traj
                tokens = traj.full_context()
                self.used -= tokens
                self._on_turn_done(traj, self)  # the driver may re-cache it here via put_idle
            else:
                still.append(s)
        self.running = still

    def _admit(self) -> None:
        try:
            self._admit_waiting()
        finally:
            self._persist.clear()

    def _admit_waiting(self) -> None:
        while self.waiting:
            key, order, traj = self.waiting[0]
            cached = self.idle.get(traj.traj_id, 0)
            need = traj.full_context() - cached
            if len(self.running) >= self.max_running:
                if not self._preempt_for(traj, key, need):
                    return
                continue  # the victim re-queues under its current key: read the head again
            # Room for the prompt plus decode headroom for everyone (SGLang-style reservation).
            # NOTE: as in SGLang, cached prefixes that could be evicted count as room, and only
            # the prompt's share is evicted now; the headroom is evicted as decoding fills it.
            # Evicting it up front drops the KV of trajectories in short tool calls, which then
            # prefill their whole context again on return.
            reserve = self.decode_reserve * (len(self.running) + 1)
            if not self._can_fit(need + reserve, keep=traj.traj_id, rank=key):
                if not self._preempt_for(traj, key, need):
                    return
                continue
            fitted = self._make_room(need, keep=traj.traj_id, rank=key)
            assert fitted, f"worker {self.idx}: room checked for trajectory {traj.traj_id}"
            self.waiting.remove(self._queued.pop(traj.traj_id))
            self.drop_idle(traj.traj_id)
            self.used += cached
            self.cached_hit_tokens += cached
            traj.queue_delay_s += self.eng.now - traj.turn_arrival_s
            traj.status = TrajectoryStatus.RUNNING
            traj.host = self.idx
            self.running.append(Seq(traj, key, need, order))
            if self._on_admit is not None:
                self._on_admit(traj, cached)

    def _preempt_for(self, traj: TrajState, key: float, need: int) -> bool:
        """Algorithm 1, lines 6-10: if `key` outranks the lowest-priority running turn, evict
        that turn, persist its KV as a cached prefix and re-queue it; the caller then promotes
        `traj` (`need` new tokens). Where memory rather than a slot is short, the victim's
        persisted KV is room that `traj` alone may take (it is dropped, and recomputed on
        resume, only as far as `traj` needs it), and further victims follow while `traj`
        still outranks them. NOTE: nobody is preempted when even every turn that `traj`
        outranks would not make room for it: that would recompute them for nothing."""
        if not self.sched.preemptive or not self.running:
            return False
        victim = self._worst()
        if not self.sched.outranks(key, victim.key) or not self._fits_by_preempting(
            traj, key, need
        ):
            return False
        self._persist[victim.traj.traj_id] = traj.traj_id
        self._preempt(victim)
        return True

    def _fits_by_preempting(self, traj: TrajState, key: float, need: int) -> bool:
        """Whether `traj` would get a slot and room once every running turn it outranks were
        preempted and their KV dropped."""
        victims = [s for s in self.running if self.sched.outranks(key, s.key)]
        staying = len(self.running) - len(victims)
        if staying >= self.max_running:
            return False
        freed = sum(s.traj.full_context() - s.prefill_left for s in victims)
        reserve = self.decode_reserve * (staying + 1)
        return self._can_fit(need + reserve - freed, keep=traj.traj_id, rank=key)

    def _preempt(self, victim: Seq) -> None:
        self.running.remove(victim)
        self.preemptions += 1
        tokens = victim.traj.full_context() - victim.prefill_left
        self.used -= tokens
        self.put_idle(victim.traj, tokens)  # persist its KV as a cached prefix
        victim.traj.turn_arrival_s = self.eng.now
        victim.traj.status = TrajectoryStatus.QUEUED
        victim.traj.queued_on = self.idx
        self._push_waiting(victim.traj, victim.order if self.requeue_in_place else None)

    def _worst(self) -> Seq:
        """The running turn to preempt first: the highest key; of equal keys, under
        `requeue_in_place` the one queued last, else the one admitted first."""
        if self.requeue_in_place:
            return max(self.running, key=lambda s: (s.key, s.order))
        return max(self.running, key=lambda s: s.key)

    def _plan(self, start: float) -> None:
        while self.running:
            k, dt, growth = self._segment()
            if k > 0:
                self.reserved = growth
                ev = self.eng.schedule(start + k * dt, self._on_segment_end, priority=1)
                self._seg = (start, dt, k, ev)
                return
            # No room to grow: free idle prefixes, else preempt or stall the worst turn.
            victim = self._worst()
            assert len(self.running) > 1, f"worker {self.idx}: one turn exceeds KV capacity"
            self._preempt(victim)
        self._seg = None

    def _segment(self) -> tuple[int, float, int]:
        """Iterations until the next batch change, the time of one iteration, and the KV
        tokens the segment may add."""
        n_dec, dec_ctx, k = 0, 0, math.inf
        pre: Seq | None = None
        for s in self.running:
            if s.prefill_left > 0:
                if pre is None:
                    pre = s
            else:
                n_dec += 1
                dec_ctx += s.traj.full_context()
                k = min(k, s.decode_left)
        chunk = 0
        if pre is not None:
            chunk = min(self.chunk, pre.prefill_left)
            k = min(k, math.ceil(pre.prefill_left / self.chunk))
        growth = n_dec + chunk
        if growth * k > self._free():
            # NOTE: a lone turn may evict any prefix: preempting it would free nothing.
            worst = max(s.key for s in self.running) if len(self.running) > 1 else -math.inf
            self._make_room(growth * int(k), rank=worst)
            k = min(k, self._free() // max(growth, 1))
        k = int(k)
        if k <= 0:
            return 0, 0.0, 0
        mid = dec_ctx + n_dec * k // 2
        pre_ctx = pre.traj.full_context() - pre.prefill_left if pre is not None else 0
        dt = self.lat.iteration_time(n_dec, mid, chunk, pre_ctx)
        return k, dt, growth * k
