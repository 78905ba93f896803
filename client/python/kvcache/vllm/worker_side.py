"""The connector in a vLLM worker: fills vLLM's paged blocks from kvcached (loads) and
publishes prompt blocks to it (saves).

Loads run in start_load_kv, before the forward pass that reads the blocks, and finish there
(a load is one attach plus one fetch per request). A sequence is created from the cached
prefix (it pins those blocks while it lives), fetched, written into vLLM's blocks and released.
Blocks kvcached no longer holds (evicted since the lookup), a failed call or an answer that
is not the prefix asked for are reported by get_block_ids_with_load_errors: vLLM then
recomputes those tokens (kv_load_failure_policy "recompute"); nothing half-loaded is used.

Saves copy the blocks' keys and values out of vLLM's cache in wait_for_save (the blocks may
be reused once the step is over) and send them from a thread of their own: a sequence created
from the cached prefix gets the remaining tokens appended layer by layer and is published,
then released. The forward pass never waits on kvcached; a save that fails is counted and
dropped (a later request misses), and saves beyond max_pending_save_mb are dropped too.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Dict, List, Optional, Set

import numpy as np
import torch

from kvcache.errors import KvCacheError
from kvcache.types import CompressionSpec, Prefix
from kvcache.vllm import paged
from kvcache.vllm.scheduler_side import KvcachedMetadata, LoadOp, SaveOp
from kvcache.vllm.stats import Counters

log = logging.getLogger("kvcache.vllm")

# kvcached's pool dtype for each cache dtype vLLM may use (bf16 travels as its uint16 bits).
_POOL_DTYPE = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32"}


def _to_numpy(x: torch.Tensor) -> np.ndarray:
    if x.dtype == torch.bfloat16:
        return x.contiguous().view(torch.int16).numpy().view(np.uint16)
    return x.contiguous().numpy()


def _to_torch(x: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.bfloat16:
        return torch.from_numpy(np.ascontiguousarray(x).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(x))


class WorkerSide:
    def __init__(self, client: Any, pool: str, identity: str, policy: Optional[CompressionSpec],
                 block_size: int, num_layers: int, num_kv_heads: int, head_dim: int,
                 max_pending_bytes: int, counters: Counters):
        self._client = client
        self._pool = pool
        self._identity = identity
        self._policy = policy
        self._block = block_size
        self._geometry = (num_layers, num_kv_heads, head_dim)
        self._counters = counters
        self._layers: List[torch.Tensor] = []  # by layer index
        self._dtype: Optional[torch.dtype] = None
        self._load_errors: Set[int] = set()
        self._failed_loads: Set[str] = set()  # requests whose load failed in this step
        self._max_pending = max_pending_bytes
        self._pending = 0
        self._pending_lock = threading.Lock()
        self._saves: "queue.Queue[Optional[tuple]]" = queue.Queue()
        self._saver = threading.Thread(target=self._save_loop, name="kvcache-vllm-save",
                                       daemon=True)
        self._saver.start()

    # -- registration -------------------------------------------------------------------

    def register(self, kv_caches: Dict[str, torch.Tensor], layer_index: Any) -> None:
        """kv_caches: vLLM's layer name -> layer cache. layer_index: name -> model layer."""
        num_layers, heads, head_dim = self._geometry
        by_index: Dict[int, torch.Tensor] = {}
        for name, cache in kv_caches.items():
            paged.check_layer(name, cache, self._block, heads, head_dim)
            by_index[layer_index(name)] = cache
        if sorted(by_index) != list(range(num_layers)):
            raise ValueError(f"kvcache.vllm: vLLM registered KV caches for layers "
                             f"{sorted(by_index)[:8]}...; expected 0..{num_layers - 1}")
        dtypes = {c.dtype for c in by_index.values()}
        if len(dtypes) != 1 or next(iter(dtypes)) not in _POOL_DTYPE:
            raise ValueError(f"kvcache.vllm: KV cache dtype {sorted(map(str, dtypes))}; "
                             f"supported: {[str(d) for d in _POOL_DTYPE]} (cache_dtype 'auto')")
        self._dtype = next(iter(dtypes))
        self._layers = [by_index[i] for i in range(num_layers)]

    def check_pool(self, pool: Any) -> None:
        """Raises ValueError when kvcached's pool (a PoolInfo) cannot hold this model's KV."""
        g = pool.geometry
        num_layers, heads, head_dim = self._geometry
        want = _POOL_DTYPE.get(self._dtype) if self._dtype is not None else None
        have = {1: "f32", 2: "f16", 3: "bf16"}.get(int(g.dtype) or 2, "?")
        if (g.num_layers, g.num_kv_heads, g.head_dim) != (num_layers, heads, head_dim) or (
                want is not None and want != have):
            raise ValueError(
                f"kvcache.vllm: kvcached pool {pool.name[:40]!r} holds {g.num_layers} layers x "
                f"{g.num_kv_heads} kv heads x {g.head_dim} ({have}); this model needs "
                f"{num_layers} x {heads} x {head_dim} ({want})")

    # -- loads --------------------------------------------------------------------------

    def load(self, meta: KvcachedMetadata) -> None:
        self._failed_loads = set()
        for op in meta.loads:
            start = time.perf_counter()
            good = self._load_one(op)
            if good < op.end:
                # The blocks of tokens [good, end) stay unfilled: vLLM recomputes them.
                self._load_errors.update(op.block_ids[(good - op.first) // self._block:])
                self._failed_loads.add(op.req_id)
            if good > op.first:
                n = good - op.first
                self._counters.add("loaded_tokens", n)
                self._counters.add("loaded_bytes", n * self._token_bytes())
            self._counters.add("load_seconds", time.perf_counter() - start)

    def _token_bytes(self) -> int:
        num_layers, heads, head_dim = self._geometry
        size = torch.empty((), dtype=self._dtype or torch.float16).element_size()
        return num_layers * heads * 2 * head_dim * size

    def _load_one(self, op: LoadOp) -> int:
        """Loads what it can of op; returns the end of the tokens loaded (a block multiple)."""
        if not self._layers:
            self._counters.failed("not_registered")
            return op.first
        seq = None
        try:
            seq = self._client.create_sequence(pool=self._pool, policy=self._policy,
                                               prefix=Prefix(self._identity, op.token_ids,
                                                             op.salt))
            good = min(seq.attached_tokens, op.end) // self._block * self._block
            if good < op.end:
                self._counters.failed("evicted")
            if good <= op.first:
                return op.first
            kv = self._client.fetch(seq, dtype=_POOL_DTYPE[self._dtype])
            heads = self._geometry[1]
            for layer, cache in enumerate(self._layers):
                keys, values = [], []
                for h in range(heads):
                    head = kv[(layer, h)]
                    if not np.array_equal(head.positions[op.first:good],
                                          np.arange(op.first, good)):
                        raise _Mismatch(f"layer {layer} head {h} positions")
                    keys.append(head.keys[op.first:good])
                    values.append(head.values[op.first:good])
                k = _to_torch(np.stack(keys, axis=1), self._dtype)
                v = _to_torch(np.stack(values, axis=1), self._dtype)
                paged.scatter(cache, op.block_ids[:(good - op.first) // self._block],
                              self._block, k, v)
            return good
        except _Mismatch as e:
            log.error("kvcache.vllm: load of request %s refused: %s", op.req_id, e)
            self._counters.failed("mismatch")
            return op.first
        except KvCacheError as e:
            log.warning("kvcache.vllm: load of request %s failed (%s); vLLM recomputes it",
                        op.req_id, e)
            self._counters.failed("load")
            return op.first
        finally:
            if seq is not None:
                self._release(seq)

    def take_load_errors(self) -> Set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    # -- saves --------------------------------------------------------------------------

    def save(self, meta: KvcachedMetadata) -> None:
        """Copies each save's blocks out of vLLM's cache and queues it for the save thread."""
        if not self._layers:
            return
        for op in meta.saves:
            if op.req_id in self._failed_loads:
                # This step's tokens attended to blocks that failed to load: their keys and
                # values are wrong (vLLM recomputes them) and must never be published.
                self._counters.failed("save_after_failed_load")
                continue
            n = len(op.token_ids) - op.cached
            nbytes = n * self._token_bytes()
            with self._pending_lock:
                if self._pending + nbytes > self._max_pending:
                    self._counters.failed("save_backlog")
                    continue
                self._pending += nbytes
            layers = [paged.gather(cache, op.block_ids, self._block) for cache in self._layers]
            self._saves.put((op, layers, nbytes))

    def _save_loop(self) -> None:
        while True:
            item = self._saves.get()
            if item is None:
                self._saves.task_done()
                return
            op, layers, nbytes = item
            try:
                self._save_one(op, layers)
            finally:
                with self._pending_lock:
                    self._pending -= nbytes
                self._saves.task_done()

    def _save_one(self, op: SaveOp, layers: List[Any]) -> None:
        start = time.perf_counter()
        prefix = Prefix(self._identity, op.token_ids, op.salt)
        seq = None
        try:
            seq = self._client.create_sequence(pool=self._pool, policy=self._policy,
                                               prefix=prefix)
            have = seq.attached_tokens
            if have < op.cached:
                # Evicted since the lookup: the tokens before op.cached were not copied out.
                self._counters.failed("save_evicted")
                return
            if have >= len(op.token_ids):
                return  # another instance published it meanwhile
            skip = have - op.cached
            for layer, (keys, values) in enumerate(layers):
                self._client.append(seq, layer, have, _to_numpy(keys[skip:]),
                                    _to_numpy(values[skip:]),
                                    dtype=_POOL_DTYPE[self._dtype])
            self._client.publish_prefix(seq, prefix)
            n = len(op.token_ids) - have
            self._counters.add("saved_tokens", n)
            self._counters.add("saved_bytes", n * self._token_bytes())
            self._counters.add("save_seconds", time.perf_counter() - start)
        except KvCacheError as e:
            log.warning("kvcache.vllm: save of request %s failed (%s)", op.req_id, e)
            self._counters.failed("save")
        finally:
            if seq is not None:
                self._release(seq)

    def wait_saves(self) -> None:
        """Blocks until every queued save has been sent (or has failed)."""
        self._saves.join()

    def close(self) -> None:
        self._saves.put(None)
        self._saver.join(timeout=60)

    def _release(self, seq: Any) -> None:
        try:
            self._client.release(seq)
        except KvCacheError as e:
            # It stays in kvcached, holding its blocks, until evicted (kvcachectl).
            log.error("kvcache.vllm: release of sequence %s failed (%s)", seq.sequence_id, e)
            self._counters.failed("release")


class _Mismatch(Exception):
    """kvcached answered with other tokens than the prefix asked for."""
