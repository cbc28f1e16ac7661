"""Host <-> device copies of model state, chunked and pipelined (PlexRL §4.5, §5.3).

An offload or a load is a run of tensor copies between the GPU and host memory. Done one
tensor at a time, each copy waits for the one before it: the copy engine idles while the host
issues the next, and the state's many tensors each pay that gap. `Copier` instead cuts every
copy into chunks of `chunk_bytes` and issues them, without waiting, round robin over `streams`
CUDA streams (per device), so one chunk's transfer overlaps the issue of the next and the copy
engines never wait for the host; `sync` waits for all of them. A host buffer that is not pinned
cannot take an asynchronous copy: such a copy goes through a ring of pinned staging buffers (two
per stream), the host copying one chunk into or out of staging while the GPU moves another.

Copies between two CPU tensors (a node without a GPU; shared memory) are cut into the same
chunks and done at once. `chunk_bytes=0` or `streams=0` copies each tensor whole and
synchronously, as `Tensor.copy_` does.

The rules a caller keeps: a copy is complete only once `sync` has returned; until then neither
tensor may be written, read for its new contents, or freed (the copier holds a reference to
both, so dropping yours is safe). `sync` lets go of each copy's tensors as soon as that copy is
done, while later ones still run: where that is the last reference (a worker's memory mapped by
the sidecar), its release overlaps the remaining copies. A copy is ordered after the work
already enqueued on the device's current stream when it is issued (a CUDA IPC mapping waits
there for its producer).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from loom.core.errors import ConfigError

__all__ = ["DEFAULT_CHUNK_BYTES", "DEFAULT_STREAMS", "Copier", "chunk_spans"]

DEFAULT_CHUNK_BYTES = 32 << 20
DEFAULT_STREAMS = 2


def chunk_spans(n: int, chunk: int) -> list[tuple[int, int]]:
    """The byte ranges [lo, hi) that cut `n` bytes into chunks of at most `chunk` (one range
    of everything when `chunk` is 0)."""
    if n < 0 or chunk < 0:
        raise ConfigError(f"chunk_spans needs n >= 0 and chunk >= 0, got {n}, {chunk}")
    if n == 0:
        return []
    if chunk == 0 or chunk >= n:
        return [(0, n)]
    return [(lo, min(lo + chunk, n)) for lo in range(0, n, chunk)]


def _bytes(t: Any) -> Any:
    """A contiguous tensor's bytes as a flat uint8 view."""
    import torch

    return t.reshape(-1).view(torch.uint8)


@dataclass
class _Slot:
    """A pinned staging buffer and what is pending on it: the GPU's use (an event) and, for a
    device-to-host copy, the host copy out of it that runs once that is done."""

    buf: Any
    event: Any = None
    out: Any = None  # the destination chunk of a device-to-host copy through this buffer

    def finish(self) -> None:
        if self.event is not None:
            self.event.synchronize()
            self.event = None
        if self.out is not None:
            out, self.out = self.out, None
            out.copy_(self.buf[: out.numel()])


@dataclass
class _Lane:
    """One device's streams, used round robin."""

    streams: list[Any]
    next: int = 0

    def stream(self) -> Any:
        s = self.streams[self.next]
        self.next = (self.next + 1) % len(self.streams)
        return s


@dataclass
class CopyCounters:
    """What a copier did, summed since it was made."""

    copies: int = 0
    bytes: int = 0
    chunks: int = 0
    staged_chunks: int = 0
    issue_s: float = 0.0  # time spent issuing copies (for synchronous copies, doing them)
    wait_s: float = 0.0  # time spent in sync, waiting for copies in flight


@dataclass
class Copier:
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    streams: int = DEFAULT_STREAMS
    counters: CopyCounters = field(default_factory=CopyCounters)

    def __post_init__(self) -> None:
        if self.chunk_bytes < 0 or self.streams < 0:
            raise ConfigError(
                f"copies need chunk_bytes >= 0 and streams >= 0, got {self.chunk_bytes}, "
                f"{self.streams}"
            )
        self._lanes: dict[Any, _Lane] = {}
        self._slots: list[_Slot] = []
        self._slot = 0
        self._held: list[tuple[Any, Any, list[Any]]] = []  # (dst, src, events marking its end)
        self.epoch = 0  # how many times copies in flight were waited for

    @property
    def pipelined(self) -> bool:
        return self.chunk_bytes > 0 and self.streams > 0

    @property
    def pending(self) -> bool:
        """Whether a copy may still be in flight (until `sync`)."""
        return bool(self._held)

    def copy(self, dst: Any, src: Any) -> None:
        """Copy `src` into `dst` (same shape and dtype): done when `sync` returns (CPU-to-CPU
        copies, and every copy when not pipelined, are done on return)."""
        if tuple(dst.shape) != tuple(src.shape) or dst.dtype != src.dtype:
            raise ConfigError(
                f"a copy needs the same shape and dtype: {tuple(src.shape)} {src.dtype} into "
                f"{tuple(dst.shape)} {dst.dtype}"
            )
        n = src.numel() * src.element_size()
        c = self.counters
        t0 = time.perf_counter()
        try:
            if n == 0:
                return
            c.copies += 1
            c.bytes += n
            if not self.pipelined:
                dst.copy_(src)
                c.chunks += 1
            elif not (dst.is_cuda or src.is_cuda):
                self._copy_cpu(dst, src, n)
            else:
                self._copy_cuda(dst, src, n)
        finally:
            c.issue_s += time.perf_counter() - t0

    def sync(self) -> None:
        """Wait until every copy issued so far is complete, then let go of their tensors."""
        if not self._held:
            return
        t0 = time.perf_counter()
        try:
            while self._held:  # in issue order: each copy's tensors go once it is done
                _, _, events = self._held[0]
                for e in events:
                    e.synchronize()
                del self._held[0]
            for slot in self._slots:
                slot.finish()
            for lane in self._lanes.values():
                for s in lane.streams:
                    s.synchronize()
        finally:
            for slot in self._slots:  # after a failure nothing stays pending either
                slot.event = slot.out = None
            self._held.clear()
            self.epoch += 1
            self.counters.wait_s += time.perf_counter() - t0

    # ---- internals -----------------------------------------------------------------------------
    def _copy_cpu(self, dst: Any, src: Any, n: int) -> None:
        if not (dst.is_contiguous() and src.is_contiguous()):
            dst.copy_(src)
            self.counters.chunks += 1
            return
        d, s = _bytes(dst), _bytes(src)
        for lo, hi in chunk_spans(n, self.chunk_bytes):
            d[lo:hi].copy_(s[lo:hi])
            self.counters.chunks += 1

    def _copy_cuda(self, dst: Any, src: Any, n: int) -> None:
        import torch

        device = dst.device if dst.is_cuda else src.device
        lane = self._lane(device)
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(device))
        for s in lane.streams:
            s.wait_event(ready)
        used: dict[int, Any] = {}
        self._held.append((dst, src, []))
        try:
            self._issue(dst, src, n, lane, used)
        finally:  # (also after a failure: what was issued is waited for)
            for stream in used.values():
                done = torch.cuda.Event()
                done.record(stream)
                self._held[-1][2].append(done)

    def _issue(self, dst: Any, src: Any, n: int, lane: _Lane, used: dict[int, Any]) -> None:
        import torch

        c = self.counters

        def next_stream() -> Any:
            s = lane.stream()
            used[id(s)] = s
            return s

        if dst.is_cuda and src.is_cuda:
            with torch.cuda.stream(next_stream()):
                dst.copy_(src, non_blocking=True)
            c.chunks += 1
            return
        if not (dst.is_contiguous() and src.is_contiguous()):  # rare: whole, and waited for
            with torch.cuda.stream(next_stream()):
                dst.copy_(src)
            c.chunks += 1
            return
        host = dst if src.is_cuda else src
        d, s = _bytes(dst), _bytes(src)
        pinned = host.is_pinned()
        for lo, hi in chunk_spans(n, self.chunk_bytes):
            stream = next_stream()
            c.chunks += 1
            if pinned:
                with torch.cuda.stream(stream):
                    d[lo:hi].copy_(s[lo:hi], non_blocking=True)
                continue
            c.staged_chunks += 1
            slot = self._stage()
            buf = slot.buf[: hi - lo]
            if dst.is_cuda:  # host -> staging (here), staging -> device (the stream)
                buf.copy_(s[lo:hi])
                with torch.cuda.stream(stream):
                    d[lo:hi].copy_(buf, non_blocking=True)
            else:  # device -> staging (the stream), staging -> host once it has landed
                with torch.cuda.stream(stream):
                    buf.copy_(s[lo:hi], non_blocking=True)
                slot.out = d[lo:hi]
            slot.event = torch.cuda.Event()
            slot.event.record(stream)

    def _lane(self, device: Any) -> _Lane:
        import torch

        lane = self._lanes.get(device)
        if lane is None:
            streams = [torch.cuda.Stream(device=device) for _ in range(self.streams)]
            lane = self._lanes[device] = _Lane(streams)
        return lane

    def _stage(self) -> _Slot:
        """The next staging buffer of the ring, free: what was pending on it is finished."""
        import torch

        if not self._slots:
            self._slots = [
                _Slot(torch.empty(self.chunk_bytes, dtype=torch.uint8, pin_memory=True))
                for _ in range(2 * self.streams)
            ]
        slot = self._slots[self._slot]
        self._slot = (self._slot + 1) % len(self._slots)
        slot.finish()
        return slot
