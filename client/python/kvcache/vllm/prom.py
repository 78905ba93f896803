"""The connector's counters as Prometheus metrics on vLLM's own endpoint (vLLM calls
KvcachedConnector.build_prom_metrics once, then observe() with each interval's summed
KvcachedStats data). Names: vllm:kvcached_<field>_total, and
vllm:kvcached_failures_total{reason} / vllm:kvcached_skipped_total{reason}."""

from __future__ import annotations

from typing import Any, Dict, List

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics

HELP = {
    "lookups": "Prefix lookups the scheduler asked kvcached.",
    "lookup_tokens": "Whole-block prompt tokens looked up in kvcached.",
    "hit_tokens": "Prompt tokens kvcached held that vLLM had not computed.",
    "loaded_tokens": "Tokens loaded from kvcached into vLLM's blocks.",
    "loaded_bytes": "Bytes of keys and values loaded from kvcached (as vLLM holds them).",
    "load_seconds": "Seconds spent loading from kvcached.",
    "saved_tokens": "Tokens published to kvcached.",
    "saved_bytes": "Bytes of keys and values published to kvcached (as vLLM holds them).",
    "save_seconds": "Seconds spent saving to kvcached (off the forward pass).",
}


class KvcachedPromMetrics(KVConnectorPromMetrics):
    def __init__(self, vllm_config: Any, metric_types: Dict[type, type], labelnames: List[str],
                 per_engine_labelvalues: Dict[int, List[object]]):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._sums = {field: self._counter_cls(name=f"vllm:kvcached_{field}",
                                               documentation=text, labelnames=labelnames)
                      for field, text in HELP.items()}
        self._by_reason = {
            prefix: self._counter_cls(name=f"vllm:kvcached_{name}", documentation=text,
                                      labelnames=labelnames + ["reason"])
            for prefix, name, text in (
                ("failed_", "failures", "kvcached operations that failed, by reason (the "
                 "request recomputes, or its prompt is not published)."),
                ("skipped_", "skipped", "Requests that did not ask kvcached, by reason."))}

    def observe(self, transfer_stats_data: Dict[str, Any], engine_idx: int = 0) -> None:
        labels = [str(v) for v in self.per_engine_labelvalues[engine_idx]]
        for key, value in transfer_stats_data.items():
            if key in self._sums:
                self._sums[key].labels(*labels).inc(value)
                continue
            for prefix, counter in self._by_reason.items():
                if key.startswith(prefix):
                    counter.labels(*labels, key[len(prefix):]).inc(value)

