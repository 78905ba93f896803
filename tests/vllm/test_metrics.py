"""The connector's counters on vLLM's Prometheus endpoint: vLLM's own KVConnectorProm builds
the connector's metrics and observes what both sides reported through vLLM's stats."""

from __future__ import annotations

import functools
import pathlib

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorProm

from harness import Engine, assert_scheduler_empty, vllm_config


def test_hits_loads_saves_and_failures_reach_prometheus(kvcached,
                                                        model_dir: pathlib.Path) -> None:
    first = Engine(vllm_config(model_dir, kvcached.target))
    second = Engine(vllm_config(model_dir, kvcached.target))
    try:
        prompt = list(range(800, 870))  # 4 whole blocks + 6
        first.add("a", prompt)
        first.run()
        first.settle()
        second.add("b", prompt)
        second.run()
        stats = second.settle()
        assert_scheduler_empty(second)
    finally:
        first.close()
        second.close()
    stats = dict(stats, failed_load=2, skipped_multimodal=1)  # as a worker would report them

    registry = CollectorRegistry()

    class Prom(KVConnectorProm):  # vLLM's class, on a registry of this test's own
        _gauge_cls = functools.partial(Gauge, registry=registry)
        _counter_cls = functools.partial(Counter, registry=registry)
        _histogram_cls = functools.partial(Histogram, registry=registry)

    prom = Prom(vllm_config(model_dir, kvcached.target), ["model_name", "engine"],
                {0: ["smollm2", 0]})
    prom.observe(stats, 0)
    labels = {"engine": "0", "model_name": "smollm2"}

    def value(name: str, **extra: str) -> float:
        return registry.get_sample_value(f"vllm:kvcached_{name}_total", {**labels, **extra})

    assert value("hit_tokens") == 64 and value("loaded_tokens") == 64
    assert value("loaded_bytes") == 64 * 30 * 3 * 2 * 64 * 2
    assert value("lookups") == 1 and value("load_seconds") > 0
    assert value("failures", reason="load") == 2
    assert value("skipped", reason="multimodal") == 1
    assert "# HELP vllm:kvcached_loaded_tokens_total Tokens loaded" in generate_latest(
        registry).decode()
