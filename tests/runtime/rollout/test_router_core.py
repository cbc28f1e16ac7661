"""The router's core on its own, with a fake clock: no event loop, no sleeps, no sockets.

A hypothesis state machine feeds `RouterCore` every kind of event in any order (submissions
and bursts, chunks, attempts that end, fail or are refused, engines that die, come back,
drain, leave or join, load reports, weight changes, aborts, clients that leave, predictions
that move trajectories, time passing) and plays the engines itself: an attempt runs from the
core's `Start` until its `Stop` or its end, and produces the stand-in model's tokens. After
every step: each turn is exactly where its state says, no engine runs more turns than the
core admits or than its cap, and a finished turn holds exactly the tokens and logprobs its
engines produced. At the end, with every engine back, each turn has ended exactly once.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from loom.core.errors import Conflict, NotFound, Unavailable
from loom.perf.transfer import KvLinks
from loom.runtime.rollout import events as ev
from loom.runtime.rollout.admission import Capacity
from loom.runtime.rollout.config import EngineConfig, RolloutServerConfig
from loom.runtime.rollout.core import RouterCore
from loom.runtime.rollout.policies import make_core
from loom.runtime.rollout.standin import continuation
from loom.runtime.rollout.state import EngineState, Turn
from loom.runtime.rollout.turn import (
    Delta,
    Done,
    EngineLoad,
    LogprobSpec,
    TokenLogprob,
    TurnRequest,
    TurnState,
)

CAP = 2


@dataclass
class Attempt:
    """An attempt the test's engine is running: started by `Start`, gone by `Stop` or its
    end."""

    turn: Turn
    number: int
    engine: EngineState
    rid: str
    produced: list[int] = field(default_factory=list)


class CoreMachine(RuleBasedStateMachine):
    placement = "least_load"
    scheduler = "pps"

    def __init__(self) -> None:
        super().__init__()
        cfg = RolloutServerConfig(
            placement=self.placement,
            scheduler=self.scheduler,
            rose_cap_per_gpu=1,
            max_wait_s=2.0,
            stall_timeout_s=5.0,
            lent_stall_timeout_s=1.0,
            first_token_timeout_s=20.0,
            health_failures=1,
            tokenizer="engine",
            model="qwen3-8b",
        )
        self.core: RouterCore = make_core(cfg)
        self.t = 0.0
        self.turns: list[Turn] = []
        self.ends: Counter[int] = Counter()
        self.attempts: dict[int, Attempt] = {}  # by turn seq
        self.probes: list[EngineState] = []
        self.predicts: dict[int, Any] = {}
        self.n = 0
        self.dead: set[str] = set()
        self.copies: list[ev.MoveKv] = []  # on their way
        for _ in range(2):
            self._add()

    # ---- the engines' side -----------------------------------------------------------------

    def do(self, event: ev.Event) -> Any:
        value = None
        for c in self.core.handle(event, self.t):
            kind = type(c)
            if kind is ev.Reply:
                value = c.value
            elif kind is ev.Start:
                assert c.engine.alive and c.engine.id not in self.dead, "started at a dead engine"
                prev = self.attempts.get(c.turn.seq)  # only a retry without the priority
                assert prev is None or prev.number == c.attempt, "two attempts of one turn"
                t = c.turn  # (its attempt may have moved on within the same event)
                self.attempts[t.seq] = Attempt(t, c.attempt, c.engine, t.rid(c.attempt))
                here = sum(1 for a in self.attempts.values() if a.engine is c.engine)
                assert here <= CAP, f"{c.engine.id} runs {here} turns, its cap is {CAP}"
            elif kind is ev.Stop:
                a = self.attempts.pop(c.turn.seq, None)
                assert a is not None and a.rid == c.rid, "stopped an attempt that was not running"
            elif kind is ev.TurnEnded:
                self.ends[c.turn.seq] += 1
                a = self.attempts.get(c.turn.seq)
                if a is not None and a.turn is c.turn:
                    del self.attempts[c.turn.seq]  # the engine ended it
            elif kind is ev.Probe:
                self.probes.append(c.engine)
            elif kind is ev.Predict:
                self.predicts[c.trajectory.traj_id] = c.trajectory
            elif kind is ev.MoveKv:
                busy = {e.idx for m in self.copies for e in (m.src, m.dst)}
                assert not {c.src.idx, c.dst.idx} & busy, "an engine in two copies at once"
                t = c.trajectory
                assert not t.active, "a copy for a trajectory that is not in a tool call"
                last = t.last_turn
                assert last is not None and c.tokens == last.prompt + last.generated
                self.copies.append(c)
        return value

    def _add(self) -> None:
        fleet = self.core.fleet
        idx = fleet.next_idx()
        e = EngineState(
            idx=idx,
            id=f"e{idx}",
            config=EngineConfig(url=f"http://fake{idx}", kind="sglang", max_running=CAP),
            client=None,
            model="m",
            capacity=Capacity(configured=CAP),
            kv=KvLinks.of("qwen3-8b", "h100", node=idx % 2),
        )
        self.do(ev.EngineAdded(e))
        self.n += 1

    def _engine(self, i: int) -> EngineState | None:
        engines = list(self.core.fleet.engines.values())
        return engines[i % len(engines)] if engines else None

    def _attempt(self, i: int) -> Attempt | None:
        running = sorted(self.attempts.values(), key=lambda a: a.turn.seq)
        return running[i % len(running)] if running else None

    def _produce(self, a: Attempt, k: int) -> None:
        """`a`'s engine produces its next `k` tokens (the stand-in model's)."""
        turn = a.turn
        have = len(turn.generated)
        k = max(0, min(k, turn.remaining))
        if not k:
            return
        tokens, lps = continuation(turn.prompt, have + k)
        delta = Delta(tokens[have:], "x" * k, [TokenLogprob(lp) for lp in lps[have:]])
        self.do(ev.Chunk(turn, a.number, delta))

    # ---- rules ----------------------------------------------------------------------------

    @initialize(
        keys=st.lists(st.sampled_from([None, "a", "b", "c"]), min_size=3, max_size=8),
        max_tokens=st.integers(4, 30),
    )
    def first_batch(self, keys: list[str | None], max_tokens: int) -> None:
        self.submit(keys, 3, max_tokens, 1, 0, True)

    @rule(
        keys=st.lists(st.sampled_from([None, "a", "b", "c", "d"]), min_size=1, max_size=4),
        plen=st.integers(1, 6),
        max_tokens=st.integers(0, 30),
        n=st.integers(1, 2),
        priority=st.integers(0, 1),
        logprobs=st.booleans(),
    )
    def submit(
        self,
        keys: list[str | None],
        plen: int,
        max_tokens: int,
        n: int,
        priority: int,
        logprobs: bool,
    ) -> None:
        for key in keys:
            prompt = [3 + (plen * 7 + i) % 50 for i in range(plen)]
            req = TurnRequest(
                {"max_tokens": max_tokens, "ignore_eos": True},
                LogprobSpec(output=logprobs),
                client_rid=f"rid{len(self.turns)}",
                priority=priority,
                stream=True,
            )
            try:
                turns = self.do(ev.Submit(key, prompt, req, n))
            except Unavailable as exc:  # refused up front, nothing accepted
                assert "no live engine" in str(exc)
                return
            self.turns += turns
            plen += 1

    @rule(i=st.integers(0, 20), k=st.integers(1, 12))
    def chunk(self, i: int, k: int) -> None:
        if (a := self._attempt(i)) is not None:
            self._produce(a, k)

    @rule(i=st.integers(0, 20), stop_early=st.booleans())
    def finish(self, i: int, stop_early: bool) -> None:
        if (a := self._attempt(i)) is None:
            return
        if not stop_early:
            self._produce(a, a.turn.remaining)
        reason = "stop" if stop_early else "length"
        self.do(ev.AttemptDone(a.turn, a.number, Done(reason)))

    @rule(i=st.integers(0, 20), down=st.booleans())
    def fail(self, i: int, down: bool) -> None:
        if (a := self._attempt(i)) is not None:
            self.do(ev.AttemptFailed(a.turn, a.number, a.engine, "broken stream", down=down))

    @rule(i=st.integers(0, 20))
    def engine_aborts(self, i: int) -> None:
        if (a := self._attempt(i)) is not None:
            self.do(ev.AttemptDone(a.turn, a.number, Done("abort", message="engine abort")))

    @rule(i=st.integers(0, 20))
    def priority_refused(self, i: int) -> None:
        if (a := self._attempt(i)) is not None:
            self.do(ev.PriorityRefused(a.turn, a.number, Conflict("priority refused")))

    @rule(i=st.integers(0, 5))
    def kill(self, i: int) -> None:
        if (e := self._engine(i)) is not None:
            self.dead.add(e.id)
            for a in [a for a in self.attempts.values() if a.engine is e]:
                self.do(ev.AttemptFailed(a.turn, a.number, e, "connection refused", down=True))
            self.do(ev.EngineDown(e, "connection refused"))

    @rule(i=st.integers(0, 5), ok=st.booleans())
    def health(self, i: int, ok: bool) -> None:
        if (e := self._engine(i)) is not None:
            ok = ok and e.id not in self.dead
            self.do(ev.Health([(e, ok)]))

    @rule(i=st.integers(0, 5))
    def restore(self, i: int) -> None:
        if (e := self._engine(i)) is not None:
            self.dead.discard(e.id)
            self.do(ev.Health([(e, True)]))

    @rule(i=st.integers(0, 5))
    def suspect(self, i: int) -> None:
        if (e := self._engine(i)) is not None:
            self.do(ev.Suspect(e, "a 502"))

    @rule()
    def answer_probes(self) -> None:
        probes, self.probes = self.probes, []
        for e in probes:
            self.do(ev.Probed(e, e.id not in self.dead, "a 502"))

    @rule(i=st.integers(0, 5), force=st.booleans(), leaving=st.booleans())
    def drain(self, i: int, force: bool, leaving: bool) -> None:
        if (e := self._engine(i)) is None:
            return
        try:
            self.do(ev.EngineRemoved(e.id, force=force, leaving=leaving))
        except (Conflict, NotFound):
            return
        if leaving:  # its launcher stops it right after
            self.dead.add(e.id)
            for a in [a for a in self.attempts.values() if a.engine is e]:
                self.do(ev.AttemptFailed(a.turn, a.number, e, "gone", down=True))
            self.do(ev.EngineDown(e, "gone"))

    @precondition(lambda self: self.n < 6)
    @rule()
    def add(self) -> None:
        self._add()

    @rule(i=st.integers(0, 5), waiting=st.integers(0, 3))
    def load_report(self, i: int, waiting: int) -> None:
        if (e := self._engine(i)) is not None and e.alive:
            self.do(ev.EngineLoaded(e, EngineLoad(len(e.running), waiting, 0.5)))

    @rule(i=st.integers(0, 5), everyone=st.booleans())
    def new_weights(self, i: int, everyone: bool) -> None:
        engines = list(self.core.fleet.engines)
        ids = engines if everyone else engines[i % max(1, len(engines)) :][:1]
        self.do(ev.WeightsSet(self.core.version + 1, tuple(ids)))

    @rule(i=st.integers(0, 5))
    def catch_up(self, i: int) -> None:
        if (e := self._engine(i)) is not None:
            self.do(ev.Report(e.id, version=self.core.version))

    @rule(j=st.integers(0, 1000))
    def abort(self, j: int) -> None:
        live = [t for t in self.turns if not t.ended]
        if live:
            rid = live[j % len(live)].request.client_rid
            assert rid is not None
            assert self.do(ev.Abort((rid,))) >= 1

    @rule(j=st.integers(0, 1000))
    def client_leaves(self, j: int) -> None:
        live = [t for t in self.turns if not t.ended]
        if live:
            self.do(ev.Abandon((live[j % len(live)],)))

    @rule(key=st.sampled_from(["a", "b", "c", "d"]))
    def trajectory_ends(self, key: str) -> None:
        with contextlib.suppress(NotFound):
            self.do(ev.EndTrajectory(key))

    @rule(total=st.floats(1, 500))
    def predicted(self, total: float) -> None:
        predicts, self.predicts = self.predicts, {}
        for t in predicts.values():
            self.do(ev.Predicted(t, t.steps_done, total))

    @rule(j=st.integers(0, 100), ok=st.booleans())
    def copy_lands(self, j: int, ok: bool) -> None:
        """A KV copy ends, or fails, in any order."""
        if self.copies:
            c = self.copies.pop(j % len(self.copies))
            n = len(c.tokens) if ok else 0
            self.do(ev.KvMoved(c.trajectory, c.src, c.dst, n, 0.01, None if ok else "refused"))

    @rule(dt=st.floats(0.01, 8.0))
    def time_passes(self, dt: float) -> None:
        self.t += dt
        self.do(ev.Tick())

    # ---- invariants -----------------------------------------------------------------------

    @invariant()
    def every_turn_is_in_exactly_the_place_its_state_says(self) -> None:
        core = self.core
        held = {id(t) for q in core.held.values() for t in q}
        engines = list(core.fleet.engines.values())
        waiting = {id(t) for e in engines for t in e.waiting}
        running = {id(t) for e in engines for t in e.running.values()}
        for turn in self.turns:
            where = (id(turn) in held, id(turn) in waiting, id(turn) in running)
            want = {
                TurnState.HELD: (True, False, False),
                TurnState.QUEUED: (False, True, False),
                TurnState.RUNNING: (False, False, True),
            }.get(turn.state, (False, False, False))
            assert where == want, f"{turn.rid()} is {turn.state.name} but at {where}"
            if turn.ended:
                assert self.ends[turn.seq] == 1, f"{turn.rid()} ended {self.ends[turn.seq]} times"
            else:
                assert self.ends[turn.seq] == 0
                assert turn.seq in turn.traj.active

    @invariant()
    def a_turn_waits_for_its_kv_only_while_a_copy_is_on_its_way(self) -> None:
        core = self.core
        for tid in core.held:
            t = core.by_tid[tid]
            if t.moving is None:
                continue
            flying = any(c.trajectory is t and c.dst.idx == t.moving for c in self.copies)
            asked = any(r.traj_id == tid and r.dst == t.moving for r in core._copies)
            assert flying or asked, f"{t.key}'s turns wait for a copy that will never come"

    @invariant()
    def the_engines_run_exactly_what_the_core_admitted(self) -> None:
        for e in self.core.fleet.engines.values():
            assert len(e.running) <= CAP
            mine = {a.turn.seq for a in self.attempts.values() if a.engine is e}
            assert mine == set(e.running), f"{e.id}: the core says {set(e.running)}, ran {mine}"

    @invariant()
    def finished_turns_hold_exactly_what_their_engines_produced(self) -> None:
        for turn in self.turns:
            if turn.state is not TurnState.FINISHED:
                continue
            want, lps = continuation(turn.prompt, len(turn.generated))
            assert turn.generated == want  # every token, in order, once, across attempts
            assert len(turn.generated) <= turn.max_tokens
            if turn.request.logprobs.output:
                assert [lp.logprob for lp in turn.logprobs] == lps

    def teardown(self) -> None:
        for e in list(self.core.fleet.engines.values()):  # every engine back
            self.dead.discard(e.id)
            self.do(ev.Health([(e, True)]))
        self.answer_probes()
        self.do(ev.WeightsSet(self.core.version, tuple(self.core.fleet.engines)))
        for _ in range(500):
            if all(t.ended for t in self.turns):
                break
            if self.copies:
                self.copy_lands(0, True)
            elif self.attempts:
                self.finish(0, False)
            else:
                self.time_passes(1.0)
        survivors = [t for t in self.turns if not t.ended]
        assert not survivors or not self.core.live(), f"{len(survivors)} turns never ended"
        self.do(ev.Shutdown())
        for turn in self.turns:
            assert turn.ended and self.ends[turn.seq] == 1
            if turn.state is TurnState.FAILED:  # an error only where no engine could serve
                assert turn.error and (
                    "no live engine" in turn.error
                    or "shutting down" in turn.error
                    or "gave up" in turn.error
                    or "priority refused" in turn.error
                ), turn.error
        assert not self.attempts, "an attempt outlived the shutdown"
        while self.copies:  # a copy that lands after the shutdown changes nothing
            self.copy_lands(0, True)


class RoseCoreMachine(CoreMachine):
    """ROSE's placement: a central queue of held turns, drained as engines free."""

    placement = "rose"


class HeddleCoreMachine(CoreMachine):
    """Heddle's placement: homes planned per trajectory, migrated on predictions."""

    placement = "heddle"


_SETTINGS = settings(
    max_examples=200,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestCoreMachine = CoreMachine.TestCase
TestCoreMachine.settings = _SETTINGS
TestRoseCoreMachine = RoseCoreMachine.TestCase
TestRoseCoreMachine.settings = _SETTINGS
TestHeddleCoreMachine = HeddleCoreMachine.TestCase
TestHeddleCoreMachine.settings = _SETTINGS
