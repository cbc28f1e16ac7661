"""The router's move rule: whether a move pays, weighed by time (`loom.rollout.moves`) on each
engine's own latency model (its degree) and measured pace. Late binding, Heddle's migrations
and PPS's preemptions all ask it; the core (`core.py`) holds one. No I/O, no clock."""

from __future__ import annotations

import math
from collections.abc import Callable

from loom.perf.latency import LatencyModel
from loom.rollout.moves import decode_step_s, move_pays, pace_gain_s, prefill_s, slot_wait_s
from loom.runtime.rollout.state import EngineState, Trajectory, Turn

__all__ = ["MoveRule"]


class MoveRule:
    """A move weighed by time (`loom.rollout.moves`): the wait it saves against what
    prefilling the turn's context there costs beyond staying, by each engine's latency model
    (its degree) and its measured pace. Late binding, Heddle's migrations and PPS's
    preemptions all ask it. A migration whose KV moves with it (`move_kv`, between engines
    that move KV) costs the part of the copy its tool call does not hide instead."""

    def __init__(
        self, latency: Callable[[int], LatencyModel | None], *, move_kv: bool = True
    ) -> None:
        self.latency = latency
        self.move_kv = move_kv

    def carries_kv(self, t: Trajectory, src: EngineState, dst: EngineState) -> bool:
        """Whether moving `t` from `src` to `dst` now copies its KV there: it is in a tool
        call with its context cached at `src`, and both engines move KV."""
        return (
            self.move_kv
            and src.kv is not None
            and dst.kv is not None
            and src.kv.reaches(dst.kv)
            and not t.active
            and t.prefix.get(src.idx, 0) > 0
        )

    def transfer_s(self, t: Trajectory, src: EngineState, dst: EngineState) -> float:
        """Seconds copying `t`'s KV from `src` to `dst` takes (`loom.perf.transfer`)."""
        assert src.kv is not None and dst.kv is not None, "engines that move no KV"
        return src.kv.transfer_s(t.prefix.get(src.idx, 0), dst.kv)

    def prefill_s(self, e: EngineState, tokens: int, cached: int) -> float:
        """Seconds prefilling `tokens`, `cached` of them in its prefix cache, adds to a step
        of `e`'s."""
        return prefill_s(self.latency(e.tp), tokens, cached)

    def extra_prefill_s(self, t: Trajectory, seq: int, src: EngineState, dst: EngineState) -> float:
        """What prefilling `seq` tokens of `t` at `dst` costs beyond prefilling them at `src`."""
        there = self.prefill_s(dst, seq, t.prefix.get(dst.idx, 0))
        return there - self.prefill_s(src, seq, t.prefix.get(src.idx, 0))

    def _steps_s(self, e: EngineState, context: int) -> tuple[float | None, float | None]:
        """A decode step of `e`'s running turns with one more sequence of `context` tokens
        among them, and without it (None where it has no latency model)."""
        held = sum(len(r.prompt) + len(r.generated) for r in e.running.values())
        model, n = self.latency(e.tp), len(e.running)
        return decode_step_s(model, n + 1, held + context), decode_step_s(model, n, held)

    def slot_wait(self, e: EngineState) -> float:
        """Seconds a turn placed at `e` now would wait for a slot there."""
        if e.has_slot() and not e.waiting:
            return 0.0
        return slot_wait_s(len(e.running), e.pace.turn_s, len(e.waiting))

    def late_pays(self, turn: Turn, src: EngineState, ahead: int, dst: EngineState) -> bool:
        """`turn`, `ahead` turns from the head of `src`'s queue, moves to `dst` (which has a
        slot) where its wait at `src` exceeds what prefilling it at `dst` costs more; an
        aged turn moves whatever it costs."""
        if turn.aged:
            return True
        seq = len(turn.prompt) + len(turn.generated)
        wait = slot_wait_s(len(src.running), src.pace.turn_s, ahead)
        return wait > self.extra_prefill_s(turn.traj, seq, src, dst)

    @staticmethod
    def _others_s(
        remaining: float, running: int, with_it: float | None, without: float | None
    ) -> float:
        """What one more sequence among an engine's `running` turns costs them over its
        `remaining` tokens: each takes the step `with_it` instead of `without`."""
        if with_it is None or without is None:
            return math.nan
        return remaining * running * (with_it - without)

    def migration_pays(
        self, t: Trajectory, src: EngineState, dst: EngineState, tool_left_s: float = 0.0
    ) -> bool:
        """Heddle's migration between turns: the wait its next turn saves at `dst`, with the
        time its remaining tokens (as predicted) save decoding at `dst`'s step, must exceed
        what the move costs: prefilling its context there beyond at `src` (or, where its KV
        moves, the part of the copy the `tool_left_s` its tool call is expected to run yet
        does not hide), and what it does to the other turns at both engines."""
        seq = t.pending_context
        if self.carries_kv(t, src, dst):
            cost = max(0.0, self.transfer_s(t, src, dst) - tool_left_s)
        else:
            cost = self.extra_prefill_s(t, seq, src, dst)
        remaining = float(t.predicted_total) - t.generated
        src_with, src_without = self._steps_s(src, seq)
        dst_with, dst_without = self._steps_s(dst, seq)
        gain = pace_gain_s(remaining, src_with, dst_with)
        if math.isfinite(remaining) and remaining > 0:
            # the other turns at both: each of dst's takes a step with it among them, each
            # of src's one without (negative where they gain); nothing where a model is missing
            others = self._others_s(remaining, len(dst.running), dst_with, dst_without)
            others -= self._others_s(remaining, len(src.running), src_with, src_without)
            cost += 0.0 if math.isnan(others) else others
        return move_pays(cost, self.slot_wait(src), self.slot_wait(dst), gain)

    def preemption_pays(self, e: EngineState, victim: Turn) -> bool:
        """Evicting `victim` pays where the wait the head of `e`'s queue saves exceeds the
        victim's prefill again."""
        saved = slot_wait_s(len(e.running), e.pace.turn_s)
        return saved > self.prefill_s(e, len(victim.prompt) + len(victim.generated), 0)
