"""The weight relay (ROSE §4.2): a versioned object store between training ranks, which push
weights in fixed-size buckets, and serving ranks, which pull them in large batches on demand;
members join and leave freely and versions nobody may need are dropped.

`WeightStore` is the interface; `InMemoryStore` implements it in this process, and
`loom.client.RelayClient` over HTTP against `loom serve relay` (`loom.runtime.relay.app`,
`.server`, imported on their own so that clients need not load the server)."""

from loom.runtime.relay.catchup import CatchUp, CatchUpKind, plan_catch_up
from loom.runtime.relay.errors import (
    InvalidRequestError,
    ObjectMissingError,
    RelayError,
    RelayUnreachableError,
    StoreFullError,
    UnknownMemberError,
    UnknownVersionError,
    VersionConflictError,
    VersionNeededError,
)
from loom.runtime.relay.memory import InMemoryStore, StoreStats
from loom.runtime.relay.store import Member, ObjectInfo, Role, VersionInfo, WeightStore
from loom.runtime.relay.transfer import (
    BUCKET_BYTES,
    PULL_BATCH_BYTES,
    Manifest,
    Puller,
    Pusher,
    bucket_key,
    manifest_key,
)

__all__ = [
    "BUCKET_BYTES",
    "PULL_BATCH_BYTES",
    "CatchUp",
    "CatchUpKind",
    "InMemoryStore",
    "InvalidRequestError",
    "Manifest",
    "Member",
    "ObjectInfo",
    "ObjectMissingError",
    "Puller",
    "Pusher",
    "RelayError",
    "RelayUnreachableError",
    "Role",
    "StoreFullError",
    "StoreStats",
    "UnknownMemberError",
    "UnknownVersionError",
    "VersionConflictError",
    "VersionInfo",
    "VersionNeededError",
    "WeightStore",
    "bucket_key",
    "manifest_key",
    "plan_catch_up",
]
