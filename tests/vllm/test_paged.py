"""kvcache/vllm/paged.py against the obvious per-token loop (its specification), on the
physical layouts vLLM 0.33 and 0.34 give a connector (LBNHC, LBHNC), kernel blocks smaller than the
scheduler's, and each dtype."""

from __future__ import annotations

import pytest
import torch

from kvcache.vllm import paged

BLOCKS, HEADS, HEAD_DIM, BLOCK = 12, 3, 64, 16


def layer_cache(layout: str, kernel_tokens: int, dtype: torch.dtype) -> torch.Tensor:
    """One layer's logical [blocks, heads, tokens, 2D] view over memory in `layout`."""
    blocks = BLOCKS * (BLOCK // kernel_tokens)
    g = torch.Generator().manual_seed(7)
    if layout == "LBNHC":  # memory [blocks, tokens, heads, 2D]
        raw = torch.randn(blocks, kernel_tokens, HEADS, 2 * HEAD_DIM, generator=g)
        return raw.to(dtype).permute(0, 2, 1, 3)
    raw = torch.randn(blocks, HEADS, kernel_tokens, 2 * HEAD_DIM, generator=g)  # LBHNC
    return raw.to(dtype)


def token_row(cache: torch.Tensor, block_id: int, offset: int) -> torch.Tensor:
    """[heads, 2D] of token `offset` of scheduler block `block_id`: the specification."""
    tokens = cache.shape[2]
    ratio = BLOCK // tokens
    return cache[block_id * ratio + offset // tokens, :, offset % tokens, :]


CASES = [(layout, tokens, dtype) for layout in ("LBNHC", "LBHNC") for tokens in (16, 8)
         for dtype in (torch.float16, torch.bfloat16, torch.float32)]


@pytest.mark.parametrize("layout,kernel_tokens,dtype", CASES)
def test_gather_and_scatter_match_the_per_token_loop(layout, kernel_tokens, dtype) -> None:
    cache = layer_cache(layout, kernel_tokens, dtype)
    paged.check_layer("layer", cache, BLOCK, HEADS, HEAD_DIM)
    block_ids = [7, 2, 9]
    keys, values = paged.gather(cache, block_ids, BLOCK)
    assert keys.shape == values.shape == (len(block_ids) * BLOCK, HEADS, HEAD_DIM)
    for i in range(len(block_ids) * BLOCK):
        row = token_row(cache, block_ids[i // BLOCK], i % BLOCK)
        assert torch.equal(keys[i], row[:, :HEAD_DIM]) and torch.equal(values[i], row[:, HEAD_DIM:])

    before = cache.clone()
    target = [4, 11, 0]
    paged.scatter(cache, target, BLOCK, keys, values)
    for i in range(len(target) * BLOCK):
        row = token_row(cache, target[i // BLOCK], i % BLOCK)
        assert torch.equal(row, torch.cat([keys[i], values[i]], dim=-1))
    untouched = [b for b in range(BLOCKS) if b not in target]
    for b in untouched:
        for t in range(BLOCK):
            assert torch.equal(token_row(cache, b, t), token_row(before, b, t))


@pytest.mark.parametrize("shape,match", [
    ((BLOCKS, HEADS, BLOCK), "3-D"), ((BLOCKS, 2, BLOCK, 2 * HEAD_DIM), "kv heads"),
    ((BLOCKS, HEADS, BLOCK, HEAD_DIM), "kv heads"), ((BLOCKS, HEADS, 5, 2 * HEAD_DIM), "divide")])
def test_other_layouts_are_refused(shape, match) -> None:
    with pytest.raises(ValueError, match=match):
        paged.check_layer("model.layers.0.self_attn.attn", torch.zeros(shape), BLOCK, HEADS,
                          HEAD_DIM)
