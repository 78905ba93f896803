"""KvcachedConnector: vLLM's KVConnectorBase_V1 over kvcached's prefix cache.

vLLM makes one in the scheduler (role SCHEDULER: lookups, load and save plans) and one in each
worker (role WORKER: the copies between vLLM's paged blocks and kvcached). Both talk to
kvcached through kvcache.Client: its same-node paths when kvcached has a local_socket here,
otherwise gRPC.

Supported: decoder-only models whose attention layers all hold the same kv heads x head_dim,
cache_dtype "auto" (f16, bf16 or f32), a GPU platform with the FlashAttention, Triton or
FlexAttention backend (their paged layout: paged.py), tensor parallelism 1, pipeline
parallelism 1, kv_load_failure_policy "recompute". Anything else is refused when vLLM starts,
with the reason.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Dict, Optional, Tuple

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1,
                                                               KVConnectorMetadata,
                                                               KVConnectorRole)

import kvcache
from kvcache.types import CompressionSpec, StorageFormat
from kvcache.vllm.prom import KvcachedPromMetrics
from kvcache.vllm.scheduler_side import KvcachedMetadata, SchedulerSide
from kvcache.vllm.settings import Settings, cache_identity
from kvcache.vllm.stats import Counters, KvcachedStats
from kvcache.vllm.worker_side import WorkerSide

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig

log = logging.getLogger("kvcache.vllm")


def _layer_index(name: str) -> int:
    from vllm.model_executor.models.utils import extract_layer_index
    return extract_layer_index(name)


class KvcachedConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole,
                 kv_cache_config: Optional["KVCacheConfig"] = None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        transfer = vllm_config.kv_transfer_config
        self.settings = Settings.from_extra_config(transfer.kv_connector_extra_config or {})
        _check_supported(vllm_config)
        model = vllm_config.model_config
        parallel = vllm_config.parallel_config
        self._block = vllm_config.cache_config.block_size
        num_layers = model.get_num_layers(parallel)
        heads = model.get_num_kv_heads(parallel)
        head_dim = model.get_head_size()
        storage = self.settings.storage_format
        self.identity = cache_identity(
            self.settings.model_id or model.model, model.revision, str(model.dtype), num_layers,
            heads, head_dim, getattr(parallel, "rank", 0) % max(parallel.tensor_parallel_size, 1),
            parallel.tensor_parallel_size, storage)
        self._policy = (CompressionSpec(storage=storage) if storage != StorageFormat.POOL
                        else None)
        self.counters = Counters()
        self.client = kvcache.Client(self.settings.target, timeout=self.settings.timeout_s,
                                     token=self.settings.bearer_token(),
                                     tls_ca=self.settings.tls_ca or None)
        load = transfer.is_kv_consumer
        save = transfer.is_kv_producer
        self._scheduler: Optional[SchedulerSide] = None
        self._worker: Optional[WorkerSide] = None
        if role == KVConnectorRole.SCHEDULER:
            self._scheduler = SchedulerSide(self._lookup, self.identity, self.settings.salt,
                                            self._block, load, save, self.counters)
        else:
            self._worker = WorkerSide(self.client, self.settings.pool, self.identity,
                                      self._policy, self._block, num_layers, heads, head_dim,
                                      self.settings.max_pending_save_mb << 20, self.counters)
        log.info("kvcache.vllm: %s connector to %s, pool %r, storage %s, identity %r",
                 role.name.lower(), self.settings.target, self.settings.pool, storage.name,
                 self.identity)

    def _lookup(self, prefix: kvcache.Prefix) -> int:
        return self.client.lookup_prefix(prefix, self.settings.pool,
                                         storage=self.settings.storage_format,
                                         timeout=self.settings.lookup_timeout_s)

    # -- scheduler side -----------------------------------------------------------------

    def get_num_new_matched_tokens(self, request: Any,
                                   num_computed_tokens: int) -> Tuple[Optional[int], bool]:
        assert self._scheduler is not None
        return self._scheduler.matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Any, blocks: Any,
                                 num_external_tokens: int) -> None:
        assert self._scheduler is not None
        self._scheduler.after_alloc(request, num_external_tokens)

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        assert self._scheduler is not None
        return self._scheduler.build_meta(scheduler_output)

    def request_finished(self, request: Any,
                         block_ids: list) -> Tuple[bool, Optional[Dict[str, Any]]]:
        # Saves copy the blocks out within the step: vLLM may free them now.
        if self._scheduler is not None:
            self._scheduler.finished(request.request_id)
        return False, None

    # -- worker side --------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: Dict[str, torch.Tensor]) -> None:
        assert self._worker is not None
        self._worker.register(kv_caches, _layer_index)
        try:
            pools = {p.name: p for p in self.client.list_pools()}
        except kvcache.KvCacheError as e:
            # Not fatal: every load and save fails (counted) until kvcached answers.
            log.error("kvcache.vllm: kvcached at %s did not answer (%s); vLLM runs without "
                      "it until it does", self.settings.target, e)
            return
        pool = pools.get(self.settings.pool) if self.settings.pool else next(
            iter(pools.values()), None)
        if pool is None:
            raise ValueError(f"kvcache.vllm: kvcached has no pool {self.settings.pool[:40]!r} "
                             f"(it has {sorted(pools)[:8]})")
        self._worker.check_pool(pool)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        assert self._worker is not None
        meta = self._get_connector_metadata()
        assert isinstance(meta, KvcachedMetadata)
        self._worker.load(meta)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # start_load_kv finished every load

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any,
                      **kwargs: Any) -> None:
        return  # wait_for_save copies every layer's blocks at once

    def wait_for_save(self) -> None:
        assert self._worker is not None
        meta = self._get_connector_metadata()
        assert isinstance(meta, KvcachedMetadata)
        self._worker.save(meta)

    def get_block_ids_with_load_errors(self) -> set:
        return self._worker.take_load_errors() if self._worker is not None else set()

    # -- both ---------------------------------------------------------------------------

    def get_kv_connector_stats(self) -> Optional[KvcachedStats]:
        stats = self.counters.take()
        return None if stats.is_empty() else stats

    @classmethod
    def build_kv_connector_stats(cls, data: Optional[Dict[str, Any]] = None) -> KvcachedStats:
        return KvcachedStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(cls, vllm_config: "VllmConfig", metric_types: Dict[type, type],
                           labelnames: list, per_engine_labelvalues: Dict[int, list]) -> Any:
        return KvcachedPromMetrics(vllm_config, metric_types, labelnames,
                                   per_engine_labelvalues)

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.close()
        self.client.close()


_VERIFIED_BACKENDS = {"FLASH_ATTN", "TRITON_ATTN", "FLEX_ATTENTION"}


def _check_supported(config: "VllmConfig") -> None:
    problems = []
    transfer = config.kv_transfer_config
    if transfer.kv_load_failure_policy != "recompute":
        problems.append('kv_load_failure_policy must be "recompute" (a block kvcached no longer '
                        "holds is then recomputed, not a failed request)")
    parallel = config.parallel_config
    if parallel.tensor_parallel_size != 1 or parallel.pipeline_parallel_size != 1:
        problems.append("tensor and pipeline parallel sizes must be 1")
    if config.cache_config.cache_dtype != "auto":
        problems.append(f"cache_dtype {config.cache_config.cache_dtype!r}: only 'auto' (f16, "
                        "bf16, f32; kvcached stores low-bit formats itself: storage=...)")
    model = config.model_config
    if model.is_encoder_decoder or getattr(model, "use_mla", False):
        problems.append("encoder-decoder and MLA models are not supported")
    # The backends whose per-token rows are [keys | values] (paged.py); the CPU backend reads
    # the same tensor as [blocks, heads, 2 * tokens, head_dim] and would get wrong KV.
    backend = getattr(getattr(config, "attention_config", None), "backend", None)
    if backend is not None and backend.name not in _VERIFIED_BACKENDS:
        problems.append(f"attention backend {backend.name}: supported "
                        f"{sorted(_VERIFIED_BACKENDS)} (or the platform's default on a GPU)")
    from vllm.platforms import current_platform
    if current_platform.is_cpu():
        problems.append("vLLM's CPU platform (its attention backend keeps another block layout)")
    if problems:
        raise ValueError("kvcache.vllm: " + "; ".join(problems))
