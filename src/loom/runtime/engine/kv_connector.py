"""Loom's KV connector for vLLM (0.32, `KVConnectorBase_V1`): a trajectory's KV moves from
one engine to another through a shared store (`kv_store.KvStore`), so that the engine a
trajectory moves to loads its context instead of prefilling it again.

- **Save, when asked.** A request whose `kv_transfer_params` carry `{"loom_save": true}` has
  every full block of its prompt written to the store, one file per block, named by the
  hash chain of its tokens (`kv_store.block_hashes`). The router asks so when it moves a
  trajectory (`VllmEngine.send_kv`): a one-token request with the trajectory's context, its
  prompt a prefix-cache hit at the source, so the save costs a step and the copy. Nothing
  else is written.
- **Load, whenever it can.** Any request whose leading blocks, beyond what the engine's own
  prefix cache holds, are in the store has them loaded before its prefill (at most the
  prompt less one token: vLLM computes at least one). Loading goes by whole blocks and by
  name, so it is the same under chunked prefill as without (vLLM's `ExampleConnector` names
  a request's KV by its whole prompt and saves only the first chunk's, which crashed the
  loading engine).
- **Never crash the engine.** A block that is missing, short, of another shape or dtype, or
  unreadable is reported as a load error (`get_block_ids_with_load_errors`), and vLLM
  recomputes it (Loom starts engines with `kv_load_failure_policy: recompute`, and the
  connector refuses to start without it). A write that fails is logged and skipped.

Blocks are valid across engines of the same model, dtype, block size and tensor-parallel
degree (the store's folder names them), and within one generation of weights: a prefix-cache
reset with `reset_external=true` (what a weight sync sends) moves the engine to a new folder.
Start an engine with it: `EngineConfig(kv_store=DIR)` (`loom serve engine --kv-store DIR`),
or vLLM's own `--kv-transfer-config` with `kv_connector: LoomKVConnector`,
`kv_connector_module_path: loom.runtime.engine.kv_connector`, `kv_role: kv_both`,
`kv_load_failure_policy: recompute` and `kv_connector_extra_config: {"path": DIR}`."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import safetensors.torch
import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from loom.runtime.engine.kv_store import KvStore, block_hashes, namespace

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

__all__ = ["SAVE", "LoomKVConnector"]

log = logging.getLogger("vllm.loom_kv")  # under vLLM's logger: its handlers print it

SAVE = "loom_save"
"""The `kv_transfer_params` key that asks for a request's prompt to be saved."""
SAVED = "loom_saved_tokens"
"""The answer's `kv_transfer_params` key: the prompt's tokens whose blocks it saved."""


@dataclass
class LoomKVMetadata(KVConnectorMetadata):
    """One step's work for the workers: blocks to load (name, block id) and to save, each
    under its store folder."""

    folder: str = ""
    loads: list[tuple[str, int]] = field(default_factory=list)
    saves: list[tuple[str, int]] = field(default_factory=list)


@dataclass
class _Saving:
    names: list[str]
    blocks: list[int]
    saved: int = 0  # blocks scheduled to be saved so far


class LoomKVConnector(KVConnectorBase_V1):
    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig
    ) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        transfer = vllm_config.kv_transfer_config
        assert transfer is not None
        if transfer.kv_load_failure_policy != "recompute":
            raise ValueError(
                "LoomKVConnector needs kv_load_failure_policy 'recompute' (a block it cannot "
                "load is recomputed, never fatal); got "
                f"{transfer.kv_load_failure_policy!r}"
            )
        path = transfer.get_from_extra_config("path", None)
        if not path:
            raise ValueError("LoomKVConnector needs kv_connector_extra_config.path (its store)")
        self.block_size = vllm_config.cache_config.block_size
        self.tp = vllm_config.parallel_config.tensor_parallel_size
        self.num_blocks = kv_cache_config.num_blocks
        groups = len(kv_cache_config.kv_cache_groups)
        self.enabled = groups == 1  # one full-attention group: a block id is one block
        if not self.enabled:
            log.warning("LoomKVConnector: %d KV cache groups, moves nothing", groups)
        model = vllm_config.model_config
        self.base = (str(model.model), str(model.dtype), self.block_size, self.tp)
        self.generation = 0  # prefix-cache resets with `reset_external` (new weights)
        self.root = Path(path)
        self.max_bytes = int(transfer.get_from_extra_config("max_bytes", 8 << 30))
        self._stores: dict[str, KvStore] = {}
        # scheduler side
        self._names: dict[str, list[str]] = {}
        self._local: dict[str, int] = {}
        self._loads: list[tuple[str, int]] = []
        self._saving: dict[str, _Saving] = {}
        # worker side
        self.rank = 0
        if role == KVConnectorRole.WORKER:
            from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

            try:
                self.rank = get_tensor_model_parallel_rank()
            except Exception:  # (no group set up: one rank)
                self.rank = 0
        self._errors: set[int] = set()
        self._pending: dict[str, dict[str, torch.Tensor]] = {}

    # ---- the store ------------------------------------------------------------------------

    @property
    def folder(self) -> str:
        return namespace(*self.base, self.generation)

    def _store(self, folder: str) -> KvStore:
        store = self._stores.get(folder)
        if store is None:
            store = self._stores[folder] = KvStore(self.root / folder, max_bytes=self.max_bytes)
        return store

    # ---- scheduler side -------------------------------------------------------------------

    def _request_names(self, request: Request) -> list[str]:
        names = self._names.get(request.request_id)
        if names is None:
            lora = getattr(request, "lora_request", None)
            salt = f"{getattr(request, 'cache_salt', None) or ''}|{lora.lora_name if lora else ''}"
            names = block_hashes(list(request.all_token_ids), self.block_size, salt)
            self._names[request.request_id] = names
        return names

    def _movable(self, request: Request) -> bool:
        return self.enabled and not getattr(request, "mm_features", None)

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        if not self._movable(request):
            return 0, False
        limit = (request.num_tokens - 1) // self.block_size  # leave a token to compute
        start = num_computed_tokens // self.block_size
        if start >= limit or num_computed_tokens % self.block_size:
            return 0, False
        names = self._request_names(request)[:limit]
        found = self._store(self.folder).leading(names, start, self.tp)
        self._local[request.request_id] = start
        return found * self.block_size, False

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        rid = request.request_id
        if num_external_tokens > 0:
            ids = blocks.get_block_ids()[0]
            start = self._local.get(rid, 0)
            names = self._request_names(request)
            n = num_external_tokens // self.block_size
            self._loads += [(names[start + i], ids[start + i]) for i in range(n)]
        params = request.kv_transfer_params or {}
        if params.get(SAVE) and self._movable(request) and rid not in self._saving:
            prompt = len(request.prompt_token_ids or ())
            names = self._request_names(request)[: prompt // self.block_size]
            self._saving[rid] = _Saving(names, list(blocks.get_block_ids()[0]))

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        meta = LoomKVMetadata(folder=self.folder, loads=self._loads)
        self._loads = []
        if self._saving:
            for new in scheduler_output.scheduled_new_reqs:
                s = self._saving.get(new.req_id)
                if s is not None:
                    s.blocks = list(new.block_ids[0])
            cached = scheduler_output.scheduled_cached_reqs
            for i, rid in enumerate(cached.req_ids):
                s = self._saving.get(rid)
                ids = cached.new_block_ids[i]
                if s is None or ids is None:
                    continue
                s.blocks = list(ids[0]) if rid in cached.resumed_req_ids else s.blocks + ids[0]
            for rid, s in self._saving.items():
                scheduled = scheduler_output.num_scheduled_tokens.get(rid)
                if scheduled is None:
                    continue
                done = self._computed(scheduler_output, rid) + scheduled
                upto = min(done // self.block_size, len(s.names), len(s.blocks))
                meta.saves += [(s.names[i], s.blocks[i]) for i in range(s.saved, upto)]
                s.saved = max(s.saved, upto)
        for rid in list(self._local):
            if rid not in self._saving:
                self._local.pop(rid, None)
        return meta

    @staticmethod
    def _computed(out: SchedulerOutput, rid: str) -> int:
        for new in out.scheduled_new_reqs:
            if new.req_id == rid:
                return int(new.num_computed_tokens)
        cached = out.scheduled_cached_reqs
        for i, r in enumerate(cached.req_ids):
            if r == rid:
                return int(cached.num_computed_tokens[i])
        return 0

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        rid = request.request_id
        self._names.pop(rid, None)
        self._local.pop(rid, None)
        s = self._saving.pop(rid, None)
        if s is None:
            return False, None
        return False, {SAVED: s.saved * self.block_size}

    def reset_cache(self) -> bool:
        """New weights: blocks stored before are not this engine's KV any more."""
        self.generation += 1
        self._names.clear()
        return True

    # ---- worker side ----------------------------------------------------------------------

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, LoomKVMetadata)
        if not meta.loads:
            return
        layers = {
            name: layer.kv_cache
            for name, layer in forward_context.no_compile_layers.items()
            if isinstance(getattr(layer, "kv_cache", None), torch.Tensor)
        }
        store = self._store(meta.folder)
        for name, bid in meta.loads:
            try:
                block = safetensors.torch.load(store.read(name, self.rank))
                for layer, cache in layers.items():
                    got = block[layer]
                    if cache.shape[0] != self.num_blocks or got.shape != cache.shape[1:]:
                        raise ValueError(f"{layer}: {tuple(got.shape)} for {tuple(cache.shape)}")
                    if got.dtype != cache.dtype:
                        raise ValueError(f"{layer}: {got.dtype} for {cache.dtype}")
                for layer, cache in layers.items():
                    cache[bid].copy_(block[layer])
            except Exception as exc:  # a block it cannot load is recomputed, never fatal
                log.warning("LoomKVConnector: block %s not loaded (%s): recomputed", name, exc)
                self._errors.add(bid)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any
    ) -> None:
        # NOTE: vLLM starts a step's loads after its forward when none is synchronous, so the
        # saves are read from the step's metadata here, bound before the forward
        meta = self._get_connector_metadata()
        assert isinstance(meta, LoomKVMetadata)
        if not meta.saves or kv_layer.shape[0] != self.num_blocks:
            return
        for name, bid in meta.saves:
            self._pending.setdefault(name, {})[layer_name] = kv_layer[bid].detach().cpu().clone()

    def wait_for_save(self) -> None:
        if not self._pending:
            return
        meta = self._get_connector_metadata()
        assert isinstance(meta, LoomKVMetadata)
        store = self._store(meta.folder)
        for name, layers in self._pending.items():
            try:
                store.write(name, safetensors.torch.save(layers), self.rank)
            except OSError as exc:
                log.warning("LoomKVConnector: block %s not saved (%s)", name, exc)
        self._pending = {}

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._errors = self._errors, set()
        return errors
