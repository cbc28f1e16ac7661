"""The cluster service on Ray: `loom serve cluster` in a named, detached Ray actor that any
driver of the cluster finds, launching deployments as Ray worker groups (`ray_wpg`)."""

from __future__ import annotations

from typing import Any

from loom.runtime.cluster.app import BackgroundCluster

__all__ = [
    "SERVICE_NAME",
    "ClusterServiceActor",
    "connect_service",
    "deploy_service",
    "shutdown_service",
]


class ClusterServiceActor:
    """`loom serve cluster` in a Ray actor (wrapped with `ray.remote` on deploy): the service
    on this node's address, launching deployments as Ray worker groups."""

    def __init__(self, config: Any) -> None:
        import ray

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
