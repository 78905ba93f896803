"""kvcache.vllm: vLLM's KV connector over kvcached (`pip install "./client/python[vllm]"`).

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "KvcachedConnector",
        "kv_connector_module_path": "kvcache.vllm", "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"target": "127.0.0.1:50051", "storage": "int8"}}'

A prompt's whole blocks are published to kvcached's prefix cache once computed; a later
request (of this vLLM or any other with the same model, salt and tenant) loads the blocks
kvcached holds instead of computing them. kvcache/vllm/connector.py says what is supported.
"""

try:
    import vllm  # noqa: F401
except ImportError as e:  # pragma: no cover (the hf venv has no vllm)
    raise ImportError("kvcache.vllm needs vLLM: pip install \"./client/python[vllm]\"") from e

from kvcache.vllm.connector import KvcachedConnector  # noqa: E402
from kvcache.vllm.settings import Settings  # noqa: E402

__all__ = ["KvcachedConnector", "Settings"]
