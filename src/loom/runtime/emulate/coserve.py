"""An emulated lent serving instance (ROSE §4.1): the simulator's co-serving worker
(`loom.sim.rollout.coserve.CoServingWorker`) behind the emulated engine, so that one GPU's
worth of engine serves its own model's requests (a prefiller's prefills or a decoder's
decodes, PD-disaggregated as ROSE's serving instances are) and admits rollout turns beside
them under the dual-SLO rule, on one pool of KV pages: the rollout keeps its prefix cache and
gives pages back when serving bursts.

The rollout side is the emulated engine's (`core.EmulatedEngine`): requests of the rollout
model, tokens from the deterministic generator, the same prefix index. A rollout request the
worker aborts (its pages reclaimed for serving, or stalled 2 s without progress) ends with
finish reason `abort` and what it generated, for the router to send elsewhere. Serving
requests (`serve`) carry only their lengths, as the simulator's do: a prefiller answers once
the prompt is prefilled (TTFT), a decoder once the last token is out (TPOT), both measured on
the emulated clock. No I/O here."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from loom.core.errors import InvalidRequest
from loom.perf.latency import RooflineLatencyModel
from loom.perf.specs import model_spec
from loom.rollout.rose.admission import Role, ServingSlo
from loom.rollout.rose.memory import MemorySharing, lent_memory
from loom.runtime.emulate.config import CoServeSettings, EmulatedEngineConfig
from loom.runtime.emulate.core import EmulatedEngine
from loom.sim.rollout.coserve import CoServeConfig, CoServingWorker, ServingRequest
from loom.sim.rollout.state import TrajState
from loom.sim.rollout.worker import Worker

if TYPE_CHECKING:
    from loom.perf.latency import LatencyModel
    from loom.sim.engine import Engine

__all__ = ["CoServingEngine"]


class CoServingEngine(EmulatedEngine):
    """An emulated engine whose GPU is lent: rollout requests through `submit` as on any
    emulated engine, serving requests through `serve`."""

    def __init__(
        self,
        config: EmulatedEngineConfig,
        clock: Engine,
        coserve: CoServeSettings,
        latency: LatencyModel | None = None,
    ) -> None:
        spec = config.spec
        self.coserve = coserve
        self.coserve_config = CoServeConfig(
            role=coserve.role,
            slo=ServingSlo(ttft_s=coserve.ttft_s, tpot_s=coserve.tpot_s),
            admission=coserve.admission,
            memory=lent_memory(
                spec.gpu, spec.model, coserve.serving_model, spec.tp, coserve.lease_s
            ),
        )
        self.serving_latency = RooflineLatencyModel(spec.gpu, coserve.serving_model, tp=spec.tp)
        self._serving_ids = itertools.count()
        self._listeners: dict[int, Callable[[ServingRequest], None]] = {}
        self.serving_counts = {"served": 0, "reclaimed": 0, "stalled": 0}
        super().__init__(config, clock, latency)
        self.coworker.set_version(0)  # the rollout's weights are here from the start
        self.coworker.begin_step(0)
        # its rollout's room moves with serving; a request may use the whole pool
        self.capacity = self.coserve_config.memory.pool_pages * self.coworker.r_tpp
        self.max_model_len = config.max_model_len or self.capacity

    @property
    def coworker(self) -> CoServingWorker:
        assert isinstance(self.worker, CoServingWorker)
        return self.worker

    def _worker(self) -> Worker:
        spec = self.cfg.spec
        return CoServingWorker(
            idx=0,
            tp=spec.tp,
            node=0,
            latency=self.latency,
            serving_latency=self.serving_latency,
            rollout_kv_bytes=model_spec(spec.model).kv_bytes_per_token,
            serving_kv_bytes=model_spec(self.coserve.serving_model).kv_bytes_per_token,
            config=self.coserve_config,
            memory=MemorySharing(self.coserve_config.memory),
            scheduler=self.queue,
            engine=self.eng,
            max_running=self.coserve.max_running_per_gpu * spec.tp,
            on_turn_done=self._turn_done,
            on_abort=self._reclaimed,
            on_prefilled=self._serving_done if self.coserve.role == Role.PREFILL else None,
            on_served=self._serving_done,
            on_admit=self._admitted,
            requeue_in_place=True,
        )

    # ---- serving --------------------------------------------------------------------------
    def serve(
        self,
        prompt_tokens: int,
        output_tokens: int,
        listener: Callable[[ServingRequest], None] | None = None,
    ) -> ServingRequest:
        """A serving request of these lengths arrives now: a prefiller prefills its prompt;
        a decoder (it arrives prefilled) decodes its output. `listener` hears its end."""
        if prompt_tokens < 1 or output_tokens < 1:
            raise InvalidRequest("a serving request needs a prompt and an output of >= 1 token")
        req = ServingRequest(next(self._serving_ids), self.eng.now, prompt_tokens, output_tokens)
        if self.coserve.role == Role.DECODE:
            req.first_token_s = self.eng.now  # its first token came with its prefill
        if listener is not None:
            self._listeners[req.req_id] = listener
        self.serving_counts["served"] += 1
        if self.coserve.role == Role.PREFILL:
            self.coworker.serve_prefill(req)
        else:
            self.coworker.serve_decode(req)
        return req

    def begin_step(self, step: int) -> None:
        """A new RL step: the memory policy sets the rollout's budget from recent serving."""
        self.coworker.begin_step(step)

    def serving_stats(self) -> dict[str, float | int]:
        """Serving requests ended here, and the share of them within the SLO of this
        instance's role (TTFT on a prefiller, TPOT on a decoder); the rollout's room
        (`free_tokens`) and the serving-SLO slack a rollout iteration has now (`slack_s`, inf
        where nothing binds), which the router's ROSE placement reads."""
        stats = self.coworker.stats
        if self.coserve.role == Role.PREFILL:
            xs, slo = stats.ttft, self.coserve.ttft_s
        else:
            xs, slo = stats.tpot, self.coserve.tpot_s
        met = sum(x <= slo + 1e-9 for x in xs)
        return {
            **self.serving_counts,
            "ended": len(xs),
            "slo_attainment": met / len(xs) if xs else math.nan,
            "load": self.coworker.serving_load(self.eng.now),
            "free_tokens": self.coworker.free_pages * self.coworker.r_tpp,
            "slack_s": self.coworker.slack_s,
            "serving_pages": self.coworker.serving_pages,
            "rollout_budget_pages": self.coworker.mem.budget,
        }

    # ---- the worker's callbacks -----------------------------------------------------------
    def _serving_done(self, req: ServingRequest, _worker: CoServingWorker) -> None:
        listener = self._listeners.pop(req.req_id, None)
        if listener is not None:
            listener(req)

    def _reclaimed(self, state: TrajState, _worker: CoServingWorker, why: str) -> None:
        """The worker took a rollout request off the GPU (pages reclaimed for serving, or a
        stall): it ends as an abort with what it generated; the router sends it elsewhere."""
        req = self.live.get(state.traj_id)
        if req is None or req.done:
            return
        self.serving_counts["stalled" if why == "stalled" else "reclaimed"] += 1
        req.record["reclaimed"] = why
        self._end(req, "abort")
