"""The StateManager as a per-node sidecar process (PlexRL §5.3), serving the node's workers and
the scheduler typed calls over a Unix (or TCP) socket; workers share their memory, the sidecar
copies.

`wire` holds the messages and the handshake, `shm` the shared memory, `server` the daemon,
`client` the `StateClient`, `process` the `StateSidecar` that starts and stops it, and
`loom.state.errors` the error family the calls raise.
"""

from loom.state.errors import BadMessage, StateError, Unauthenticated
from loom.state.sidecar.client import Loaded, StateClient
from loom.state.sidecar.config import SidecarConfig
from loom.state.sidecar.process import StateSidecar
from loom.state.sidecar.server import serve
from loom.state.sidecar.shm import alloc_targets, export_tensors
from loom.state.sidecar.wire import TOKEN_ENV, VERSION

__all__ = [
    "TOKEN_ENV",
    "VERSION",
    "BadMessage",
    "Loaded",
    "SidecarConfig",
    "StateClient",
    "StateError",
    "StateSidecar",
    "Unauthenticated",
    "alloc_targets",
    "export_tensors",
    "serve",
]
