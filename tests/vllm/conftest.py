"""Fixtures of the vLLM connector tests: vLLM's own Scheduler (on CPU) with
kvcache.vllm.KvcachedConnector on both sides against real kvcached processes, and the model
config of the project's SmolLM2-135M made locally from its GGUF (nothing from a hub).

Run in the venv scripts/test.sh makes for them (client/python[vllm] with vllm 0.33.0; the
suite passes against 0.34.0 too); a missing vllm fails the tests, it never skips them."""

from __future__ import annotations

import importlib.util
import pathlib
from typing import Iterator

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
# tests/python/conftest.py's Server (a real kvcached process), loaded under its own name: this
# file is the "conftest" module here.
_spec = importlib.util.spec_from_file_location("python_conftest",
                                               REPO / "tests" / "python" / "conftest.py")
_python = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_python)
Server, kvcached_binary = _python.Server, _python.kvcached_binary

GGUF = REPO / ".cache" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
# SmolLM2-135M: 30 layers x 3 kv heads (9 query heads) x head_dim 64.
LAYERS, KV_HEADS, Q_HEADS, HEAD_DIM = 30, 3, 9, 64
GEOMETRY = (f"num_layers: {LAYERS} num_kv_heads: {KV_HEADS} num_query_heads: {Q_HEADS} "
            f"head_dim: {HEAD_DIM}")
POOLS = f"""
pools {{ name: "smollm2" capacity_bytes: 268435456 geometry {{ {GEOMETRY} dtype: DTYPE_F16 }} }}
pools {{ name: "smollm2-bf16" capacity_bytes: 67108864
        geometry {{ {GEOMETRY} dtype: DTYPE_BF16 }} }}
pools {{ name: "other" capacity_bytes: 16777216
        geometry {{ num_layers: 4 num_kv_heads: 2 num_query_heads: 4 head_dim: 32 }} }}
"""


def start_kvcached(tmp: pathlib.Path, extra: str = "") -> Server:
    kvcached_binary()  # fails the test when it is missing
    config = tmp / "kvcached.textproto"
    config.write_text(POOLS + extra)
    return Server(config)


@pytest.fixture()
def kvcached(tmp_path: pathlib.Path) -> Iterator[Server]:
    """A kvcached of its own per test: each test's prefix cache starts empty."""
    s = start_kvcached(tmp_path)
    yield s
    s.stop()


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """config.json of SmolLM2-135M-Instruct, read from the GGUF by transformers."""
    if not GGUF.is_file():
        pytest.fail(f"{GGUF} is missing: run scripts/fetch_model.sh", pytrace=False)
    from transformers import AutoConfig
    config = AutoConfig.from_pretrained(GGUF.parent, gguf_file=GGUF.name)
    config.architectures = ["LlamaForCausalLM"]
    out = tmp_path_factory.mktemp("smollm2-config")
    config.save_pretrained(out)
    return out
