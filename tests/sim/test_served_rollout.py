"""The simulator's served rollout runs the served router's own core: the same event trace fed
to the core the served driver builds gives the same commands, event by event; and a batch
ends with every trajectory's turns, the same at the same seed."""

from __future__ import annotations

import random
from typing import Any

import pytest

from loom.core.trajectory import TrajectorySpec, TurnSpec, WorkloadKind
from loom.rollout.policy import Router
from loom.runtime.emulate.config import EmulatedEngineConfig, EmulationSpec
from loom.runtime.rollout import events as ev
from loom.runtime.rollout.admission import Capacity
from loom.runtime.rollout.config import EngineConfig, RolloutServerConfig
from loom.runtime.rollout.driver import RolloutDriver
from loom.runtime.rollout.policies import make_core
from loom.runtime.rollout.state import EngineState, Trajectory, Turn
from loom.sim.rollout.served import ServedRollout

SPEC = EmulationSpec.parse("qwen3-8b@h100:tp1")


def _batch(n: int, seed: int) -> list[TrajectorySpec]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        k = rng.randint(1, 4)
        turns = tuple(
            TurnSpec(
                rng.randint(40, 900),
                rng.randint(10, 500),
                None if j == k - 1 else rng.uniform(0.2, 4.0),
            )
            for j in range(k)
        )
        out.append(
            TrajectorySpec(
                traj_id=i, prompt_id=i // 4, sample_idx=i % 4, workload=None, turns=turns
            )
        )
    return out


def _config(
    placement: str, scheduler: str, engines: int = 3, cap: int = 6, move_kv: bool = True
) -> RolloutServerConfig:
    return RolloutServerConfig(
        placement=placement,
        scheduler=scheduler,
        model="qwen3-8b",
        gpu="h100",
        engines=tuple(EngineConfig(url=f"http://sim{i}", max_running=cap) for i in range(engines)),
        move_kv=move_kv,
    )


def _predictions(specs: list[TrajectorySpec]) -> list[list[float]]:
    return [[float(sum(t.output_tokens for t in s.turns))] * len(s.turns) for s in specs]


class _Canon:
    """Commands as data that two runs can compare: turns by the order they were submitted,
    engines by id, trajectories by key."""

    def __init__(self) -> None:
        self.turns: dict[int, int] = {}  # id(turn) -> ordinal

    def value(self, v: Any) -> Any:
        if isinstance(v, Turn):
            return ("turn", self.turns[id(v)])
        if isinstance(v, EngineState):
            return ("engine", v.id)
        if isinstance(v, Trajectory):
            return ("trajectory", v.key)
        if isinstance(v, list | tuple):
            return [self.value(x) for x in v]
        if isinstance(v, dict):
            return {k: self.value(x) for k, x in v.items()}
        return v

    def commands(self, out: list[ev.Command]) -> list[tuple[Any, ...]]:
        rows = []
        for c in out:
            if (
                type(c) is ev.Reply
                and isinstance(c.value, list)
                and c.value
                and isinstance(c.value[0], Turn)
            ):
                for turn in c.value:
                    self.turns.setdefault(id(turn), len(self.turns))
            fields = [self.value(getattr(c, f)) for f in c.__dataclass_fields__]  # type: ignore[attr-defined]
            if type(c) is ev.Stop:  # an engine-side id ends with the process's turn counter
                fields[2] = fields[2].rsplit("-", 1)[0]
            if type(c) is ev.TurnEnded:
                turn = c.turn
                fields.append((turn.state.name, turn.finish_reason, len(turn.generated)))
            rows.append((type(c).__name__, *fields))
        return rows


def _turns(c: ev.Command) -> bool:
    """Whether `c` replies with the turns of a submission."""
    return (
        type(c) is ev.Reply
        and isinstance(c.value, list)
        and bool(c.value)
        and isinstance(c.value[0], Turn)
    )


def _rest(event: Any, skip: int) -> list[Any]:
    return [getattr(event, f) for f in list(event.__dataclass_fields__)[skip:]]


@pytest.mark.parametrize(
    ("placement", "scheduler"),
    [("least_load", "fcfs"), ("heddle", "pps"), ("rose", "fcfs"), ("cache_aware", "pps")],
)
def test_the_served_drivers_core_gives_the_simulators_commands_for_its_trace(
    placement: str, scheduler: str
) -> None:
    specs = _batch(40, seed=5)
    config = _config(placement, scheduler)
    trace: list[tuple[float, ev.Event]] = []
    commands: list[list[ev.Command]] = []
    ServedRollout(
        specs,
        [EmulatedEngineConfig(spec=SPEC)] * 3,
        config,
        predictions=_predictions(specs),
        trace=trace,
        commands=commands,
    ).run()
    assert len(trace) == len(commands) > 200
    kinds = {type(e).__name__ for _, e in trace}
    assert {"Submit", "Chunk", "AttemptDone", "Tick", "EngineLoaded", "Declare"} <= kinds

    sim = _Canon()
    theirs = [sim.commands(out) for out in commands]
    outs = _replay(trace, config, _submitted(commands))
    served = _Canon()
    ours = [served.commands(out) for out in outs]
    for i, (a, b) in enumerate(zip(theirs, ours, strict=True)):
        assert a == b, f"event {i} ({type(trace[i][1]).__name__}) at t={trace[i][0]:.3f}"


def _submitted(commands: list[list[ev.Command]]) -> dict[int, int]:
    """The trace's turns by the order its core submitted them: id(turn) -> ordinal."""
    order: dict[int, int] = {}
    for out in commands:
        for c in out:
            if _turns(c):
                for t in c.value:  # type: ignore[attr-defined]
                    order.setdefault(id(t), len(order))
    return order


def _replay(
    trace: list[tuple[float, ev.Event]], config: RolloutServerConfig, order: dict[int, int]
) -> list[list[ev.Command]]:
    """`trace` fed to the core of a served driver of `config` (built as `loom serve rollout`
    builds it), its events' turns, engines and trajectories mapped to that core's own."""
    core = RolloutDriver(config).core
    mine: list[Turn] = []
    outs: list[list[ev.Command]] = []
    for now, event in trace:
        e: ev.Event = event
        if isinstance(event, ev.EngineAdded):
            src = event.engine
            core.fleet.next_idx()
            e = ev.EngineAdded(
                EngineState(
                    idx=src.idx,
                    id=src.id,
                    config=src.config,
                    client=None,
                    model=src.model,
                    capacity=Capacity(configured=src.config.max_running, kv_full=0.95),
                    kv=src.kv,  # what the driver's probe learns of an engine that moves KV
                )
            )
        elif isinstance(event, ev.EngineLoaded | ev.Probed):
            e = type(event)(core.fleet.engines[event.engine.id], *_rest(event, 1))
        elif isinstance(event, ev.Chunk | ev.AttemptDone | ev.AttemptRejected | ev.PriorityRefused):
            e = type(event)(mine[order[id(event.turn)]], *_rest(event, 1))
        elif isinstance(event, ev.KvMoved):
            engines = core.fleet.engines
            t = core.trajectories.get(event.trajectory.key, event.trajectory)
            src, dst = engines[event.src.id], engines[event.dst.id]
            e = ev.KvMoved(t, src, dst, *_rest(event, 3))
        elif isinstance(event, ev.Predicted):
            t = core.trajectories.get(event.trajectory.key, event.trajectory)  # (ended: ignored)
            e = ev.Predicted(t, event.steps, event.total)
        out = core.handle(e, now)
        for c in out:
            if _turns(c):
                mine.extend(c.value)  # type: ignore[attr-defined]
        outs.append(out)
    return outs


@pytest.mark.parametrize(("placement", "scheduler"), [("least_load", "fcfs"), ("heddle", "pps")])
def test_a_served_batch_ends_every_trajectory_the_same_at_the_same_seed(
    placement: str, scheduler: str
) -> None:
    specs = _batch(60, seed=11)

    def run() -> Any:
        return ServedRollout(
            specs,
            [EmulatedEngineConfig(spec=SPEC)] * 3,
            _config(placement, scheduler),
            predictions=_predictions(specs),
        ).run()

    a, b = run(), run()
    assert a.makespan_s == b.makespan_s and a.counts == b.counts
    assert (a.finish_s == b.finish_s).all()
    assert a.counts["turns"] == sum(len(s.turns) for s in specs)
    assert a.counts["finished"] == len(specs) and a.counts["declared"] == len(specs)
    assert a.output_tokens == sum(t.output_tokens for s in specs for t in s.turns)
    assert a.makespan_s == pytest.approx(float(a.finish_s.max()))
    assert a.counts["decisions"] >= a.counts["turns"]


# ---- the move rule, as the core applies it on simulated engines ----------------------------


class _Flipper(Router):
    """Every trajectory starts on engine 0 and, whenever the core asks (`stale` names every
    trajectory), asks to move to the other engine; it moves only where `move_pays` says so.
    Counts asks and moves."""

    def __init__(self) -> None:
        self.homes: dict[int, int] = {}
        self.asked = self.moved = 0

    def stale(self) -> list[int]:
        return list(self.homes)

    def route(self, t: Any, workers: Any, now: float) -> int:
        return self.homes.setdefault(t.traj_id, 0)

    def migrate(self, t: Any, workers: Any, now: float) -> int | None:
        home = self.homes.setdefault(t.traj_id, 0)
        other = 1 - home
        self.asked += 1
        if self.move_pays is not None and not self.move_pays(t, home, other):
            return None
        self.moved += 1
        self.homes[t.traj_id] = other
        return other


class _Stay(Router):
    def route(self, t: Any, workers: Any, now: float) -> int:
        return 0


def _agents(
    n: int, turns: int = 3, prompt: int = 2048, tool_s: float = 1.0
) -> list[TrajectorySpec]:
    return [
        TrajectorySpec(
            traj_id=i,
            prompt_id=i,
            sample_idx=0,
            workload=WorkloadKind.CODING,
            turns=(
                *(TurnSpec(prompt if k == 0 else 256, 256, tool_s) for k in range(turns - 1)),
                TurnSpec(256, 256, None),
            ),
        )
        for i in range(n)
    ]


def _served(
    specs: list[TrajectorySpec],
    router: Router,
    *,
    cap: int = 64,
    engines: int = 2,
    predictions: list[list[float]] | None = None,
    move_kv: bool = False,
    nodes: tuple[int, ...] = (),
) -> Any:
    """`specs` through the core over `engines` emulated engines (on `nodes`, else one node);
    by default moves prefill again (the issue 28 rule), `move_kv`: they copy the KV."""
    config = _config("least_load", "fcfs", engines=engines, cap=cap, move_kv=move_kv)
    where = nodes or (0,) * engines
    res = ServedRollout(
        specs,
        [EmulatedEngineConfig(spec=SPEC, node=where[i]) for i in range(engines)],
        config,
        predictions=predictions,
        core=lambda cfg: make_core(cfg, router=router),
    ).run()
    assert res.output_tokens == sum(t.output_tokens for s in specs for t in s.turns)
    return res


def test_moves_that_save_no_wait_are_declined() -> None:
    # Engines with room for every turn: a move saves no slot wait and would prefill the
    # context again, so the core declines every one: the run is that of a router that never
    # moves.
    flipper = _Flipper()
    res = _served(_agents(8), flipper)
    assert flipper.asked > 0 and flipper.moved == 0
    assert res.counts["migrations_declined"] == flipper.asked
    stay = _served(_agents(8), _Stay())
    assert res.makespan_s == pytest.approx(stay.makespan_s, rel=1e-12)


def test_waiting_turns_leave_a_long_queue_for_an_idle_engine() -> None:
    # One turn at a time per engine and every trajectory homed on engine 0: turns queue
    # there while engine 1 idles; the core sends them on (late binding, or a move that
    # pays), and the batch ends well before it would on engine 0 alone.
    flipper = _Flipper()
    res = _served(_agents(8), flipper, cap=1)
    assert res.counts["late_bindings"] + flipper.moved > 0
    alone = _served(_agents(8), _Stay(), cap=1, engines=1)
    assert res.makespan_s < 0.8 * alone.makespan_s


def test_moves_pay_by_their_pace_where_no_turn_waits() -> None:
    # Room for every turn, but every trajectory starts on engine 0: with long predicted
    # remainders, decoding them on the idle engine repays prefilling their contexts there,
    # so some move; predicted to end now, none do.
    specs = _agents(8)
    long, done = _Flipper(), _Flipper()
    _served(specs, long, predictions=[[1e5] * len(s.turns) for s in specs])
    assert long.moved > 0
    _served(specs, done, predictions=[[0.0] * len(s.turns) for s in specs])
    assert done.asked > 0 and done.moved == 0


def test_a_lone_trajectory_gains_no_pace_by_moving_between_idle_engines() -> None:
    # Alone on two idle engines its step is the same either side: with a long remainder it
    # still stays (in its tool call it runs nowhere, so it counts on neither side).
    specs = _agents(1)
    flipper = _Flipper()
    _served(specs, flipper, predictions=[[1e5] * len(specs[0].turns)])
    assert flipper.asked > 0 and flipper.moved == 0


def test_the_routers_time_per_turn_queues_turns_in_the_order_they_arrive() -> None:
    # Trajectory 0 goes into a 10 s tool call first, trajectory 1 into a 0.1 s one just after:
    # the router decides 1's next turn when it arrives, not after 0's (still in its tool).
    specs = [
        TrajectorySpec(traj_id=0, prompt_id=0, sample_idx=0, workload=None,
                       turns=(TurnSpec(64, 1, 10.0), TurnSpec(8, 1, None))),
        TrajectorySpec(traj_id=1, prompt_id=1, sample_idx=0, workload=None,
                       turns=(TurnSpec(64, 20, 0.1), TurnSpec(8, 1, None))),
    ]  # fmt: skip
    res = ServedRollout(
        specs, [EmulatedEngineConfig(spec=SPEC)], _config("least_load", "fcfs", engines=1),
        decision_s=0.05,
    ).run()  # fmt: skip
    assert res.finish_s[0] > 10.0
    assert res.finish_s[1] < 2.0


# ---- moves that carry their KV (Heddle §5.3) -------------------------------------------------


def test_a_move_whose_copy_the_tool_call_hides_costs_no_prefill() -> None:
    # The flipper asks every trajectory to move at every tool call. Copying the KV (about
    # 20 ms for a 2,300-token context over NVLink) hides behind the 1 s tool call: the moves
    # are made, the next turns find their contexts cached where they moved, nothing is
    # prefilled again, and the batch ends no later than with a router that never moves.
    flipper = _Flipper()
    res = _served(_agents(8), flipper, move_kv=True)
    assert flipper.moved > 0
    assert 0 < res.counts["kv_copies"] <= flipper.moved  # (a move back home copies nothing)
    assert res.counts["kv_copies_failed"] == res.counts["kv_copies_dropped"] == 0
    assert res.reprefill["migration"] == 0
    stay = _served(_agents(8), _Stay())
    assert res.cache_hit_tokens == stay.cache_hit_tokens
    assert res.prefill_tokens == stay.prefill_tokens
    assert res.makespan_s <= stay.makespan_s  # (the moves spread the decoding over two)


def test_a_copy_the_tool_call_cannot_hide_is_weighed_like_a_prefill() -> None:
    # Engines on two nodes, long contexts and tool calls of no time: the copy over the
    # network is all exposed and saves no wait, so no move is made.
    specs = _agents(4, prompt=60_000, tool_s=0.0)
    flipper = _Flipper()
    res = _served(specs, flipper, move_kv=True, nodes=(0, 1))
    assert flipper.asked > 0 and flipper.moved == 0
    assert res.counts["kv_copies"] == 0


def test_a_turn_that_comes_before_its_kv_waits_for_it_and_finds_it_cached() -> None:
    # A 3 ms tool call against a copy of about 30 ms over the network: the next turn waits
    # for its KV, then finds it cached where it moved.
    specs = _agents(2, prompt=8000, tool_s=0.003)
    flipper = _Flipper()
    res = _served(specs, flipper, move_kv=True, nodes=(0, 1), predictions=[[1e6] * 3] * 2)
    assert flipper.moved > 0 and res.counts["kv_copies"] > 0
    assert res.reprefill["migration"] == 0
    assert res.counts["kv_copied_tokens"] >= 8000
