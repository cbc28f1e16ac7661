"""The rollout router's executor: it turns engine streams, health checks, load reports, HTTP
requests and time into events for the router's core (`core.RouterCore`) and carries out the
commands the core returns (an attempt started at an engine or stopped, an engine probed, a
trajectory predicted, a waiter woken). It holds no decision: what a turn does next is the
core's; the simulator drives the same core (`loom.sim.rollout.served`).

All methods run on one event loop. A command never handles an event itself: an attempt's
stream, a probe or a prediction runs as a task and comes back as the next event.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import aiohttp

from loom.core.errors import Unavailable
from loom.rollout.policy import Router, TurnScheduler
from loom.runtime.rollout import events as ev
from loom.runtime.rollout.config import EngineConfig, EngineKind, RolloutServerConfig
from loom.runtime.rollout.core import UnknownTrajectory, prompt_hash
from loom.runtime.rollout.engines import (
    EngineClient,
    EngineError,
    EngineRejected,
    EngineUnreachable,
    PriorityRefused,
    make_engine,
)
from loom.runtime.rollout.events import BatchEntry
from loom.runtime.rollout.fleet import PlannedFleet
from loom.runtime.rollout.metrics import RouterMetrics
from loom.runtime.rollout.policies import check_config, make_core, stable_id
from loom.runtime.rollout.prediction import Forecasts, OnlinePredictor
from loom.runtime.rollout.registry import ClientFactory, EngineRegistry, UnknownEngine
from loom.runtime.rollout.state import EngineState, Trajectory, Turn
from loom.runtime.rollout.tokenizer import LocalTokenizer, load_tokenizer
from loom.runtime.rollout.turn import Delta, Done, TurnRequest
from loom.runtime.rollout.views import engine_view, stats

__all__ = [
    "BatchEntry",
    "RolloutDriver",
    "UnknownEngine",
    "UnknownTrajectory",
    "check_config",
    "prompt_hash",
    "stable_id",
]

log = logging.getLogger("loom.rollout")


class RolloutDriver:
    """Everything the HTTP app calls; all methods run on one event loop."""

    def __init__(
        self,
        config: RolloutServerConfig,
        *,
        router: Router | None = None,
        scheduler: TurnScheduler | None = None,
        clock: Callable[[], float] = time.monotonic,
        client_factory: ClientFactory = make_engine,
    ) -> None:
        self.config = config
        self.predictor = OnlinePredictor(config.state_dir, config.history_limit)
        self.core = make_core(
            config,
            router=router,
            scheduler=scheduler,
            prior=self.predictor.fallback,
            history=self.predictor.history,
        )
        self.clock = clock
        self._t0 = clock()
        self.metrics = RouterMetrics(self.core.ledger, lambda: list(self.engines.values()))
        self.registry = EngineRegistry(config, self.core.fleet, client_factory=client_factory)
        self.tokenizer: LocalTokenizer | None = None
        self._tokenizer_tried = False
        self._attempts: dict[int, asyncio.Task[None]] = {}  # by turn seq: its running attempt
        self._wake_at = 0.0
        self._session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self.forecasts = Forecasts(self.predictor, config.refit_every, self._spawn)
        self.fleet = PlannedFleet(config.fleet, self) if config.fleet is not None else None
        self.last_batch: int | None = None  # trajectories in the latest declared batch
        self._execute: dict[type, Callable[[Any], None]] = {
            ev.Start: self._start,
            ev.Stop: self._stop,
            ev.Probe: self._probe,
            ev.MoveKv: self._move_kv,
            ev.Predict: lambda c: self.forecasts.ask(c.trajectory),
            ev.Record: lambda c: self.forecasts.learn(c.trajectory),
            ev.TurnEnded: self._ended,
            ev.Stream: self._stream,
            ev.WakeAt: self._wake,
        }

    # ---- the core ----------------------------------------------------------------------

    def send(self, event: ev.Event) -> Any:
        """Hand `event` to the core and carry out its commands; returns its reply."""
        value = None
        for c in self.core.handle(event, self.now()):
            if type(c) is ev.Reply:
                value = c.value
            else:
                self._execute[type(c)](c)
        return value

    @property
    def router(self) -> Router:
        return self.core.router

    @property
    def scheduler(self) -> TurnScheduler:
        return self.core.scheduler

    @property
    def counts(self) -> dict[str, int]:
        return self.core.ledger.counts

    @property
    def engines(self) -> dict[str, EngineState]:
        return self.core.fleet.engines

    @property
    def trajectories(self) -> dict[str, Trajectory]:
        return self.core.trajectories

    @property
    def model(self) -> str:
        return self.registry.model

    @property
    def max_model_len(self) -> int | None:
        return self.registry.max_model_len

    @property
    def version(self) -> int:
        return self.core.version

    def live(self) -> list[EngineState]:
        return self.core.live()

    def current(self) -> list[EngineState]:
        return self.core.current()

    def load(self) -> int:
        return self.core.load()

    def held(self) -> int:
        return self.core.held_turns()

    def now(self) -> float:
        return self.clock() - self._t0

    # ---- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        cfg = self.config
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=cfg.connect_timeout_s),
            # NOTE: idle connections closed before the engines' servers close them (uvicorn's
            # keep-alive, vLLM's 5 s): a request sent as the server closes fails to write
            connector=aiohttp.TCPConnector(limit=0, force_close=False, keepalive_timeout=4.0),
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),  # engines set none; skip the jar per request
        )
        self.registry.session = self._session
        try:
            for e in cfg.engines:
                await self.add_engine(e)
            if self.fleet is not None:
                await self.fleet.start()
        except BaseException:
            if self.fleet is not None:
                await self.fleet.close()
            await self._session.close()
            raise
        self._spawn(self.registry.health_loop(self.send))
        self._spawn(self.registry.load_loop(self.send))
        self._spawn(self._tick_loop())
        self._spawn(self.forecasts.loop(self.send))
        self.forecasts.refit_if_due()

    async def close(self) -> None:
        """Stop: every held, queued and running turn ends (with an error for the client),
        every engine request is aborted."""
        for task in list(self._tasks):
            task.cancel()
        self.send(ev.Shutdown())  # (the aborts it sends the engines are new tasks)
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.fleet is not None:
            await self.fleet.close()
        if self._session is not None:
            await self._session.close()
            await asyncio.sleep(0)  # let the closed connections' transports finish closing

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _tick_loop(self) -> None:
        """Time for the core: a `Tick` whenever it said something falls due (aging, stalled
        attempts, idle trajectories)."""
        while True:
            self.send(ev.Tick())
            await asyncio.sleep(min(1.0, max(0.01, self._wake_at - self.now())))

    # ---- engines -----------------------------------------------------------------------

    async def add_engine(self, cfg: EngineConfig) -> EngineState:
        """Probe and add an engine; the placement re-plans over the new set."""
        e: EngineState = self.send(ev.EngineAdded(await self.registry.probe(cfg)))
        if not self._tokenizer_tried:
            self._tokenizer_tried = True
            await self._load_tokenizer()
        return e

    async def _load_tokenizer(self) -> None:
        source = self.config.tokenizer
        if source == "engine":
            return
        info = self.registry.first
        candidates = (
            [source] if source else [c for c in (info.root, info.model) if c] if info else []
        )
        if candidates:
            self.tokenizer = await asyncio.get_running_loop().run_in_executor(
                None, functools.partial(load_tokenizer, candidates, download=bool(source))
            )
        if self.tokenizer is None:
            log.warning(
                "no local tokenizer (%s): text prompts cost a /tokenize call to an engine",
                ", ".join(candidates) or "none given",
            )

    def remove_engine(self, eid: str, *, force: bool = False, leaving: bool = False) -> EngineState:
        """Drain an engine (`events.EngineRemoved`)."""
        e: EngineState = self.send(ev.EngineRemoved(eid, force=force, leaving=leaving))
        return e

    def take_back(self, e: EngineState) -> None:
        self.send(ev.EngineTakenBack(e))

    def engine_down(self, e: EngineState, reason: str) -> None:
        self.send(ev.EngineDown(e, reason))

    def set_weights(self, version: int, engines: Sequence[str] = ()) -> list[str]:
        behind: list[str] = self.send(ev.WeightsSet(version, tuple(engines)))
        return behind

    def report(
        self,
        eid: str,
        *,
        version: int | None = None,
        free_tokens: int | None = None,
        slack_s: float | None = None,
    ) -> EngineState:
        e: EngineState = self.send(
            ev.Report(eid, version=version, free_tokens=free_tokens, slack_s=slack_s)
        )
        return e

    # ---- commands ----------------------------------------------------------------------

    def _start(self, c: ev.Start) -> None:
        self._attempts[c.turn.seq] = self._spawn(
            self._attempt(c.engine, c.turn, c.attempt, c.priority)
        )

    def _stop(self, c: ev.Stop) -> None:
        task = self._attempts.pop(c.turn.seq, None)
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()
        if c.tell:
            self._spawn(self._abort_quietly(_client(c.engine), c.rid))

    def _probe(self, c: ev.Probe) -> None:
        self._spawn(self._probe_health(c.engine, c.reason))

    def _move_kv(self, c: ev.MoveKv) -> None:
        self._spawn(self._copy(c))

    def _ended(self, c: ev.TurnEnded) -> None:
        turn = c.turn
        self._attempts.pop(turn.seq, None)
        _watch(turn)
        turn.finished.set()
        if turn.updates is not None:
            turn.updates.put_nowait(None)

    def _stream(self, c: ev.Stream) -> None:
        _watch(c.turn).updates.put_nowait(c.delta)

    def _wake(self, c: ev.WakeAt) -> None:
        self._wake_at = c.at

    # ---- what runs as tasks ------------------------------------------------------------

    async def _attempt(
        self, e: EngineState, turn: Turn, attempt: int, priority: int | None
    ) -> None:
        """One attempt's stream from its engine, as events."""
        client = _client(e)
        sampling = turn.attempt_sampling()
        if not turn.request.stream and client.kind is EngineKind.VLLM:
            # NOTE: the router streams from the engine to keep what a turn generated; a client
            # that reads the answer whole needs no chunk per token, whose cost (the engine's
            # API server and this router, per chunk) took CPU from two-core vLLM engines
            sampling.setdefault("stream_interval", self.config.stream_interval)
        if sampling["max_tokens"] < 1:  # scoring a prompt: engines generate at least one
            sampling["max_tokens"] = 1
            sampling.pop("min_tokens", None)
        context = turn.prompt + turn.generated
        rid, logprobs = turn.rid(attempt), turn.attempt_logprobs()
        stream = client.generate(rid, context, sampling, priority, logprobs)
        send = self.send
        done: Done | None = None
        try:
            async for item in stream:
                if turn.attempt != attempt:  # stopped (defensive: we were cancelled)
                    return
                if type(item) is Delta:
                    send(ev.Chunk(turn, attempt, item))
                else:
                    done = item  # type: ignore[assignment]
        except PriorityRefused as exc:
            refused = priority is not None
            send((ev.PriorityRefused if refused else ev.AttemptRejected)(turn, attempt, exc))
            return
        except EngineRejected as exc:
            send(ev.AttemptRejected(turn, attempt, exc))
            return
        except EngineError as exc:
            # NOTE: a refused connection is a dead engine; anything else (a 5xx, a broken
            # stream, a connect that timed out on loaded cores) may be this request's
            # alone: the turn moves and the engine's health decides whether it stays in
            down = isinstance(exc, EngineUnreachable)
            send(ev.AttemptFailed(turn, attempt, e, str(exc), down=down))
            return
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
        if done is not None:
            send(ev.AttemptDone(turn, attempt, done))

    async def _abort_quietly(self, client: EngineClient, rid: str) -> None:
        with contextlib.suppress(Exception):
            await client.abort(rid)

    async def _copy(self, c: ev.MoveKv) -> None:
        """A KV copy between two engines, its end an event whatever happens."""
        tokens, seconds, error = 0, 0.0, None
        try:
            tokens, seconds = await _client(c.src).send_kv(c.tokens, c.dst.config.url)
        except (EngineError, EngineRejected) as exc:
            error = str(exc)
        except asyncio.CancelledError:
            error = "the router is shutting down"
            raise
        finally:
            self.send(ev.KvMoved(c.trajectory, c.src, c.dst, tokens, seconds, error))

    async def _probe_health(self, e: EngineState, reason: str) -> None:
        ok = await _client(e).health(self.config.engine_call_timeout_s)
        self.send(ev.Probed(e, ok, reason))

    # ---- trajectories and turns --------------------------------------------------------

    async def declare(self, entries: Sequence[BatchEntry]) -> dict[str, str]:
        """A batch before it starts: predictions for its first turns, then the placement
        plans over it. Returns each trajectory's planned engine ("" where the placement
        places turns only when they are ready)."""
        if not self.live():
            raise Unavailable("no live engine: add one with POST /v1/engines")
        predicted = await self.forecasts.first([(b.prompt_id, b.prompt_tokens) for b in entries])
        homes: dict[str, str] = self.send(ev.Declare(tuple(entries), predicted))
        self.last_batch = len(entries)
        return homes

    def end_trajectory(self, key: str) -> Trajectory:
        t: Trajectory = self.send(ev.EndTrajectory(key))
        return t

    def submit(
        self,
        key: str | None,
        prompt: list[int],
        request: TurnRequest,
        *,
        n: int = 1,
        prompt_id: int | None = None,
    ) -> list[Turn]:
        """A request of trajectory `key` (None: a one-request trajectory of its own): `n`
        turns that share the prompt."""
        turns: list[Turn] = self.send(ev.Submit(key, prompt, request, n, prompt_id))
        for turn in turns:
            _watch(turn)
        return turns

    def abort(self, rids: Iterable[str] = (), *, everything: bool = False) -> int:
        """`POST /abort_request`: end the turns of these client request ids (or every turn
        in flight) with what they generated, marked abort. Returns how many ended."""
        n: int = self.send(ev.Abort(tuple(rids), everything))
        return n

    def abandon(self, turns: Iterable[Turn]) -> None:
        """The client went away: stop its turns wherever they are, keeping what they
        generated."""
        self.send(ev.Abandon(tuple(turns)))

    async def tokenize(self, body: Mapping[str, Any]) -> list[int]:
        """Token ids of a text prompt ({"prompt", "add_special_tokens"}) or a chat request
        ({"messages", ...}): by the router's tokenizer, else by a live engine's `/tokenize`."""
        if self.tokenizer is not None:
            if "messages" in body:
                return self.tokenizer.chat(body)
            return self.tokenizer.encode(body["prompt"], bool(body.get("add_special_tokens", True)))
        ids = await self.registry.tokenize(body, self.send)
        self.counts["engine_tokenized"] += 1
        return ids

    # ---- views -------------------------------------------------------------------------

    def engine_view(self, e: EngineState) -> dict[str, Any]:
        return engine_view(e)

    def stats(self) -> dict[str, Any]:
        return stats(
            self.core,
            config=self.config,
            model=self.model,
            tokenizer=self.tokenizer,
            predictor=self.predictor,
        )


def _client(e: EngineState) -> EngineClient:
    assert e.client is not None, "a served engine has a client"
    return e.client


def _watch(turn: Turn) -> Turn:
    """Give `turn` what its client waits on: an event set once it ends and, streamed, a
    feed of its chunks."""
    if turn.finished is None:
        turn.finished = asyncio.Event()
        if turn.request.stream:
            turn.updates = asyncio.Queue()
    return turn
