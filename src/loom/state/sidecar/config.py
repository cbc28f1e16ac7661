"""A node sidecar's configuration: its tiers' capacities, its device, its listeners, its
deadlines and how it copies."""

from __future__ import annotations

from dataclasses import dataclass

from loom.core.errors import ConfigError
from loom.state.copy import DEFAULT_CHUNK_BYTES, DEFAULT_STREAMS

__all__ = ["SidecarConfig"]


@dataclass(frozen=True, kw_only=True)
class SidecarConfig:
    gpus: int = 1
    device_bytes: int | None = None  # per GPU: its memory; on a CPU node, the node's memory
    host_bytes: int = 1 << 30
    disk_bytes: int = 4 << 30
    disk_dir: str = ""  # a private temporary directory when empty
    device: str | None = None  # "cuda" where there is one, else "cpu"
    pin_host: bool | None = None  # pinned host memory where CUDA is present
    tcp_host: str | None = None  # also listen on TCP (host, a free port): peers migrate here
    collective_timeout_s: float = 120.0
    start_timeout_s: float = 60.0
    # copies in chunks of this many bytes on this many CUDA streams; 0: whole and one at a time
    copy_chunk_bytes: int = DEFAULT_CHUNK_BYTES
    copy_streams: int = DEFAULT_STREAMS

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise ConfigError(f"a sidecar needs gpus >= 1, got {self.gpus}")
        if min(self.device_bytes or 0, self.host_bytes, self.disk_bytes) < 0:
            raise ConfigError("tier capacities must be >= 0 bytes")
        if self.copy_chunk_bytes < 0 or self.copy_streams < 0:
            raise ConfigError("copy_chunk_bytes and copy_streams must be >= 0")
