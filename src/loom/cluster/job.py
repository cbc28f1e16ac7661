"""An RL job as the cluster level sees it: node counts, worst-case phase times, footprint, SLO."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from loom.core.errors import ConfigError
from loom.core.jobs import PhaseKind, PhaseSpec, RLJobSpec
from loom.core.topology import PoolRole

__all__ = ["MuxJob"]


@dataclass(frozen=True, kw_only=True)
class MuxJob:
    """One RL job for co-execution scheduling.

    Phase times are worst-case (every response at the maximum length) on the job's own
    `rollout_nodes` and `train_nodes`; `sync_s` is the model synchronization after training.
    Footprints are host GB per node to keep the job's actors warm (Table 2).
    """

    job_id: str
    size: str  # model-size key of the Table 2 and Fig. 4 tables: "3b", "7b", "14b", "32b"
    rollout_nodes: int
    train_nodes: int
    roll_s: float
    train_s: float
    sync_s: float = 0.0
    warm_s: float = 0.0  # warm-start time of one phase (load state from host memory)
    rollout_mem_gb: float = 0.0
    train_mem_gb: float = 0.0
    slo: float = 2.0
    iterations: int = 1
    arrival_s: float = 0.0
    kind: str = ""  # workload label (profile name), for reporting only
    # Worst-case rollout time on the job's training GPUs, for co-located baselines (veRL); None:
    # as on the rollout pool. See `loom.cluster.colocation`.
    colocated_roll_s: float | None = None
    # The job as submitted, when this copy was fitted to a smaller training pool (`on_train_pool`).
    submitted: MuxJob | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.rollout_nodes < 1 or self.train_nodes < 1:
            raise ConfigError(f"job {self.job_id!r}: needs >= 1 node in each pool")
        if not (self.roll_s > 0 and self.train_s > 0 and self.sync_s >= 0 and self.warm_s >= 0):
            raise ConfigError(f"job {self.job_id!r}: phase times must be > 0")
        if not self.slo >= 1.0:
            raise ConfigError(f"job {self.job_id!r}: SLO is a slowdown bound, must be >= 1")
        if self.iterations < 1:
            raise ConfigError(f"job {self.job_id!r}: iterations must be >= 1")
        if self.colocated_roll_s is not None and not self.colocated_roll_s > 0:
            raise ConfigError(f"job {self.job_id!r}: co-located rollout time must be > 0")

    @property
    def train_total_s(self) -> float:
        """Training-pool occupancy of one iteration: training then synchronization."""
        return self.train_s + self.sync_s

    @property
    def solo_s(self) -> float:
        """Worst-case iteration time alone on dedicated pools (no context switches)."""
        return self.roll_s + self.train_s + self.sync_s

    @property
    def native(self) -> MuxJob:
        """The job as submitted (itself unless fitted to a group's training pool)."""
        return self.submitted or self

    @property
    def slo_bound_s(self) -> float:
        """Longest co-executed iteration the SLO allows: relative to solo execution on the
        job's own pools, also when it trains on fewer nodes in a group."""
        return self.slo * self.native.solo_s

    def on_train_pool(self, nodes: int) -> MuxJob:
        """The job fitted to a group's training pool of `nodes` nodes (§4.2, footnote 2: the
        pool is not scaled, the arriving job's data parallelism is adjusted to its size). On
        fewer nodes than it asked for, training takes proportionally longer (data-parallel
        compute at a fixed global batch) and each node caches a proportionally larger shard of
        its state. NOTE: on a larger pool the job keeps its own degree (it trains on a subset,
        at its own speed), so the pool can shrink back when larger members leave."""
        base = self.native
        if nodes < 1:
            raise ConfigError(f"job {self.job_id!r}: a training pool needs >= 1 node")
        if nodes >= base.train_nodes:
            return base
        f = base.train_nodes / nodes
        return replace(
            base,
            train_nodes=nodes,
            train_s=base.train_s * f,
            train_mem_gb=base.train_mem_gb * f,
            submitted=base,
        )

    def to_spec(self, gpus_per_node: int = 8) -> RLJobSpec:
        """The job in the shared vocabulary."""
        phases = (
            PhaseSpec(
                kind=PhaseKind.ROLLOUT,
                pool=PoolRole.ROLLOUT,
                gpus=self.rollout_nodes * gpus_per_node,
                duration_s=self.roll_s,
                worst_case_s=self.roll_s,
                memory_gb=self.rollout_mem_gb,
            ),
            PhaseSpec(
                kind=PhaseKind.TRAIN,
                pool=PoolRole.TRAINING,
                gpus=self.train_nodes * gpus_per_node,
                duration_s=self.train_s,
                worst_case_s=self.train_s,
                memory_gb=self.train_mem_gb,
            ),
            PhaseSpec(
                kind=PhaseKind.SYNC,
                pool=PoolRole.TRAINING,
                gpus=self.train_nodes * gpus_per_node,
                duration_s=self.sync_s,
                worst_case_s=self.sync_s,
            ),
        )
        return RLJobSpec(
            job_id=self.job_id,
            model=self.size,
            phases=phases,
            iterations=self.iterations,
            arrival_s=self.arrival_s,
            slo=self.slo,
        )

    @classmethod
    def from_spec(
        cls, spec: RLJobSpec, *, size: str, gpus_per_node: int = 8, warm_s: float = 0.0
    ) -> MuxJob:
        """Read rollout, train and sync phases (worst case where given) from a job spec."""

        def phase(kind: PhaseKind) -> PhaseSpec | None:
            return next((p for p in spec.phases if p.kind == kind), None)

        roll, train, sync = phase(PhaseKind.ROLLOUT), phase(PhaseKind.TRAIN), phase(PhaseKind.SYNC)
        if roll is None or train is None:
            raise ConfigError(f"job {spec.job_id!r} needs a rollout and a train phase")
        return cls(
            job_id=spec.job_id,
            size=size,
            rollout_nodes=max(1, -(-roll.gpus // gpus_per_node)),
            train_nodes=max(1, -(-train.gpus // gpus_per_node)),
            roll_s=roll.worst_case_s or roll.duration_s,
            train_s=train.worst_case_s or train.duration_s,
            sync_s=0.0 if sync is None else (sync.worst_case_s or sync.duration_s),
            warm_s=warm_s,
            rollout_mem_gb=roll.memory_gb,
            train_mem_gb=train.memory_gb,
            slo=spec.slo,
            iterations=spec.iterations,
            arrival_s=spec.arrival_s,
        )
