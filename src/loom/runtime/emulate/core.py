"""The emulated GPU engine's state: requests served by the simulator's rollout worker.

Each request becomes a one-turn trajectory of the worker (`loom.sim.rollout.worker`): its
prompt is the turn's input, its output (computed when it arrives: the model is a function of
the context) the turn's output. The worker's prefix cache is per trajectory; here a request
takes over the trajectory id of the longest cached context that begins its prompt, as an
agent's next turn begins with its last turn's context, so the worker finds that prefix
cached, as vLLM's prefix cache would. Time is the worker's `Clock`: the discrete-event
`Engine` in tests, the same `Engine` advanced by the wall clock when served
(`loom.runtime.emulate.clock`). No I/O here.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from loom.core.errors import InvalidRequest, NotFound
from loom.core.trajectory import TrajectorySpec, TrajectoryStatus, TurnSpec
from loom.rollout.engine_queue import EngineQueue, EngineSchedulingPolicy
from loom.runtime.emulate.config import EmulatedEngineConfig
from loom.runtime.emulate.tokens import Generation, generate
from loom.sim.engine import Engine
from loom.sim.rollout.state import TrajState
from loom.sim.rollout.worker import Worker

if TYPE_CHECKING:
    from loom.perf.latency import LatencyModel

__all__ = ["EmulatedEngine", "Request", "UnknownCopy"]

PREFIX_KEY = 16  # tokens that key the prefix index; shorter contexts are not cached
LOG_LIMIT = 200_000


class UnknownCopy(NotFound):
    """A KV copy this engine does not hold room for (never reserved, committed, cancelled,
    or expired)."""


class Request:
    """One completion request: its prompt, its whole output, and where the worker is with it."""

    __slots__ = (
        "admitted_s",
        "arrival_s",
        "cached",
        "finish_reason",
        "finished_s",
        "gen",
        "listener",
        "priority",
        "prompt",
        "record",
        "rid",
        "state",
        "stop_reason",
    )

    def __init__(
        self, rid: str, prompt: list[int], gen: Generation, priority: int, state: TrajState
    ) -> None:
        self.rid = rid
        self.prompt = prompt
        self.gen = gen
        self.priority = priority
        self.state = state
        self.arrival_s = 0.0
        self.admitted_s: float | None = None
        self.finished_s: float | None = None
        self.cached = 0
        self.finish_reason: str | None = None  # set once it ends: stop, length or abort
        self.stop_reason: int | None = None
        self.listener: Callable[[Request], None] | None = None  # hears its end
        self.record: dict[str, Any] = {}  # its entry in the engine's log

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def output_len(self) -> int:
        """Output tokens produced so far: all of them once it ended but by an abort."""
        if self.done and self.finish_reason != "abort":
            return len(self.gen.tokens)
        return self.state.turn_generated


class EmulatedEngine:
    """Requests in, the worker's timing out. Callers advance the clock before each call."""

    def __init__(
        self, config: EmulatedEngineConfig, clock: Engine, latency: LatencyModel | None = None
    ) -> None:
        """`latency`: the worker's latency model (default: the roofline of `config.spec`;
        a measured profile in the simulator's runs of a profiled engine)."""
        self.cfg = config
        self.eng = clock
        self.queue = EngineQueue(policy=config.scheduling_policy)
        self.latency = latency or config.latency()
        self.worker = self._worker()
        self.capacity = self.worker.capacity
        self.max_model_len = config.max_model_len or self.capacity
        self.live: dict[int, Request] = {}  # by worker trajectory id
        self._by_rid: dict[str, list[Request]] = {}
        self._index: dict[int, list[int]] = {}  # hash of the first tokens -> trajectory ids
        self._entries: dict[int, list[int]] = {}  # trajectory id -> its cached context
        self._ids = itertools.count()
        self._since_sweep = 0
        self.log: deque[dict[str, Any]] = deque(maxlen=LOG_LIMIT)
        self.counts = {
            "prompt_tokens": 0,
            "generation_tokens": 0,
            "prefix_queries": 0,
            "prefix_hits": 0,
        }
        self.finished: dict[str, int] = {"stop": 0, "length": 0, "abort": 0}
        self.links = config.links
        self._sending: dict[int, int] = {}  # cached contexts a copy reads now -> copies
        self._incoming: dict[int, tuple[list[int], Any]] = {}  # reserved -> tokens, expiry
        self.kv = {"sent": 0, "sent_tokens": 0, "received": 0, "received_tokens": 0, "expired": 0}

    def _worker(self) -> Worker:
        """The simulator's worker this engine runs (a co-serving engine runs another)."""
        return Worker(
            idx=0,
            tp=self.cfg.spec.tp,
            node=0,
            latency=self.latency,
            scheduler=self.queue,
            engine=self.eng,
            max_running=self.cfg.max_running,
            chunk_tokens=self.cfg.chunk_tokens,
            decode_reserve=self.cfg.decode_reserve,
            on_turn_done=self._turn_done,
            on_admit=self._admitted,
            requeue_in_place=True,
        )

    # ---- requests ------------------------------------------------------------------------
    def check(self, prompt: list[int], max_tokens: int, priority: int) -> None:
        """Raise InvalidRequest for what this engine would refuse."""
        if not prompt:
            raise InvalidRequest("the prompt is empty")
        if max_tokens < 1:
            raise InvalidRequest(f"max_tokens must be at least 1, got {max_tokens}")
        if len(prompt) + max_tokens > self.max_model_len:
            raise InvalidRequest(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"you requested {len(prompt) + max_tokens} tokens ({len(prompt)} in the "
                f"messages, {max_tokens} in the completion)."
            )
        if priority != 0 and self.cfg.scheduling_policy is EngineSchedulingPolicy.FCFS:
            raise InvalidRequest(f"Got priority {priority} but Priority scheduling is not enabled.")

    def submit(
        self,
        rid: str,
        prompt: list[int],
        max_tokens: int,
        *,
        min_tokens: int = 0,
        ignore_eos: bool = False,
        stop_token_ids: frozenset[int] = frozenset(),
        priority: int = 0,
    ) -> Request:
        self.check(prompt, max_tokens, priority)
        gen = generate(
            prompt,
            max_tokens,
            min_tokens=min_tokens,
            ignore_eos=ignore_eos,
            stop_token_ids=stop_token_ids,
        )
        tid, cached = self._match(prompt)
        if tid < 0:
            tid = next(self._ids)
        state = _one_turn(tid, len(prompt) - cached, len(gen.tokens))
        state.context = cached  # the prefix cached here when it arrived, if still there then
        entry = self._entries.get(tid)
        if entry is not None and cached < len(entry):
            # a context that diverges from the prompt (an aborted request's last token, which
            # its client never saw): keep the common part, as a block cache would
            self.worker.put_idle(state, cached)
            self._remember(tid, entry[:cached])
        state.first_arrival_s = self.eng.now
        req = Request(rid, prompt, gen, priority, state)
        req.arrival_s = self.eng.now
        req.record = {
            "rid": rid,
            "arrival_s": req.arrival_s,
            "admitted_s": None,
            "finished_s": None,
            "prompt_tokens": len(prompt),
            "max_tokens": max_tokens,
            "output_tokens": None,
            "cached_tokens": None,
            "finish_reason": None,
            "priority": priority,
        }
        self.log.append(req.record)
        self.live[tid] = req
        self._by_rid.setdefault(rid, []).append(req)
        self.queue.priorities[tid] = float(priority)
        self.counts["prompt_tokens"] += len(prompt)
        self.worker.enqueue(state)
        return req

    def abort(self, rid: str) -> int:
        """End every request named `rid` that has not ended, with what it generated so far;
        how many it ended."""
        return sum(self.abort_request(req) for req in list(self._by_rid.get(rid, ())))

    def abort_all(self) -> int:
        return sum(self.abort_request(req) for req in list(self.live.values()))

    def abort_request(self, req: Request) -> bool:
        """End `req` with what it generated so far; False when it had ended already (perhaps
        with the iteration just completed)."""
        if req.done or not self.worker.abort(req.state):
            return False
        tid = req.state.traj_id
        tokens = self.worker.cached_tokens(tid)
        if tokens:  # the worker keeps what it computed as a cached prefix
            self._remember(tid, (req.prompt + req.gen.tokens)[:tokens])
        self._end(req, "abort")
        return True

    def progress(self) -> Iterator[tuple[Request, int]]:
        """Each running request with its output tokens produced by now."""
        for state, n in self.worker.progress():
            yield self.live[state.traj_id], n

    # ---- KV moves (Heddle §5.3): this engine's two ends of a copy --------------------------
    def hold_prefix(self, tokens: list[int]) -> tuple[int, int]:
        """The cached context sharing the longest beginning with `tokens`, pinned (never
        evicted) while a copy of it goes to another engine: (its id, tokens shared); (-1, 0)
        where none is cached here."""
        tid, n = self._match(tokens)
        if tid < 0:
            return -1, 0
        self._sending[tid] = self._sending.get(tid, 0) + 1
        self.worker.pinned.add(tid)
        return tid, n

    def release_prefix(self, tid: int, tokens: int = 0) -> None:
        """A copy of `hold_prefix`'s context ended (`tokens` sent; 0: it failed)."""
        left = self._sending.get(tid, 0) - 1
        if left > 0:
            self._sending[tid] = left
        else:
            self._sending.pop(tid, None)
            self.worker.pinned.discard(tid)
            self.worker.poke()  # its room may be evicted again
        if tokens > 0:
            self.kv["sent"] += 1
            self.kv["sent_tokens"] += tokens

    def reserve_prefix(self, tokens: list[int], hold_s: float) -> int | None:
        """Room for a copy of `tokens`' KV arriving from another engine, held from now (the
        blocks are taken during the copy) until `commit_prefix`, `cancel_prefix` or `hold_s`
        from now; the copy's id, or None where it cannot fit."""
        if len(tokens) < PREFIX_KEY:
            raise InvalidRequest(f"a KV copy needs at least {PREFIX_KEY} tokens, got {len(tokens)}")
        if not 0 < hold_s < float("inf"):
            raise InvalidRequest(f"hold_s must be a finite number > 0, got {hold_s}")
        cid = next(self._ids)
        state = _one_turn(cid, len(tokens), 1)
        state.status = TrajectoryStatus.FINISHED  # no request of its own reads it here
        if not self.worker.put_idle(state, len(tokens)):
            return None
        self.worker.pinned.add(cid)
        expiry = self.eng.after(hold_s, self._expire, cid)
        self._incoming[cid] = (list(tokens), expiry)
        return cid

    def commit_prefix(self, cid: int) -> int:
        """The copy `cid` arrived: its KV is a cached prefix the next request that begins
        with its tokens finds here. Returns the tokens it holds."""
        tokens, expiry = self._take(cid)
        self.eng.cancel(expiry)
        self._remember(cid, tokens)
        self.kv["received"] += 1
        self.kv["received_tokens"] += len(tokens)
        return len(tokens)

    def cancel_prefix(self, cid: int) -> None:
        """The copy `cid` will not arrive: free its room."""
        _, expiry = self._take(cid)
        self.eng.cancel(expiry)
        self.worker.drop_idle(cid)
        self.worker.poke()

    def _take(self, cid: int) -> tuple[list[int], Any]:
        entry = self._incoming.pop(cid, None)
        if entry is None:
            raise UnknownCopy(f"no KV copy {cid} is on its way here (expired or never reserved)")
        self.worker.pinned.discard(cid)
        return entry

    def _expire(self, cid: int) -> None:
        if cid in self._incoming:
            self._incoming.pop(cid)
            self.worker.pinned.discard(cid)
            self.worker.drop_idle(cid)
            self.kv["expired"] += 1
            self.worker.poke()

    # ---- views ---------------------------------------------------------------------------
    @property
    def running(self) -> int:
        return len(self.worker.running)

    @property
    def waiting(self) -> int:
        return len(self.worker.waiting)

    @property
    def kv_usage(self) -> float:
        """KV memory held by running requests, of the capacity (cached prefixes are free to
        evict, as vLLM counts them)."""
        return self.worker.used / self.capacity if self.capacity else 0.0

    # ---- the worker's callbacks ----------------------------------------------------------
    def _admitted(self, state: TrajState, cached: int) -> None:
        req = self.live[state.traj_id]
        if req.admitted_s is None:
            req.admitted_s = self.eng.now
            req.cached = cached
            req.record.update(admitted_s=req.admitted_s, cached_tokens=cached)
            self.counts["prefix_queries"] += len(req.prompt)
            self.counts["prefix_hits"] += cached

    def _turn_done(self, state: TrajState, worker: Worker) -> None:
        req = self.live[state.traj_id]
        state.status = TrajectoryStatus.FINISHED
        context = req.prompt + req.gen.tokens
        if worker.put_idle(state, len(context)):
            self._remember(state.traj_id, context)
        req.stop_reason = req.gen.stop_reason
        self._end(req, req.gen.finish_reason)

    def _end(self, req: Request, reason: str) -> None:
        req.finish_reason = reason
        req.finished_s = self.eng.now
        tid = req.state.traj_id
        del self.live[tid]
        self.queue.priorities.pop(tid, None)
        same = self._by_rid[req.rid]
        same.remove(req)
        if not same:
            del self._by_rid[req.rid]
        self.counts["generation_tokens"] += req.output_len
        self.finished[reason] += 1
        req.record.update(
            finished_s=req.finished_s, output_tokens=req.output_len, finish_reason=reason
        )
        if req.listener is not None:
            req.listener(req)

    # ---- prefix index --------------------------------------------------------------------
    def _match(self, prompt: list[int]) -> tuple[int, int]:
        """The trajectory id of the context cached here that shares the longest beginning
        with `prompt` and that no live request holds, with the length they share; (-1, 0)
        when there is none."""
        if len(prompt) < PREFIX_KEY:
            return -1, 0
        key = hash(tuple(prompt[:PREFIX_KEY]))
        ids = self._index.get(key)
        best, best_n = -1, 0
        for tid in list(ids or ()):
            tokens = self._entries.get(tid)
            n = self.worker.cached_tokens(tid)
            if tokens is None or n != len(tokens):  # evicted since
                self._forget(tid)
                continue
            if tid in self.live or n <= best_n:
                continue
            common = _common(prompt, tokens)
            if common > best_n:
                best, best_n = tid, common
        return best, best_n

    def _remember(self, tid: int, context: list[int]) -> None:
        self._forget(tid)
        if len(context) < PREFIX_KEY:
            self.worker.drop_idle(tid)
            return
        self._entries[tid] = context
        self._index.setdefault(hash(tuple(context[:PREFIX_KEY])), []).append(tid)
        self._since_sweep += 1
        if self._since_sweep >= 256:
            self._sweep()

    def _forget(self, tid: int) -> None:
        tokens = self._entries.pop(tid, None)
        if tokens is None:
            return
        key = hash(tuple(tokens[:PREFIX_KEY]))
        ids = self._index[key]
        ids.remove(tid)
        if not ids:
            del self._index[key]

    def _sweep(self) -> None:
        """Forget the contexts the worker has evicted (they are never looked up again)."""
        self._since_sweep = 0
        for tid, tokens in list(self._entries.items()):
            if self.worker.cached_tokens(tid) != len(tokens):
                self._forget(tid)


def _one_turn(tid: int, input_tokens: int, output_tokens: int) -> TrajState:
    """The worker's trajectory `tid` of one turn: a request, or room for a KV copy."""
    turn = TurnSpec(input_tokens, output_tokens, None)
    spec = TrajectorySpec(traj_id=tid, prompt_id=0, sample_idx=0, workload=None, turns=(turn,))
    return TrajState(spec, ())


def _common(a: list[int], b: list[int]) -> int:
    """Length of the longest common beginning of `a` and `b` (slices compare in C)."""
    hi = min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    lo = 0  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo
