"""What the connector counts, on both sides, in the shape vLLM's KV connector stats take
(KVConnectorStats: collected on each worker and the scheduler, summed, logged; every field
is a sum since the last report)."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Dict

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats

# lookup_tokens: prompt tokens asked for (whole blocks); hit_tokens: of which kvcached held and
# vLLM had not computed; loaded_/saved_ tokens, bytes (keys and values as vLLM holds them) and
# seconds; failed_<reason>: operations that failed (the request recomputes or is not saved).
FIELDS = ("lookups", "lookup_tokens", "hit_tokens", "loaded_tokens", "loaded_bytes",
          "load_seconds", "saved_tokens", "saved_bytes", "save_seconds")


@dataclasses.dataclass
class KvcachedStats(KVConnectorStats):
    def reset(self) -> None:
        self.data = {}

    def aggregate(self, other: KVConnectorStats) -> "KvcachedStats":
        for key, value in other.data.items():
            self.data[key] = self.data.get(key, 0) + value
        return self

    def reduce(self) -> Dict[str, Any]:
        return dict(sorted(self.data.items()))

    def is_empty(self) -> bool:
        return not self.data


class Counters:
    """Thread-safe sums (the worker's saves run on a thread of their own)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._data: Dict[str, float] = {}

    def add(self, key: str, value: float = 1) -> None:
        with self._lock:
            self._data[key] = self._data.get(key, 0) + value

    def failed(self, reason: str) -> None:
        self.add("failed_" + reason)

    def take(self) -> KvcachedStats:
        """The sums since the last take."""
        with self._lock:
            data, self._data = self._data, {}
        return KvcachedStats(data=data)
