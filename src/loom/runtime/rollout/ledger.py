"""The router's counters, kept once: `/v1/stats` reads them as they are and `/metrics` renders
them for Prometheus at scrape time (`metrics.RouterMetrics`). The core counts; nothing else
does."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

__all__ = ["COUNTS", "LATENCY_BUCKETS", "REPREFILL_REASONS", "Histogram", "Ledger"]

REPREFILL_REASONS = ("placement", "migration", "late_binding", "preemption", "failover")
LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

COUNTS = {
    "decisions": "turns the placement routed",
    "fallbacks": "turns the placement sent to a dead or draining engine, placed elsewhere",
    "preemptions": "running turns evicted by an outranking one",
    "migrations": "trajectories whose home engine moved",
    "failovers": "turns resumed elsewhere after an engine failed",
    "stalls": "turns a lent engine stopped advancing (moved elsewhere)",
    "reclaimed": "turns a lent engine took off its GPU itself, for serving (moved elsewhere)",
    "held": "turns that waited in the central queue",
    "declared": "trajectories declared in a batch",
    "finished": "trajectories ended",
    "turns": "turns submitted",
    "aborted": "turns ended by an abort (the client's or the engine's)",
    "abandoned": "turns whose client went away",
    "engine_tokenized": "text prompts tokenized by an engine (no local tokenizer)",
    "late_bindings": "waiting turns a freed engine took from another's queue",
    "aged": "turns that waited max_wait_s and so ran next",
    "preemptions_declined": "outranked, but not worth a prefill again (or capped)",
    "migrations_declined": "placed elsewhere, but not worth a prefill again",
    "priority_refused": "engines that refused the priority field",
    "removed": "engines drained and forgotten",
    "moved": "turns resumed elsewhere because their draining engine left",
    "kv_copies": "KV caches copied to a trajectory's new engine during its tool call",
    "kv_copies_failed": "KV copies that failed (the next turn prefills its context again)",
    "kv_copies_dropped": "KV copies not started before the next turn came (it goes without)",
    "kv_copied_tokens": "tokens of KV copied between engines",
}


@dataclass
class Histogram:
    """Observations in cumulative-free buckets (`LATENCY_BUCKETS`, then +Inf) and their sum."""

    buckets: tuple[float, ...] = LATENCY_BUCKETS
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value

    @property
    def count(self) -> int:
        return sum(self.counts)


@dataclass
class Ledger:
    """Every count the router keeps: events by kind (`counts`), tokens prefilled again by why
    (`reprefill`), time summed over finished turns (`timing`), and two latency histograms."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTS, 0))
    # tokens an engine had computed that a turn's attempt prefills again, by why it went
    # where it went (as the router predicts them: an engine's prefix cache may keep some)
    reprefill: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REPREFILL_REASONS, 0))
    # summed over finished turns: router queueing, time to first token, decoding; and the
    # most one turn waited in the router
    timing: dict[str, float] = field(
        default_factory=lambda: {
            "turns": 0,
            "queue_s": 0.0,
            "first_token_s": 0.0,
            "decode_s": 0.0,
            "longest_wait_s": 0.0,
            "kv_copy_s": 0.0,  # the engines' seconds copying KV
            "kv_wait_s": 0.0,  # turns' seconds waiting for their KV to arrive
        }
    )
    turn_seconds: Histogram = field(default_factory=Histogram)  # arrival to end
    queueing_seconds: Histogram = field(default_factory=Histogram)  # arrival to first admission
