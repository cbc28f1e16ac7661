"""The turn lifecycle: every allowed transition and no other; then the driver under a storm of
submits, preemptions, engine kills, hangs, drains, restores, aborts and clients leaving (a
hypothesis state machine over in-process engines), checking that every turn ends exactly
once with the tokens and logprobs it should have, that no engine ever runs more than its cap,
and that waiting turns survive."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from typing import Any

import pytest
from fake_engine import FakeEngine
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from loom.core.errors import Conflict, NotFound
from loom.runtime.rollout.config import EngineConfig, EngineKind, RolloutServerConfig
from loom.runtime.rollout.driver import RolloutDriver
from loom.runtime.rollout.engines import EngineClient
from loom.runtime.rollout.standin import continuation
from loom.runtime.rollout.state import Turn
from loom.runtime.rollout.turn import (
    TRANSITIONS,
    LogprobSpec,
    TurnRequest,
    TurnState,
    TurnStateError,
)

# ---- the transition graph ------------------------------------------------------------------


def _turn() -> Turn:
    from loom.runtime.rollout.state import Trajectory

    t = Trajectory(traj_id=0, key="k", prompt_id=0, group=None, declared=False, first_arrival_s=0)
    req = TurnRequest({"max_tokens": 4}, stream=True)
    return Turn(traj=t, index=0, prompt=[1], request=req, arrival_s=0)


def _go(turn: Turn, target: TurnState) -> None:
    if target is TurnState.HELD:
        turn.hold(0.5)
    elif target is TurnState.QUEUED:
        turn.queue(object(), (0, 1, 0.0), 0.5)  # type: ignore[arg-type]
    elif target is TurnState.RUNNING:
        turn.run(1.0)
    elif target is TurnState.FINISHED:
        turn.end(1.0)
    elif target is TurnState.FAILED:
        turn.end(1.0, error="boom", status=503)
    else:
        pytest.skip("NEW is only a start")


@pytest.mark.parametrize("source", list(TurnState))
@pytest.mark.parametrize("target", [s for s in TurnState if s is not TurnState.NEW])
def test_every_allowed_transition_and_no_other(source: TurnState, target: TurnState) -> None:
    turn = _turn()
    turn.state = source
    if target in TRANSITIONS[source]:
        _go(turn, target)
        assert turn.state is target
        if target.ended:
            assert turn.ended_s == 1.0
    else:
        with pytest.raises(TurnStateError, match=f"{source.name} -> {target.name}"):
            _go(turn, target)
        assert turn.state is source


def test_only_a_running_attempt_is_interrupted_and_ended_is_a_comparison() -> None:
    turn = _turn()
    with pytest.raises(TurnStateError, match="interrupt"):
        turn.interrupt()
    turn.queue(object(), (0, 1, 0.0), 0.0)  # type: ignore[arg-type]
    turn.run(0.0)
    rid = turn.interrupt()
    assert rid.endswith(f"-0-{turn.seq}") and turn.rid().endswith(f"-1-{turn.seq}")
    assert [s for s in TurnState if s.ended] == [TurnState.FINISHED, TurnState.FAILED]


# ---- in-process engines --------------------------------------------------------------------


expected = continuation


CAP = 2


class DriverMachine(RuleBasedStateMachine):
    placement = "least_load"  # each turn to the least-loaded engine; PPS preempts

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.fakes: dict[str, FakeEngine] = {}
        cfg = RolloutServerConfig(
            placement=self.placement,
            scheduler="pps",
            rose_cap_per_gpu=1,
            health_interval_s=0.02,
            health_failures=1,
            stall_timeout_s=0.3,
            first_token_timeout_s=5.0,
            tokenizer="engine",
        )
        self.driver = RolloutDriver(cfg, client_factory=self._client)
        self.turns: list[Turn] = []
        self.ends: dict[int, int] = {}
        self.n_engines = 0
        self._run(self.driver.start())
        for _ in range(2):
            self._add()

    def _client(self, kind: EngineKind, url: str, session: Any, timeout: float) -> EngineClient:
        return self.fakes[url]

    def _run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def _do(self, fn: Any) -> Any:
        """Call a driver method on its loop (the driver runs on one event loop)."""

        async def call() -> Any:
            return fn()

        return self._run(call())

    def _settle(self, seconds: float = 0.01) -> None:
        self._run(asyncio.sleep(seconds))

    def _add(self) -> None:
        url = f"http://fake{self.n_engines}"
        self.n_engines += 1
        self.fakes[url] = FakeEngine(url, None)
        cfg = EngineConfig(url=url, kind="sglang", max_running=CAP)
        self._run(self.driver.add_engine(cfg))

    def _pick(self, i: int) -> tuple[str, FakeEngine] | None:
        states = list(self.driver.engines.values())
        if not states:
            return None
        e = states[i % len(states)]
        return e.id, self.fakes[e.config.url]

    @initialize(
        keys=st.lists(st.sampled_from([None, "a", "b", "c"]), min_size=3, max_size=8),
        plen=st.integers(1, 6),
        max_tokens=st.integers(10, 40),
    )
    def first_batch(self, keys, plen, max_tokens) -> None:
        self.submit(keys, plen, max_tokens, 1, 0, True)

    @rule(
        keys=st.lists(st.sampled_from([None, "a", "b", "c"]), min_size=1, max_size=4),
        plen=st.integers(1, 6),
        max_tokens=st.integers(1, 40),
        n=st.integers(1, 2),
        priority=st.integers(0, 1),
        logprobs=st.booleans(),
    )
    def submit(self, keys, plen, max_tokens, n, priority, logprobs) -> None:
        for key in keys:  # a burst: they queue, and outrank or wait for each other
            prompt = [3 + (plen * 7 + i) % 50 for i in range(plen)]
            req = TurnRequest(
                {"max_tokens": max_tokens, "ignore_eos": True},
                LogprobSpec(output=logprobs),
                client_rid=f"rid{len(self.turns)}",
                priority=priority,
                stream=True,
            )
            try:
                turns = self._do(functools.partial(self.driver.submit, key, prompt, req, n=n))
            except Exception as exc:  # no live engine: refused up front, nothing accepted
                assert "no live engine" in str(exc)
                return
            self.turns += turns
            plen += 1
        self._settle()

    @rule(i=st.integers(0, 5))
    def kill(self, i) -> None:
        if (picked := self._pick(i)) is not None:
            picked[1].dead = True
        self._settle(0.03)

    @rule(i=st.integers(0, 5))
    def hang(self, i) -> None:
        if (picked := self._pick(i)) is not None:
            picked[1].hung = True
        self._settle(0.03)

    @rule(i=st.integers(0, 5))
    def restore(self, i) -> None:
        if (picked := self._pick(i)) is not None:
            picked[1].dead = picked[1].hung = False
        self._settle(0.05)

    @rule(i=st.integers(0, 5), force=st.booleans())
    def drain(self, i, force) -> None:
        if (picked := self._pick(i)) is not None:
            with contextlib.suppress(Conflict, NotFound):
                self._do(lambda: self.driver.remove_engine(picked[0], force=force))
        self._settle()

    @precondition(lambda self: self.n_engines < 6)
    @rule()
    def add(self) -> None:
        self._add()
        self._settle()

    @rule(j=st.integers(0, 1000))
    def abort(self, j) -> None:
        live = [t for t in self.turns if not t.ended]
        if live:
            rid = live[j % len(live)].request.client_rid
            assert rid is not None
            self._do(lambda: self.driver.abort([rid]))
        self._settle()

    @rule(j=st.integers(0, 1000))
    def client_leaves(self, j) -> None:
        live = [t for t in self.turns if not t.ended]
        if live:
            self._do(lambda: self.driver.abandon([live[j % len(live)]]))
        self._settle()

    @rule(ms=st.integers(5, 80))
    def wait(self, ms) -> None:
        self._settle(ms / 1000)

    @invariant()
    def no_engine_runs_more_than_its_cap(self) -> None:
        for e in self.driver.engines.values():
            assert len(e.running) <= e.max_running
        for fake in self.fakes.values():
            assert fake.peak <= CAP, f"{fake.url} ran {fake.peak} at once"

    @invariant()
    def every_turn_is_in_exactly_the_place_its_state_says(self) -> None:
        held = {id(t) for q in self.driver.core.held.values() for t in q}
        waiting = {id(t) for e in self.driver.engines.values() for t in e.waiting}
        running = {id(t) for e in self.driver.engines.values() for t in e.running.values()}
        for turn in self.turns:
            where = (id(turn) in held, id(turn) in waiting, id(turn) in running)
            want = {
                TurnState.HELD: (True, False, False),
                TurnState.QUEUED: (False, True, False),
                TurnState.RUNNING: (False, False, True),
            }.get(turn.state, (False, False, False))
            assert where == want, f"{turn.rid()} is {turn.state.name} but at {where}"
            if not turn.ended:
                assert turn.seq in turn.traj.active  # its trajectory still knows it

    @invariant()
    def ended_turns_have_exactly_their_tokens(self) -> None:
        for turn in self.turns:
            if turn.state is not TurnState.FINISHED:
                continue
            want, lps = expected(turn.prompt, len(turn.generated))
            assert turn.generated == want  # every token, in order, once, across attempts
            assert len(turn.generated) <= turn.max_tokens
            if turn.finish_reason == "length":
                assert len(turn.generated) == turn.max_tokens
            if turn.request.logprobs.output:
                assert [lp.logprob for lp in turn.logprobs] == lps

    def teardown(self) -> None:
        try:
            for fake in self.fakes.values():  # everything back: waiting turns must finish
                fake.dead = fake.hung = False
            for _ in range(400):
                if all(t.ended for t in self.turns):
                    break
                self._settle(0.02)
            survivors = [t for t in self.turns if not t.ended]
            live = self.driver.live()
            assert not survivors or not live, f"{len(survivors)} turns never ended"
            self._run(self.driver.close())
            for turn in self.turns:
                assert turn.ended and turn.finished.is_set()
                assert self._ends(turn) == 1
                if turn.state is TurnState.FAILED:  # an error only where no engine could serve
                    assert turn.error and (
                        "no live engine" in turn.error
                        or "shutting down" in turn.error
                        or "gave up" in turn.error
                    ), turn.error
            ended = self.ended_turns_have_exactly_their_tokens
            ended()
        finally:
            self.loop.close()

    def _ends(self, turn: Turn) -> int:
        # `end` puts one None on the updates queue; drain and count them
        n = 0
        assert turn.updates is not None
        while not turn.updates.empty():
            if turn.updates.get_nowait() is None:
                n += 1
        return n


class RoseMachine(DriverMachine):
    """ROSE's placement: a central queue of held turns, drained as engines free."""

    placement = "rose"


_SETTINGS = settings(
    max_examples=20,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestDriverMachine = DriverMachine.TestCase
TestDriverMachine.settings = _SETTINGS
TestRoseMachine = RoseMachine.TestCase
TestRoseMachine.settings = _SETTINGS
