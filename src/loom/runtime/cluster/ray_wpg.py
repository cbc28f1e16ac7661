"""Worker-process groups on a Ray cluster (the `ray` extra): one Ray actor per rank, the ranks
of a deployment in one placement group (a bundle of `gpus_per_rank` GPUs and a CPU each,
packed: a deployment's data-parallel group stays together), joined by torch.distributed at
rank 0's node. The same interface as `WorkerGroup`, so the cluster service drives either.

A deployment the cluster cannot place fails within `placement_timeout_s`, saying what it
asked, and leaves nothing behind; `close` kills the actors and removes the placement group.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, field
from typing import Any

from loom.runtime.cluster.wpg import OPS, WorkerError, WorkerGroupConfig, _free_port, _Worker

__all__ = [
    "ClusterServiceActor",
    "RankActor",
    "RayWorkerGroup",
    "connect_service",
    "deploy_service",
    "shutdown_service",
]


class RankActor:
    """One rank of a deployment, in a Ray actor (wrapped with `ray.remote` on use)."""

    def __init__(self, cfg: dict[str, Any], rank: int, port: int, master: str) -> None:
        self._cfg, self._rank, self._port, self._master = cfg, rank, port, master
        self._worker: _Worker | None = None

    def join(self) -> bool:
        """Build the model and join the group (blocks until every rank has joined)."""
        self._worker = _Worker(self._cfg, self._rank, self._port, self._master)
        return True

    def run(self, op: str, payload: dict[str, Any]) -> dict[str, Any]:
        assert self._worker is not None, "join first"
        return self._worker.run(op, payload)


def _where() -> tuple[str, int]:
    import ray

    return str(ray.util.get_node_ip_address()), _free_port()


@dataclass
class RayWorkerGroup:
    config: WorkerGroupConfig
    gpus_per_rank: float = 0.0
    placement_timeout_s: float = 60.0
    _actors: list[Any] = field(default_factory=list)
    _pg: Any = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    running: str | None = None
    ops_run: int = 0

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
            master, port = ray.get(
                ray.remote(num_cpus=0)(_where).options(scheduling_strategy=on(0)).remote(),
                timeout=self.placement_timeout_s,
            )
            spec = asdict(cfg) | {"state_dir": str(cfg.state_dir or "/tmp/loom-wpg")}
            actor = ray.remote(RankActor)
            for rank in range(cfg.dp):
                self._actors.append(
                    actor.options(
                        num_cpus=1,
                        num_gpus=self.gpus_per_rank,
                        scheduling_strategy=on(rank),
                        name=f"loom-wpg/{cfg.name}/{rank}",
                    ).remote(spec, rank, port, master)
                )
            ray.get([a.join.remote() for a in self._actors], timeout=cfg.start_timeout_s)
        except Exception as exc:
            self.close()
            raise WorkerError(f"{cfg.name}: the ranks did not start: {exc}") from None
        return self

    @property
    def alive(self) -> bool:
        return bool(self._actors)

    def run(
        self, op: str, payload: dict[str, Any] | None = None, timeout_s: float = 600.0
    ) -> dict[str, Any]:
        import ray

        if op not in OPS:
            raise WorkerError(f"unknown operation {op!r}")
        if not self._lock.acquire(blocking=False):
            raise WorkerError(
                f"{self.config.name}: {self.running} is running; one operation at a time"
            )
        try:
            self.running = op
            try:
                replies = ray.get(
                    [a.run.remote(op, payload or {}) for a in self._actors], timeout=timeout_s
                )
            except Exception as exc:
                raise WorkerError(f"{self.config.name} {op}: {exc}") from None
            if op == "sync_weights" and len({r["digest"] for r in replies}) != 1:
                raise WorkerError(f"{self.config.name}: replicas disagree on the weights")
            self.ops_run += 1
            result: dict[str, Any] = replies[0]
            return result
        finally:
            self.running = None
            self._lock.release()

    def close(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        for a in self._actors:
            ray.kill(a)
        self._actors = []
        if self._pg is not None:
            remove_placement_group(self._pg)
            self._pg = None

    def __enter__(self) -> RayWorkerGroup:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class ClusterServiceActor:
    """`loom serve cluster` in a Ray actor (wrapped with `ray.remote` on deploy): the service
    on this node's address, launching deployments as Ray worker groups."""

    def __init__(self, config: Any) -> None:
        import ray

        from loom.runtime.cluster.app import BackgroundCluster

        host = config.host if config.host != "auto" else str(ray.util.get_node_ip_address())
        self._svc = BackgroundCluster(
            config.model_copy(update={"host": host, "launcher": "ray"})
        ).start()

    def url(self) -> str:
        return self._svc.url

    def stop(self) -> None:
        self._svc.stop()


SERVICE_NAME = "loom-cluster"


def deploy_service(
    config: Any, *, name: str = SERVICE_NAME, namespace: str | None = None
) -> tuple[Any, str]:
    """Start the cluster service as a named, detached Ray actor (any driver of the cluster
    finds it with `connect_service`); returns the actor and the service's URL."""
    import ray

    remote: Any = ray.remote(num_cpus=0)(ClusterServiceActor)
    actor = remote.options(name=name, namespace=namespace, lifetime="detached").remote(config)
    return actor, str(ray.get(actor.url.remote(), timeout=120))


def connect_service(*, name: str = SERVICE_NAME, namespace: str | None = None) -> tuple[Any, str]:
    import ray

    actor = ray.get_actor(name, namespace=namespace)
    return actor, str(ray.get(actor.url.remote(), timeout=60))


def shutdown_service(actor: Any) -> None:
    """Stop the service (its deployments' actors and placement groups go with it), then the
    actor itself."""
    import ray

    ray.get(actor.stop.remote(), timeout=120)
    ray.kill(actor)
