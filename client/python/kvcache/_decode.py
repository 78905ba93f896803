"""Dense rows from stored records, in NumPy: what kvcached's Fetch returns for records of any
storage format, for the Python client's lease readers (the mapped pool, a transfer channel).

The record layouts and the arithmetic are kernels/include/kvc/kernels/record_codec.h's
(the specification): DequantizeElement's float expression, evaluated in float32 with the same
operations in the same order (NumPy rounds each one, as the C++ does without fused
multiply-adds), then StoreElement's conversion to the requested dtype (f16: round to nearest
even, as NumPy's float16 cast; bf16: the kernels' bit-level rounding). A record decoded here
equals the server's decode bit for bit (tests/python/test_record_decode.py).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from kvcache._proto.kvcache.v1 import types_pb2
from kvcache.types import NUMPY_DTYPE, DType

_F32 = types_pb2.STORAGE_FORMAT_F32
_F16 = types_pb2.STORAGE_FORMAT_F16
_BF16 = types_pb2.STORAGE_FORMAT_BF16
_FP8 = types_pb2.STORAGE_FORMAT_FP8_E4M3
_INT8 = types_pb2.STORAGE_FORMAT_INT8
_INT4_G32 = types_pb2.STORAGE_FORMAT_INT4_G32
_INT4_G64 = types_pb2.STORAGE_FORMAT_INT4_G64
_NVFP4 = types_pb2.STORAGE_FORMAT_NVFP4

# The storage format whose records are exactly a dtype's rows.
RAW_FORMAT = {DType.F16: _F16, DType.BF16: _BF16, DType.F32: _F32}
DECODABLE = frozenset({_F32, _F16, _BF16, _FP8, _INT8, _INT4_G32, _INT4_G64, _NVFP4})


def _e4m3_table() -> np.ndarray:
    """E4M3ToFloat of every code (fp_formats.h), as float32."""
    u = np.arange(256, dtype=np.uint32)
    e = (u >> 3) & 15
    m = u & 7
    sub = m.astype(np.float32) * np.float32(1.0 / 512.0)
    normal = (((e + 120) << 23) | (m << 20)).astype(np.uint32).view(np.float32)
    bits = np.where(e == 0, sub, normal).astype(np.float32).view(np.uint32)
    bits = np.where((u & 0x7F) == 0x7F, np.uint32(0x7FC00000), bits)
    return (bits | ((u & 0x80) << 24)).astype(np.uint32).view(np.float32)


def _pairs(values: np.ndarray) -> np.ndarray:
    """For every byte: the values of its low and its high nibble, as one uint64 (two float32
    side by side), so that one lookup per byte writes two elements in order."""
    b = np.arange(256)
    return np.stack([values[b & 15], values[b >> 4]], axis=1).astype(np.float32).view(
        np.uint64).reshape(256)


_E4M3 = _e4m3_table()
# E2M1ToFloat of every 4-bit code (sign in bit 3).
_E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6],
                 dtype=np.float32)
_E2M1_PAIRS = _pairs(_E2M1)
_U4_PAIRS = _pairs(np.arange(16, dtype=np.float32))  # INT4 codes as floats


def _field(rows: np.ndarray, at: int, count: int, dtype: str) -> np.ndarray:
    """`count` little-endian `dtype` fields of every record from byte `at`: [n, count]."""
    size = np.dtype(dtype).itemsize
    return np.ascontiguousarray(rows[:, at:at + count * size]).view(dtype)


def _nibble_values(pairs: np.ndarray, rows: np.ndarray, d: int) -> np.ndarray:
    """The d 4-bit codes of every record (element 2i in byte i's low nibble) looked up in a
    _pairs table: [n, d] float32 (a new array)."""
    return pairs[rows[:, :d // 2]].view(np.float32)


def to_float(storage: int, d: int, rows: np.ndarray) -> np.ndarray:
    """DequantizeRecord of every row of `rows` ([n, record_bytes] uint8): [n, d] float32.
    Products and sums run in place on the one float32 array (the same rounding as
    out-of-place operations, without a temporary per step)."""
    n = rows.shape[0]
    if storage == _F32:
        return _field(rows, 0, d, "<f4")
    if storage == _F16:
        return _field(rows, 0, d, "<f2").astype(np.float32)
    if storage == _BF16:
        return (_field(rows, 0, d, "<u2").astype(np.uint32) << 16).view(np.float32)
    if storage in (_FP8, _INT8):
        x = _E4M3[rows[:, :d]] if storage == _FP8 else \
            rows[:, :d].view(np.int8).astype(np.float32)
        x *= _field(rows, d, 1, "<f4")
        return x
    if storage in (_INT4_G32, _INT4_G64):
        group = 32 if storage == _INT4_G32 else 64
        groups = d // group
        scale_min = _field(rows, d // 2, 2 * groups, "<f2").astype(np.float32).reshape(
            n, groups, 2)
        x = _nibble_values(_U4_PAIRS, rows, d)
        g = x.reshape(n, groups, group)
        g *= scale_min[:, :, 0:1]
        g += scale_min[:, :, 1:2]
        return x
    if storage == _NVFP4:
        tensor_at = (d // 2 + d // 16 + 3) // 4 * 4  # Nvfp4TensorScaleOffset
        eff = _E4M3[rows[:, d // 2:d // 2 + d // 16]] * _field(rows, tensor_at, 1, "<f4")
        x = _nibble_values(_E2M1_PAIRS, rows, d)
        x.reshape(n, d // 16, 16).__imul__(eff[:, :, None])
        return x
    raise ValueError(f"storage format {storage} cannot be decoded here")


def _to_bf16(x: np.ndarray) -> np.ndarray:
    """FloatToBFloat16 (dtype.h): round to nearest even on the bits, NaNs kept quiet NaNs."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & 1)) >> 16
    nan = (bits >> 16) | 0x40
    return np.where((bits & 0x7FFFFFFF) > 0x7F800000, nan, rounded).astype(np.uint16)


def decode(storage: int, d: int, rows: np.ndarray, dtype: DType) -> np.ndarray:
    """The rows of `rows` ([n, record_bytes] uint8 records of `storage`) as dense [n, d] in
    `dtype`'s NumPy dtype (bf16 as uint16 bits), equal to the server's dense Fetch."""
    if RAW_FORMAT.get(dtype) == storage:
        return _field(rows, 0, d, NUMPY_DTYPE[dtype].str)
    x = to_float(storage, d, rows)
    if dtype == DType.F32:
        return np.ascontiguousarray(x, dtype=np.float32)
    if dtype == DType.F16:
        return x.astype(np.float16)
    return _to_bf16(x)


def output_dtype(pool_dtype: int, requested: Optional[DType]) -> Optional[DType]:
    """The dtype a fetch returns: the requested one, or the pool's; None when that is not a
    dense dtype this module writes."""
    dt = DType(pool_dtype) if requested is None or requested == DType.POOL else DType(requested)
    return dt if dt in RAW_FORMAT else None
