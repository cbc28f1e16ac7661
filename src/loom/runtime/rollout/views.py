"""What `/v1/stats` and `/v1/engines` show of the router: plain reads of its core's state and
ledger."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from loom.runtime.rollout.state import EngineState

if TYPE_CHECKING:
    from loom.runtime.rollout.config import RolloutServerConfig
    from loom.runtime.rollout.core import RouterCore
    from loom.runtime.rollout.prediction import OnlinePredictor
    from loom.runtime.rollout.tokenizer import LocalTokenizer

__all__ = ["engine_view", "pools", "stats"]


def stats(
    core: RouterCore,
    *,
    config: RolloutServerConfig,
    model: str,
    tokenizer: LocalTokenizer | None,
    predictor: OnlinePredictor,
) -> dict[str, Any]:
    """`GET /v1/stats`: the router's settings, engines, counts and timing."""
    ledger = core.ledger
    return {
        "model": model,
        "placement": config.placement.value,
        "scheduler": config.scheduler.value,
        "tokenizer": tokenizer.source if tokenizer is not None else None,
        "engines": {e.id: engine_view(e) for e in core.fleet.engines.values()},
        "pools": pools(core.fleet.engines.values()),
        "weights_version": core.version,
        "held": core.held_turns(),
        "policy": dict(ledger.counts),
        "reprefill_tokens": dict(ledger.reprefill),
        "timing": dict(ledger.timing),
        "trajectories": {
            "active": len(core.trajectories),
            "in_flight": sum(1 for t in core.trajectories.values() if t.active),
        },
        "predictor": {
            "history": len(predictor.history),
            "fitted": predictor.model is not None,
            "fits": predictor.fits,
        },
    }


def pools(engines: Iterable[EngineState]) -> dict[str, dict[str, int]]:
    """Load per pool (ROSE): the job's dedicated engines and the serving engines lent to it."""
    out = {name: {"engines": 0, "alive": 0, "running": 0, "waiting": 0} for name in POOLS}
    for e in engines:
        p = out["lent" if e.lent else "dedicated"]
        p["engines"] += 1
        p["alive"] += e.alive
        p["running"] += len(e.running)
        p["waiting"] += len(e.waiting)
    return out


POOLS = ("dedicated", "lent")


def engine_view(e: EngineState) -> dict[str, Any]:
    """An engine as `/v1/engines` and `/v1/stats` show it."""
    return {
        "url": e.config.url,
        "kind": e.config.kind.value,
        "tp": e.tp,
        "alive": e.alive,
        "draining": e.draining,
        "max_running": e.max_running,
        "limit": e.limit if math.isfinite(e.limit) else None,
        "priority": e.send_priority,
        "reported": None
        if e.reported is None
        else {
            "running": e.reported.running,
            "waiting": e.reported.waiting,
            "kv_usage": e.reported.kv_usage,
        },
        "turn_s": e.pace.turn_s,  # its measured pace (moving averages; None: not yet)
        "start_s": e.pace.start_s,  # an attempt's start to its first token
        "token_s": e.pace.token_s,  # per decoded token after the first
        "running": len(e.running),
        "waiting": len(e.waiting),
        "load": e.load,
        "admitted": e.admitted,
        "completed": e.completed,
        "preempted": e.preempted,
        "failed_turns": e.failed_turns,
        "tokens": e.tokens,
        "lent": e.lent,
        # how its KV moves: "direct" (an emulated engine's copy), a shared store's path
        # (vLLM with Loom's connector), or None (it moves none: a move prefills again)
        "kv": None if e.kv is None else (e.kv.store or "direct"),
        "version": e.version,
        "free_tokens": e.free_tokens,
        "slack_s": e.reported_slack_s if math.isfinite(e.reported_slack_s) else None,
        "stalled": e.stalled,
    }
