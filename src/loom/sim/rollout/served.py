"""A served rollout on simulated time: the router's own core in front of emulated engines.

The served router (`loom serve rollout`) decides with `RouterCore`; here the same core, built
from the same settings (`policies.make_core`), decides on the discrete-event clock, and the
engines are the emulated GPU engine's state (`loom.runtime.emulate.core.EmulatedEngine`, the
simulator's worker) that `loom serve engine --emulate` serves. This module only executes, as
the served driver does: it turns the engines' ends, the agents' tool calls and time into the
core's events, and carries out its commands. Placement, admission, the per-engine queue,
late binding, learned engine limits, preemption and the move rule are the core's; nothing of
them is copied here.

What differs from the served router, by design: an attempt's tokens reach the core in one
chunk when it ends (events grow with turns, not tokens), so an attempt the core stops (a
preemption, a late binding) resumes without the tokens it had produced; engines never fail;
the agents' requests reach the router after `dispatch_s`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from loom.core.errors import ConfigError
from loom.core.trajectory import TrajectorySpec
from loom.perf.latency import LatencyModel
from loom.runtime.emulate.config import EmulatedEngineConfig
from loom.runtime.emulate.core import EmulatedEngine, Request
from loom.runtime.emulate.kv import HOLD_SLACK_S
from loom.runtime.rollout import events as ev
from loom.runtime.rollout.admission import Capacity
from loom.runtime.rollout.config import EngineConfig, EngineKind, RolloutServerConfig
from loom.runtime.rollout.core import RouterCore
from loom.runtime.rollout.policies import make_core
from loom.runtime.rollout.state import EngineState, Turn
from loom.runtime.rollout.turn import Delta, Done, EngineLoad, TurnRequest, TurnState
from loom.sim.engine import Engine

__all__ = ["ServedResult", "ServedRollout"]

VOCAB = 200  # prompt and tool tokens are drawn below this (small ints share one object)


@dataclass(frozen=True)
class ServedResult:
    """One batch through the router's core on simulated engines."""

    makespan_s: float
    output_tokens: int
    finish_s: np.ndarray  # per trajectory, by traj_id
    counts: dict[str, int]  # the core's ledger
    reprefill: dict[str, int]  # tokens prefilled again, by why (the core's reckoning)
    prefill_tokens: int  # the engines': prefilled, recomputation included
    cache_hit_tokens: int  # the engines': found in their prefix caches
    engine_preemptions: int  # the engines' own (KV ran out), beside the core's
    events: int  # clock events run

    @property
    def preemptions(self) -> int:
        """The core's (PPS evicting a running turn) and the engines' own."""
        return self.counts["preemptions"] + self.engine_preemptions

    @property
    def migrations(self) -> int:
        return self.counts["migrations"]

    @property
    def throughput_tok_s(self) -> float:
        return self.output_tokens / self.makespan_s if self.makespan_s > 0 else 0.0


@dataclass
class _Agent:
    """One trajectory's client: its context so far and the turn it is at."""

    spec: TrajectorySpec
    context: list[int] = field(default_factory=list)
    step: int = 0
    finish_s: float = float("nan")


class ServedRollout:
    """Runs one batch; `run()` returns a `ServedResult`. One use per instance.

    `router`: the served router's settings (placement, scheduler, caps, cost model); its
    `engines` give each engine's cap (`max_running`); the engines themselves are `engines`,
    in order, each with the latency model `latency(tp)` where given (a measured profile)
    else its roofline. `predictions[i][k]`: trajectory i's predicted total after k turns
    (the served router's predictor; None: its prior). `dispatch_s`: seconds from a turn being
    ready to the router (HTTP round trips); `decision_s`: the router's seconds per turn, one
    turn at a time (its event loop). `core`: build the core otherwise (tests feed the served
    driver's). `trace`: a list that gets every (time, event) the core handled, in order, and
    `commands` one that gets each event's commands."""

    def __init__(
        self,
        trajectories: Sequence[TrajectorySpec],
        engines: Sequence[EmulatedEngineConfig],
        router: RolloutServerConfig,
        *,
        predictions: Sequence[Sequence[float]] | None = None,
        dispatch_s: float = 0.0,
        decision_s: float = 0.0,
        latency: Callable[[int], LatencyModel] | None = None,
        load_interval_s: float | None = None,
        core: Callable[[RolloutServerConfig], RouterCore] = make_core,
        trace: list[tuple[float, ev.Event]] | None = None,
        commands: list[list[ev.Command]] | None = None,
    ) -> None:
        if not trajectories:
            raise ConfigError("a rollout needs at least one trajectory")
        if not engines:
            raise ConfigError("a rollout needs at least one engine")
        if sorted(t.traj_id for t in trajectories) != list(range(len(trajectories))):
            raise ConfigError("trajectory ids must be 0..n-1")
        if predictions is not None and len(predictions) != len(trajectories):
            raise ConfigError("need one prediction sequence per trajectory")
        for name, value in (("dispatch_s", dispatch_s), ("decision_s", decision_s)):
            if not 0 <= value < float("inf"):
                raise ConfigError(f"{name} must be a finite number >= 0, got {value}")
        self.clock = Engine()
        self.router = router
        self.core = core(router)
        self.emus = [
            EmulatedEngine(cfg, self.clock, latency(cfg.spec.tp) if latency else None)
            for cfg in engines
        ]
        self.agents = [_Agent(t) for t in sorted(trajectories, key=lambda t: t.traj_id)]
        self.predictions = predictions
        self.dispatch_s = dispatch_s
        self.decision_s = decision_s
        self._router_free = 0.0  # when the router has decided every turn that reached it
        self.load_interval_s = (
            router.load_interval_s if load_interval_s is None else load_interval_s
        )
        self.trace = trace
        self.commands = commands
        self._reqs: dict[int, Request] = {}  # by turn seq: its running attempt's request
        self._tick: Any = None
        self._tick_at = float("inf")
        self._left = len(self.agents)
        self._ran = False
        self._execute: dict[type, Callable[[Any], None]] = {
            ev.Start: self._start,
            ev.Stop: self._stop,
            ev.TurnEnded: self._ended,
            ev.Predict: self._predict,
            ev.Probe: self._probe,
            ev.MoveKv: self._move_kv,
            ev.WakeAt: self._wake,
            ev.Record: lambda c: None,  # the predictor's history is the served driver's
            ev.Stream: lambda c: None,  # no client streams here
        }

    # ---- the core ------------------------------------------------------------------------

    def send(self, event: ev.Event) -> Any:
        """Hand `event` to the core now and carry out its commands; returns its reply. Never
        called from inside a command: what a command causes comes back as a clock event."""
        now = self.clock.now
        if self.trace is not None:
            self.trace.append((now, event))
        out = self.core.handle(event, now)
        if self.commands is not None:
            self.commands.append(out)
        value = None
        for c in out:
            if type(c) is ev.Reply:
                value = c.value
            else:
                self._execute[type(c)](c)
        return value

    def _later(self, event: ev.Event, delay: float = 0.0) -> None:
        self.clock.after(delay, self.send, event)

    # ---- run -----------------------------------------------------------------------------

    def run(self) -> ServedResult:
        if self._ran:
            raise RuntimeError("a ServedRollout runs once; build a new one")
        self._ran = True
        for i, emu in enumerate(self.emus):
            given = self.router.engines[i] if i < len(self.router.engines) else None
            cfg = (given or EngineConfig(url=f"http://sim{i}")).model_copy(
                update={"id": f"e{i}", "kind": EngineKind.VLLM, "tp": emu.cfg.spec.tp}
            )
            self.send(ev.EngineAdded(_engine(self.core, cfg, emu)))
        first = None
        if self.predictions is not None:
            first = [float(p[0]) if len(p) else 1.0 for p in self.predictions]
        entries = [
            ev.BatchEntry(str(a.spec.traj_id), a.spec.prompt_id, a.spec.turns[0].input_tokens)
            for a in self.agents
        ]
        self.send(ev.Declare(entries, first))
        for a in self.agents:
            self._dispatch(a, 0.0)
        self.clock.after(self.load_interval_s, self._poll_load)
        self._wake(ev.WakeAt(0.0))
        self.clock.run()
        lost = [a.spec.traj_id for a in self.agents if a.step < len(a.spec.turns)]
        assert not lost, f"trajectories never finished: {lost[:10]}"
        finish = np.array([a.finish_s for a in self.agents])
        ledger = self.core.ledger
        return ServedResult(
            makespan_s=float(finish.max()),
            output_tokens=sum(sum(t.output_tokens for t in a.spec.turns) for a in self.agents),
            finish_s=finish,
            counts=dict(ledger.counts),
            reprefill=dict(ledger.reprefill),
            prefill_tokens=sum(e.worker.prefill_tokens for e in self.emus),
            cache_hit_tokens=sum(e.worker.cached_hit_tokens for e in self.emus),
            engine_preemptions=sum(e.worker.preemptions for e in self.emus),
            events=self.clock.events_run,
        )

    def _dispatch(self, a: _Agent, delay: float) -> None:
        """`a`'s next turn reaches the router `delay` + `dispatch_s` from now."""
        self.clock.after(delay + self.dispatch_s, self._arrive, a)

    def _arrive(self, a: _Agent) -> None:
        """`a`'s turn is at the router: decided once it has decided those that came before
        (`decision_s` each, one at a time)."""
        if self.decision_s <= 0:
            self._submit(a)
            return
        self._router_free = max(self.clock.now, self._router_free) + self.decision_s
        self.clock.schedule(self._router_free, self._submit, a)

    def _submit(self, a: _Agent) -> None:
        turn = a.spec.turns[a.step]
        a.context += _tokens(a.spec.traj_id, a.step, turn.input_tokens)
        request = TurnRequest({"max_tokens": turn.output_tokens, "ignore_eos": True})
        self.send(ev.Submit(str(a.spec.traj_id), list(a.context), request, 1, a.spec.prompt_id))

    def _poll_load(self) -> None:
        """The served driver's load reports, at its interval."""
        if not self._left:
            return
        for e, emu in zip(list(self.core.fleet.engines.values()), self.emus, strict=False):
            load = EngineLoad(emu.running, emu.waiting, emu.kv_usage)
            self.send(ev.EngineLoaded(e, load))
        self.clock.after(self.load_interval_s, self._poll_load)

    # ---- commands ------------------------------------------------------------------------

    def _start(self, c: ev.Start) -> None:
        turn, emu = c.turn, self.emus[c.engine.idx]
        priority = c.priority or 0
        if priority and emu.cfg.scheduling_policy.value == "fcfs":
            self._later(ev.PriorityRefused(turn, c.attempt, ConfigError("priority refused")))
            return
        req = emu.submit(
            turn.rid(c.attempt),
            turn.prompt + turn.generated,
            max(1, turn.remaining),
            ignore_eos=True,
            priority=priority,
        )
        attempt = c.attempt
        # NOTE: the engine's worker calls back mid-iteration; the router hears of an end
        # after it, as a served router hears of it over HTTP
        req.listener = lambda r: self._heard(turn, attempt, r)
        self._reqs[turn.seq] = req

    def _heard(self, turn: Turn, attempt: int, req: Request) -> None:
        self.clock.after(0.0, self._done, turn, attempt, req)

    def _done(self, turn: Turn, attempt: int, req: Request) -> None:
        """An engine ended an attempt (a clock event, never inside `send`)."""
        if self._reqs.get(turn.seq) is not req:
            return  # stopped meanwhile
        del self._reqs[turn.seq]
        tokens = req.gen.tokens if req.finish_reason != "abort" else []
        if tokens:
            self.send(ev.Chunk(turn, attempt, Delta(list(tokens), "")))
        done = Done(req.finish_reason or "stop", cached_tokens=req.cached)
        self.send(ev.AttemptDone(turn, attempt, done))

    def _stop(self, c: ev.Stop) -> None:
        req = self._reqs.pop(c.turn.seq, None)
        if req is not None and not req.done:
            req.listener = None  # stopped: its end is not an event
            if c.tell:
                self.emus[c.engine.idx].abort_request(req)

    def _ended(self, c: ev.TurnEnded) -> None:
        turn = c.turn
        if turn.state is not TurnState.FINISHED:
            raise RuntimeError(f"turn {turn.rid()} failed in the simulator: {turn.error}")
        a = self.agents[int(turn.traj.key)]
        a.context += turn.generated
        spec = a.spec.turns[a.step]
        a.step += 1
        if a.step == len(a.spec.turns):
            a.finish_s = self.clock.now
            self._left -= 1
            self._later(ev.EndTrajectory(turn.traj.key))
            return
        assert spec.tool_latency_s is not None
        self._dispatch(a, spec.tool_latency_s)

    def _predict(self, c: ev.Predict) -> None:
        t = c.trajectory
        if self.predictions is None:
            return  # the prior stands
        steps = self.predictions[int(t.key)]
        k = min(t.steps_done, len(steps) - 1)
        self._later(ev.Predicted(t, t.steps_done, float(steps[k])))

    def _move_kv(self, c: ev.MoveKv) -> None:
        """The copy `loom.runtime.emulate.kv` makes between served engines: the sender
        pins the context, the receiver takes room for it, the link's time passes, it lands."""
        src, dst = self.emus[c.src.idx], self.emus[c.dst.idx]
        tid, n = src.hold_prefix(c.tokens)
        seconds = src.links.transfer_s(n, dst.links)
        cid = dst.reserve_prefix(c.tokens[:n], 2 * seconds + HOLD_SLACK_S) if n else None
        if cid is None:
            if n:
                src.release_prefix(tid, 0)
            error = "no room there" if n else "nothing cached"
            self._later(ev.KvMoved(c.trajectory, c.src, c.dst, 0, error=error))
            return

        def landed() -> None:
            dst.commit_prefix(cid)
            src.release_prefix(tid, n)
            self.send(ev.KvMoved(c.trajectory, c.src, c.dst, n, seconds))

        self.clock.after(seconds, landed)

    def _probe(self, c: ev.Probe) -> None:
        self._later(ev.Probed(c.engine, True, c.reason))  # simulated engines do not fail

    def _wake(self, c: ev.WakeAt) -> None:
        if not self._left or c.at >= self._tick_at:
            return
        if self._tick is not None:
            self.clock.cancel(self._tick)
        self._tick_at = c.at
        self._tick = self.clock.schedule(max(c.at, self.clock.now), self._on_tick)

    def _on_tick(self) -> None:
        self._tick, self._tick_at = None, float("inf")
        if self._left:
            self.send(ev.Tick())


def _engine(core: RouterCore, cfg: EngineConfig, emu: EmulatedEngine) -> EngineState:
    """What the served driver's registration makes of an emulated engine."""
    return EngineState(
        idx=core.fleet.next_idx(),
        id=cfg.id or "",
        config=cfg,
        client=None,
        model=emu.cfg.model_name,
        version=core.fleet.version,
        capacity=Capacity(configured=cfg.max_running, kv_full=0.95),
        send_priority=cfg.priority,
        kv=emu.links if core.moves.move_kv else None,
    )


def _tokens(traj_id: int, step: int, n: int) -> list[int]:
    """`n` prompt or tool tokens of a trajectory's step, beginning with its id and the
    step's, so that no two trajectories share a prefix by chance."""
    head = [traj_id % VOCAB, traj_id // VOCAB % VOCAB, traj_id // VOCAB**2 % VOCAB, step % VOCAB]
    body = [(traj_id + step * 31 + i * 7 + (i * i) % 13) % VOCAB for i in range(max(0, n - 4))]
    return [1 + x for x in (head + body)[:n]]
