"""vLLM's paged KV cache of one layer, read and written a whole block at a time.

vLLM 0.33 and 0.34 give a connector each attention layer's cache as a logical [num_blocks,
num_kv_heads, block_tokens, 2 * head_dim] view (any of its physical layouts: LBNHC, LBHNC,
...), keys in the first head_dim elements of each token's row and values in the last: the
layout the FlashAttention, Triton and FlexAttention backends split (`split(head_size, -1)`).
The view's blocks may be kernel blocks, a fraction of the scheduler's (`block_size`):
scheduler block b is then kernel blocks b*r .. b*r + r - 1, r = block_size / kernel block
tokens. Indexing with a block-id tensor works on any strides, so no layout is copied whole.
"""

from __future__ import annotations

from typing import Sequence, Tuple

import torch


def check_layer(name: str, cache: torch.Tensor, block_size: int, num_kv_heads: int,
                head_dim: int) -> None:
    """Raises ValueError when `cache` is not a layer cache of the layout described above."""
    if cache.dim() != 4:
        raise ValueError(f"kvcache.vllm: layer {name[:60]!r} has a {cache.dim()}-D KV cache "
                         f"{tuple(cache.shape)}; supported: [blocks, kv_heads, block_tokens, "
                         "2 * head_dim] (FlashAttention, Triton, FlexAttention)")
    _, heads, tokens, content = cache.shape
    if heads != num_kv_heads or content != 2 * head_dim:
        raise ValueError(f"kvcache.vllm: layer {name[:60]!r} cache {tuple(cache.shape)} does "
                         f"not hold {num_kv_heads} kv heads x 2 * {head_dim}")
    if tokens <= 0 or block_size % tokens:
        raise ValueError(f"kvcache.vllm: layer {name[:60]!r} blocks of {tokens} tokens do not "
                         f"divide the scheduler's block_size {block_size}")


def _kernel_blocks(cache: torch.Tensor, block_ids: Sequence[int], block_size: int) -> torch.Tensor:
    ratio = block_size // cache.shape[2]
    ids = torch.as_tensor(list(block_ids), dtype=torch.long)
    if ratio > 1:
        ids = (ids[:, None] * ratio + torch.arange(ratio)[None, :]).reshape(-1)
    return ids.to(cache.device)


def gather(cache: torch.Tensor, block_ids: Sequence[int],
           block_size: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Keys and values of every token of `block_ids` (in order), each [n, kv_heads, head_dim]
    with n = len(block_ids) * block_size, copied to host memory."""
    blocks = cache[_kernel_blocks(cache, block_ids, block_size)]  # a copy: [nb, H, N, 2D]
    tokens = blocks.permute(0, 2, 1, 3).reshape(-1, cache.shape[1], cache.shape[3])
    head_dim = cache.shape[3] // 2
    return (tokens[..., :head_dim].to("cpu").contiguous(),
            tokens[..., head_dim:].to("cpu").contiguous())


def scatter(cache: torch.Tensor, block_ids: Sequence[int], block_size: int,
            keys: torch.Tensor, values: torch.Tensor) -> None:
    """Writes keys and values [len(block_ids) * block_size, kv_heads, head_dim] into the
    blocks, token i into block i // block_size at offset i % block_size."""
    heads, tokens = cache.shape[1], cache.shape[2]
    rows = torch.cat([keys, values], dim=-1).to(device=cache.device, dtype=cache.dtype)
    rows = rows.reshape(-1, tokens, heads, cache.shape[3]).permute(0, 2, 1, 3)
    cache[_kernel_blocks(cache, block_ids, block_size)] = rows

