"""The store Loom's vLLM KV connector (`kv_connector.py`) moves KV through: one file per
full block of a sequence's KV, named by a hash chain over the block's tokens and every token
before it (so a block's name is its whole prefix, as vLLM's prefix cache keys it), under a
folder named by what makes KV of one engine valid in another (model, dtype, block size,
tensor-parallel degree, the cache salt). Engines that share the folder (a tmpfs on one host,
a shared file system across hosts) load each other's blocks.

Writes are atomic (a temporary name, then a rename), so a reader sees a whole block or none;
the store keeps at most `max_bytes`, the oldest blocks going first. No torch, no vLLM: the
connector holds the tensors, this holds the names and the bytes."""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from loom.core.errors import ConfigError

__all__ = ["KvStore", "block_hashes", "namespace"]

_SUFFIX = ".kv"


def namespace(*parts: object) -> str:
    """The folder name for KV that is valid exactly where every one of `parts` is equal."""
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:24]


def block_hashes(tokens: Sequence[int], block_size: int, salt: str = "") -> list[str]:
    """The names of the full blocks of `tokens`: block i's name hashes its tokens and block
    i-1's name (a chain: equal names, equal prefixes). `salt` starts the chain (a request's
    cache salt or adapter keeps its blocks apart)."""
    if block_size < 1:
        raise ConfigError(f"block_size must be >= 1, got {block_size}")
    names: list[str] = []
    parent = hashlib.sha256(b"loom-kv\0" + salt.encode()).digest()
    for i in range(len(tokens) // block_size):
        h = hashlib.sha256(parent)
        h.update(",".join(map(str, tokens[i * block_size : (i + 1) * block_size])).encode())
        parent = h.digest()
        names.append(parent.hex()[:40])
    return names


@dataclass
class KvStore:
    """Blocks of KV as files in `root/<namespace>/`, one per block and rank."""

    root: Path
    max_bytes: int = 8 << 30
    _written: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        if self.max_bytes < 1:
            raise ConfigError(f"max_bytes must be >= 1, got {self.max_bytes}")
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, name: str, rank: int = 0) -> Path:
        return self.root / f"{name}.{rank}{_SUFFIX}"

    def has(self, name: str, ranks: int = 1) -> bool:
        return all(self.path(name, r).is_file() for r in range(ranks))

    def leading(self, names: Sequence[str], start: int, ranks: int = 1) -> int:
        """How many of `names` from index `start` on are stored, without a gap."""
        n = 0
        for name in names[start:]:
            if not self.has(name, ranks):
                break
            n += 1
        return n

    def read(self, name: str, rank: int = 0) -> bytes:
        return self.path(name, rank).read_bytes()

    def write(self, name: str, data: bytes, rank: int = 0) -> bool:
        """Store a block (atomically; a block stored already is left as it is). Returns
        whether it wrote."""
        target = self.path(name, rank)
        if target.exists():
            return False
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".part-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self._written += len(data)
        if self._written > self.max_bytes // 8:
            self._written = 0
            self.trim()
        return True

    def trim(self) -> int:
        """Drop the oldest blocks until the store holds at most `max_bytes`. Returns the
        bytes dropped."""
        entries = []
        total = 0
        with os.scandir(self.root) as it:
            for e in it:
                if not e.name.endswith(_SUFFIX):
                    continue
                try:
                    st = e.stat()
                except FileNotFoundError:
                    continue
                entries.append((st.st_mtime, st.st_size, e.path))
                total += st.st_size
        dropped = 0
        for _, size, p in sorted(entries):
            if total - dropped <= self.max_bytes:
                break
            Path(p).unlink(missing_ok=True)
            dropped += size
        return dropped
