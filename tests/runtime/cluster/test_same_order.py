"""The same operation policy objects, given the same operations and durations, run them in the
same order with the same start times in the simulator (`NodeGroupSimulator`) and in the
runtime (`ClusterDriver`, with its GroupScheduler, switch insertion and duration estimates).

The runtime runs on a virtual clock over stand-in worker groups that take exactly their
operation's duration (a switch: half its setup to offload, half to load) — the part of the
runtime that does not decide order. As in the simulator, a job calls its next operation the
moment its previous one ends."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loom.cluster.plexrl.hrrs import OP_POLICIES, OpPolicyKind
from loom.runtime.cluster.driver import ClusterDriver
from loom.runtime.cluster.launchers import FactoryLauncher
from loom.runtime.cluster.wpg import WorkerGroupConfig
from loom.sim.cluster.plexrl import GroupJob, NodeGroupSimulator

SETUP_S = 4.0


class Clock:
    def __init__(self) -> None:
        self.t = 0.0
        self.on = False  # off while the deployments start (their first offloads take no time)

    def __call__(self) -> float:
        return self.t


class StandIn:
    """A worker group that takes its operation's duration on the virtual clock and, when an
    operation ends, has its job call the next one (before the scheduler looks again). Its
    job's operations run one after another, so their durations wait in order in `durations`."""

    def __init__(self, cfg: WorkerGroupConfig, clock: Clock, on_done: Any) -> None:
        self.config, self.clock, self.on_done = cfg, clock, on_done
        self.ops_run = 0
        self.durations: list[float] = []

    def death(self) -> str | None:
        return None

    def start(self) -> StandIn:
        return self

    def check(self, op: str, payload: dict[str, Any]) -> None:
        pass  # (its payloads are the runtime's own)

    def close(self) -> None:
        pass

    def state(self, op: str, **kw: Any) -> list[Any]:
        return [0]  # the state hints have nothing to move here

    def run(self, op: str, payload: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        if op in ("offload", "load"):
            self.clock.t += SETUP_S / 2 if self.clock.on else 0.0
        else:
            self.clock.t += self.durations.pop(0)
            self.on_done(self.config.name)
        self.ops_run += 1
        return {}


def sim_order(jobs: list[GroupJob], kind: OpPolicyKind) -> list[tuple[str, str, float]]:
    sim = NodeGroupSimulator(jobs, OP_POLICIES.get(kind)(), lambda job, res: SETUP_S)
    sim.group.resident = jobs[0].job_id  # the runtime's first deployment starts resident
    res = sim.run()
    recs = sorted(res.records, key=lambda r: r.start_s)
    return [(r.job, KIND[r.name], round(r.start_s, 6)) for r in recs]


def runtime_order(jobs: list[GroupJob], kind: OpPolicyKind) -> list[tuple[str, str, float]]:
    clock = Clock()
    chains = {
        j.job_id: [(KIND[name], s) for _ in range(j.steps) for name, s in j.train_ops] for j in jobs
    }

    async def main() -> list[tuple[str, str, float]]:
        loop = asyncio.get_running_loop()
        deps: dict[str, Any] = {}
        by_name: dict[str, str] = {}
        ids: list[int] = []

        def call_next(job: str) -> None:
            if chains[job]:
                name, secs = chains[job].pop(0)
                deps[job].wpg.durations.append(secs)
                ids.append(drv.submit(deps[job].id, name, PAYLOADS[name]).op_id)

        def on_done(name: str) -> None:  # runs in the driver's worker thread
            loop.call_soon_threadsafe(call_next, by_name[name])

        drv = ClusterDriver(
            groups=1,
            policy=kind,
            clock=clock,
            default_switch_s=SETUP_S,
            launcher=FactoryLauncher(lambda cfg: StandIn(cfg, clock, on_done)),
        )
        for j in jobs:
            est = {KIND[name]: s for name, s in j.train_ops}
            assert len(est) == len(j.train_ops), "one duration per operation kind"
            deps[j.job_id] = await drv.create(
                job_id=j.job_id, model="tiny", role="actor", dp=1, group=0, estimates=est
            )
            by_name[deps[j.job_id].wpg.config.name] = j.job_id
        clock.on = True
        for j in jobs:
            call_next(j.job_id)
        while not (
            all(not c for c in chains.values()) and all(drv.ops[i].status.terminal for i in ids)
        ):
            await asyncio.sleep(0.001)
        recs = sorted((drv.ops[i] for i in ids), key=lambda r: r.started_s or 0.0)
        assert all(r.status.value == "succeeded" for r in recs)
        await drv.close()
        return [(r.job, r.kind, round(r.started_s or 0.0, 6)) for r in recs]

    return asyncio.run(main())


# the paper's training operations, and the runtime's operation kinds that carry them
OPS = ("compute_log_prob", "update_actor", "sync_weight")
KIND = {
    "compute_log_prob": "forward",
    "update_actor": "forward_backward",
    "sync_weight": "sync_weights",
}
PAYLOADS: dict[str, dict[str, Any]] = {
    "forward": {"ids": [[1, 2]]},
    "forward_backward": {"ids": [[1, 2]]},
    "sync_weights": {},
}


def make_jobs(spec: list[tuple[float, float, float]], steps: int) -> list[GroupJob]:
    return [
        GroupJob(
            job_id=f"j{i}", rollout_s=0.0, train_ops=tuple(zip(OPS, d, strict=True)), steps=steps
        )
        for i, d in enumerate(spec)
    ]


@pytest.mark.parametrize("kind", [OpPolicyKind.HRRS, OpPolicyKind.FCFS, OpPolicyKind.ROUND_ROBIN])
def test_table2_like_jobs_run_in_the_same_order(kind: OpPolicyKind) -> None:
    jobs = make_jobs([(3.0, 9.0, 1.0), (5.0, 14.0, 2.0), (2.0, 4.0, 1.0)], steps=3)
    assert runtime_order(jobs, kind) == sim_order(jobs, kind)


durations = st.tuples(*[st.integers(1, 20).map(float)] * 3)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=st.lists(durations, min_size=2, max_size=3), steps=st.integers(1, 3))
def test_hrrs_orders_agree_on_random_jobs(
    spec: list[tuple[float, float, float]], steps: int
) -> None:
    jobs = make_jobs(spec, steps)
    assert runtime_order(jobs, OpPolicyKind.HRRS) == sim_order(jobs, OpPolicyKind.HRRS)


def test_finished_operations_are_remembered_up_to_retain_ops() -> None:
    """What finished operations leave is bounded: the oldest beyond `retain_ops` are
    forgotten, and asking for one says so (not "no such operation")."""
    from loom.core.errors import NotFound

    async def main() -> None:
        clock = Clock()
        drv = ClusterDriver(
            groups=1,
            clock=clock,
            retain_ops=3,
            launcher=FactoryLauncher(lambda cfg: StandIn(cfg, clock, _noop)),
        )
        dep = await drv.create(job_id="j", model="tiny", role="actor", dp=1, group=0)
        ids = []
        for _ in range(6):
            dep.wpg.durations.append(1.0)
            rec = drv.submit(dep.id, "forward", PAYLOADS["forward"])
            ids.append(rec.op_id)
            await drv.wait(rec.op_id, 30)
        assert [i for i in ids if i in drv.ops] == ids[-3:] and drv.forgotten >= 3
        with pytest.raises(NotFound, match="forgotten"):
            await drv.wait(ids[0], 0)
        with pytest.raises(NotFound, match="no operation"):
            await drv.wait(10_000, 0)
        await drv.close()

    asyncio.run(main())


def _noop(name: str) -> None:
    return None
