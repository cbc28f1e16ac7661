"""PlexRL's StateManager (§4.5): one node's authority over where model state lives — the GPUs,
host memory, disk — and over the transformations other components need from it.

* **Canonical offloaded state** (§4.5.2): a tensor is keyed by what it is, `StateKey(model,
  kind, name, box)` — the box being the slice of the full tensor a rank holds — not by the
  process that held it. Data-parallel replicas hold equal keys, so offloaded state is stored
  once: host and disk bytes equal the unique logical bytes.
* **Residency** (§4.5.1): a deployment's ranks each hold their keys on their own GPU while it
  runs (`load`); offloaded, each key lives in exactly one of host and disk. Nothing reads a
  deployment's tensors unless they are on its devices (`tensors` raises `NotResident`).
  Capacities are hard: when a tier would overflow, what moves down is chosen by the scheduler's
  plan (the deployment used furthest in the future first, §4.5.1's scheduler-directed
  residency), or least recently used without one. `prefetch` moves a deployment's state up
  before a predicted switch.
* **Materialisation** (§4.5.3): a checkpoint of a model's full tensors assembled from wherever
  its pieces are, offloaded or not; and the slices a rank of another tensor-parallel layout
  needs (rollout weights resharded), each rank fetching only the bytes inside its own shard;
  and a mirror of a deployment's state onto another node's manager (migration).

A plain object driven by its owner — the node's sidecar daemon (`loom.state.sidecar`), or a
test: no threads, no clock (`use` takes a logical time). In the sidecar the device tier is
*external*: it holds mappings of the workers' own GPU memory (CUDA IPC; shared memory on a CPU
node), bound by `bind` before an offload and filled through `expect` on a load.

Copies between the tiers run through one `Copier` (`loom.state.copy`): chunks of
`copy_chunk_bytes` on `copy_streams` CUDA streams, issued without waiting; every call that moves
state waits for its copies before it returns, so a returned call still means the state is where
it was asked to be.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loom.core.errors import ConfigError
from loom.state.copy import DEFAULT_CHUNK_BYTES, DEFAULT_STREAMS, Copier
from loom.state.errors import NotResident, UnknownDeployment
from loom.state.tiers import DeviceTier, DiskTier, HostTier, Tier, TierFull, TierStore, nbytes
from loom.state.weights.params import ParamSpec
from loom.state.weights.shards import Box, shard_box

__all__ = ["NotResident", "StateKey", "StateManager", "StateStats"]


@dataclass(frozen=True, order=True)
class StateKey:
    """What a tensor is: a slice (`box`, one (start, stop) per dim; empty = the whole tensor)
    of tensor `name` of `kind` ("weights", "optimizer", ...) of `model`."""

    model: str
    kind: str
    name: str
    box: tuple[tuple[int, int], ...] = ()

    def covers(self, shape: Sequence[int]) -> tuple[tuple[int, int], ...]:
        return self.box or tuple((0, d) for d in shape)


@dataclass
class StateStats:
    bytes_by_tier: dict[str, int]
    unique_logical_bytes: int
    moved_bytes: dict[str, int]  # "device->host", "host->disk", ...


@dataclass
class _Deployment:
    name: str
    ranks: dict[int, int] = field(default_factory=dict)  # rank -> GPU index
    keys: dict[int, list[StateKey]] = field(default_factory=dict)  # rank -> its keys
    loaded: bool = False
    last_use: float = -math.inf
    meta: dict[str, Any] = field(default_factory=dict)  # the owner's notes (a training step)


class StateManager:
    def __init__(
        self,
        *,
        gpus: int,
        device_bytes: int,
        host_bytes: int,
        disk_bytes: int,
        disk_dir: Path,
        device: str | None = None,
        pin_host: bool | None = None,
        verify_replicas: bool = False,
        external_device: bool = False,
        copy_chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        copy_streams: int = DEFAULT_STREAMS,
    ) -> None:
        if gpus < 1:
            raise ConfigError(f"a node needs >= 1 GPU (or CPU device tier), got {gpus}")
        self.copier = Copier(copy_chunk_bytes, copy_streams)
        self.devices = [
            DeviceTier(device_bytes, device, external=external_device, copier=self.copier)
            for _ in range(gpus)
        ]
        self.host = HostTier(host_bytes, pin_host, copier=self.copier)
        self.disk = DiskTier(disk_bytes, disk_dir)
        self.verify_replicas = verify_replicas
        self._deps: dict[str, _Deployment] = {}
        self._home: dict[StateKey, Tier] = {}  # offloaded keys: which of host or disk
        self._shape: dict[StateKey, tuple[int, ...]] = {}
        self._plan: list[str] = []  # upcoming deployments, soonest first
        self.moved: dict[str, int] = {}

    # ---- registration ------------------------------------------------------------------------
    def register(
        self, deployment: str, rank: int, gpu: int, tensors: Mapping[StateKey, Any]
    ) -> None:
        """Rank `rank` of `deployment`, on GPU `gpu`, holds `tensors` (put on that GPU)."""
        if not 0 <= gpu < len(self.devices):
            raise ConfigError(f"no GPU {gpu} on this node ({len(self.devices)})")
        dep = self._deps.setdefault(deployment, _Deployment(deployment))
        if rank in dep.ranks:
            raise ConfigError(f"{deployment} rank {rank} is registered already")
        if not self.devices[gpu].external and any(
            r != rank and g == gpu for r, g in dep.ranks.items()
        ):  # (a worker's own memory may hold two ranks on one GPU: fractional GPUs)
            raise ConfigError(f"{deployment}: two ranks on GPU {gpu}")
        if dep.ranks and not dep.loaded:
            raise ConfigError(f"{deployment} is offloaded: load it before adding ranks")
        dev = self.devices[gpu]
        need = sum(nbytes(t) for t in tensors.values())
        with self._copies():
            self._make_room(dev, need, keep=deployment)
            for key, t in tensors.items():
                dev.put((deployment, rank, key), t)
                self._shape[key] = tuple(t.shape)
        dep.ranks[rank] = gpu
        dep.keys[rank] = list(tensors)
        dep.loaded = True

    def bind(self, deployment: str, rank: int, gpu: int, tensors: Mapping[StateKey, Any]) -> None:
        """Rank `rank`'s tensors as they are now (a worker re-exports its memory before an
        offload: its optimizer may have made new tensors since): registers the rank the first
        time; after that the deployment must be loaded, and the rank's keys are replaced."""
        dep = self._deps.get(deployment)
        if dep is None or rank not in dep.ranks:
            self.register(deployment, rank, gpu, tensors)
            return
        if not dep.loaded:
            raise NotResident(f"{deployment} is offloaded: load it before binding its tensors")
        if dep.ranks[rank] != gpu:
            raise ConfigError(f"{deployment} rank {rank} is on GPU {dep.ranks[rank]}, not {gpu}")
        dev = self.devices[gpu]
        old = sum(dev.size_of((deployment, rank, k)) for k in dep.keys[rank])
        extra = sum(nbytes(t) for t in tensors.values()) - old
        if extra > 0:  # room first: a refused bind leaves the rank as it was
            self._make_room(dev, extra, keep=deployment)
        for key in dep.keys[rank]:
            dev.delete((deployment, rank, key))
        for key in set(dep.keys[rank]) | set(tensors):
            # an offloaded copy while loaded is stale (an offload that failed half way)
            if key in self._home and not self._shared(key, deployment):
                self._store(self._home.pop(key)).delete(key)
        for key, t in tensors.items():
            dev.put((deployment, rank, key), t)
            self._shape[key] = tuple(t.shape)
        dep.keys[rank] = list(tensors)

    def expect(self, deployment: str, rank: int, targets: Mapping[StateKey, Any]) -> None:
        """Before `load`: the buffers rank `rank` exported for its keys (an external device
        tier copies into them); every key of the rank needs one."""
        dep = self._dep(deployment)
        missing = set(dep.keys[rank]) - set(targets)
        if missing:
            raise ConfigError(f"{deployment} rank {rank}: no buffer for {sorted(missing)[:3]}")
        dev = self.devices[dep.ranks[rank]]
        for key in dep.keys[rank]:
            dev.expect((deployment, rank, key), targets[key])

    def keys_of(self, deployment: str, rank: int) -> dict[StateKey, tuple[tuple[int, ...], Any]]:
        """Rank `rank`'s keys with their shapes and dtypes (what a load fills)."""
        dep = self._dep(deployment)
        out = {}
        for key in dep.keys[rank]:
            tier = self._home.get(key)
            if tier is not None:
                meta = self._store(tier)._meta[key]
            else:
                meta = self.devices[dep.ranks[rank]]._meta[(deployment, rank, key)]
            out[key] = (meta.shape, meta.dtype)
        return out

    def drop(self, deployment: str) -> None:
        """The deployment is gone: its state everywhere (keys no other deployment holds)."""
        dep = self._deps.pop(deployment, None)
        if dep is None:
            raise UnknownDeployment(f"unknown deployment {deployment!r}")
        if dep.loaded:
            for rank, gpu in dep.ranks.items():
                for key in dep.keys[rank]:
                    self.devices[gpu].delete((deployment, rank, key))
        mine = {k for ks in dep.keys.values() for k in ks}
        others = {k for d in self._deps.values() for ks in d.keys.values() for k in ks}
        for key in mine - others:
            tier = self._home.pop(key, None)
            if tier is not None:
                self._store(tier).delete(key)

    # ---- the scheduler's hints ---------------------------------------------------------------
    def set_plan(self, upcoming: Sequence[str]) -> None:
        """Deployments in the order the scheduler will run them (eviction reads it)."""
        self._plan = list(upcoming)

    def use(self, deployment: str, now: float) -> None:
        """The deployment ran at logical time `now` (LRU without a plan)."""
        self._dep(deployment).last_use = now

    # ---- moves -------------------------------------------------------------------------------
    def offload(self, deployment: str, to: Tier = Tier.HOST) -> int:
        """Every key of the deployment off its GPUs, once per key (replicas deduplicated), to
        `to` (host, spilling to disk per the plan when host is full, or disk). Returns the
        bytes written."""
        dep = self._dep(deployment)
        if not dep.loaded:
            return 0
        if to == Tier.DEVICE:
            raise ConfigError("offload goes to host or disk")
        with self._copies():
            return self._offload(dep, to)

    def _offload(self, dep: _Deployment, to: Tier) -> int:
        deployment = dep.name
        written = 0
        done: dict[StateKey, Any] = {}
        try:
            for rank in sorted(dep.ranks):
                gpu = dep.ranks[rank]
                for key in dep.keys[rank]:
                    t = self.devices[gpu].get((deployment, rank, key))
                    if key in done:
                        if self.verify_replicas:
                            assert _equal(done[key], t), f"replicas of {key} differ"
                        continue
                    done[key] = t
                    written += self._home_put(key, t, to, keep=deployment)
                    self._count("device->" + self._home[key].value, nbytes(t))
        except BaseException:  # the deployment stays loaded: drop the copies made so far
            for key in done:
                if key in self._home and not self._shared(key, deployment):
                    self._store(self._home.pop(key)).delete(key)
            raise
        for rank, gpu in dep.ranks.items():
            for key in dep.keys[rank]:
                self.devices[gpu].delete((deployment, rank, key))
        dep.loaded = False
        return written

    def load(self, deployment: str) -> int:
        """Every rank's keys onto its GPU from host or disk, making room by the plan. The
        offloaded copies are then dropped: a key lives in one place at a time. Returns bytes
        read."""
        dep = self._dep(deployment)
        if dep.loaded:
            return 0
        with self._copies():
            return self._load(dep)

    def _load(self, dep: _Deployment) -> int:
        deployment = dep.name
        for rank, gpu in dep.ranks.items():
            need = sum(self._size(k) for k in dep.keys[rank])
            self._make_room(self.devices[gpu], need, keep=deployment)
        read = 0
        for rank in sorted(dep.ranks):
            gpu = dep.ranks[rank]
            for key in dep.keys[rank]:
                tier = self._home[key]
                t = self._store(tier).get(key)
                self.devices[gpu].put((deployment, rank, key), t)
                self._count(f"{tier.value}->device", nbytes(t))
                read += nbytes(t)
        self.copier.sync()  # the offloaded copies go next: nothing may still read them
        for key in {k for ks in dep.keys.values() for k in ks}:
            if not self._shared(key, deployment):
                self._store(self._home.pop(key)).delete(key)
        dep.loaded = True
        return read

    def prefetch(self, deployment: str) -> int:
        """Bring an offloaded deployment's keys from disk to host ahead of its turn (as far as
        host has room after evicting what the plan needs later)."""
        dep = self._dep(deployment)
        if dep.loaded:
            return 0
        with self._copies():
            return self._prefetch(dep)

    def _prefetch(self, dep: _Deployment) -> int:
        deployment = dep.name
        moved = 0
        for key in sorted({k for ks in dep.keys.values() for k in ks}):
            if self._home.get(key) != Tier.DISK:
                continue
            size = self._size(key)
            try:
                self._make_room(self.host, size, keep=deployment)
            except TierFull:
                break
            t = self.disk.get(key)
            self.disk.delete(key)
            self.host.put(key, t)
            self._home[key] = Tier.HOST
            self._count("disk->host", size)
            moved += size
        return moved

    # ---- reads -------------------------------------------------------------------------------
    def tensors(self, deployment: str, rank: int) -> dict[StateKey, Any]:
        """Rank `rank`'s tensors, on its GPU; `NotResident` if the deployment is offloaded."""
        dep = self._dep(deployment)
        if not dep.loaded:
            raise NotResident(f"{deployment} is offloaded: load it before it runs")
        gpu = dep.ranks[rank]
        return {k: self.devices[gpu].get((deployment, rank, k)) for k in dep.keys[rank]}

    def full_tensor(self, model: str, kind: str, name: str) -> Any:
        """The whole tensor assembled from its pieces, wherever they are (a checkpoint reads
        offloaded state without loading it)."""
        pieces = self._pieces(model, kind, name)
        if not pieces:
            raise ConfigError(f"no state for {model}/{kind}/{name}")
        shape = _full_shape(pieces)
        torch = _torch()
        first = pieces[0][1]
        out = torch.empty(shape, dtype=first.dtype)
        for key, t in pieces:
            out[tuple(slice(a, b) for a, b in key.covers(shape))] = t.cpu()
        return out

    def checkpoint(
        self, model: str, path: Path, meta: Mapping[str, Any] | None = None
    ) -> list[str]:
        """Every tensor of `model`, whole, to one file (`torch.save` of {kind/name: tensor},
        and `__meta__`: the owner's notes, when given)."""
        torch = _torch()
        names = sorted({(k.kind, k.name) for k in self._all_keys() if k.model == model})
        if not names:
            raise ConfigError(f"no state for model {model!r}")
        state: dict[str, Any] = {
            f"{kind}/{name}": self.full_tensor(model, kind, name) for kind, name in names
        }
        written = list(state)
        if meta is not None:
            state["__meta__"] = dict(meta)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(state, path)
        return written

    def materialize(
        self, model: str, kind: str, params: Iterable[ParamSpec], tp: int, rank: int
    ) -> tuple[dict[str, Any], int]:
        """What rank `rank` of a TP-`tp` layout holds of `params` (its shard of each), cut
        from the pieces held here, and the bytes it fetched: only those inside its shard."""
        torch = _torch()
        out: dict[str, Any] = {}
        fetched = 0
        for p in params:
            want = shard_box(p, tp, rank)
            pieces = self._pieces(model, kind, p.name)
            if not pieces:
                raise ConfigError(f"no state for {model}/{kind}/{p.name}")
            buf = torch.empty(want.shape, dtype=pieces[0][1].dtype)
            filled = 0
            for key, t in pieces:
                have = key.covers(p.shape)
                inter = tuple(
                    (max(a, c), min(b, d))
                    for (a, b), (c, d) in zip(have, _spans(want), strict=True)
                )
                if any(lo >= hi for lo, hi in inter):
                    continue
                src = t[
                    tuple(
                        slice(lo - a, hi - a) for (lo, hi), (a, _) in zip(inter, have, strict=True)
                    )
                ]
                dst = tuple(
                    slice(lo - c, hi - c)
                    for (lo, hi), (c, _) in zip(inter, _spans(want), strict=True)
                )
                buf[dst] = src.cpu()
                n = math.prod(hi - lo for lo, hi in inter)
                filled += n
                fetched += n * t.element_size()
            if filled != want.numel:
                raise ConfigError(
                    f"{p.name}: the pieces held cover {filled} of {want.numel} elements"
                )
            out[p.name] = buf
        return out, fetched

    def mirror_to(self, other: StateManager, deployment: str) -> int:
        """Copy a deployment's offloaded state into another node's manager (migration): its
        keys land in that node's host tier (spilling to disk there by its own plan)."""
        dep = self._dep(deployment)
        tensors = {k: t for k, t in self.offloaded(deployment).items() if k not in other._home}
        return other.adopt(deployment, dep.ranks, dep.keys, tensors, meta=dep.meta)

    def offloaded(self, deployment: str) -> dict[StateKey, Any]:
        """The deployment's canonical offloaded tensors, once per key (what a migration
        carries to another node)."""
        dep = self._dep(deployment)
        if dep.loaded:
            raise ConfigError(f"offload {deployment} before mirroring it")
        keys = sorted({k for ks in dep.keys.values() for k in ks})
        return {k: self._store(self._home[k]).get(k) for k in keys}

    def adopt(
        self,
        deployment: str,
        ranks: Mapping[int, int],
        keys: Mapping[int, Sequence[StateKey]],
        tensors: Mapping[StateKey, Any],
        meta: Mapping[str, Any] | None = None,
    ) -> int:
        """Take in a deployment migrated from another node, offloaded: `tensors` (keys not
        held here yet) go to host, spilling to disk by the plan. Returns the bytes stored."""
        if deployment in self._deps and self._deps[deployment].loaded:
            raise ConfigError(f"{deployment} is loaded on this node already")
        for gpu in ranks.values():
            if not 0 <= gpu < len(self.devices):
                raise ConfigError(f"no GPU {gpu} on this node ({len(self.devices)})")
        need = {k for ks in keys.values() for k in ks}
        missing = sorted(k for k in need if k not in self._home and k not in tensors)
        if missing:
            raise ConfigError(f"{deployment}: migrated without {missing[:3]}")
        stored, added = 0, []
        try:
            with self._copies():
                for key in sorted(tensors):
                    if key not in self._home:
                        stored += self._home_put(key, tensors[key], Tier.HOST, keep=deployment)
                        self._shape[key] = tuple(tensors[key].shape)
                        added.append(key)
        except BaseException:  # nothing half-adopted: no key here that nobody owns
            for key in added:
                self._store(self._home.pop(key)).delete(key)
            raise
        target = self._deps.setdefault(deployment, _Deployment(deployment))
        target.ranks = dict(ranks)
        target.keys = {r: list(k) for r, k in keys.items()}
        target.loaded = False
        target.meta = dict(meta or {})
        return stored

    def is_loaded(self, deployment: str) -> bool:
        """Whether the deployment's state is on its devices (unknown deployments: no)."""
        dep = self._deps.get(deployment)
        return dep is not None and dep.loaded

    def meta(self, deployment: str) -> dict[str, Any]:
        """The owner's notes on a deployment (kept with its state, carried by a migration)."""
        return self._dep(deployment).meta

    def deployments(self) -> dict[str, dict[str, Any]]:
        """Each deployment: loaded or not, its ranks' GPUs, and its unique keys' bytes by
        the tier they are in."""
        out = {}
        for d in self._deps.values():
            by_tier = {"device": 0, "host": 0, "disk": 0}
            for key in {k for ks in d.keys.values() for k in ks}:
                tier = self._home.get(key)
                by_tier["device" if tier is None else tier.value] += self._size(key)
            out[d.name] = {"loaded": d.loaded, "ranks": dict(d.ranks), "bytes": by_tier}
        return out

    def stats(self) -> StateStats:
        by_tier = {
            "device": sum(d.used for d in self.devices),
            "host": self.host.used,
            "disk": self.disk.used,
        }
        unique = sum(self._size(k) for k in self._home)
        return StateStats(by_tier, unique, dict(self.moved))

    # ---- internals ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def _copies(self) -> Iterator[None]:
        """Whatever happens inside, the copies issued there are complete on leaving."""
        try:
            yield
        finally:
            self.copier.sync()

    @property
    def plan(self) -> list[str]:
        """The upcoming deployments, soonest first, as `set_plan` last gave them."""
        return list(self._plan)

    def owners(self, dep: str) -> tuple[dict[int, Any], dict[Any, Any], dict[str, Any]]:
        """A deployment's ranks, its keys and its notes (copies): what another node's manager
        needs to adopt its offloaded state."""
        d = self._dep(dep)
        return dict(d.ranks), dict(d.keys), dict(d.meta)

    def _dep(self, name: str) -> _Deployment:
        dep = self._deps.get(name)
        if dep is None:
            raise UnknownDeployment(f"unknown deployment {name!r}")
        return dep

    def _store(self, tier: Tier) -> TierStore:
        return self.host if tier == Tier.HOST else self.disk

    def _size(self, key: StateKey) -> int:
        tier = self._home.get(key)
        if tier is not None:
            return self._store(tier).size_of(key)
        for d in self._deps.values():
            if d.loaded:
                for rank, gpu in d.ranks.items():
                    if key in d.keys[rank]:
                        return self.devices[gpu].size_of((d.name, rank, key))
        raise ConfigError(f"no state for {key}")

    def _count(self, route: str, n: int) -> None:
        self.moved[route] = self.moved.get(route, 0) + n

    def _shared(self, key: StateKey, but: str) -> bool:
        return any(
            d.name != but and not d.loaded and any(key in ks for ks in d.keys.values())
            for d in self._deps.values()
        )

    def _home_put(self, key: StateKey, t: Any, to: Tier, keep: str) -> int:
        """Store an offloaded key once (replacing a stale copy), in host if it can be made to
        fit, else disk."""
        if key in self._home:
            self._store(self._home.pop(key)).delete(key)
        n = nbytes(t)
        if to == Tier.HOST:
            try:
                self._make_room(self.host, n, keep=keep)
                self.host.put(key, t)
                self._home[key] = Tier.HOST
                return n
            except TierFull:
                pass
        self.disk.put(key, t)  # TierFull here: nowhere left, the caller's error
        self._home[key] = Tier.DISK
        return n

    def _victims(self, keep: str, *, runs_now: bool) -> list[str]:
        """Deployments whose state may make room for `keep`'s, in eviction order. With a plan:
        never used again first, then the furthest next use; without one, least recently used
        first. When `keep` runs now (it is being loaded) any other may go; when its state is
        being put away, only those needed later than it (plan) or used before it (LRU)."""
        names = [d for d in self._deps if d != keep]
        if self._plan:
            nxt = {d: (self._plan.index(d) if d in self._plan else math.inf) for d in self._deps}
            if not runs_now:
                names = [d for d in names if nxt[d] > nxt[keep]]
            return sorted(names, key=lambda d: (-nxt[d], self._deps[d].last_use, d))
        if not runs_now:
            mine = self._deps[keep].last_use if keep in self._deps else math.inf
            names = [d for d in names if self._deps[d].last_use <= mine]
        return sorted(names, key=lambda d: (self._deps[d].last_use, d))

    def _make_room(self, store: TierStore, need: int, keep: str) -> None:
        if need > store.capacity:
            raise TierFull(store.tier, need, store.capacity)
        if need <= store.free:
            return
        if isinstance(store, DeviceTier) and store.external:
            # a worker's memory is its own: only its offload frees it
            held = sorted(
                d.name
                for d in self._deps.values()
                if d.loaded
                and d.name != keep
                and any(self.devices[g] is store for g in d.ranks.values())
            )
            note = f"resident there: {', '.join(held) or 'nothing'}; offload first"
            raise TierFull(store.tier, need, store.free, note)
        for victim in self._victims(keep, runs_now=isinstance(store, DeviceTier)):
            if need <= store.free:
                return
            if isinstance(store, DeviceTier):
                if self._deps[victim].loaded and any(
                    self.devices[g] is store for g in self._deps[victim].ranks.values()
                ):
                    self.offload(victim)
            elif store is self.host:
                for key in sorted(
                    k for k, t in self._home.items() if t == Tier.HOST and self._owned_by(k, victim)
                ):
                    if need <= store.free:
                        break
                    t = self.host.get(key)
                    self.host.delete(key)
                    self.disk.put(key, t)
                    self._home[key] = Tier.DISK
                    self._count("host->disk", nbytes(t))
        if need > store.free:
            raise TierFull(store.tier, need, store.free)

    def _owned_by(self, key: StateKey, deployment: str) -> bool:
        return any(key in ks for ks in self._deps[deployment].keys.values())

    def _all_keys(self) -> set[StateKey]:
        return set(self._home) | {
            k for d in self._deps.values() for ks in d.keys.values() for k in ks
        }

    def _pieces(self, model: str, kind: str, name: str) -> list[tuple[StateKey, Any]]:
        """Every distinct piece of a tensor, from where it is now (once per key)."""
        out: dict[StateKey, Any] = {}
        for key, tier in self._home.items():
            if (key.model, key.kind, key.name) == (model, kind, name):
                out[key] = self._store(tier).get(key)
        for d in self._deps.values():
            if not d.loaded:
                continue
            for rank, gpu in d.ranks.items():
                for key in d.keys[rank]:
                    if (key.model, key.kind, key.name) == (model, kind, name) and key not in out:
                        out[key] = self.devices[gpu].get((d.name, rank, key))
        return sorted(out.items(), key=lambda kv: kv[0])


def _spans(box: Box) -> tuple[tuple[int, int], ...]:
    return tuple((s.start, s.stop) for s in box.slices)


def _full_shape(pieces: list[tuple[StateKey, Any]]) -> tuple[int, ...]:
    key, t = pieces[0]
    if not key.box:
        return tuple(t.shape)
    return tuple(max(k.box[i][1] for k, _ in pieces) for i in range(len(key.box)))


def _equal(a: Any, b: Any) -> bool:
    return bool(a.shape == b.shape and a.dtype == b.dtype and (a.cpu() == b.cpu()).all())


def _torch() -> Any:
    import torch

    return torch
