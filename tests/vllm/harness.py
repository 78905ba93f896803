"""vLLM's own Scheduler with KvcachedConnector on both sides, and a stand-in for the model's
forward pass over real paged KV tensors in vLLM's layout.

The forward pass writes each scheduled token's keys and values as a function of the tokens up
to and including it (as a model's are), so a block loaded from kvcached can be compared with
the one computing it would have written, byte for byte. Everything else is vLLM's code: its
Scheduler, KV cache manager, request lifecycle and load-failure recovery."""

from __future__ import annotations

import hashlib
import pathlib
from typing import Any, Dict, List, Optional, Set, Tuple

import numpy as np
import torch
from vllm import SamplingParams
from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig,
                         SchedulerConfig, VllmConfig)
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from conftest import HEAD_DIM, KV_HEADS, LAYERS
from kvcache.vllm import KvcachedConnector
from kvcache.vllm.scheduler_side import KvcachedMetadata

BLOCK = 16
EOS = 2
init_none_hash(sha256)


def vllm_config(model_dir: pathlib.Path, target: str, extra: Optional[Dict[str, Any]] = None,
                dtype: str = "float16", kv_role: str = "kv_both",
                failure_policy: str = "recompute", max_batched: int = 64) -> VllmConfig:
    model = ModelConfig(model=str(model_dir), dtype=dtype, seed=0, skip_tokenizer_init=True)
    extra = {"target": target, "pool": "smollm2", "timeout_s": 5, **(extra or {})}
    return VllmConfig(
        model_config=model,
        scheduler_config=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=max_batched,
                                         max_model_len=4096, enable_chunked_prefill=True,
                                         is_encoder_decoder=False),
        cache_config=CacheConfig(block_size=BLOCK, cache_dtype="auto",
                                 enable_prefix_caching=True),
        kv_transfer_config=KVTransferConfig(
            kv_connector="KvcachedConnector", kv_connector_module_path="kvcache.vllm",
            kv_role=kv_role, kv_load_failure_policy=failure_policy,
            kv_connector_extra_config=extra),
        device_config=DeviceConfig("cpu"))


def token_kv(tokens: Tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """[LAYERS, KV_HEADS, 2 * HEAD_DIM] of the last of `tokens`: a function of all of them."""
    seed = int.from_bytes(hashlib.sha256(np.asarray(tokens, np.int64).tobytes()).digest()[:8],
                          "little")
    rng = np.random.default_rng(seed)
    return torch.from_numpy(rng.standard_normal((LAYERS, KV_HEADS, 2 * HEAD_DIM),
                                                np.float32)).to(dtype)


class Engine:
    def __init__(self, config: VllmConfig, num_blocks: int = 96,
                 dtype: torch.dtype = torch.float16):
        self.dtype = dtype
        names = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]
        kv_config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[
            KVCacheGroupSpec(names, FullAttentionSpec(block_size=BLOCK, num_kv_heads=KV_HEADS,
                                                      head_size=HEAD_DIM, dtype=dtype))])
        config.cache_config.num_gpu_blocks = num_blocks
        self.scheduler = Scheduler(vllm_config=config, kv_cache_config=kv_config, log_stats=True,
                                   structured_output_manager=StructuredOutputManager(config),
                                   block_size=BLOCK)
        self.connector = self.scheduler.connector
        assert isinstance(self.connector, KvcachedConnector)
        self.worker = KvcachedConnector(config, KVConnectorRole.WORKER, kv_config)
        # Each layer's cache in vLLM's LBNHC layout: [layers][blocks, tokens, heads, 2D]
        # memory viewed as the logical [blocks, heads, tokens, 2D] the connector is given.
        backing = torch.full((LAYERS, num_blocks, BLOCK, KV_HEADS, 2 * HEAD_DIM), float("nan"),
                             dtype=dtype)
        self.caches = {name: backing[i].permute(0, 2, 1, 3) for i, name in enumerate(names)}
        self.worker.register_kv_caches(self.caches)
        self.tokens: Dict[str, List[int]] = {}
        self.blocks: Dict[str, List[int]] = {}
        self.metas: List[KvcachedMetadata] = []
        self.load_errors: List[Set[int]] = []
        self.finished: Dict[str, Any] = {}  # request id -> vLLM's FinishReason
        self.reported: Dict[str, float] = {}  # the connectors' stats as vLLM reports them
        self.before_load: Optional[Any] = None  # called between schedule() and the loads

    def add(self, req_id: str, prompt: List[int], max_tokens: int = 2) -> None:
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        params.update_from_generation_config({}, EOS)
        self.tokens[req_id] = list(prompt)
        self.scheduler.add_request(Request(request_id=req_id, prompt_token_ids=list(prompt),
                                           sampling_params=params, pooling_params=None,
                                           block_hasher=get_request_block_hasher(BLOCK, sha256)))

    def step(self) -> None:
        out = self.scheduler.schedule()
        meta = out.kv_connector_metadata
        assert isinstance(meta, KvcachedMetadata)
        self.metas.append(meta)
        computed = {}
        for new in out.scheduled_new_reqs:
            self.blocks[new.req_id] = list(new.block_ids[0])
            computed[new.req_id] = new.num_computed_tokens
        cached = out.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            if cached.new_block_ids[i] is not None:
                self.blocks[req_id].extend(cached.new_block_ids[i][0])
            computed[req_id] = cached.num_computed_tokens[i]
        self.worker.bind_connector_metadata(meta)
        if self.before_load is not None and meta.loads:
            self.before_load()
        self.worker.start_load_kv(None)
        errors = self.worker.get_block_ids_with_load_errors()
        self.load_errors.append(errors)
        req_ids, sampled = [], []
        for req_id, n in out.num_scheduled_tokens.items():
            first = computed[req_id]
            for pos in range(first, first + n):
                self._forward(req_id, pos)
            req_ids.append(req_id)
            done = first + n >= len(self.tokens[req_id])
            sampled.append([1000 + len(self.tokens[req_id])] if done else [])
        self.worker.wait_for_save()
        self.worker.clear_connector_metadata()
        # The model runner hands the worker's stats to the scheduler with the step's output.
        stats = self.worker.get_kv_connector_stats()
        connector_output = (KVConnectorOutput(invalid_block_ids=errors, kv_connector_stats=stats)
                            if errors or stats is not None else None)
        fields = {"req_ids": req_ids, "sampled_token_ids": sampled, "logprobs": None,
                  "prompt_logprobs_dict": {}, "pooler_output": None,
                  "kv_connector_output": connector_output}
        if "req_id_to_index" in ModelRunnerOutput.__dataclass_fields__:  # vLLM <= 0.33
            fields["req_id_to_index"] = {r: i for i, r in enumerate(req_ids)}
        output = ModelRunnerOutput(**fields)
        for outputs in self.scheduler.update_from_output(out, output).values():
            reported = outputs.scheduler_stats and outputs.scheduler_stats.kv_connector_stats
            for key, value in (reported or {}).items():
                self.reported[key] = self.reported.get(key, 0) + value
            for o in outputs.outputs:
                if o.finish_reason is not None:
                    self.finished[o.request_id] = o.finish_reason
        for req_id in req_ids:  # what vLLM kept (it drops a token sampled over failed loads)
            request = self.scheduler.requests.get(req_id)
            if request is not None:
                self.tokens[req_id] = list(request.all_token_ids)

    def _forward(self, req_id: str, pos: int) -> None:
        kv = token_kv(tuple(self.tokens[req_id][:pos + 1]), self.dtype)
        block, offset = self.blocks[req_id][pos // BLOCK], pos % BLOCK
        for layer, cache in enumerate(self.caches.values()):
            cache[block, :, offset, :] = kv[layer]

    def run(self, max_steps: int = 200) -> None:
        for _ in range(max_steps):
            if not self.scheduler.has_unfinished_requests():
                return
            self.step()
        raise AssertionError("requests still unfinished after %d steps" % max_steps)

    def block_kv(self, req_id: str, first: int, end: int) -> torch.Tensor:
        """[end - first, LAYERS, KV_HEADS, 2 * HEAD_DIM]: what the request's blocks hold."""
        rows = []
        for pos in range(first, end):
            block, offset = self.blocks[req_id][pos // BLOCK], pos % BLOCK
            rows.append(torch.stack([c[block, :, offset, :] for c in self.caches.values()]))
        return torch.stack(rows)

    def expected_kv(self, prompt: List[int], first: int, end: int) -> torch.Tensor:
        return torch.stack([token_kv(tuple(prompt[:p + 1]), self.dtype) for p in range(first, end)])

    def settle(self) -> Dict[str, float]:
        """Waits for the worker's queued saves and reports their stats through vLLM."""
        self.worker._worker.wait_saves()
        self.step()
        return self.reported

    def loads(self) -> List[Any]:
        return [op for meta in self.metas for op in meta.loads]

    def saves(self) -> List[Any]:
        return [op for meta in self.metas for op in meta.saves]

    def close(self) -> None:
        self.worker.shutdown()
        self.connector.shutdown()


def assert_scheduler_empty(engine: Engine) -> None:
    """vLLM's own no-leak checks (tests/v1/kv_connector/unit/utils.py), and the connector's."""
    s = engine.scheduler
    engine.step()  # an empty step hands the last finished ids to the workers
    assert not s.requests and not s.waiting and not s.running
    assert not s.finished_req_ids and not s.finished_recving_kv_req_ids
    manager = s.kv_cache_manager.coordinator.single_type_managers[0]
    assert not manager.req_to_blocks and not manager.num_cached_block
    pool = s.kv_cache_manager.block_pool
    assert pool.free_block_queue.num_free_blocks == pool.num_gpu_blocks - 1
    assert all(block.ref_cnt == 0 for block in pool.blocks)
    assert engine.connector._scheduler.tracked() == 0
