"""How long moving a trajectory's KV cache between two workers takes (Heddle §5.3): its
tokens' bytes over NVLink within a node, over the scale-out network across nodes. One
formula for the simulator, the emulated engines that do the move and the router that weighs
it."""

from __future__ import annotations

from dataclasses import dataclass

from loom.core.errors import ConfigError
from loom.core.topology import GpuType, Link, LinkKind
from loom.perf.specs import gpu_spec, model_spec

__all__ = ["INTER_NODE_GBS", "KvLinks"]

INTER_NODE_GBS = 50.0  # 400 Gb/s InfiniBand per GPU, the papers' testbeds


@dataclass(frozen=True, kw_only=True)
class KvLinks:
    """What a worker's KV moves over: `kv_bytes_per_token` of its model, NVLink within its
    node (`nvlink_gbs`), the network across (`network_gbs`); `node` is where it runs."""

    node: int
    kv_bytes_per_token: int
    nvlink_gbs: float
    network_gbs: float = INTER_NODE_GBS
    store: str | None = None
    """Where a move goes through a store shared by the engines (vLLM with Loom's connector:
    `loom.runtime.engine.kv_connector`), the store's name; `nvlink_gbs` is then its rate on
    one node and the engines that reach each other are those of one store. None: the engine
    copies to another directly (the emulated engines)."""

    def __post_init__(self) -> None:
        if self.node < 0 or self.kv_bytes_per_token < 1:
            raise ConfigError("a worker's node must be >= 0 and its KV bytes per token >= 1")
        for name in ("nvlink_gbs", "network_gbs"):
            if not 0 < getattr(self, name) < float("inf"):
                raise ConfigError(f"{name} must be a finite number > 0")

    @classmethod
    def of(
        cls, model: str, gpu: GpuType | str, node: int = 0, network_gbs: float = INTER_NODE_GBS
    ) -> KvLinks:
        """A worker serving `model` on `gpu`s of `node`, from `loom.perf`'s specs."""
        return cls(
            node=node,
            kv_bytes_per_token=model_spec(model).kv_bytes_per_token,
            nvlink_gbs=gpu_spec(gpu).nvlink_gbs,
            network_gbs=network_gbs,
        )

    def reaches(self, other: KvLinks) -> bool:
        """Whether KV moves from this worker to `other`: both copy directly, or both share
        one store."""
        return self.store == other.store

    def link(self, other: KvLinks) -> Link:
        """The path from this worker to `other`: NVLink on one node, else the slower NIC."""
        if other.node == self.node:
            return Link(
                kind=LinkKind.NVLINK,
                bandwidth_gbs=min(self.nvlink_gbs, other.nvlink_gbs),
                latency_s=1e-5,
            )
        return Link(
            kind=LinkKind.INFINIBAND,
            bandwidth_gbs=min(self.network_gbs, other.network_gbs),
            latency_s=2e-5,
        )

    def transfer_s(self, tokens: int, other: KvLinks) -> float:
        """Seconds to copy `tokens` of KV from this worker to `other`."""
        return self.link(other).transfer_time_s(max(0, tokens) * self.kv_bytes_per_token)
