"""Heddle's run-time policies: PPS ordering, rank-based migration, the transmission scheduler."""

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from loom.rollout.heddle.placement import WorkerCost
from loom.rollout.heddle.router import HeddleRouter
from loom.rollout.heddle.scheduler import ProgressivePriorityScheduler
from loom.rollout.heddle.transmission import MigrationRequest, select_batch


@dataclass
class T:
    traj_id: int
    predicted_total: float
    prompt_id: int = 0
    steps_done: int = 0
    generated: int = 0
    context: int = 0
    first_arrival_s: float = 0.0
    turn_arrival_s: float = 0.0
    host: int = -1


@dataclass
class W:
    idx: int
    tp: int
    node: int = 0
    load: int = 0

    def cached_tokens(self, traj_id):
        return 0


def test_pps_runs_longest_prediction_first_and_preempts_shorter():
    s = ProgressivePriorityScheduler()
    long, short = T(0, 9000.0), T(1, 100.0)
    assert s.key(long, 0) < s.key(short, 0)
    assert s.outranks(s.key(long, 0), s.key(short, 0))
    assert not s.outranks(s.key(short, 0), s.key(long, 0))
    assert not ProgressivePriorityScheduler(margin=1.0).outranks(-150.0, -100.0)


def _router(lengths, degrees):
    cost = lambda d: WorkerCost(token_time=1.0 / d, interference=lambda k: 1.0 + 0.5 * (k - 1))  # noqa: E731
    trajs = [T(i, float(x)) for i, x in enumerate(lengths)]
    workers = [W(j, d) for j, d in enumerate(degrees)]
    r = HeddleRouter(cost)
    r.start(trajs, workers)
    return r, trajs, workers


def test_initial_placement_follows_presorted_groups():
    r, trajs, workers = _router([100, 5, 90, 4, 3, 2], (1, 1))
    homes = [r.route(t, workers, 0.0) for t in trajs]
    assert homes[0] == homes[2] == 0  # the two long ones share the first group
    assert set(homes[i] for i in (1, 3, 4, 5)) == {1}


def test_a_trajectory_predicted_longer_migrates_to_the_long_group():
    r, trajs, workers = _router([100, 5, 90, 4, 3, 2], (1, 1))
    t = trajs[5]
    t.predicted_total = 500.0  # it turned out to be the longest
    assert r.migrate(t, workers, 1.0) == 0
    assert r.route(t, workers, 1.0) == 0
    assert r.migrate(t, workers, 2.0) is None  # already there


requests = st.lists(
    st.builds(
        MigrationRequest,
        traj_id=st.integers(0, 30),
        src=st.integers(0, 5),
        dst=st.integers(0, 5),
        tokens=st.integers(0, 10_000),
        predicted_length=st.floats(0, 1e5),
    ).filter(lambda r: r.src != r.dst),
    max_size=20,
    unique_by=lambda r: r.traj_id,
)


@given(requests, st.sets(st.integers(0, 5), max_size=3))
def test_transmission_batches_are_endpoint_exclusive_and_longest_first(pending, busy):
    chosen = select_batch(pending, busy)
    ends = [e for r in chosen for e in (r.src, r.dst)]
    assert len(ends) == len(set(ends)) and not set(ends) & busy
    # Greedy maximality: every skipped request conflicts with a chosen or busy endpoint.
    taken = set(ends) | busy
    for r in pending:
        if r not in chosen:
            assert r.src in taken or r.dst in taken
    # The longest request that touches no busy endpoint is always chosen.
    free = [r for r in pending if r.src not in busy and r.dst not in busy]
    if free:
        top = min(free, key=lambda r: (-r.predicted_length, r.traj_id))
        assert top in chosen
