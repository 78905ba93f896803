"""The connector's settings (vLLM's ``kv_connector_extra_config``) and the cache identity its
prefixes are published under.

The identity names everything that changes the bytes of a token's keys and values: the
model (its name or path, or ``model_id`` when instances load it from different paths), its
revision, the dtype, the layers x kv heads x head_dim this rank holds, the tensor-parallel
rank, and the storage format in kvcached. The block size is not in it: a token's keys and
values do not depend on it, and every hit is rounded down to the asking instance's blocks.
kvcached keys the cache by tenant, pool, storage format and salt as well (Prefix).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import Any, Mapping, Optional

from kvcache.types import StorageFormat, parse_storage


@dataclasses.dataclass(frozen=True)
class Settings:
    target: str = "127.0.0.1:50051"  # kvcached's gRPC target
    pool: str = ""                   # "" = the server's first pool
    storage: str = ""                # format kept in kvcached: "" = the pool's raw dtype,
    #                                  "int8", "fp8_e4m3", "int4_g32", ... (kvcache.StorageFormat)
    salt: str = ""                   # only instances with the same salt share prefixes
    model_id: str = ""               # names the model in the identity ("" = vLLM's model)
    token_file: str = ""             # file holding the tenant's bearer token ("" = none)
    tls_ca: str = ""                 # PEM CA file: TLS to kvcached
    timeout_s: float = 10.0          # deadline of each kvcached call but lookups
    lookup_timeout_s: float = 1.0    # deadline of a lookup (vLLM's scheduler waits on it)
    max_pending_save_mb: int = 1024  # saves copied out but not yet sent; more are dropped

    @staticmethod
    def from_extra_config(extra: Mapping[str, Any]) -> "Settings":
        """Raises ValueError naming a key it does not know or a value it cannot use."""
        fields = {f.name: f for f in dataclasses.fields(Settings)}
        unknown = sorted(k for k in extra if k not in fields)
        if unknown:
            raise ValueError(f"kvcache.vllm: unknown kv_connector_extra_config key(s) "
                             f"{[k[:40] for k in unknown[:4]]}; known: {sorted(fields)}")
        values = {}
        for key, value in extra.items():
            kind = type(fields[key].default)
            try:
                values[key] = kind(value)
            except (TypeError, ValueError):
                raise ValueError(f"kvcache.vllm: {key} must be a {kind.__name__}, not "
                                 f"{str(value)[:40]!r}") from None
        s = Settings(**values)
        parse_storage(s.storage or None)  # ValueError for an unknown format
        for key in ("timeout_s", "lookup_timeout_s"):
            value = getattr(s, key)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"kvcache.vllm: {key} must be > 0, not {value}")
        if s.max_pending_save_mb < 0:
            raise ValueError("kvcache.vllm: max_pending_save_mb must be >= 0")
        return s

    @property
    def storage_format(self) -> StorageFormat:
        return parse_storage(self.storage or None)

    def bearer_token(self) -> Optional[str]:
        """The token in token_file (stripped), None without one. Raises ValueError when the
        file cannot be read or is empty: running without the tenant's token would be another
        tenant's (or no tenant's) cache."""
        if not self.token_file:
            return None
        try:
            with open(self.token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as e:
            raise ValueError(f"kvcache.vllm: cannot read token_file {self.token_file[:80]!r}: "
                             f"{e.strerror}") from None
        if not token:
            raise ValueError(f"kvcache.vllm: token_file {self.token_file[:80]!r} is empty")
        return token


def cache_identity(model: str, revision: Optional[str], dtype: str, num_layers: int,
                   num_kv_heads: int, head_dim: int, tp_rank: int, tp_size: int,
                   storage: StorageFormat) -> str:
    """The PrefixSpec.model of this instance's prefixes (at most 128 bytes: a longer text is
    replaced by its SHA-256)."""
    text = (f"vllm|{model}|{revision or '-'}|{dtype}|L{num_layers}xH{num_kv_heads}x"
            f"D{head_dim}|tp{tp_rank}/{tp_size}|{storage.name}")
    if len(text.encode()) <= 128:
        return text
    return "vllm|sha256:" + hashlib.sha256(text.encode()).hexdigest()
