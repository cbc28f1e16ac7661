"""Worker-process groups (PlexRL §4.2): one logical deployment of a model — one real process per
(fake or real) GPU, joined in a torch.distributed group (gloo on the CPU) — that executes the
operations the scheduler admits, one at a time and in order.

Operations: `forward` (log-probabilities of token sequences), `forward_backward` (a policy-
gradient loss, gradients averaged over the data-parallel ranks), `optim_step` (Adam),
`generate` (greedy), `save_ckpt` / `load_ckpt`, `sync_weights` (the weights' version and
digest, which every replica must agree on), and the state moves the scheduler inserts on a job
change: `offload` (to host or disk) and `load`. State moves go through the node's StateManager
sidecar (`loom.state.sidecar`): every rank exports its memory and the sidecar copies each
logical tensor once (data-parallel replicas are stored once); on `load` each rank gets fresh
buffers the sidecar fills. While offloaded, a deployment refuses to compute (`nothing runs
unless its state is on the device`). Checkpoints are materialised by the sidecar from the state
it manages; `sync_weights` with a `tp` also cuts the rollout shards of a tensor-parallel layout
from it, each target rank fetching only its slices.

A group run alone starts a sidecar of its own; the cluster service gives every group on a node
the node's sidecar (`state_address`).

Failures: every rank checks a payload before it computes (`payloads`), so a payload no rank can
run fails on all of them alike. An operation fails at the first rank that raises
(`RankFailed`), without waiting for the others, which may be blocked in a collective for the
rank that gave up; `settle` then waits a short while for them. A rank that dies, an operation
past its deadline or ranks that never settle make the group unusable (`GroupBroken`): its owner
`kill`s it. Ranks and a private sidecar are tied to the process that started them
(`loom.proc.lifeline`): they die with it, by whatever signal.

The package: `group` (the group's side: `WorkerGroup`, `OneAtATime`, the `Workers` protocol),
`rank` (a rank's process and its serving loop), `worker` (`RankWorker`: what one rank
computes), `messages` (the typed, versioned messages between the two sides), `config`
(`WorkerGroupConfig`, read by both) and `errors` (`WorkerError` and its kinds).
"""

from loom.runtime.cluster.wpg.config import WorkerGroupConfig, check_op
from loom.runtime.cluster.wpg.errors import (
    BadMessage,
    FailureKind,
    GroupBroken,
    RankFailed,
    WorkerError,
)
from loom.runtime.cluster.wpg.group import OneAtATime, WorkerGroup, Workers, drop_state
from loom.runtime.cluster.wpg.messages import OPS, VERSION

__all__ = [
    "OPS",
    "VERSION",
    "BadMessage",
    "FailureKind",
    "GroupBroken",
    "OneAtATime",
    "RankFailed",
    "WorkerError",
    "WorkerGroup",
    "WorkerGroupConfig",
    "Workers",
    "check_op",
    "drop_state",
]
