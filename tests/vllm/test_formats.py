"""A prompt saved by one vLLM instance and loaded by another in each storage format kvcached
keeps: f16 and bf16 pools give back every byte; INT8, FP8 and INT4 each element within one
quantization step of what vLLM computed (docs/KERNELS.md, "Round-trip error")."""

from __future__ import annotations

import pathlib
from typing import List

import pytest
import torch

from harness import Engine, assert_scheduler_empty, vllm_config


def one_step(x: torch.Tensor, storage: str) -> torch.Tensor:
    """Per element, one quantization step of `storage` for rows x [..., head_dim] (float32),
    plus the f16 rounding of the decoded value."""
    amax = x.abs().amax(dim=-1, keepdim=True)
    f16 = x.abs() * 2.0**-10 + 1e-6
    if storage == "int8":
        return amax / 127 + f16
    if storage == "fp8_e4m3":
        s = amax / 448
        y = (x.abs() / s.clamp_min(1e-30)).clamp_min(2.0**-6)
        return torch.exp2(torch.floor(torch.log2(y)) - 3) * s + f16
    if storage == "int4_g32":
        g = x.reshape(*x.shape[:-1], -1, 32)
        step = (g.amax(-1, keepdim=True) - g.amin(-1, keepdim=True)) / 15
        return (step * 1.01 + 1e-3).expand_as(g).reshape(x.shape) + f16
    raise ValueError(storage)


def halves(kv: torch.Tensor) -> List[torch.Tensor]:
    d = kv.shape[-1] // 2
    return [kv[..., :d].float(), kv[..., d:].float()]


@pytest.mark.parametrize("storage,dtype,pool", [
    ("", "float16", "smollm2"), ("", "bfloat16", "smollm2-bf16"),
    ("int8", "float16", "smollm2"), ("fp8_e4m3", "float16", "smollm2"),
    ("int4_g32", "float16", "smollm2")])
def test_saved_then_loaded_into_other_blocks(kvcached, model_dir: pathlib.Path, storage: str,
                                             dtype: str, pool: str) -> None:
    extra = {"storage": storage, "pool": pool}
    torch_dtype = getattr(torch, dtype)
    first = Engine(vllm_config(model_dir, kvcached.target, extra, dtype=dtype), dtype=torch_dtype)
    second = Engine(vllm_config(model_dir, kvcached.target, extra, dtype=dtype),
                    dtype=torch_dtype)
    try:
        prompt = list(range(2000, 2000 + 90))  # 5 whole blocks + 10
        first.add("a", prompt)
        first.run()
        first.settle()
        second.add("pad", list(range(7000, 7033)), max_tokens=1)
        second.run()
        second.add("b", prompt)
        second.run()
        assert [(op.first, op.end) for op in second.loads()] == [(0, 80)]
        assert second.loads()[0].block_ids != first.blocks["a"][:5]
        got = second.block_kv("b", 0, 80)
        want = second.expected_kv(prompt, 0, 80)
        if storage == "":
            assert torch.equal(got, want)
        else:
            for g, w in zip(halves(got), halves(want)):
                err = (g - w).abs()
                assert (err <= one_step(w, storage)).all(), float(err.max())
                assert float(err.max()) > 0  # stored in the low-bit format, not raw
        # The computed tokens after the loaded ones are vLLM's own, exactly.
        assert torch.equal(second.block_kv("b", 80, 90), second.expected_kv(prompt, 80, 90))
        assert_scheduler_empty(second)
    finally:
        first.close()
        second.close()
