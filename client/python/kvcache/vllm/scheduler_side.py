"""The connector in vLLM's scheduler process: asks kvcached how much of a prompt it holds,
and tells the workers, step by step, which blocks to fill from kvcached (loads) and which
to publish to it (saves).

A prompt's blocks are saved once, in the step that computes its last prompt token (all of its
blocks then hold their keys and values), and only its whole blocks: a partial last block is
never published. The last prompt token is never loaded (vLLM must compute at least one token
to sample from), so a prompt of exactly k blocks loads at most k - 1 of them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

from kvcache.errors import KvCacheError
from kvcache.types import Prefix
from kvcache.vllm.stats import Counters

log = logging.getLogger("kvcache.vllm")
QUIET_AFTER_FAILURE_S = 5.0


@dataclasses.dataclass
class LoadOp:
    """Fill blocks_ids (tokens [first, end) of the prompt) from kvcached's prefix of
    token_ids (= the prompt's first `end` tokens)."""
    req_id: str
    token_ids: List[int]
    salt: str
    first: int
    end: int
    block_ids: List[int]


@dataclasses.dataclass
class SaveOp:
    """Publish token_ids (the prompt's whole blocks) to kvcached; it held the first `cached`
    when asked, so only tokens [cached, len(token_ids)) are copied out of block_ids (the
    blocks of those tokens)."""
    req_id: str
    token_ids: List[int]
    salt: str
    cached: int
    block_ids: List[int]


@dataclasses.dataclass
class KvcachedMetadata(KVConnectorMetadata):
    loads: List[LoadOp] = dataclasses.field(default_factory=list)
    saves: List[SaveOp] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _Request:
    prompt: List[int]
    salt: str
    cached: int = 0               # whole-block prompt tokens kvcached held at the lookup
    load_end: int = 0             # of which may be loaded (not the prompt's last token)
    load: Optional[Tuple[int, int]] = None  # tokens to load, decided after allocation
    block_ids: List[int] = dataclasses.field(default_factory=list)
    computed: int = 0             # tokens computed once the step built last runs
    saved: bool = False


def unsupported(request: Any) -> str:
    """Why the request's token ids do not name its keys and values ("" when they do)."""
    if getattr(request, "mm_features", None):
        return "multimodal"  # placeholder token ids stand for the images' embeddings
    if getattr(request, "prompt_embeds", None) is not None:
        return "prompt_embeds"
    if not request.prompt_token_ids:
        return "no_prompt_tokens"
    return ""


class SchedulerSide:
    def __init__(self, lookup: Callable[[Prefix], int], identity: str, salt: str,
                 block_size: int, load: bool, save: bool, counters: Counters):
        self._lookup = lookup  # cached whole-block tokens of a prefix; raises KvCacheError
        self._identity = identity
        self._salt = salt
        self._block = block_size
        self._load, self._save = load, save
        self._counters = counters
        self._requests: Dict[str, _Request] = {}
        self._quiet_until = 0.0  # no lookups before (time.monotonic()) after a failure

    def _salt_of(self, request: Any) -> str:
        # vLLM's per-request cache_salt and LoRA adapter change who may share the blocks.
        parts = [self._salt, getattr(request, "cache_salt", None) or ""]
        lora = getattr(request, "lora_request", None)
        if lora is not None:
            parts.append(f"lora:{lora.lora_name}")
        if not any(parts[1:]):
            return self._salt
        salt = "|".join(parts)
        return salt if len(salt.encode()) <= 128 else hashlib.sha256(salt.encode()).hexdigest()

    def matched_tokens(self, request: Any, num_computed_tokens: int) -> Tuple[int, bool]:
        why = unsupported(request)
        if why:
            self._counters.add("skipped_" + why)
            return 0, False
        state = _Request(list(request.prompt_token_ids), self._salt_of(request))
        self._requests[request.request_id] = state
        if not self._load and not self._save:
            return 0, False
        # What kvcached holds of the prompt's whole blocks (saves skip it); what may be loaded
        # stops before the prompt's last token.
        whole = len(state.prompt) // self._block * self._block
        limit = (len(state.prompt) - 1) // self._block * self._block
        if whole == 0:
            return 0, False
        if time.monotonic() < self._quiet_until:
            self._counters.add("skipped_unavailable")
            return 0, False
        self._counters.add("lookups")
        self._counters.add("lookup_tokens", whole)
        try:
            cached = self._lookup(Prefix(self._identity, state.prompt[:whole], state.salt))
        except KvCacheError as e:
            # The scheduler waits on this call: after a failure, requests skip kvcached for
            # a while instead of each waiting out a deadline (they compute their prompts).
            self._quiet_until = time.monotonic() + QUIET_AFTER_FAILURE_S
            log.warning("kvcache.vllm: lookup failed (%s); requests compute their prompts "
                        "for the next %.0f s", e, QUIET_AFTER_FAILURE_S)
            self._counters.failed("lookup")
            return 0, False
        state.cached = min(cached, whole) // self._block * self._block
        if not self._load:
            return 0, False
        state.load_end = min(state.cached, limit)
        new = max(0, state.load_end - num_computed_tokens)
        self._counters.add("hit_tokens", new)
        return new, False

    def after_alloc(self, request: Any, num_external_tokens: int) -> None:
        state = self._requests.get(request.request_id)
        if state is None or num_external_tokens <= 0:
            return
        end = state.load_end
        state.load = (end - num_external_tokens, end)

    def build_meta(self, out: Any) -> KvcachedMetadata:
        meta = KvcachedMetadata()
        touched: List[Tuple[str, _Request]] = []
        for new in out.scheduled_new_reqs:  # new, or resumed after a preemption
            state = self._requests.get(new.req_id)
            if state is None:
                continue
            state.block_ids = list(new.block_ids[0])
            state.computed = new.num_computed_tokens + out.num_scheduled_tokens.get(new.req_id, 0)
            if state.load is not None:
                first, end = state.load
                state.load = None
                meta.loads.append(LoadOp(new.req_id, state.prompt[:end], state.salt, first, end,
                                         state.block_ids[first // self._block:
                                                         end // self._block]))
            touched.append((new.req_id, state))
        cached = out.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            state = self._requests.get(req_id)
            if state is None:
                continue
            if cached.new_block_ids[i] is not None:
                state.block_ids.extend(cached.new_block_ids[i][0])
            state.computed = cached.num_computed_tokens[i] + out.num_scheduled_tokens.get(req_id, 0)
            touched.append((req_id, state))
        if self._save:
            for req_id, state in touched:
                whole = len(state.prompt) // self._block * self._block
                if state.saved or state.computed < len(state.prompt) or whole <= state.cached:
                    continue
                state.saved = True
                meta.saves.append(SaveOp(req_id, state.prompt[:whole], state.salt, state.cached,
                                         state.block_ids[state.cached // self._block:
                                                         whole // self._block]))
        return meta

    def finished(self, req_id: str) -> None:
        self._requests.pop(req_id, None)

    def tracked(self) -> int:
        return len(self._requests)
