"""What KvcachedConnector refuses when vLLM starts (each with its reason), and tenants: with
kvcached's authentication on, a vLLM instance sees only the prefixes its own tenant's token
published."""

from __future__ import annotations

import pathlib

import pytest

import kvcache
from conftest import _python, start_kvcached
from harness import Engine, assert_scheduler_empty, vllm_config
from kvcache.vllm import KvcachedConnector


@pytest.mark.parametrize("extra,match", [
    ({"tagret": "x"}, "unknown kv_connector_extra_config key"),
    ({"storage": "int3"}, "unknown storage format"),
    ({"timeout_s": "soon"}, "timeout_s must be a float"),
    ({"timeout_s": 0}, "timeout_s must be > 0"),
    ({"token_file": "/nonexistent/token"}, "cannot read token_file"),
])
def test_bad_settings_are_refused(kvcached, model_dir: pathlib.Path, extra, match) -> None:
    with pytest.raises(ValueError, match=match):
        Engine(vllm_config(model_dir, kvcached.target, extra))


def test_unsupported_vllm_settings_are_refused(kvcached, model_dir: pathlib.Path) -> None:
    with pytest.raises(ValueError, match='kv_load_failure_policy must be "recompute"'):
        Engine(vllm_config(model_dir, kvcached.target, failure_policy="fail"))
    config = vllm_config(model_dir, kvcached.target)
    config.cache_config.cache_dtype = "fp8"
    with pytest.raises(ValueError, match="cache_dtype 'fp8'"):
        KvcachedConnector(config, kvcache_role_worker())
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    config = vllm_config(model_dir, kvcached.target)
    config.attention_config.backend = AttentionBackendEnum.CPU_ATTN
    with pytest.raises(ValueError, match="attention backend CPU_ATTN"):
        KvcachedConnector(config, kvcache_role_worker())


def kvcache_role_worker():
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    return KVConnectorRole.WORKER


def test_a_pool_of_another_shape_is_refused(kvcached, model_dir: pathlib.Path) -> None:
    with pytest.raises(ValueError, match="holds 4 layers x 2 kv heads x 32"):
        Engine(vllm_config(model_dir, kvcached.target, {"pool": "other"}))
    with pytest.raises(ValueError, match="no pool 'nope'"):
        Engine(vllm_config(model_dir, kvcached.target, {"pool": "nope"}))


def test_tenants_never_share_prefixes(tmp_path: pathlib.Path, model_dir: pathlib.Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(_python.token_line("alice", "tenant", "alice-token") +
                      _python.token_line("bob", "tenant", "bob-token"))
    server = start_kvcached(tmp_path, f'auth {{ tokens_file: "{tokens}" }}\n')
    files = {}
    for name in ("alice", "bob"):
        files[name] = tmp_path / f"{name}.token"
        files[name].write_text(f"{name}-token\n")
    engines = []

    def engine(tenant: str) -> Engine:
        e = Engine(vllm_config(model_dir, server.target, {"token_file": str(files[tenant])}))
        engines.append(e)
        return e

    try:
        prompt = list(range(40, 40 + 70))
        alice = engine("alice")
        alice.add("a", prompt)
        alice.run()
        assert alice.settle()["saved_tokens"] == 64
        bob = engine("bob")
        bob.add("b", prompt)
        bob.run()
        assert bob.loads() == []  # bob's lookup: 0 of alice's 64 tokens
        alice2 = engine("alice")
        alice2.add("a2", prompt)
        alice2.run()
        assert [(op.first, op.end) for op in alice2.loads()] == [(0, 64)]
        assert_scheduler_empty(alice2)
        # Without a token the service refuses the connector's calls: no hit, no save.
        with kvcache.Client(server.target) as anonymous, pytest.raises(kvcache.Unauthenticated):
            anonymous.lookup_prefix(kvcache.Prefix(alice.connector.identity, prompt), "smollm2")
    finally:
        for e in engines:
            e.close()
        server.stop()
