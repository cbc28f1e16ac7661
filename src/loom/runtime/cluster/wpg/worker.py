"""One rank of a worker-process group: the model it trains in its torch.distributed group,
and every operation (`forward`, `forward_backward`, `optim_step`, `generate`, checkpoints,
`sync_weights`, and the state moves `offload` and `load` through the node's sidecar). It runs
in a rank's own process (`wpg.rank`) or in a Ray actor (`ray_wpg`)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from pathlib import Path
from typing import Any

from loom.core.errors import ConfigError
from loom.runtime.cluster.wpg.config import WorkerGroupConfig, check_op
from loom.state.sidecar import StateClient

__all__ = ["RankWorker"]


class RankWorker:
    """One rank: its model, optimizer and device, in the group's torch.distributed group;
    `run(op, payload)` checks the payload and runs the operation (collective where it must
    be: every rank of the group runs each operation)."""

    def __init__(
        self,
        cfg: dict[str, Any],
        rank: int,
        port: int,
        token: bytes,
        master: str = "127.0.0.1",
        *,
        local: tuple[int, int] | None = None,
        gpu: int | None = None,
    ) -> None:
        """`local`: (this rank's index, the deployment's ranks) on its node's sidecar, and
        `gpu` the GPU it was given (Ray's: then the only one it sees); by default every rank
        is on one node, on GPU gpu_base + rank."""
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        self.torch, self.dist = torch, dist
        self.rank, self.world = rank, cfg["dp"]
        self.name = cfg["name"]
        self.cfg = WorkerGroupConfig(
            **{k: v for k, v in cfg.items() if k in WorkerGroupConfig.__dataclass_fields__}
        )
        where: tuple[int, int] = local if local is not None else (rank, int(self.world))
        self.local_rank, self.local_world = where
        self.gpu = int(cfg["gpu_base"]) + self.local_rank if gpu is None else gpu
        self.device = self._pick_device(assigned=gpu is not None)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        dist.init_process_group(
            "nccl" if self.device.type == "cuda" else "gloo",
            init_method=f"tcp://{master}:{port}",
            rank=rank,
            world_size=self.world,
        )
        from loom.runtime.cluster.models.build import build_worker

        self.mw = build_worker(
            self.cfg.model_ref(),
            seed=self.cfg.seed,
            device=self.device,
            options=self.cfg.model_kwargs(),
        )
        self.model = self.mw.module
        self.optim = self.mw.optimizer(self.cfg.lr)
        self.info = self.mw.info()
        self.step = 0
        self.resident = True
        self.publisher: Any = None  # what sync_weights pushed last (rank 0, with a relay)
        self.sc = StateClient(cfg["state_address"], token)
        if cfg.get("start_offloaded"):  # its state waits on the sidecar: drop the fresh one
            for t in self._state().values():
                t.data = torch.empty(0, dtype=t.dtype, device=t.device)
            self.resident = False

    def _pick_device(self, *, assigned: bool) -> Any:
        """A GPU of its own where CUDA gives every rank one (`auto`, `cuda`), else the CPU.
        Every rank of the group decides alike: from the same device count and layout."""
        torch = self.torch
        want = self.cfg.device
        n = torch.cuda.device_count() if want != "cpu" and torch.cuda.is_available() else 0
        fits = n > 0 and (assigned or self.cfg.gpu_base + self.local_world <= n)
        if want == "cuda" and not fits:
            raise ConfigError(
                f"device cuda: {n} CUDA devices here, the group needs GPUs "
                f"{self.cfg.gpu_base}..{self.cfg.gpu_base + self.local_world - 1}"
            )
        if not fits:
            return torch.device("cpu")
        return torch.device("cuda", 0 if assigned else self.gpu)

    def close(self) -> None:
        self.sc.close()
        with contextlib.suppress(Exception):
            self.dist.destroy_process_group()

    # ---- dispatch ---------------------------------------------------------------------------
    def run(self, op: str, p: dict[str, Any]) -> dict[str, Any]:
        # every rank checks the whole payload first: a bad one fails on all ranks alike,
        # before any collective
        check_op(self.cfg, self.info, op, p)
        if op in ("offload", "load"):
            return getattr(self, f"_{op}")(p)
        if not self.resident:
            raise RuntimeError(f"{self.name} is offloaded: load it before {op}")
        return getattr(self, f"_{op}")(p)

    def _inject_fault(self, p: dict[str, Any]) -> dict[str, Any]:
        """Test-only (the group's `faults`): rank `p["rank"]` raises, hangs `hang_s` or exits
        where the others wait for it in a collective."""
        if self.rank == p["rank"]:
            if p["action"] == "raise":
                raise RuntimeError(f"injected fault on rank {self.rank}")
            if p["action"] == "exit":
                os._exit(13)
            time.sleep(float(p.get("hang_s", 3600.0)))
        t = self.torch.ones((), device=self.device)
        self.dist.all_reduce(t)
        return {"sum": float(t)}

    def _mine(self, rows: list[Any]) -> list[Any]:
        """This rank's share of a batch's rows (every world-th, from its rank)."""
        return rows[self.rank :: self.world]

    def _rows(self, ids: list[list[int]]) -> Any:
        mine = self._mine(ids)
        return self.torch.tensor(mine, dtype=self.torch.long, device=self.device) if mine else None

    def _gather_rows(self, local: list[Any], n: int) -> list[Any]:
        parts: list[Any] = [None] * self.world
        self.dist.all_gather_object(parts, local)
        out: list[Any] = [None] * n
        for r, part in enumerate(parts):
            for i, row in enumerate(part):
                out[r + i * self.world] = row
        return out

    def _forward(self, p: dict[str, Any]) -> dict[str, Any]:
        ids = p["ids"]
        x = self._rows(ids)
        with self.torch.no_grad():
            local = self.mw.logprobs(x).tolist() if x is not None else []
        return {"logprobs": self._gather_rows(local, len(ids))}

    def _forward_backward(self, p: dict[str, Any]) -> dict[str, Any]:
        """The loss the payload names over the batch (`losses`); each rank scores its rows,
        the gradients summed over the ranks are the batch's. Gradients add up over calls
        until `optim_step` (micro-batches)."""
        from loom.runtime.cluster.losses import Agg, LossBatch, LossKind, loss_of

        torch, dist, dev = self.torch, self.dist, self.device
        ids = p["ids"]
        rows, width = len(ids), len(ids[0]) - 1
        kind, agg = LossKind(p.get("loss", "pg")), Agg(p.get("agg", "sequence"))
        mask = p.get("mask") or [[1] * width] * rows
        adv = p.get("advantages")
        if adv is None and kind is not LossKind.NLL:
            adv = [1.0] * rows
        tokens = sum(map(sum, mask))
        norm = float(tokens if agg is Agg.TOKEN else rows)  # the whole batch's, on every rank
        x = self._rows(ids)
        loss, stats = torch.zeros((), device=dev), {}
        if x is not None:

            def mine(v: list[Any]) -> Any:
                return torch.tensor(self._mine(v), dtype=torch.float32, device=dev)

            clip = p.get("clip") or 0.2
            out = loss_of(
                kind,
                LossBatch(
                    logp=self.mw.logprobs(x),
                    mask=mine(mask),
                    advantages=None if adv is None else mine(adv),
                    old_logp=mine(p["old_logprobs"]) if kind is LossKind.PPO else None,
                    agg=agg,
                    norm=norm,
                    clip_low=clip,
                    clip_high=p.get("clip_high") or clip,
                ),
            )
            out.loss.backward()
            loss, stats = out.loss, out.stats
        for param in self.model.parameters():
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            dist.all_reduce(param.grad)  # the rows' terms summed: the full batch's gradient
        total = loss.detach().clone()
        dist.all_reduce(total)
        result: dict[str, Any] = {"loss": float(total), "tokens": int(tokens)}
        if kind is LossKind.PPO:
            result |= self._ratio_stats(stats, tokens)
        return result

    def _ratio_stats(self, stats: dict[str, Any], tokens: int) -> dict[str, Any]:
        """The importance ratio over the batch's scored tokens: mean, spread, range, and the
        share of tokens whose clipped term was taken."""
        torch, dist, dev = self.torch, self.dist, self.device
        inf = float("inf")
        sums = torch.tensor(
            [float(stats.get(k, 0.0)) for k in ("ratio_sum", "ratio_sq_sum", "clipped")],
            dtype=torch.float64,
            device=dev,
        )
        low = torch.tensor([float(stats.get("ratio_min", inf))], dtype=torch.float64, device=dev)
        high = torch.tensor([float(stats.get("ratio_max", -inf))], dtype=torch.float64, device=dev)
        dist.all_reduce(sums)
        dist.all_reduce(low, op=dist.ReduceOp.MIN)
        dist.all_reduce(high, op=dist.ReduceOp.MAX)
        if not tokens:
            return {"ratio": None, "clipped": 0.0}
        total, sq, clipped = (float(v) for v in sums.tolist())
        mean = total / tokens
        return {
            "ratio": {
                "mean": mean,
                "std": max(0.0, sq / tokens - mean * mean) ** 0.5,
                "min": float(low),
                "max": float(high),
            },
            "clipped": clipped / tokens,
        }

    def _optim_step(self, p: dict[str, Any]) -> dict[str, Any]:
        """One step of the optimizer on the summed gradients (clipped to `max_grad_norm`
        first if given); it reports their norm."""
        torch = self.torch
        if p.get("lr") is not None:
            for g in self.optim.param_groups:
                g["lr"] = float(p["lr"])
        params = [q for q in self.model.parameters() if q.grad is not None]
        if p.get("max_grad_norm") is not None:
            norm = torch.nn.utils.clip_grad_norm_(params, float(p["max_grad_norm"]))
        else:
            norm = torch.nn.utils.get_total_norm([q.grad for q in params]) if params else 0.0
        self.optim.step()
        self.optim.zero_grad(set_to_none=True)
        self.step += 1
        return {"step": self.step, "grad_norm": float(norm)}

    def _generate(self, p: dict[str, Any]) -> dict[str, Any]:
        ids = p["ids"]
        x = self._rows(ids)
        local = self.mw.generate(x, int(p.get("max_tokens", 8))).tolist() if x is not None else []
        return {"tokens": self._gather_rows(local, len(ids))}

    def _bind(self) -> None:
        """Show the sidecar this rank's state as it is now (collective over the ranks)."""
        self.sc.bind(
            self.name, self.local_rank, self.local_world, self.gpu, self._state(),
            meta={"step": self.step},
        )  # fmt: skip

    def _save_ckpt(self, p: dict[str, Any]) -> dict[str, Any]:
        """A checkpoint materialised by the sidecar from the state it manages (§4.5.3)."""
        path = Path(p["path"])
        self._bind()
        out: dict[str, Any] = {"path": str(path), "step": self.step}
        if self.local_rank == 0 and self.rank == 0:
            done = self.sc.call("checkpoint", dep=self.name, path=str(path))
            out |= {k: v for k, v in done.items() if k != "meta"}
        self.dist.barrier()
        return out

    def _load_ckpt(self, p: dict[str, Any]) -> dict[str, Any]:
        """Read a checkpoint the sidecar wrote ({kind/name: tensor}, with the step)."""
        from loom.runtime.cluster.model import restore_items

        state = self.torch.load(Path(p["path"]), weights_only=False, map_location=self.device)
        meta = state.pop("__meta__", {})
        restore_items(self.model, self.optim, state)
        self.step = int(meta.get("step", 0))
        return {"step": self.step}

    def _digest(self) -> str:
        h = hashlib.sha256()
        for name, t in sorted(self.model.state_dict().items()):
            h.update(name.encode())
            h.update(
                t.detach().cpu().contiguous().view(-1).view(self.torch.uint8).numpy().tobytes()
            )
        return h.hexdigest()

    def _sync_weights(self, p: dict[str, Any]) -> dict[str, Any]:
        """The weights' version and digest (every replica must agree: checked before anything
        leaves). With `tp`, also the shards a rollout layout of that tensor-parallel degree
        loads, cut by the sidecar from the managed state: each target rank fetches only its
        slices. With a `relay`, rank 0 publishes them there as a new version (sparse deltas
        against the one before) and, with `engines`, has every engine load it without a
        restart and tells the `router` which engines serve it."""
        digest = self._digest()
        digests: list[Any] = [None] * self.world
        self.dist.all_gather_object(digests, digest)
        if len(set(digests)) != 1:
            raise RuntimeError(f"replicas disagree on the weights: {sorted(set(digests))}")
        out: dict[str, Any] = {"version": self.step, "digest": digest}
        tp = p.get("tp")
        if tp is not None:
            out["reshard"] = self._reshard(int(tp))
        if p.get("relay") is not None and self.rank == 0:
            out |= self._publish(p)
        return out

    def _reshard(self, tp: int) -> dict[str, Any] | None:
        specs = self.mw.param_specs()
        assert specs is not None, "the payload check refuses tp without a layout"
        self._bind()
        if self.rank != 0:
            return None
        fetched, digests = [], []
        for r in range(tp):
            shards, n = self.sc.call(
                "materialize", model=self.name, kind="weights", params=specs, tp=tp, rank=r
            )
            fetched.append(int(n))
            d = hashlib.sha256()
            for name in sorted(shards):
                d.update(name.encode())
                d.update(
                    shards[name].contiguous().view(-1).view(self.torch.uint8).numpy().tobytes()
                )
            digests.append(d.hexdigest())
        return {"tp": tp, "fetched_bytes": fetched, "shard_digests": digests}

    def _publish(self, p: dict[str, Any]) -> dict[str, Any]:
        """Publish the serving weights to the relay; then every engine named loads them."""
        from dataclasses import asdict as as_dict

        from loom.runtime.engine.weight_sync import EngineRef, sync_engines
        from loom.runtime.relay.client import RelayClient
        from loom.runtime.relay.model_sync import WeightPublisher

        t0 = time.perf_counter()
        relay = p["relay"]
        version = self.step if p.get("version") is None else int(p["version"])
        token = os.environ.get("LOOM_TOKEN")  # (the relay's and router's: one for every service)
        if self.publisher is None or self.publisher.store.base_url != relay["url"].rstrip("/"):
            store = RelayClient(relay["url"], token=token, timeout_s=600)
            member = "train-" + self.name.replace(":", "-")
            self.publisher = WeightPublisher(store, member_id=member)
        self.publisher.dense_every = int(relay.get("dense_every") or 0)
        published = self.publisher.publish(version, self.mw.serving_weights())
        out: dict[str, Any] = {"published": as_dict(published)}
        if p.get("engines"):
            done = sync_engines(
                [EngineRef(e["url"], e.get("id")) for e in p["engines"]],
                relay=relay["url"],
                job=relay.get("job") or self.name,
                version=version,
                router=p.get("router"),
                token=token,
            )
            out["engines"] = [as_dict(e) for e in done]
        out["sync_s"] = time.perf_counter() - t0
        return out

    # ---- state moves ------------------------------------------------------------------------
    def _state(self) -> dict[Any, Any]:
        from loom.runtime.cluster.model import state_items
        from loom.state.manager import StateKey

        out = {}
        for full, t in state_items(self.model, self.optim).items():
            kind, name = full.split("/", 1)
            out[StateKey(self.name, kind, name)] = t
        return out

    def _offload(self, p: dict[str, Any]) -> dict[str, Any]:
        """Every rank exports its state to the sidecar, which keeps one copy of each tensor;
        then the ranks free their memory."""
        if not self.resident:
            return {"bytes": 0}
        state = self._state()
        written = self.sc.offload(
            self.name, self.local_rank, self.local_world, self.gpu, state,
            tier=p.get("tier", "host"), meta={"step": self.step},
        )  # fmt: skip
        for t in state.values():  # free the deployment's memory on every rank
            t.data = self.torch.empty(0, dtype=t.dtype, device=t.device)
        self.resident = False
        return {"bytes": written}

    def _load(self, p: dict[str, Any]) -> dict[str, Any]:
        """Fresh buffers on every rank, filled by the sidecar."""
        if self.resident:
            return {"bytes": 0}
        from loom.runtime.cluster.model import adopt_items

        # NOTE: the buffers on the rank's own device (a GPU rank's state loads back into GPU
        # memory, not the host's)
        got = self.sc.load(self.name, self.local_rank, self.local_world, device=str(self.device))
        adopt_items(self.model, self.optim, {f"{k.kind}/{k.name}": v for k, v in got.views.items()})
        self.step = int(got.meta.get("step", self.step))
        self.resident = True
        return {"bytes": got.bytes}
