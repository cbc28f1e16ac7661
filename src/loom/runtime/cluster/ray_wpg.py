"""Worker-process groups on a Ray cluster (the `ray` extra): one Ray actor per rank, the ranks
of a deployment in one placement group (a bundle of `gpus_per_rank` GPUs and a CPU each,
packed: a deployment's data-parallel group stays together), joined by torch.distributed at
rank 0's node. The same interface as `WorkerGroup`, so the cluster service drives either.

State moves through one StateManager sidecar per Ray node (`NodeStateActor`, a named actor
that runs `python -m loom.state.sidecar` on its node): the ranks a deployment has on a node
share that node's sidecar, which keeps one copy of their replicated state.

A deployment the cluster cannot place fails within `placement_timeout_s`, saying what it
asked, and leaves nothing behind; `close` kills the actors and removes the placement group.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import asdict, dataclass, field
from typing import Any

from loom.runtime.cluster.models.ref import ModelInfo
from loom.runtime.cluster.wpg.config import WorkerGroupConfig
from loom.runtime.cluster.wpg.errors import GroupBroken, RankFailed, WorkerError
from loom.runtime.cluster.wpg.group import OneAtATime, free_port
from loom.runtime.cluster.wpg.messages import Failure, Reply, Request
from loom.runtime.cluster.wpg.rank import answer
from loom.runtime.cluster.wpg.worker import RankWorker
from loom.state.sidecar import SidecarConfig, StateSidecar

__all__ = [
    "NodeStateActor",
    "RankActor",
    "RayWorkerGroup",
]


class RankActor:
    """One rank of a deployment, in a Ray actor (wrapped with `ray.remote` on use)."""

    def __init__(
        self,
        cfg: dict[str, Any],
        rank: int,
        port: int,
        master: str,
        state: tuple[str, str],
        local: tuple[int, int],
    ) -> None:
        self._cfg, self._rank, self._port, self._master = cfg, rank, port, master
        self._state, self._local = state, local
        self._worker: RankWorker | None = None

    def join(self) -> dict[str, Any]:
        """Build the model and join the group (blocks until every rank has joined); what
        the model is (`ModelInfo`'s fields)."""
        import ray

        address, token = self._state
        gpus = ray.get_gpu_ids()
        self._worker = RankWorker(
            self._cfg | {"state_address": address},
            self._rank,
            self._port,
            bytes.fromhex(token),
            self._master,
            local=self._local,
            gpu=int(gpus[0]) if gpus else None,
        )
        return asdict(self._worker.mw.info())

    def run(self, request: Request) -> Reply:
        """The rank's answer to `request`: what a rank process would send (`wpg.rank`)."""
        assert self._worker is not None, "join first"
        return answer(self._worker, request)


def _where() -> tuple[str, int, str]:
    import ray

    return (
        str(ray.util.get_node_ip_address()),
        free_port(),
        ray.get_runtime_context().get_node_id(),
    )


def _device_slots(node_id: str) -> int:
    """Device tiers a node's sidecar keeps: one per GPU, and at least one per CPU (a CPU-only
    rank takes a CPU, and its device tier is indexed by its place among its group's ranks)."""
    import ray

    for n in ray.nodes():
        if n.get("NodeID") == node_id:
            res = n.get("Resources", {})
            return max(1, int(res.get("GPU", 0)), int(res.get("CPU", 0)))
    return 1


class NodeStateActor:
    """A node's StateManager sidecar, in a Ray actor pinned to the node (wrapped with
    `ray.remote` on use): the ranks there reach it over its Unix socket; the service calls it
    through the actor."""

    def __init__(self, config: dict[str, Any]) -> None:
        self._sc = StateSidecar(SidecarConfig(**config)).start()

    def address(self) -> tuple[str, str]:
        return self._sc.address, self._sc.token.hex()

    def call(self, op: str, kw: dict[str, Any]) -> Any:
        with self._sc.client(timeout_s=600) as c:
            return c.call(op, **kw)

    def stop(self) -> None:
        self._sc.close()


def node_sidecar(
    node_id: str, gpus: int, namespace: str | None = None, start_timeout_s: float = 60.0
) -> Any:
    """The node's sidecar actor, started on first use (one per node, shared by deployments)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    remote: Any = ray.remote(num_cpus=0)(NodeStateActor)
    return remote.options(
        name=f"loom-state/{node_id}",
        namespace=namespace,
        get_if_exists=True,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
    ).remote(asdict(SidecarConfig(gpus=gpus, start_timeout_s=start_timeout_s)))


@dataclass
class RayWorkerGroup(OneAtATime):
    config: WorkerGroupConfig
    gpus_per_rank: float = 0.0
    placement_timeout_s: float = 60.0
    _actors: list[Any] = field(default_factory=list)
    _sidecars: dict[str, Any] = field(default_factory=dict)  # node id -> its sidecar actor
    _pg: Any = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    running: str | None = None
    ops_run: int = 0
    info: ModelInfo | None = None
    _pending: list[Any] = field(default_factory=list)  # results a failed operation left out

    def start(self) -> RayWorkerGroup:
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        cfg = self.config
        bundle = {"CPU": 1.0, **({"GPU": self.gpus_per_rank} if self.gpus_per_rank else {})}
        pg = placement_group([bundle] * cfg.dp, strategy="PACK", name=f"loom-wpg/{cfg.name}")
        if not pg.wait(timeout_seconds=self.placement_timeout_s):
            remove_placement_group(pg)
            raise WorkerError(
                f"{cfg.name}: the cluster did not place {cfg.dp} ranks of {bundle} within "
                f"{self.placement_timeout_s:.0f} s (free: {ray.available_resources()})"
            )
        self._pg = pg

        def on(i: int) -> Any:
            return PlacementGroupSchedulingStrategy(
                placement_group=pg, placement_group_bundle_index=i
            )

        try:
            where = ray.get(
                [
                    ray.remote(num_cpus=0)(_where).options(scheduling_strategy=on(r)).remote()
                    for r in range(cfg.dp)
                ],
                timeout=self.placement_timeout_s,
            )
            master, port, _ = where[0]
            nodes = [w[2] for w in where]
            spec = asdict(cfg) | {"state_dir": str(cfg.state_dir or "/tmp/loom-wpg")}
            # one sidecar per node the ranks landed on; it and the ranks start within the
            # group's start timeout, as a process group's do
            wait_s = cfg.start_timeout_s
            for node in dict.fromkeys(nodes):
                self._sidecars[node] = node_sidecar(
                    node, _device_slots(node), start_timeout_s=wait_s
                )
            addresses = dict(
                zip(
                    self._sidecars,
                    ray.get([a.address.remote() for a in self._sidecars.values()], timeout=wait_s),
                    strict=True,
                )
            )
            actor = ray.remote(RankActor)
            for rank in range(cfg.dp):
                node = nodes[rank]
                local = (nodes[:rank].count(node), nodes.count(node))
                self._actors.append(
                    actor.options(
                        num_cpus=1,
                        num_gpus=self.gpus_per_rank,
                        scheduling_strategy=on(rank),
                        name=f"loom-wpg/{cfg.name}/{rank}",
                    ).remote(spec, rank, port, master, addresses[node], local)
                )
            infos = ray.get([a.join.remote() for a in self._actors], timeout=wait_s)
            self.info = ModelInfo(**infos[0])
        except Exception as exc:
            self.close()
            raise WorkerError(f"{cfg.name}: the ranks did not start: {exc}") from None
        return self

    @property
    def alive(self) -> bool:
        return bool(self._actors)

    def death(self) -> str | None:
        return None if self._actors else "its ranks are stopped"

    def state_intact(self) -> bool:
        """NOTE: a Ray deployment is not restarted from its sidecars' state (its new ranks
        could land on other nodes than the state): a broken one is marked failed."""
        return False

    def _run_ranks(self, op: str, payload: dict[str, Any], timeout_s: float) -> list[Any]:
        import time

        import ray
        from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

        name = self.config.name
        if self._pending and not self._settle(self.config.settle_s):
            raise GroupBroken(f"{name}: ranks never finished an earlier operation")
        request = Request(op=op, payload=payload)
        refs = [a.run.remote(request) for a in self._actors]
        rank_of = {r: i for i, r in enumerate(refs)}
        pending, results = list(refs), {}
        deadline = time.monotonic() + timeout_s
        while pending:
            left = deadline - time.monotonic()
            ready, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, left))
            if not ready:
                self._pending = pending
                raise GroupBroken(f"{name}: {op} ran past its deadline of {timeout_s:g} s")
            rank = rank_of[ready[0]]
            try:
                reply = ray.get(ready[0], timeout=0)
            except RayTaskError as exc:  # fail now: the others may wait in a collective
                self._pending = pending
                cause = exc.cause if exc.cause is not None else exc
                raise RankFailed(
                    f"{name} {op}: rank {rank}: {type(cause).__name__}: {cause}",
                    frozenset(rank_of[r] for r in pending),
                ) from None
            except (RayActorError, GetTimeoutError) as exc:
                self._pending = pending
                raise GroupBroken(f"{name}: rank {rank} is gone during {op}: {exc}") from None
            except Exception as exc:
                self._pending = pending
                raise WorkerError(f"{name} {op}: rank {rank}: {exc}") from None
            if isinstance(reply, Failure):  # fail now: the others may wait in a collective
                self._pending = pending
                raise self._rank_failed(op, rank, reply, (rank_of[r] for r in pending))
            results[rank] = reply.result
        self._pending = []
        return [results[r] for r in range(len(refs))]

    def _settle(self, timeout_s: float) -> bool:
        import ray

        if self._pending:
            _, still = ray.wait(self._pending, num_returns=len(self._pending), timeout=timeout_s)
            if still:
                return False
            self._pending = []
        return True

    @property
    def pids(self) -> list[int]:
        """Its ranks' processes: none of this process's (Ray's workers run them)."""
        return []

    def kill(self) -> None:
        """Stop the ranks at once; the state their nodes' sidecars hold stays."""
        import ray

        for a in self._actors:
            with contextlib.suppress(Exception):
                ray.kill(a)
        self._actors, self._pending = [], []

    def state(self, op: str, **kw: Any) -> list[Any]:
        """A call on the sidecar of every node holding this group's state, one result each."""
        import ray

        actors = list(self._sidecars.values())
        if op == "checkpoint":  # every node holds the whole replicated state: one writes it
            actors = actors[:1]
        return list(ray.get([a.call.remote(op, kw) for a in actors], timeout=600))

    def close(self, *, keep_state: bool = False) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        for a in self._actors:
            with contextlib.suppress(Exception):
                ray.kill(a)
        self._actors, self._pending = [], []
        for sidecar in self._sidecars.values() if not keep_state else ():
            with contextlib.suppress(Exception):  # the node's sidecar stays for others
                ray.get(sidecar.call.remote("drop", {"dep": self.config.name}), timeout=30)
        self._sidecars = {}
        if self._pg is not None:
            remove_placement_group(self._pg)
            self._pg = None

    def __enter__(self) -> RayWorkerGroup:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
