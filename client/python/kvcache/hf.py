"""A Hugging Face transformers `Cache` whose keys and values live in kvcached.

    import kvcache, kvcache.hf
    client = kvcache.Client("127.0.0.1:50051")
    spec = kvcache.CompressionSpec(eviction=kvcache.SnapKV(window=32, budget=256), storage="int4_g32")
    with kvcache.hf.KvcachedCache(model, client, pool="smollm2", compression=spec) as cache:
        out = model.generate(input_ids, cache=cache, max_new_tokens=32, do_sample=False)
    # (transformers < 5.24: past_key_values=cache)

Every layer's new keys and values are appended to one kvcached sequence, and the model attends
to exactly what the service stores (compressed, quantized and all); nothing is kept on the
client between forward passes. Two ways to attend, `decode=`:
  * "fetch" (default): every forward reads the layer back (Fetch, dequantized to float32) and
    transformers' own attention runs over it;
  * "attend": prefills and multi-token chunks do the same, but a single-token decode step sends
    the layer's query to kvcached's Attend (one stream per cache) and gets the attention output
    back, so the cache never moves. This swaps the model's attention implementation for a
    wrapper (`kvcached_<implementation>`, the original for everything but those decode steps)
    while the cache is open, and restores it on close().

Compression runs inside the service: with `compression=`, the cache compresses the sequence at
the start of the first single-token forward after a prefill (the first decode step of
`generate`), or when `compress()` is called. The queries SnapKV and H2O need, and the query
statistics Expected Attention needs, are captured from the model's attention modules while the
prompt is prefilled (forward pre-hooks that recompute the query projection and its RoPE, as
kvpress does), so any attention implementation works.

Positions: kvcached keeps the logical length (every token ever appended) after eviction, and
so does this cache (`get_seq_length`), so new tokens get the positions they would have had
without compression; the mask places the kept tokens just below them (`get_mask_sizes`).

Errors are the service's (kvcache.errors). A failed append or read leaves layers at different
lengths, so the cache refuses every later step (close it and prefill again); a refused
compress() changes nothing. Limits (each refused with a clear error): batch size 1; a layer
whose kv heads keep different token counts (adaptive budgets, AdaKV) cannot be handed to
transformers' attention, which takes one key length per layer, so with such budgets only
decode="attend" works (kvcached's Attend serves unequal heads) and a multi-token chunk after
the compression is refused; beam search and cropping are not supported.

Needs torch and transformers (`pip install ./client/python[hf]`); importing `kvcache` alone
does not.
"""

from __future__ import annotations

import importlib
import weakref
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import torch
from transformers.cache_utils import Cache, CacheLayerMixin
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from kvcache.client import Client
from kvcache.errors import NotFound
from kvcache.types import (H2O, CompressionSpec, ExpectedAttention, LayerQueries, LayerQueryStats,
                           SnapKV)

# Expected Attention's statistics skip the first positions (attention sinks), as kvc-worker's.
_STATS_SKIP_POSITIONS = 4


def _check_batch(x: torch.Tensor) -> None:
    if x.shape[0] != 1:
        raise ValueError(f"KvcachedCache holds one sequence; got batch size {x.shape[0]}")


def _register_attend_wrapper(base: str) -> str:
    """Registers `kvcached_<base>` with transformers: attention and mask as `base`'s, except
    that a single-token decode step of a module whose KvcachedCache attends in kvcached gets
    its output from kvcached's Attend. Idempotent."""
    name = f"kvcached_{base}"
    if name in ALL_ATTENTION_FUNCTIONS._global_mapping:
        return name
    if base == "eager":
        module_name = "transformers.models.llama.modeling_llama"
        original: Callable = importlib.import_module(module_name).eager_attention_forward
    elif base in ALL_ATTENTION_FUNCTIONS._global_mapping:
        original = ALL_ATTENTION_FUNCTIONS._global_mapping[base]
    else:
        raise ValueError(f"decode='attend' cannot wrap attention implementation {base[:40]!r}")

    def attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                  value: torch.Tensor, attention_mask: Optional[torch.Tensor], *args: Any,
                  **kwargs: Any) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        ref = getattr(module, "_kvcached_cache", None)
        cache = ref() if ref is not None else None
        if cache is not None and cache._attending and query.shape[2] == 1:
            return cache._attend_forward(module, query), None
        return original(module, query, key, value, attention_mask, *args, **kwargs)

    ALL_ATTENTION_FUNCTIONS.register(name, attention)
    if base in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping:
        ALL_MASK_ATTENTION_FUNCTIONS.register(name, ALL_MASK_ATTENTION_FUNCTIONS._global_mapping[base])
    return name


class KvcachedLayer(CacheLayerMixin):
    """One model layer of a KvcachedCache: appends to kvcached, reads the layer back."""

    is_sliding = False
    is_croppable = False

    def __init__(self, owner: "KvcachedCache", layer: int):
        super().__init__()
        self._owner = owner
        self._layer = layer
        self.length = 0  # logical tokens appended (positions 0 .. length-1)
        self.kept = 0    # tokens per kv head kvcached returned at the last read

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.dtype = key_states.dtype
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        _check_batch(key_states)
        # [1, kv_heads, n, head_dim] -> kvcached's [n, kv_heads, head_dim], float32 on the wire
        # (the service converts to the pool's dtype).
        keys = key_states[0].transpose(0, 1).detach().to("cpu", torch.float32).contiguous()
        values = value_states[0].transpose(0, 1).detach().to("cpu", torch.float32).contiguous()
        o = self._owner
        o._check_usable()
        attend = o._attend_step(keys.shape[0])
        try:
            o.client.append(o.sequence, self._layer, self.length, keys.numpy(), values.numpy())
            self.length += keys.shape[0]
            if attend:
                # kvcached's Attend reads the layer where it lies (_attend_forward); the
                # token just appended is kept (nothing evicts inside Append here).
                self.kept += 1
                return key_states, value_states
            self.keys, self.values = o._read_layer(self._layer)
        except Exception as e:
            # Some layers may hold this step's tokens and others not: refuse later steps
            # rather than attend to a cache that no longer matches the model's positions.
            o._failure = e
            raise
        self.kept = self.keys.shape[-2]
        return self.keys, self.values

    def get_mask_sizes(self, query: Any) -> tuple[int, int]:
        # The kept tokens sit just below the new ones: kv index i is position
        # (length - kept) + i, so the causal mask among the new tokens stays right after
        # eviction shortened the cache. transformers < 5.24 passes the new tokens'
        # cache_position tensor instead of their count.
        n = query.shape[0] if isinstance(query, torch.Tensor) else int(query)
        return self.kept + n, self.length - self.kept

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return -1

    def get_max_cache_shape(self) -> int:  # transformers < 5.24's name of get_max_length
        return -1

    def reset(self) -> None:
        raise NotImplementedError("KvcachedCache cannot be reset; close it and make a new one")

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise NotImplementedError("KvcachedCache holds one sequence: no beam search")


class _QueryRecorder:
    """Captures, per layer, what compression needs from the prompt's queries: the newest
    `window` queries after RoPE (SnapKV), all of them (H2O), or the mean and covariance of the
    queries before RoPE (Expected Attention)."""

    def __init__(self, spec: Optional[CompressionSpec], num_layers: int):
        e = spec.eviction if spec is not None else None
        self.window = e.window if isinstance(e, SnapKV) else (-1 if isinstance(e, H2O) else 0)
        self.stats = isinstance(e, ExpectedAttention)
        self.queries: Dict[int, torch.Tensor] = {}    # layer -> [n, heads, dim] after RoPE
        self.positions: Dict[int, torch.Tensor] = {}  # layer -> [n]
        self.sums: Dict[int, torch.Tensor] = {}       # layer -> [heads, dim] (float64)
        self.outer: Dict[int, torch.Tensor] = {}      # layer -> [heads, dim, dim] (float64)
        self.count = [0] * num_layers

    @property
    def needed(self) -> bool:
        return self.window != 0 or self.stats

    def record(self, module: torch.nn.Module, hidden: torch.Tensor, cos: torch.Tensor,
               sin: torch.Tensor, start: int) -> None:
        layer, head_dim = module.layer_idx, module.head_dim
        n = hidden.shape[1]
        first = 0 if self.window <= 0 or self.stats else max(0, n - self.window)
        with torch.no_grad():
            q = module.q_proj(hidden[:, first:]).view(1, n - first, -1, head_dim).transpose(1, 2)
            if self.stats:
                self._accumulate(layer, q[0].transpose(0, 1), start + first)
                return
            rope = importlib.import_module(type(module).__module__).apply_rotary_pos_emb
            q, _ = rope(q, q, cos[:, first:], sin[:, first:])
        q = q[0].transpose(0, 1).to(torch.float32)  # [n, heads, dim]
        pos = torch.arange(start + first, start + n, dtype=torch.int64)
        if layer in self.queries:
            q = torch.cat([self.queries[layer], q])
            pos = torch.cat([self.positions[layer], pos])
        if self.window > 0:
            q, pos = q[-self.window:], pos[-self.window:]
        self.queries[layer], self.positions[layer] = q, pos

    def _accumulate(self, layer: int, q: torch.Tensor, start: int) -> None:
        q = q[max(0, _STATS_SKIP_POSITIONS - start):].to(torch.float64)  # [n, heads, dim]
        if q.shape[0] == 0:
            return
        s = q.sum(0)
        o = torch.einsum("nhd,nhe->hde", q, q)
        self.sums[layer] = self.sums[layer] + s if layer in self.sums else s
        self.outer[layer] = self.outer[layer] + o if layer in self.outer else o
        self.count[layer] += q.shape[0]

    def layer_queries(self) -> List[LayerQueries]:
        return [LayerQueries(layer, self.queries[layer].numpy(),
                             self.positions[layer].tolist()) for layer in sorted(self.queries)]

    def layer_stats(self) -> List[LayerQueryStats]:
        out = []
        for layer in sorted(self.sums):
            n = self.count[layer]
            mean = self.sums[layer] / n
            cov = self.outer[layer] / n - torch.einsum("hd,he->hde", mean, mean)
            out.append(LayerQueryStats(layer, mean.to(torch.float32).numpy(),
                                       cov.to(torch.float32).numpy()))
        return out

    def clear(self) -> None:
        self.queries.clear()
        self.positions.clear()
        self.sums.clear()
        self.outer.clear()
        self.count = [0] * len(self.count)


class KvcachedCache(Cache):
    """A transformers Cache backed by one kvcached sequence (see the module docstring).

    Args:
        model: the transformers causal LM (its config sizes the cache; its attention modules
            get forward pre-hooks while compression still needs the prompt's queries).
        client: a connected kvcache.Client.
        pool: the kvcached pool; its geometry must match the model (checked here).
        compression: compressed inside kvcached at the first decode step after a prefill.
        tenant, sequence_id: passed to CreateSequence.
    """

    def __init__(self, model: torch.nn.Module, client: Client, *, pool: str = "",
                 compression: Optional[CompressionSpec] = None, tenant: str = "",
                 sequence_id: str = "", decode: str = "fetch"):
        config = model.config.get_text_config(decoder=True)
        self.num_layers = config.num_hidden_layers
        if decode not in ("fetch", "attend"):
            raise ValueError(f"decode={decode[:32]!r}; expected 'fetch' or 'attend'")
        self._check_pool(client, pool, config)
        self.decode = decode
        self._model = model
        self._restore_attn: Optional[str] = None
        self._attend_session: Any = None
        self._attending = False  # this forward is a single-token decode step through Attend
        self.client = client
        self.compression = compression
        self.compressed = False
        self.compress_response: Any = None
        self._recorder = _QueryRecorder(compression, self.num_layers)
        self._hooks: List[Any] = []
        self._prefilled = False
        self._failure: Optional[BaseException] = None
        self.sequence = client.create_sequence(pool=pool, tenant=tenant, sequence_id=sequence_id)
        super().__init__(layers=[KvcachedLayer(self, i) for i in range(self.num_layers)])
        if compression is not None or decode == "attend":
            self._hooks.append(model.register_forward_pre_hook(self._before_forward,
                                                               with_kwargs=True))
        if compression is not None and self._recorder.needed:
            for module in model.modules():
                if hasattr(module, "q_proj") and hasattr(module, "layer_idx"):
                    self._hooks.append(module.register_forward_pre_hook(
                        self._record_queries, with_kwargs=True))
        if decode == "attend":
            try:
                self._install_attend(model, config)
            except Exception:
                self.close()
                raise

    @staticmethod
    def _check_pool(client: Client, pool: str, config: Any) -> None:
        pools = client.list_pools()
        info = next((p for p in pools if p.name == pool), None) if pool else (
            pools[0] if pools else None)
        if info is None:
            raise ValueError(f"kvcached has no pool {pool!r} (pools: "
                             f"{', '.join(p.name for p in pools) or 'none'})")
        g = info.geometry
        head_dim = getattr(config, "head_dim", None) or (
            config.hidden_size // config.num_attention_heads)
        want = (config.num_hidden_layers, config.num_key_value_heads,
                config.num_attention_heads, head_dim)
        have = (g.num_layers, g.num_kv_heads, g.num_query_heads, g.head_dim)
        if want != have:
            raise ValueError(f"pool {info.name!r} has (layers, kv heads, query heads, head_dim) "
                             f"{have}; the model needs {want}")

    def _check_usable(self) -> None:
        if self.sequence is None:
            raise ValueError("KvcachedCache is closed")
        if self._failure is not None:
            raise RuntimeError(f"KvcachedCache is unusable after an earlier failure "
                               f"({type(self._failure).__name__}: {self._failure}); close it "
                               "and prefill again") from self._failure

    # --- compression -----------------------------------------------------------------------

    def _before_forward(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        if kwargs.get("past_key_values", kwargs.get("cache")) is not self:
            self._attending = False  # the model runs with another cache (or none)
            return
        x = kwargs.get("input_ids", args[0] if args else None)
        if x is None:
            x = kwargs.get("inputs_embeds")
        n = x.shape[1] if x is not None else 0
        self._attending = self.decode == "attend" and n == 1 and self._prefilled
        if n > 1:
            self._prefilled = True
        elif (n == 1 and self._prefilled and not self.compressed and
              self.compression is not None):
            self.compress()

    def _record_queries(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        if self.compressed:
            return
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        _check_batch(hidden)
        cos, sin = kwargs["position_embeddings"]
        self._recorder.record(module, hidden, cos, sin, self.layers[module.layer_idx].length)

    def compress(self, spec: Optional[CompressionSpec] = None) -> Any:
        """Compresses the sequence in kvcached now (by `spec`, else the cache's compression),
        with the queries captured so far; returns the CompressResponse. Later reads see the
        compressed cache. Errors are the service's (kvcache.errors)."""
        self._check_usable()
        spec = spec or self.compression
        if spec is None:
            raise ValueError("no CompressionSpec: pass one here or as compression=")
        r = self._recorder
        if isinstance(spec.eviction, (SnapKV, H2O)) and not r.queries:
            raise ValueError(f"{type(spec.eviction).__name__} needs the prompt's queries: give "
                             "the cache compression= before the prefill")
        if isinstance(spec.eviction, ExpectedAttention) and not r.sums:
            raise ValueError("ExpectedAttention needs the prompt's query statistics: give the "
                             "cache compression= before the prefill")
        queries = r.layer_queries() if isinstance(spec.eviction, (SnapKV, H2O)) else None
        stats = r.layer_stats() if isinstance(spec.eviction, ExpectedAttention) else None
        # Compress is all-or-nothing in kvcached: a refusal leaves the cache as it was.
        self.compress_response = self.client.compress(self.sequence, spec, queries,
                                                      query_stats=stats)
        self.compressed = True
        r.clear()
        try:
            if self.decode == "attend":
                # Decode attends in kvcached, which serves kv heads of different lengths
                # (adaptive budgets): nothing is read back, only the kept counts the masks of
                # a later multi-token chunk need (such a chunk fetches, and refuses unequal
                # heads there).
                stored = list(self.client.get_sequence(self.sequence).stored_tokens)
                heads = len(stored) // self.num_layers
                for layer in self.layers:
                    i = layer._layer * heads
                    layer.kept = max(stored[i:i + heads])
                    layer.keys = layer.values = None
            else:
                for layer in self.layers:  # the kept counts the next mask needs
                    layer.keys, layer.values = self._read_layer(layer._layer)
                    layer.kept = layer.keys.shape[-2]
        except Exception as e:
            self._failure = e
            raise
        return self.compress_response

    # --- decode through Attend --------------------------------------------------------------

    def _install_attend(self, model: torch.nn.Module, config: Any) -> None:
        """Wraps the model's attention implementation so that the attention of a single-token
        decode step runs in kvcached. kvcached's Attend scales by 1/sqrt(head_dim) and has no
        softcapping or sliding window: models that need otherwise are refused."""
        modules = [m for m in model.modules() if hasattr(m, "q_proj") and hasattr(m, "layer_idx")]
        if not modules:
            raise ValueError("decode='attend': the model has no attention modules with q_proj "
                             "and layer_idx")
        held = getattr(modules[0], "_kvcached_cache", None)
        if held is not None and held() is not None:
            raise ValueError("the model already has an open KvcachedCache with "
                             "decode='attend'; close it first (or use decode='fetch')")
        head_dim = modules[0].head_dim
        for m in modules:
            scaling = getattr(m, "scaling", head_dim ** -0.5)
            if abs(scaling - head_dim ** -0.5) > 1e-6 or getattr(m, "sliding_window", None) or \
                    getattr(config, "attn_logit_softcapping", None):
                raise ValueError("decode='attend' needs plain softmax attention scaled by "
                                 "1/sqrt(head_dim); use decode='fetch' with this model")
        current = config._attn_implementation or "eager"
        base = current[len("kvcached_"):] if current.startswith("kvcached_") else current
        name = _register_attend_wrapper(base)
        for m in modules:
            m._kvcached_cache = weakref.ref(self)
        self._restore_attn = current
        self._attend_modules = modules
        model.config._attn_implementation = name

    def _attend_step(self, n: int) -> bool:
        """Whether this layer update belongs to a single-token decode step through Attend."""
        return self._attending and n == 1

    def _attend_forward(self, module: torch.nn.Module, query: torch.Tensor) -> torch.Tensor:
        """The attention output of one decode token for `module`'s layer, from kvcached:
        query [1, heads, 1, head_dim] after RoPE -> [1, 1, heads, head_dim]."""
        self._check_usable()
        _check_batch(query)
        layer = self.layers[module.layer_idx]
        q = query[0].transpose(0, 1).detach().to("cpu", torch.float32).contiguous()
        try:
            if self._attend_session is None:
                self._attend_session = self.client.attend_session()
            r = self._attend_session.attend(self.sequence, module.layer_idx, q.numpy(),
                                            [layer.length - 1], dtype="f32")
        except Exception as e:
            self._failure = e
            raise
        out = torch.from_numpy(np.array(r.output))  # a writable copy (9 x 64 floats)
        return out.unsqueeze(0).to(query.device, query.dtype)

    # --- reads -----------------------------------------------------------------------------

    def _read_layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer as kvcached stores it, [1, kv_heads, kept, head_dim] in the model's
        dtype. include_unfinished: the other layers have not appended this step's tokens yet."""
        lay = self.layers[layer]
        got = self.client.fetch(self.sequence, layers=[layer], dtype="f32",
                                include_unfinished=True)
        heads = sorted(h for (l, h) in got.heads if l == layer)
        counts = {h: got[(layer, h)].keys.shape[0] for h in heads}
        if len(set(counts.values())) > 1:
            raise NotImplementedError(
                f"layer {layer} keeps different token counts per kv head {counts} (adaptive "
                "budgets): transformers' attention takes one key length per layer; use uniform "
                "budgets with this cache")
        keys = torch.from_numpy(np.stack([got[(layer, h)].keys for h in heads]))
        values = torch.from_numpy(np.stack([got[(layer, h)].values for h in heads]))
        dtype = getattr(lay, "dtype", torch.float32)
        device = getattr(lay, "device", "cpu")
        return (keys.unsqueeze(0).to(device, dtype), values.unsqueeze(0).to(device, dtype))

    # --- lifetime --------------------------------------------------------------------------

    def close(self) -> None:
        """Removes the model hooks and releases the kvcached sequence (idempotent; a sequence
        that is already gone is not an error)."""
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        if self._restore_attn is not None:
            self._model.config._attn_implementation = self._restore_attn
            for m in self._attend_modules:
                m.__dict__.pop("_kvcached_cache", None)
            self._restore_attn = None
        if self._attend_session is not None:
            session, self._attend_session = self._attend_session, None
            try:
                session.close()
            except Exception:
                pass  # the stream's error was raised to the step that met it
        if self.sequence is not None:
            seq, self.sequence = self.sequence, None
            try:
                self.client.release(seq)
            except NotFound:
                pass  # already gone (released elsewhere, evicted, the server restarted)

    def __enter__(self) -> "KvcachedCache":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("KvcachedCache cannot crop: kvcached appends only")
