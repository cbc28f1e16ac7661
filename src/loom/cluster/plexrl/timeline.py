"""PlexRL's spatio-temporal resource view (§4.3.1, §5.2.1): a cyclic horizon of one-second
slots held in a ring buffer, a global capacity profile (free nodes per slot) under a lazy
segment tree for O(log L) range-min gang checks, and per-node free-interval sets.

Time is absolute (seconds since the scheduler started); slot `t` lives at `t mod L`, so the
horizon [now, now + L) slides without shifting arrays. A range that wraps the ring splits in
two. A commit reserves a job's periodic footprint over the whole horizon at once (atomic
reservation): the global profile drops by the job's node count and each of its nodes loses
those intervals; a node never holds two jobs in one slot.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from sortedcontainers import SortedList

from loom.core.errors import ConfigError

__all__ = [
    "HORIZON_SLOTS",
    "Footprint",
    "IntervalSet",
    "MinSegmentTree",
    "Timeline",
]

HORIZON_SLOTS = 28_800  # §5.2.1: an 8-hour horizon of one-second slots


class MinSegmentTree:
    """Range add, range min over `size` integer slots (lazy, iterative: the pending add of a
    node applies to its whole subtree, pushed down only on the paths a query walks)."""

    __slots__ = ("_d", "_h", "_n", "_t", "size")

    def __init__(self, size: int, value: int = 0) -> None:
        if size < 1:
            raise ConfigError(f"a segment tree needs >= 1 slot, got {size}")
        self.size = size
        self._h = max(1, (size - 1).bit_length())
        self._n = 1 << self._h
        inf = math.inf
        self._t: list[float] = [inf] * (2 * self._n)
        self._d: list[float] = [0.0] * self._n
        for i in range(size):
            self._t[self._n + i] = value
        for i in range(self._n - 1, 0, -1):
            self._t[i] = min(self._t[2 * i], self._t[2 * i + 1])

    def _apply(self, p: int, v: float) -> None:
        self._t[p] += v
        if p < self._n:
            self._d[p] += v

    def _build(self, p: int) -> None:
        t, d = self._t, self._d
        while p > 1:
            p >>= 1
            t[p] = min(t[2 * p], t[2 * p + 1]) + d[p]

    def _push(self, p: int) -> None:
        t, d = self._t, self._d
        for s in range(self._h, 0, -1):
            i = p >> s
            if d[i] != 0:
                t[2 * i] += d[i]
                t[2 * i + 1] += d[i]
                if 2 * i < self._n:
                    d[2 * i] += d[i]
                    d[2 * i + 1] += d[i]
                d[i] = 0

    def add(self, lo: int, hi: int, value: float) -> None:
        """Add `value` to slots [lo, hi)."""
        if not 0 <= lo <= hi <= self.size:
            raise ConfigError(f"range [{lo}, {hi}) outside [0, {self.size})")
        if lo == hi:
            return
        n = self._n
        left, right = lo + n, hi + n
        lo0, hi0 = left, right
        while left < right:
            if left & 1:
                self._apply(left, value)
                left += 1
            if right & 1:
                right -= 1
                self._apply(right, value)
            left >>= 1
            right >>= 1
        self._build(lo0)
        self._build(hi0 - 1)

    def min(self, lo: int, hi: int) -> float:
        """The least value over slots [lo, hi) (+inf for an empty range)."""
        if not 0 <= lo <= hi <= self.size:
            raise ConfigError(f"range [{lo}, {hi}) outside [0, {self.size})")
        if lo == hi:
            return math.inf
        n, t = self._n, self._t
        left, right = lo + n, hi + n
        self._push(left)
        self._push(right - 1)
        res = math.inf
        while left < right:
            if left & 1:
                res = min(res, t[left])
                left += 1
            if right & 1:
                right -= 1
                res = min(res, t[right])
            left >>= 1
            right >>= 1
        return res

    def values(self) -> list[float]:
        """Every slot's value (for tests and plots)."""
        return [self.min(i, i + 1) for i in range(self.size)]


class IntervalSet:
    """Sorted, disjoint, merged half-open intervals [s, e) of integers (a node's free time)."""

    __slots__ = ("_iv",)

    def __init__(self, intervals: Iterable[tuple[int, int]] = ()) -> None:
        self._iv: SortedList = SortedList()
        for s, e in intervals:
            self.add(s, e)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(self._iv)

    def __len__(self) -> int:
        return len(self._iv)

    def add(self, s: int, e: int) -> None:
        """Free [s, e), merging with neighbours."""
        if s >= e:
            return
        iv = self._iv
        i = iv.bisect_left((s, s))
        if i > 0 and iv[i - 1][1] >= s:
            i -= 1
        while i < len(iv) and iv[i][0] <= e:
            s, e = min(s, iv[i][0]), max(e, iv[i][1])
            del iv[i]
        iv.add((s, e))

    def remove(self, s: int, e: int) -> None:
        """Take [s, e) out; it must be free (a commit never books busy time)."""
        if s >= e:
            return
        w = self.window(s)
        if w is None or w[1] < e:
            raise ConfigError(f"[{s}, {e}) is not free")
        self._iv.remove(w)
        if w[0] < s:
            self._iv.add((w[0], s))
        if e < w[1]:
            self._iv.add((e, w[1]))

    def window(self, t: int) -> tuple[int, int] | None:
        """The free interval holding time `t`, if any."""
        iv = self._iv
        i = iv.bisect_right((t, math.inf)) - 1
        if i >= 0 and iv[i][0] <= t < iv[i][1]:
            w: tuple[int, int] = iv[i]
            return w
        return None

    def covers(self, s: int, e: int) -> bool:
        """Whether [s, e) is free."""
        w = self.window(s)
        return w is not None and e <= w[1]

    def overlapping(self, s: int, e: int) -> list[tuple[int, int]]:
        """The free intervals that meet [s, e)."""
        iv = self._iv
        i = max(0, iv.bisect_right((s, math.inf)) - 1)
        out = []
        while i < len(iv) and iv[i][0] < e:
            if iv[i][1] > s:
                out.append(iv[i])
            i += 1
        return out


@dataclass(frozen=True)
class Footprint:
    """A job's periodic demand: `segments` (offset, duration) within its period, repeated from
    `start` every `period` slots up to the horizon's end; it holds `nodes` while active."""

    segments: tuple[tuple[int, int], ...]
    period: int
    nodes: int = 1

    def __post_init__(self) -> None:
        if self.period < 1 or self.nodes < 1:
            raise ConfigError(f"period and nodes must be >= 1, got {self.period}, {self.nodes}")
        end = 0
        for a, d in sorted(self.segments):
            if a < end or d < 1:
                raise ConfigError(f"segments must be disjoint with durations >= 1: {self.segments}")
            end = a + d
        if end > self.period:
            raise ConfigError(f"segments end at {end}, past the period {self.period}")

    def occurrences(self, start: int, until: int) -> Iterator[tuple[int, int]]:
        """Absolute [s, e) of every segment from `start` that begins before `until`."""
        k = 0
        while start + k * self.period < until:
            base = start + k * self.period
            for a, d in self.segments:
                if base + a < until:
                    yield base + a, base + a + d
            k += 1


@dataclass
class Timeline:
    """The cluster's view over [now, now + horizon): global free-node counts and each node's
    free intervals. Nodes are named 0..nodes-1."""

    nodes: int
    horizon: int = HORIZON_SLOTS
    now: int = 0
    free: list[IntervalSet] = field(init=False)
    capacity: MinSegmentTree = field(init=False)
    bookings: dict[str, list[tuple[int, tuple[int, int]]]] = field(init=False)

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.horizon < 1:
            raise ConfigError(f"need >= 1 node and slot, got {self.nodes}, {self.horizon}")
        self.capacity = MinSegmentTree(self.horizon, self.nodes)
        self.free = [IntervalSet([(self.now, self.now + self.horizon)]) for _ in range(self.nodes)]
        self.bookings = {}

    # ---- the ring ------------------------------------------------------------------------
    def _ring(self, s: int, e: int) -> list[tuple[int, int]]:
        """Absolute [s, e) as ring ranges (one, or two where it wraps)."""
        if e - s > self.horizon:
            raise ConfigError(f"[{s}, {e}) is longer than the horizon ({self.horizon})")
        lo, hi = s % self.horizon, s % self.horizon + (e - s)
        if hi <= self.horizon:
            return [(lo, hi)]
        return [(lo, self.horizon), (0, hi - self.horizon)]

    def min_free(self, s: int, e: int) -> float:
        """Least free-node count over absolute [s, e) (+inf for an empty range)."""
        s, e = max(s, self.now), min(e, self.now + self.horizon)
        if s >= e:
            return math.inf
        return min(self.capacity.min(lo, hi) for lo, hi in self._ring(s, e))

    def gang_fits(self, occurrences: Iterable[tuple[int, int]], nodes: int) -> bool:
        return all(self.min_free(s, e) >= nodes for s, e in occurrences)

    # ---- booking ---------------------------------------------------------------------------
    def commit(
        self,
        job: str,
        footprint: Footprint,
        start: int,
        node_ids: Sequence[int],
        until: int | None = None,
    ) -> None:
        """Reserve `footprint` from `start` on `node_ids` over the rest of the horizon (or up to
        `until`, when the job ends); all or nothing."""
        if job in self.bookings:
            raise ConfigError(f"job {job!r} is booked already")
        if len(set(node_ids)) != footprint.nodes:
            raise ConfigError(f"{job}: needs {footprint.nodes} distinct nodes, got {node_ids}")
        end = self.now + self.horizon if until is None else min(until, self.now + self.horizon)
        occ = [(max(s, self.now), min(e, end)) for s, e in footprint.occurrences(start, end)]
        occ = [(s, e) for s, e in occ if s < e]
        for n in node_ids:
            if not 0 <= n < self.nodes:
                raise ConfigError(f"no node {n}")
            for s, e in occ:
                if not self.free[n].covers(s, e):
                    raise ConfigError(f"{job}: node {n} is not free over [{s}, {e})")
        booked = []
        for n in node_ids:
            for s, e in occ:
                self.free[n].remove(s, e)
                booked.append((n, (s, e)))
        for s, e in occ:
            for lo, hi in self._ring(s, e):
                self.capacity.add(lo, hi, -len(node_ids))
        self.bookings[job] = booked

    def release(self, job: str) -> None:
        """The job left: its remaining reservations are free again."""
        booked = self.bookings.pop(job, None)
        if booked is None:
            raise ConfigError(f"job {job!r} is not booked")
        per_slot: dict[tuple[int, int], int] = {}
        for n, (s, e) in booked:
            s = max(s, self.now)
            if s < e:
                self.free[n].add(s, e)
                per_slot[(s, e)] = per_slot.get((s, e), 0) + 1
        for (s, e), count in per_slot.items():
            for lo, hi in self._ring(s, e):
                self.capacity.add(lo, hi, count)

    def advance(self, now: int) -> None:
        """Slide the horizon to start at `now`. What fell into the past is given back: the ring
        slots it held become the seconds at the horizon's new far end, free everywhere (a
        job's later periods are booked by its owner's next commit)."""
        if now < self.now:
            raise ConfigError(f"time runs forward: {now} < {self.now}")
        if now == self.now:
            return
        old_end = self.now + self.horizon
        past: dict[tuple[int, int], int] = {}
        for job, booked in self.bookings.items():
            kept = []
            for n, (s, e) in booked:
                if s < now:
                    cut = min(e, now)
                    past[(s, cut)] = past.get((s, cut), 0) + 1
                if e > now:
                    kept.append((n, (max(s, now), e)))
            self.bookings[job] = kept
        for (s, e), count in past.items():
            for lo, hi in self._ring(s, e):
                self.capacity.add(lo, hi, count)
        self.now = now
        for fs in self.free:
            for s, e in fs.overlapping(-(2**62), now):
                fs.remove(s, min(e, now))
            fs.add(max(old_end, now), now + self.horizon)
