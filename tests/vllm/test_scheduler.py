"""KvcachedConnector under vLLM's own Scheduler (CPU), two vLLM instances sharing one real
kvcached: what the first publishes the second loads (block-aligned, into its own block ids,
byte for byte), a prompt of whole blocks loads all but its last, a different model, salt or
storage format never hits, a failed load is recomputed and never published, and nothing leaks
(vLLM's assert_scheduler_empty checks)."""

from __future__ import annotations

import os
import pathlib
import signal
import time
from typing import Iterator, List

import pytest
import torch
from vllm.v1.engine import FinishReason

import kvcache
from harness import BLOCK, Engine, assert_scheduler_empty, vllm_config

IDENTITY_PROMPT = list(range(100, 200))  # 6 whole blocks + 4 tokens


def ids(n: int, first: int) -> List[int]:
    return list(range(first, first + n))


@pytest.fixture()
def engines(kvcached, model_dir: pathlib.Path) -> Iterator[list]:
    made: list = []

    def make(**extra) -> Engine:
        engine = Engine(vllm_config(model_dir, kvcached.target, extra))
        made.append(engine)
        return engine

    yield make
    for e in made:
        e.close()


def publish(engine: Engine, req_id: str, prompt: List[int]) -> None:
    engine.add(req_id, prompt)
    engine.run()
    engine.settle()
    assert_scheduler_empty(engine)


def test_a_second_instance_loads_what_the_first_published(engines, kvcached) -> None:
    first, second = engines(), engines()
    publish(first, "a", IDENTITY_PROMPT)
    # Only whole blocks were published: 96 of the 100 prompt tokens.
    assert [(len(s.token_ids), s.cached) for s in first.saves()] == [(96, 0)]
    with kvcache.Client(kvcached.target) as c:
        identity = kvcache.Prefix(first.connector.identity, IDENTITY_PROMPT + ids(20, 7))
        assert c.lookup_prefix(identity, "smollm2") == 96

    # The second instance's blocks are numbered differently: a request before shifts them.
    second.add("pad", ids(40, 9000), max_tokens=1)
    second.run()
    prompt = IDENTITY_PROMPT[:96] + ids(30, 5000)
    second.add("b", prompt)
    second.run()
    loads = second.loads()
    assert [(op.req_id, op.first, op.end) for op in loads] == [("b", 0, 96)]
    assert loads[0].block_ids == second.blocks["b"][:96 // BLOCK]
    assert loads[0].block_ids != first.blocks["a"][:96 // BLOCK]
    assert torch.equal(second.block_kv("b", 0, len(prompt)),
                       second.expected_kv(prompt, 0, len(prompt)))
    # ... and it publishes its own new whole blocks: 96 -> 112 tokens.
    stats = second.settle()
    assert [(len(s.token_ids), s.cached) for s in second.saves() if s.req_id == "b"] == [(112, 96)]
    # What vLLM reports of both connectors (KVConnectorStats, summed over the steps).
    assert stats["hit_tokens"] == 96 and stats["loaded_tokens"] == 96
    assert stats["loaded_bytes"] == 96 * 30 * 3 * 2 * 64 * 2
    assert stats["saved_tokens"] == 16 + 32  # b's 7th block, and pad's 2 blocks
    assert stats["lookups"] == 2 and stats["load_seconds"] > 0 and stats["save_seconds"] > 0
    assert not any(k.startswith("failed_") for k in stats)
    assert_scheduler_empty(second)


def test_a_prompt_of_whole_blocks_loads_all_but_its_last_block(engines) -> None:
    first, second = engines(), engines()
    prompt = ids(64, 300)
    publish(first, "a", prompt)
    assert [len(s.token_ids) for s in first.saves()] == [64]
    second.add("b", prompt)
    second.run()
    # vLLM must compute one token to sample from: the last block is computed, not loaded.
    assert [(op.first, op.end) for op in second.loads()] == [(0, 48)]
    assert torch.equal(second.block_kv("b", 0, 64), second.expected_kv(prompt, 0, 64))
    assert second.saves() == []  # kvcached holds all 64 already
    assert_scheduler_empty(second)


@pytest.mark.parametrize("extra", [{"model_id": "another-model"}, {"salt": "tenant-b"},
                                   {"storage": "int8"}], ids=["model", "salt", "storage"])
def test_another_model_salt_or_format_never_hits(engines, extra) -> None:
    publish(engines(), "a", IDENTITY_PROMPT)
    other = engines(**extra)
    other.add("b", IDENTITY_PROMPT)
    other.run()
    assert other.loads() == []
    assert other.settle().get("hit_tokens", 0) == 0
    assert_scheduler_empty(other)


def test_a_failed_load_is_recomputed_and_never_published(engines, kvcached) -> None:
    publish(engines(), "a", IDENTITY_PROMPT)
    second = engines()
    prompt = IDENTITY_PROMPT[:96] + ids(30, 5000)
    second.add("b", prompt)
    # kvcached dies after the scheduler's lookup and before the worker's load.
    second.before_load = kvcached.stop
    second.run()
    assert [(op.first, op.end) for op in second.loads()] == [(0, 96)]
    assert second.load_errors[0] == set(second.blocks["b"][:6])
    # vLLM recomputed the six blocks: every token's keys and values are right.
    assert torch.equal(second.block_kv("b", 0, len(prompt)),
                       second.expected_kv(prompt, 0, len(prompt)))
    stats = second.settle()
    assert stats.get("failed_load") == 1 and "loaded_tokens" not in stats
    # The step that computed the rest attended to unloaded blocks: its save was dropped.
    assert stats.get("failed_save_after_failed_load") == 1 and "saved_tokens" not in stats
    assert second.finished["b"] == FinishReason.LENGTH  # its tokens, not an error or abort
    assert_scheduler_empty(second)


def test_a_hung_kvcached_costs_the_scheduler_one_lookup_deadline(engines, kvcached) -> None:
    engine = engines(lookup_timeout_s=0.5)
    os.kill(kvcached.proc.pid, signal.SIGSTOP)  # alive, answering nothing
    try:
        start = time.monotonic()
        for i in range(3):
            engine.add(f"r{i}", ids(40, 100 * i))
        engine.run()
        took = time.monotonic() - start
    finally:
        os.kill(kvcached.proc.pid, signal.SIGCONT)
    # One lookup waited out its deadline; the next requests skipped kvcached (5 s quiet).
    assert took < 3, took
    stats = engine.settle()
    assert stats["failed_lookup"] == 1 and stats["skipped_unavailable"] == 2
    assert engine.loads() == []
    assert_scheduler_empty(engine)
