"""The physics the simulator enforces whatever a policy decides.

* CPU nodes share their cores among running actions by processor sharing, max-min fair per
  action (each container is one cgroup of equal weight) and capped at the action's threads. An
  action with m threads progresses at E(m)·m × (share / m) single-core seconds per second. A
  policy that hands out exclusive cores never oversubscribes a node, so its actions run at full
  speed; one that overcommits (Kubernetes limits) slows everyone on the node.
* API providers accept a call only within their concurrency and per-window quota.
* Exclusive devices: no core or GPU is held by two running actions at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from loom.sim.actions.testbed import ApiProvider, Testbed
from loom.sim.engine import Engine, EventId

__all__ = ["ApiWorld", "Claims", "CpuWorld"]

_EPS = 1e-9


@dataclass(slots=True)
class _Job:
    threads: int
    speedup: float  # E(m)·m at m = threads
    work: float  # single-core seconds left
    rate: float
    since: float
    event: EventId
    done: Callable[[], None]


class _Node:
    __slots__ = ("cores", "jobs", "threads")

    def __init__(self, cores: int) -> None:
        self.cores = cores
        self.jobs: dict[str, _Job] = {}
        self.threads = 0

    @property
    def oversubscribed(self) -> bool:
        return self.threads > self.cores


def _shares(threads: list[int], cores: float) -> list[float]:
    """Max-min fair split of `cores` among jobs wanting `threads` each (water-filling)."""
    order = sorted(range(len(threads)), key=threads.__getitem__)
    out = [0.0] * len(threads)
    left, n = float(cores), len(threads)
    for pos, i in enumerate(order):
        fair = left / (n - pos)
        if threads[i] <= fair:
            out[i] = float(threads[i])
            left -= threads[i]
        else:
            for j in order[pos:]:
                out[j] = fair
            break
    return out


class CpuWorld:
    """Processor sharing per CPU node; calls `done` when an action's work is finished."""

    def __init__(self, engine: Engine, testbed: Testbed) -> None:
        self._engine = engine
        self._nodes = {n.name: _Node(n.num_cores) for n in testbed.cpu_nodes}
        self.peak_threads = dict.fromkeys(self._nodes, 0)

    def join(
        self,
        aid: str,
        node: str,
        threads: int,
        speedup: float,
        work: float,
        done: Callable[[], None],
    ) -> None:
        st = self._nodes.get(node)
        assert st is not None, f"action {aid} was started on {node!r}, not a CPU node"
        assert aid not in st.jobs, f"action {aid} runs twice on {node}"
        now = self._engine.now
        was = st.oversubscribed
        job = _Job(threads, speedup, work, speedup, now, -1, done)
        st.jobs[aid] = job
        st.threads += threads
        self.peak_threads[node] = max(self.peak_threads[node], st.threads)
        if was or st.oversubscribed:
            self._reflow(node)
        else:
            job.event = self._engine.after(work / job.rate, self._finish, node, aid)

    def _finish(self, node: str, aid: str) -> None:
        st = self._nodes[node]
        job = st.jobs.pop(aid)
        was = st.oversubscribed
        st.threads -= job.threads
        if was:
            self._reflow(node)
        job.done()

    def _reflow(self, node: str) -> None:
        st = self._nodes[node]
        now = self._engine.now
        jobs = list(st.jobs.items())
        shares = _shares([j.threads for _, j in jobs], st.cores)
        assert sum(shares) <= st.cores + _EPS, f"node {node} hands out more than its cores"
        for (aid, job), share in zip(jobs, shares, strict=True):
            job.work = max(job.work - job.rate * (now - job.since), 0.0)
            job.since = now
            job.rate = job.speedup * min(share / job.threads, 1.0)
            if job.event >= 0:
                self._engine.cancel(job.event)
            job.event = self._engine.after(job.work / job.rate, self._finish, node, aid)

    def busy_cores(self, node: str) -> float:
        st = self._nodes[node]
        return float(min(st.threads, st.cores))


class ApiWorld:
    """Provider-side admission: concurrency and aligned quota windows per API key."""

    def __init__(self, testbed: Testbed) -> None:
        self._providers = {a.key: a for a in testbed.apis}
        self._in_flight = dict.fromkeys(self._providers, 0)
        self._window = dict.fromkeys(self._providers, -1)
        self._accepted = dict.fromkeys(self._providers, 0)
        self.rejected = 0

    def provider(self, key: str) -> ApiProvider:
        return self._providers[key]

    def admit(self, key: str, now: float) -> bool:
        p = self._providers[key]
        w = math.floor(now / p.period_s)
        if w != self._window[key]:
            self._window[key], self._accepted[key] = w, 0
        if self._in_flight[key] >= p.concurrency or (
            p.quota is not None and self._accepted[key] >= p.quota
        ):
            self.rejected += 1
            return False
        self._in_flight[key] += 1
        self._accepted[key] += 1
        return True

    def release(self, key: str) -> None:
        self._in_flight[key] -= 1
        assert self._in_flight[key] >= 0, f"{key}: more calls ended than started"

    def in_flight(self, key: str) -> int:
        return self._in_flight[key]


class Claims:
    """Exclusive devices held by running actions: a core or GPU is never held twice, and a
    node never holds more exclusive units than it has."""

    def __init__(self, testbed: Testbed) -> None:
        self._cores = {n.name: n.num_cores for n in testbed.cpu_nodes}
        self._gpus = {n.name: n.gpus for n in testbed.gpu_nodes}
        self._held: dict[tuple[str, str, int], str] = {}
        self._by_action: dict[str, list[tuple[str, str, int]]] = {}

    def claim(self, aid: str, domain: str, cores: tuple[int, ...], gpus: tuple[int, ...]) -> None:
        keys = [("cpu", domain, c) for c in cores] + [("gpu", domain, g) for g in gpus]
        for k in keys:
            owner = self._held.get(k)
            assert owner is None, f"{k[0]} {k[2]} of {domain} held by {owner} and {aid}"
            limit = self._cores if k[0] == "cpu" else self._gpus
            assert 0 <= k[2] < limit[domain], f"{k[0]} {k[2]} is not a device of {domain}"
            self._held[k] = aid
        if keys:
            self._by_action.setdefault(aid, []).extend(keys)

    def release(self, aid: str) -> None:
        for k in self._by_action.pop(aid, []):
            del self._held[k]

    @property
    def held(self) -> int:
        return len(self._held)
