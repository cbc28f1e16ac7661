"""The rollout router's decisions, and nothing else: `RouterCore.handle(event, now) -> commands`.

A plain object: no I/O, no threads, no clock of its own (time is the `now` of each event).
The served router's driver turns engine streams, health checks and HTTP requests into events
(`events.py`) and carries out the commands; the simulator drives the same core with simulated
engines and time. What the core consults sits behind one object each: the placement
(`Router`), the scheduler (`TurnScheduler`), the move rule (`MoveRule`: late binding, a
migration, a preemption weighed by time), each engine's room (`admission.Capacity`) and the
settings for aging, preemption and failover (`CoreSettings`).

Admission: engines schedule, the router places. A turn is forwarded at once while its engine
has room by what the engine says of itself (`Capacity`), with the scheduler's key as the
request's `priority`. Only a turn the engine would queue anyway waits in the router, in that
engine's queue, ordered by the client's priority class, then by whether it has waited
`max_wait_s` (aged: it runs next, oldest first), then by the scheduler's key; and any engine
that frees a slot with nothing of its own waiting takes the best turn waiting elsewhere (late
binding) where that pays for prefilling its context there. A preemptive scheduler (PPS)
follows Heddle's Algorithm 1: a turn that outranks the lowest-priority running turn of a full
engine evicts it and is promoted at once, but only where the wait it saves exceeds the
victim's prefill again and the victim has been preempted fewer than `max_preemptions` times;
the evicted turn later resumes with prompt + generated tokens. The same resume carries a turn
across a failed or stalled engine to another one, so accepted work is never lost while one
engine lives.

A turn's lifecycle is `Turn`'s state machine (`turn.TRANSITIONS`, enforced by each
transition); `_end` is the one place a turn ends. What an event causes beyond its own turn (an
engine with room to fill, held turns to offer, trajectories to move) is queued and handled in
order before `handle` returns: no handler runs inside another.
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from loom.core.errors import Conflict, LoomError, NotFound, Unavailable, UpstreamError, http_status
from loom.rollout.heddle.transmission import MigrationRequest, select_batch
from loom.rollout.policy import Router, TurnScheduler
from loom.runtime.rollout import events as ev
from loom.runtime.rollout.admission import engine_priority
from loom.runtime.rollout.ledger import Ledger
from loom.runtime.rollout.move_rule import MoveRule
from loom.runtime.rollout.state import EngineState, Fleet, Trajectory, Turn, TurnRecord
from loom.runtime.rollout.turn import Key, TurnState

__all__ = [
    "ABORTED_BY_REQUEST",
    "LATE_LOOK",
    "MAX_ATTEMPTS",
    "CoreSettings",
    "MoveRule",
    "RouterCore",
    "UnknownTrajectory",
]

log = logging.getLogger("loom.rollout")

MAX_ATTEMPTS = 8  # failovers before a turn is given up as failed
LATE_LOOK = 8  # waiting turns of each other engine a free engine considers (best first)
ABORTED_BY_REQUEST = "aborted by request"


class UnknownTrajectory(NotFound):
    def __str__(self) -> str:
        return f"unknown trajectory {self.args[0]!r}"


class GaveUp(UpstreamError):
    """A turn failed over more than `MAX_ATTEMPTS` times."""


@dataclass(frozen=True)
class CoreSettings:
    """What the core decides by, besides its policies (`RolloutServerConfig`'s names)."""

    max_wait_s: float = 30.0  # a turn that waited this long in the router runs next
    max_preemptions: int = 2  # times one turn may be preempted
    stall_timeout_s: float = 120.0  # no new token for this long: the attempt moves
    lent_stall_timeout_s: float = 10.0  # the same, on a lent engine (serving comes first)
    first_token_timeout_s: float = 600.0  # no first token for this long: the attempt moves
    idle_trajectory_s: float = 3600.0  # a trajectory silent this long has ended
    health_failures: int = 3  # failed health checks in a row that take an engine out
    move_kv: bool = True  # a migration copies the KV where both engines can (Heddle §5.3)

    @classmethod
    def of(cls, config: Any) -> CoreSettings:
        """The settings of a `RolloutServerConfig` (or anything with the same fields)."""
        return cls(**{name: getattr(config, name) for name in cls.__dataclass_fields__})


Handler = Callable[[Any], None]


class RouterCore:
    """The router's state and decisions. Call `handle` on one thread; it never blocks."""

    def __init__(
        self,
        settings: CoreSettings,
        *,
        router: Router,
        scheduler: TurnScheduler,
        moves: MoveRule,
        prior: Callable[[int, int], float] = lambda prompt_id, generated: generated + 1.0,
    ) -> None:
        """`prior(prompt_id, generated)`: a trajectory's predicted total before a model has
        predicted it."""
        self.settings = settings
        self.router = router
        self.scheduler = scheduler
        self.moves = moves
        self.prior = prior
        router.move_pays = self._migration_pays
        self.fleet = Fleet()
        self.ledger = Ledger()
        self.counts = self.ledger.counts
        self.trajectories: dict[str, Trajectory] = {}
        self.by_tid: dict[int, Trajectory] = {}
        # turns no engine can take now, by trajectory id, in arrival order; the placement
        # holds (in its central queue) the trajectories in `_router_held`, the others wait
        # for an engine at the current weights
        self.held: dict[int, deque[Turn]] = {}
        self._router_held: set[int] = set()
        self.by_rid: dict[str, list[Turn]] = {}  # client request ids of turns in flight
        self._tids = itertools.count()
        self._anon = itertools.count()
        self._probing: set[str] = set()  # engines whose health a `Probe` checks now
        # KV copies (Heddle §5.3): asked for and not started, and the engines (by index) a
        # copy runs between now: one copy per engine at a time, longest trajectory first
        self._copies: list[MigrationRequest] = []
        self._copying: set[int] = set()
        self.tool_s: float | None = None  # tool calls' mean length, over every trajectory
        self.closed = False
        self.now = 0.0
        self._out: list[ev.Command] = []
        self._later: deque[tuple[Callable[..., None], Any]] = deque()
        self._queued: set[tuple[Callable[..., None], Any]] = set()
        s = settings
        self._periods = {
            self._watch: max(0.02, min(s.stall_timeout_s, s.lent_stall_timeout_s) / 4),
            self._age: max(0.05, min(1.0, s.max_wait_s / 10)),
            self._idle: min(60.0, s.idle_trajectory_s / 4),
        }
        self._due = dict.fromkeys(self._periods, 0.0)
        self._handlers: dict[type, Handler] = {
            ev.Submit: self._submit,
            ev.Declare: self._declare,
            ev.EndTrajectory: self._end_trajectory,
            ev.Chunk: self._chunk,
            ev.AttemptDone: self._attempt_done,
            ev.AttemptFailed: self._attempt_failed,
            ev.AttemptRejected: self._attempt_rejected,
            ev.PriorityRefused: self._priority_refused,
            ev.EngineAdded: self._engine_added,
            ev.EngineRemoved: self._engine_removed,
            ev.EngineTakenBack: self._engine_taken_back,
            ev.EngineDown: self._engine_down_event,
            ev.EngineUp: self._engine_up,
            ev.Health: self._health,
            ev.Suspect: self._suspect_event,
            ev.Probed: self._probed,
            ev.EngineLoaded: self._engine_loaded,
            ev.WeightsSet: self._weights_set,
            ev.Report: self._report,
            ev.Abort: self._abort,
            ev.Abandon: self._abandon,
            ev.Predicted: self._predicted,
            ev.KvMoved: self._kv_moved,
            ev.Tick: self._tick,
            ev.Shutdown: self._shutdown,
        }

    # ---- the one entry -------------------------------------------------------------------

    def handle(self, event: ev.Event, now: float) -> list[ev.Command]:
        """Handle `event` at time `now`, then what it caused, in order; return the commands.
        An event the core refuses (an unknown engine, a conflict, no live engine) raises a
        `LoomError` before anything changes."""
        self.now = now
        out: list[ev.Command] = []
        self._out = out
        self._handlers[type(event)](event)
        later = self._later
        while later:
            item = later.popleft()
            self._queued.discard(item)
            item[0](item[1])
        return out

    def _soon(self, fn: Callable[[Any], None], arg: Any = None) -> None:
        """Handle `fn(arg)` once this event's own work is done (once, however often asked)."""
        item = (fn, arg)
        if item not in self._queued:
            self._queued.add(item)
            self._later.append(item)

    def _emit(self, command: ev.Command) -> None:
        self._out.append(command)

    # ---- views ---------------------------------------------------------------------------

    @property
    def version(self) -> int:
        return self.fleet.version

    def live(self) -> list[EngineState]:
        return self.fleet.live()

    def current(self) -> list[EngineState]:
        return self.fleet.current()

    def load(self) -> int:
        """Turns in flight: held, queued and running."""
        return sum(len(t.active) for t in self.trajectories.values())

    def held_turns(self) -> int:
        return sum(len(q) for q in self.held.values())

    # ---- engines -------------------------------------------------------------------------

    def _engine_added(self, event: ev.EngineAdded) -> None:
        e = event.engine
        self.fleet.add(e)
        e.trajectories = self.by_tid
        self._emit(ev.Reply(e))
        self._workers_changed()

    def _engine_removed(self, event: ev.EngineRemoved) -> None:
        """Drain an engine: it takes no new turns, its waiting turns go elsewhere at once, its
        running ones finish there (`force`: they are aborted and resumed elsewhere now); it is
        forgotten once empty. An engine that goes away while draining is no failure: its
        turns resume elsewhere with what they generated. `leaving`: its launcher stops it
        next whatever the answer (SGLang's gateway routes), so even the last live engine is
        let go; a turn it has not finished when it goes then ends 503."""
        e = self.fleet.get(event.key)
        others = [o for o in self.live() if o is not e]
        if not others and e.load and not event.leaving:
            raise Conflict(
                f"engine {e.id} is the last live engine and holds {e.load} turns; "
                "add another engine before draining it"
            )
        self._emit(ev.Reply(e))
        self.fleet.drain(e)
        self._move_waiting(e)
        if event.force:
            for turn in list(e.running.values()):
                self._requeue(turn, e, failed=False)
        self._forget_if_drained(e)
        self._workers_changed()

    def _engine_taken_back(self, event: ev.EngineTakenBack) -> None:
        if self.fleet.undrain(event.engine):
            self._workers_changed()

    def _forget_if_drained(self, e: EngineState) -> None:
        if self.fleet.forget_if_drained(e):
            self.counts["removed"] += 1
            log.info("engine %s is drained and removed", e.id)

    def _workers_changed(self) -> None:
        current = self.current()
        if current:
            self.router.start([], current)
            self._handle_stale()
        self._soon(self._offer)

    def _engine_down_event(self, event: ev.EngineDown) -> None:
        self._engine_down(event.engine, event.reason)

    def _engine_down(self, e: EngineState, reason: str) -> None:
        """`e` failed: its turns go elsewhere, those running resume with what they
        generated. A draining engine that goes has not failed: it was asked to leave."""
        if e.draining:
            self._left(e, reason)
            return
        if not self.fleet.mark_down(e, reason):
            return
        self._move_waiting(e)
        for turn in list(e.running.values()):
            self._requeue(turn, e, failed=True)
        self._forget_if_drained(e)
        self._workers_changed()

    def _left(self, e: EngineState, reason: str) -> None:
        """A draining engine went away: its running turns resume elsewhere, none counted as
        a failover, and it is forgotten."""
        if self.fleet.engines.get(e.id) is not e:
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

    def _engine_up(self, event: ev.EngineUp) -> None:
        if self.fleet.mark_up(event.engine):
            self._workers_changed()

    def _health(self, event: ev.Health) -> None:
        for e, ok in event.results:
            if self.fleet.engines.get(e.id) is not e:
                continue
            if ok:
                e.failures = 0
                if not e.alive and self.fleet.mark_up(e):
                    self._workers_changed()
            else:
                e.failures += 1
                if e.alive and e.failures >= self.settings.health_failures:
                    self._engine_down(e, f"{e.failures} failed health checks")

    def _suspect_event(self, event: ev.Suspect) -> None:
        self._suspect(event.engine, event.reason)

    def _suspect(self, e: EngineState, reason: str) -> None:
        """A call to `e` failed: its health is checked now rather than at the next round (a
        hung engine must not collect turns meanwhile)."""
        if e.alive and e.id not in self._probing:
            self._probing.add(e.id)
            self._emit(ev.Probe(e, reason))

    def _probed(self, event: ev.Probed) -> None:
        e = event.engine
        self._probing.discard(e.id)
        if not event.ok:
            self._engine_down(e, f"{event.reason}; and its health check failed")
        else:  # it stays in: turns held while it was suspect may go there again
            self._soon(self._offer)

    def _engine_loaded(self, event: ev.EngineLoaded) -> None:
        """`e` reported its load: its capacity takes it in, and the room it has is filled."""
        e = event.engine
        if self.fleet.engines.get(e.id) is not e or not e.alive:
            return
        e.reported = event.load
        e.capacity.observe(event.load, len(e.running))
        if not self.closed:
            self._pump(e)

    def _weights_set(self, event: ev.WeightsSet) -> None:
        """Turns waiting at an engine behind the version go elsewhere; its running ones
        finish there."""
        behind = self.fleet.set_weights(event.version, event.engines)
        self._emit(ev.Reply([e.id for e in behind]))
        self.router.set_version(event.version)
        for e in behind:
            self._move_waiting(e)
        self._workers_changed()

    def _report(self, event: ev.Report) -> None:
        e = self.fleet.report(
            event.key, version=event.version, free_tokens=event.free_tokens, slack_s=event.slack_s
        )
        self._emit(ev.Reply(e))
        if e.version != self.version:
            self._move_waiting(e)
        self._workers_changed()

    def _move_waiting(self, e: EngineState) -> None:
        for turn in list(e.waiting):
            e.waiting.remove(turn)
            self._place(turn, avoid=e)

    # ---- placement -----------------------------------------------------------------------

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
            choice = self.router.route(turn.traj, current, self.now)
            self.counts["decisions"] += 1
            if choice is None:
                self._router_held.add(tid)
            elif tid in self._router_held:
                # NOTE: a router holds one turn per trajectory: routing this one took the
                # trajectory's held turn out of the router's queue; those ask again
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
            self._soon(self._offer)

    def _hold(self, turn: Turn) -> None:
        turn.hold(self.now)
        self.held.setdefault(turn.traj.traj_id, deque()).append(turn)
        self.counts["held"] += 1

    def _unhold(self, turn: Turn) -> None:
        tid = turn.traj.traj_id
        q = self.held.get(tid)
        if q is None or turn not in q:
            return
        q.remove(turn)
        if not q:
            del self.held[tid]
            if tid in self._router_held:
                self._router_held.discard(tid)
                self.router.withdraw(tid)

    def _offer(self, _: Any = None) -> None:
        """Capacity changed: place the held turns that now fit. (A change while they are
        placed offers them again: it asks for another `_offer` after this one.)"""
        if not self.held or self.closed:
            return
        current = self.current()
        if not current:
            return
        by_idx = {e.idx: e for e in current}
        again: list[Turn] = []
        for tid, idx in self.router.drain(current, self.now):
            self._router_held.discard(tid)
            q = self.held.pop(tid, None)
            if not q:
                continue
            self._enqueue(by_idx[idx], q.popleft())
            again += q  # its other held turns ask the router again
        for tid in [t for t in self.held if t not in self._router_held]:
            t = self.by_tid.get(tid)
            if t is None or t.moving is None:  # (else its turns wait for their KV)
                again += self.held.pop(tid)
        for turn in again:
            self._place(turn)

    def _key(self, turn: Turn) -> Key:
        """Its rank while it waits: the client's class, aged turns first (oldest first),
        then the scheduler's key."""
        if turn.aged:
            return (turn.request.priority, 0, turn.arrival_s)
        return (turn.request.priority, 1, self.scheduler.key(turn.traj, self.now))

    def _wait_at(self, e: EngineState, turn: Turn) -> None:
        turn.queue(e, self._key(turn), self.now)
        e.waiting.add(turn)

    def _enqueue(self, e: EngineState, turn: Turn) -> None:
        self._wait_at(e, turn)
        self._soon(self._admit, e)

    def _admit(self, e: EngineState) -> None:
        """`e` has turns waiting: the head preempts where it pays, the engine's room is
        filled, and what still waits may go to an engine with room."""
        if e.waiting and not e.has_slot() and self.scheduler.preemptive and e.running:
            self._maybe_preempt(e)
        self._pump(e)
        if e.waiting and not self.router.central_queue:
            self._bind_free()

    def _maybe_preempt(self, e: EngineState) -> None:
        """Algorithm 1, lines 6-10: evict r_min, move it to Q, promote Q.top; only a victim
        preempted fewer than `max_preemptions` times, and only where it pays."""
        cap = self.settings.max_preemptions
        victims = [r for r in e.running.values() if r.preemptions < cap]
        head = e.waiting[0]
        if not victims:
            if any(self._outranks(head.key, r.key) for r in e.running.values()):
                self.counts["preemptions_declined"] += 1
            return
        victim = max(victims, key=lambda r: (r.key, r.seq))
        if not self._outranks(head.key, victim.key):
            return
        if not self.moves.preemption_pays(e, victim):
            self.counts["preemptions_declined"] += 1
            return
        self.counts["preemptions"] += 1
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
        while e.alive and e.waiting and e.has_slot():
            self._run(e, e.waiting.pop(0))
        if e.has_slot() and e.routable and not self.router.central_queue:
            self._bind_late(e)

    # ---- late binding and migration ------------------------------------------------------

    def _bind_free(self) -> None:
        """Engines with room and nothing of their own waiting take turns waiting elsewhere."""
        for f in self.current():
            if f.has_slot() and not f.waiting and f.routable:
                self._bind_late(f)

    def _bind_late(self, f: EngineState) -> None:
        """`f` has a slot and nothing of its own waiting: it takes the best turn waiting at
        another engine (at the current weights) where the move pays (`MoveRule.late_pays`)."""
        if f.version != self.version or f.waiting:
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
        best: tuple[Key, int, EngineState, Turn] | None = None
        for e in self.live():
            if e is f or not e.waiting:
                continue
            for ahead, turn in enumerate(e.waiting.islice(0, LATE_LOOK)):
                if self.moves.late_pays(turn, e, ahead, f):
                    if best is None or (turn.key, turn.seq) < (best[0], best[1]):
                        best = (turn.key, turn.seq, e, turn)
                    break  # the best of this engine's queue that pays
        return None if best is None else (best[2], best[3])

    def _migration_pays(self, traj: Any, src_idx: int, dst_idx: int) -> bool:
        """The placement asks whether moving `traj`'s home pays (`MoveRule`)."""
        live = self.live()
        src = next((e for e in live if e.idx == src_idx), None)
        dst = next((e for e in live if e.idx == dst_idx), None)
        t = self.by_tid.get(traj.traj_id)
        if src is None or dst is None or t is None:
            return True  # its home is gone: it must move anyway
        if self.moves.migration_pays(t, src, dst, self._tool_left_s(t)):
            return True
        self.counts["migrations_declined"] += 1
        return False

    def _migrate(self, t: Trajectory) -> None:
        live = self.current()
        if not live:
            return
        target = self.router.migrate(t, live, self.now)
        if target is None:
            return
        self.counts["migrations"] += 1
        t.migrated = True
        dest = next((e for e in live if e.idx == target), None)
        if dest is None:
            return
        if not t.active:  # in a tool call: its KV goes ahead where it can
            self._drop_copy(t)
            t.moving = None  # (a copy on its way elsewhere lands, but nothing waits for it)
            src = self.fleet.by_idx(t.host)
            if src is not None and src is not dest and self.moves.carries_kv(t, src, dest):
                self._copy(t, src, dest)
        for turn in list(t.active.values()):
            src = turn.engine
            if turn.state is TurnState.QUEUED and src is not None and src is not dest:
                src.waiting.remove(turn)
                turn.bound = "migration"
                self._enqueue(dest, turn)

    def _tool_left_s(self, t: Trajectory) -> float:
        """Seconds `t`'s tool call is expected to run yet (0 where it is in none): its own
        calls' mean length, else every trajectory's, less the time since it began."""
        if t.active or t.last_end_s is None:
            return 0.0
        own = [r.tool_latency_s for r in t.records if r.tool_latency_s is not None]
        mean = sum(own) / len(own) if own else self.tool_s
        return 0.0 if mean is None else max(0.0, mean - (self.now - t.last_end_s))

    # ---- KV copies (Heddle §5.3) ----------------------------------------------------------

    def _copy(self, t: Trajectory, src: EngineState, dst: EngineState) -> None:
        """`t`, in a tool call, moves from `src` to `dst`: its KV is copied ahead of its next
        turn, which waits for the copy if it comes first."""
        self._drop_copy(t)
        t.moving = dst.idx
        tokens = t.prefix.get(src.idx, 0)
        self._copies.append(
            MigrationRequest(t.traj_id, src.idx, dst.idx, tokens, float(t.predicted_total))
        )
        self._soon(self._start_copies)

    def _drop_copy(self, t: Trajectory) -> bool:
        """Forget `t`'s copy that has not started; whether there was one."""
        n = len(self._copies)
        self._copies = [r for r in self._copies if r.traj_id != t.traj_id]
        if len(self._copies) == n:
            return False
        t.moving = None
        self.counts["kv_copies_dropped"] += 1
        return True

    def _start_copies(self, _: Any = None) -> None:
        """Start the copies Heddle's transmission scheduler picks: longest first, no engine
        in two at once."""
        for r in select_batch(self._copies, self._copying):
            self._copies.remove(r)
            t = self.by_tid.get(r.traj_id)
            src, dst = self.fleet.by_idx(r.src), self.fleet.by_idx(r.dst)
            last = t.last_turn if t is not None else None
            if t is None or last is None or src is None or dst is None or t.moving != r.dst:
                if t is not None and t.moving == r.dst:
                    self._copied(t)
                continue
            self._copying.update((r.src, r.dst))
            self.counts["kv_copies"] += 1
            self._emit(ev.MoveKv(t, src, dst, last.prompt + last.generated))

    def _kv_moved(self, event: ev.KvMoved) -> None:
        t, src, dst = event.trajectory, event.src, event.dst
        self._copying.difference_update((src.idx, dst.idx))
        if event.tokens > 0:
            self.counts["kv_copied_tokens"] += event.tokens
            self.ledger.timing["kv_copy_s"] += event.seconds
            t.prefix[dst.idx] = max(t.prefix.get(dst.idx, 0), event.tokens)
        else:
            self.counts["kv_copies_failed"] += 1
            log.warning("KV copy %s to %s of %s failed: %s", src.id, dst.id, t.key, event.error)
        if t.moving == dst.idx:
            self._copied(t)
        self._soon(self._start_copies)

    def _copied(self, t: Trajectory) -> None:
        """`t`'s copy ended (or will not run): the turns that waited for it are placed."""
        t.moving = None
        if self.by_tid.get(t.traj_id) is not t:
            return
        waiting = self.held.pop(t.traj_id, None)
        for turn in waiting or ():
            self.ledger.timing["kv_wait_s"] += self.now - turn.arrival_s
            self._place(turn)

    def _handle_stale(self, _: Any = None) -> None:
        for tid in self.router.stale():
            t = self.by_tid.get(tid)
            if t is None:
                continue
            if all(turn.state is TurnState.QUEUED for turn in t.active.values()):
                self._migrate(t)

    # ---- attempts ------------------------------------------------------------------------

    def _run(self, e: EngineState, turn: Turn) -> None:
        if turn.remaining <= 0 and turn.attempt_logprobs().prompt_start is None:
            turn.finish_reason = turn.finish_reason or "length"
            self._end(turn)
            return
        self._count_reprefill(e, turn)
        attempt = turn.run(self.now)
        turn.progress_t = self.now
        turn.attempt_chunks = 0
        e.running[turn.seq] = turn
        e.admitted += 1
        turn.traj.host = e.idx
        if attempt == 0 and turn.preemptions == 0 and turn.failovers == 0:
            self.ledger.queueing_seconds.observe(self.now - turn.arrival_s)
        priority = engine_priority(turn.key, e.high_first) if e.send_priority else None
        self._emit(ev.Start(turn, e, attempt, priority))

    def _computed(self, turn: Turn) -> int:
        """Tokens of `turn`'s sequence some engine has computed already."""
        seq = len(turn.prompt) + len(turn.generated)
        prior = max(turn.traj.prefix.values(), default=0)
        return min(seq, max(turn.computed, prior))

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
            self.ledger.reprefill[reason] += again

    def _computed_at(self, e: EngineState, turn: Turn, kept: bool = True) -> None:
        """`turn`'s attempt at `e` stopped: `e` computed its sequence so far (`kept`: and
        holds it in its prefix cache, as far as the router knows)."""
        seq = len(turn.prompt) + len(turn.generated)
        turn.computed = max(turn.computed, seq)
        if kept:
            turn.traj.prefix[e.idx] = seq
        else:
            turn.traj.prefix.pop(e.idx, None)

    def _current(self, turn: Turn, attempt: int) -> bool:
        """Whether `attempt` is `turn`'s running attempt (a stopped one's events are late)."""
        return turn.attempt == attempt and turn.state is TurnState.RUNNING

    def _chunk(self, event: ev.Chunk) -> None:
        """A chunk of the running attempt: tokens, text and logprobs join the turn."""
        turn = event.turn
        if not self._current(turn, event.attempt):
            return
        item = event.delta
        turn.progress_t = self.now
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
            if turn.request.stream:
                self._emit(ev.Stream(turn, item))
            return
        if turn.first_token_s is None:
            turn.first_token_s = self.now
        turn.generated.extend(tokens)
        if turn.request.logprobs.output and item.logprobs is not None:
            turn.logprobs.extend(item.logprobs[: len(tokens)])
        e = turn.engine
        assert e is not None, "a running turn has an engine"
        turn.version = e.version
        e.tokens += len(tokens)
        turn.text.append(item.text)
        if turn.request.stream:
            self._emit(ev.Stream(turn, item))

    def _attempt_done(self, event: ev.AttemptDone) -> None:
        turn, done = event.turn, event.done
        if not self._current(turn, event.attempt):
            return
        turn.cached_tokens += done.cached_tokens
        if done.routed_experts is not None:
            turn.routed_experts = done.routed_experts
        e = turn.engine
        if done.finish_reason == "abort" and e is not None and e.lent and turn.remaining > 0:
            # NOTE: a lent engine that aborts a rollout turn itself took its pages back for
            # serving (ROSE §4.1): the turn goes on elsewhere with what it generated, and the
            # engine takes no rollout turn until its side reports room again
            self.counts["reclaimed"] += 1
            e.stalled = True
            self._on_failure(
                e, turn, event.attempt, "reclaimed for serving", down=False, probe=False
            )
            return
        if done.finish_reason == "abort":
            # the engine aborted it itself (the driver stops its stream before it aborts
            # one): the client hears an abort, with what was generated
            self.counts["aborted"] += 1
            turn.abort_message = done.message or "aborted by the engine"
        reason = done.finish_reason
        if reason == "abort" and turn.remaining <= 0:
            reason = "length"  # it had generated everything it asked for anyway
        turn.finish_reason = reason
        turn.matched_stop = done.matched_stop
        self._end(turn, engine_done=True)

    def _attempt_rejected(self, event: ev.AttemptRejected) -> None:
        if self._current(event.turn, event.attempt):
            self._end(event.turn, error=event.error, engine_done=True)

    def _priority_refused(self, event: ev.PriorityRefused) -> None:
        """vLLM without `--scheduling-policy priority` refuses the field: the engine gets
        none from now on, and the attempt goes again without it."""
        turn = event.turn
        e = turn.engine
        if not self._current(turn, event.attempt) or e is None:
            return
        if turn.attempt_chunks:
            self._end(turn, error=event.error, engine_done=True)
            return
        if e.send_priority:
            e.send_priority = False
            self.counts["priority_refused"] += 1
            log.warning("engine %s schedules without priorities: %s", e.id, event.error)
        self._emit(ev.Start(turn, e, turn.attempt, None))

    def _attempt_failed(self, event: ev.AttemptFailed) -> None:
        self._on_failure(event.engine, event.turn, event.attempt, event.reason, down=event.down)

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
        if not self._current(turn, attempt):
            return
        turn.error = reason
        if e.draining:  # it is going away (deregistered): the turn moves, nothing failed
            self._move_off(turn, e)
            if down:
                self._left(e, reason)
                return
            self._forget_if_drained(e)
            if probe and self.fleet.engines.get(e.id) is e:
                self._suspect(e, reason)  # its other turns move at once if it is gone
            return
        if down:
            self._engine_down(e, reason)  # moves this turn (and all others) elsewhere
        elif probe:
            self._suspect(e, reason)
        if turn.state is TurnState.RUNNING and turn.engine is e:
            self._requeue(turn, e, failed=True)

    def _interrupt(self, turn: Turn, e: EngineState) -> None:
        """End the running attempt at `e`: its stream stops and the engine is told by id; the
        tokens received so far stay with the turn."""
        e.running.pop(turn.seq, None)
        self._computed_at(e, turn, kept=turn.bound != "preemption")
        rid = turn.interrupt()
        self._emit(ev.Stop(turn, e, rid, tell=e.alive))

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
            e.failed_turns += 1
            turn.failovers += 1
        if turn.failovers > MAX_ATTEMPTS:
            msg = f"gave up after {turn.failovers} failed attempts: {turn.error}"
            self._end(turn, error=GaveUp(msg))
            return
        if failed:
            log.info("turn %s resumes elsewhere after %d tokens", turn.rid(), len(turn.generated))
        if here and e.routable:
            self._wait_at(e, turn)
        else:
            self._place(turn, avoid=e)
        self._soon(self._pump, e)

    # ---- the end of a turn ---------------------------------------------------------------

    def _end(
        self, turn: Turn, *, error: Exception | None = None, engine_done: bool = False
    ) -> None:
        """The one place a turn ends: it leaves wherever it is (a running attempt is stopped
        at its engine, unless the engine ended it: `engine_done`), the trajectory learns what
        it generated, and whoever waits on it is woken. FINISHED with `turn.finish_reason`,
        or FAILED with `error`."""
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
            elif e.running.get(turn.seq) is turn:  # (not one stopped on its way elsewhere)
                self._interrupt(turn, e)
        now = self.now
        if error is None:
            turn.end(now)
        else:
            turn.end(now, error=str(error), status=http_status(error))
        self._emit(ev.TurnEnded(turn))
        if error is None and was is TurnState.RUNNING and e is not None:
            e.completed += 1
            if engine_done:
                self._computed_at(e, turn)
                turn.traj.last_turn = turn
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
        led = self.ledger
        led.turn_seconds.observe(now - turn.arrival_s)
        timing = led.timing
        timing["longest_wait_s"] = max(timing["longest_wait_s"], turn.waited_s)
        if turn.started_s is not None and turn.first_token_s is not None:
            timing["turns"] += 1
            timing["queue_s"] += turn.started_s - turn.arrival_s
            timing["first_token_s"] += turn.first_token_s - turn.started_s
            timing["decode_s"] += now - turn.first_token_s
        if e is not None:
            self._soon(self._pump, e)
            self._forget_if_drained(e)
        if not t.active and (t.one_turn or t.ended):
            self._finish(t)
        elif n and error is None and not t.one_turn:
            self._emit(ev.Predict(t))  # during its tool call
        if not self.closed:
            self._soon(self._handle_stale)
            self._soon(self._offer)

    def _forget_rid(self, turn: Turn) -> None:
        rid = turn.request.client_rid
        if rid is None:
            return
        turns = self.by_rid.get(rid)
        if turns is not None and turn in turns:
            turns.remove(turn)
            if not turns:
                del self.by_rid[rid]

    def _abort(self, event: ev.Abort) -> None:
        if event.everything:
            turns = [turn for t in self.trajectories.values() for turn in t.active.values()]
        else:
            turns = [turn for rid in event.rids for turn in self.by_rid.get(rid, ())]
        self._emit(ev.Reply(len(turns)))
        self._end_aborted(turns, ABORTED_BY_REQUEST, "aborted")

    def _abandon(self, event: ev.Abandon) -> None:
        self._end_aborted(list(event.turns), "the client went away", "abandoned")

    def _end_aborted(self, turns: Sequence[Turn], message: str, counter: str) -> None:
        """End `turns` wherever they are with what they generated, marked abort. The slots
        they free are filled once all have ended (what an end causes is queued): none of them
        starts at an engine only to be ended a moment later."""
        for turn in turns:
            if not turn.ended:
                turn.finish_reason = "abort"
                turn.abort_message = message
                self.counts[counter] += 1
                self._end(turn)

    def _predicted(self, event: ev.Predicted) -> None:
        t = event.trajectory
        if self.by_tid.get(t.traj_id) is not t or t.steps_done != event.steps:
            return  # ended, or a newer turn ended: a newer prediction follows
        t.predicted_total = event.total
        self._migrate(t)

    # ---- time ----------------------------------------------------------------------------

    def _tick(self, event: ev.Tick) -> None:
        now = self.now
        for fn, period in self._periods.items():
            if now >= self._due[fn]:
                self._due[fn] = now + period
                fn(now)
        self._emit(ev.WakeAt(min(self._due.values())))

    def _watch(self, now: float) -> None:
        """Running turns that make no progress: no first token in `first_token_timeout_s`,
        or no new token in `stall_timeout_s` (`lent_stall_timeout_s` on a lent engine)."""
        s = self.settings
        for e in list(self.fleet.engines.values()):
            stall = s.lent_stall_timeout_s if e.lent else s.stall_timeout_s
            for turn in list(e.running.values()):
                limit = stall if turn.attempt_chunks else s.first_token_timeout_s
                if now - turn.progress_t > limit and turn.engine is e:
                    self._stalled(e, turn, limit)

    def _stalled(self, e: EngineState, turn: Turn, limit: float) -> None:
        # NOTE: a lent engine that stops a rollout is serving first, not broken (ROSE §4.1):
        # the turn moves, the engine stays in (its health checks judge it) but takes no
        # rollout turn until its side reports room or slack again.
        if e.lent:
            self.counts["stalls"] += 1
            e.stalled = True
        self._on_failure(
            e, turn, turn.attempt, f"no token for {limit:g} s", down=not e.lent, probe=False
        )

    def _age(self, now: float) -> None:
        """Turns that have waited `max_wait_s` in the router are aged: they run next."""
        bound = self.settings.max_wait_s
        touched = False
        for e in self.live():
            old = [turn for turn in e.waiting if not turn.aged and turn.waited(now) >= bound]
            for turn in old:
                e.waiting.remove(turn)
                turn.aged = True
                turn.key = self._key(turn)
                e.waiting.add(turn)
                self.counts["aged"] += 1
            touched = touched or bool(old)
        if touched and not self.router.central_queue:
            self._bind_free()

    def _idle(self, now: float) -> None:
        cutoff = now - self.settings.idle_trajectory_s
        for t in list(self.trajectories.values()):
            if not t.active and t.last_seen_s < cutoff:
                log.info("trajectory %s idle for %.0f s: ended", t.key, now - t.last_seen_s)
                self._close_trajectory(t)

    def _shutdown(self, event: ev.Shutdown) -> None:
        self.closed = True
        closing = Unavailable(event.reason)
        for t in list(self.trajectories.values()):
            for turn in list(t.active.values()):
                self._end(turn, error=closing)

    # ---- trajectories --------------------------------------------------------------------

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
        now = self.now
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
        t.predicted_total = self.prior(prompt_id, 0)
        self.trajectories[key] = t
        self.by_tid[tid] = t
        return t

    def _declare(self, event: ev.Declare) -> None:
        """A batch before it starts: the placement plans over it. Replies with each
        trajectory's planned engine ("" where the placement places turns only when ready)."""
        if not self.live():
            raise Unavailable("no live engine: add one with POST /v1/engines")
        entries = event.entries
        seen: set[str] = set()
        for b in entries:
            if b.id in seen:
                raise Conflict(f"trajectory {b.id!r} appears twice in the batch")
            seen.add(b.id)
            if b.id in self.trajectories:
                raise Conflict(f"trajectory {b.id!r} exists already")
        predicted = event.predicted
        if predicted is not None and len(predicted) != len(entries):
            raise LoomError(f"{len(predicted)} predictions for {len(entries)} trajectories")
        fresh = [
            self._new_trajectory(
                b.id, b.prompt_id, declared=True, prompt_tokens=b.prompt_tokens, group=b.group
            )
            for b in entries
        ]
        if predicted is not None:
            for t, p in zip(fresh, predicted, strict=True):
                t.predicted_total = p
        self.counts["declared"] += len(fresh)
        # NOTE: while new weights load, no engine is current: the batch is planned over the
        # live ones (they serve it once current), as a trajectory that joins is
        current = self.current() or self.live()
        self.router.start(fresh, current)
        self._handle_stale()
        ids = {e.idx: e.id for e in current}
        homes = {t.key: self.router.home(t.traj_id) for t in fresh}
        self._emit(
            ev.Reply({k: "" if home is None else ids.get(home, "") for k, home in homes.items()})
        )

    def _end_trajectory(self, event: ev.EndTrajectory) -> None:
        t = self.trajectories.get(event.key)
        if t is None:
            raise UnknownTrajectory(event.key)
        self._emit(ev.Reply(t))
        self._close_trajectory(t)

    def _close_trajectory(self, t: Trajectory) -> None:
        t.ended = True
        if not t.active:
            self._finish(t)

    def _finish(self, t: Trajectory) -> None:
        """`t` has ended and has no turn in flight."""
        if self.trajectories.get(t.key) is not t:
            return
        del self.trajectories[t.key]
        del self.by_tid[t.traj_id]
        if t.started or t.declared:
            self.router.finish(t)
        self.counts["finished"] += 1
        # NOTE: a request without a trajectory id is not an agentic trajectory: the predictor
        # learns from named ones only (and one-turn traffic would refit it without end)
        if t.records and not t.one_turn:
            self._emit(ev.Record(t))
        if not self.closed:
            self._soon(self._handle_stale)

    def _submit(self, event: ev.Submit) -> None:
        """A request of trajectory `key`: `n` turns that share the prompt, sample `i` seeded
        `seed + i` where a seed is given. Replies with the turns."""
        if self.closed:
            raise Unavailable("the router is shutting down")
        if not self.live():
            raise Unavailable("no live engine: add one with POST /v1/engines")
        now = self.now
        prompt, request, n = event.prompt, event.request, event.n
        pid = event.prompt_id
        if event.key is None:
            t = self._new_trajectory(
                f"~anon-{next(self._anon)}",
                pid if pid is not None else prompt_hash(prompt),
                declared=False,
                prompt_tokens=len(prompt),
            )
            t.one_turn = True
        else:
            existing = self.trajectories.get(event.key)
            if existing is None:
                pid = pid if pid is not None else prompt_hash(prompt)
                t = self._new_trajectory(event.key, pid, declared=False, prompt_tokens=len(prompt))
            else:
                t = existing
        if not t.started:
            t.started = True
            t.prompt_tokens = t.prompt_tokens or len(prompt)
            if not t.declared:
                self.router.join(t, self.current() or self.live())
        elif not t.active and t.last_end_s is not None and t.records:
            last = t.records[-1]
            tool = now - t.last_end_s
            t.records[-1] = TurnRecord(last.input_tokens, last.output_tokens, tool)
            self.tool_s = tool if self.tool_s is None else self.tool_s + 0.05 * (tool - self.tool_s)
        t.turn_arrival_s = now
        t.last_seen_s = now
        turns = []
        seed = request.sampling.get("seed")
        for i in range(n):
            req = request
            if n > 1 and seed is not None:
                req = replace(request, sampling={**request.sampling, "seed": int(seed) + i})
            turn = Turn(
                traj=t, index=t.steps_done, prompt=prompt, request=req, arrival_s=now, choice=i
            )
            t.active[turn.seq] = turn
            if req.client_rid is not None:
                self.by_rid.setdefault(req.client_rid, []).append(turn)
            turns.append(turn)
        self.counts["turns"] += n
        self._emit(ev.Reply(turns))
        if t.moving is not None:
            self._drop_copy(t)  # not started yet: the turn goes now, its context prefilled
        for turn in turns:
            if t.moving is not None:
                self._hold(turn)  # its KV is on its way: it waits for it (`_copied`)
            else:
                self._place(turn)


def prompt_hash(prompt: list[int]) -> int:
    """A prompt's id from its first 256 tokens, the same in every process (the hash of a
    tuple of ints does not depend on PYTHONHASHSEED)."""
    return hash(tuple(prompt[:256])) & (2**56 - 1)


def reply(commands: Sequence[ev.Command]) -> Any:
    """The `Reply` among `commands` (None where the event has none)."""
    for c in commands:
        if type(c) is ev.Reply:
            return c.value
    return None
