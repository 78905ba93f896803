"""One vocabulary: the Python client's DType and StorageFormat are the proto's values (by
descriptor) and the rows of the kernels' table (kernels/include/kvc/kernels/dtype.h, which the
C++ service and client check at compile time), with the same names; the client can decode
every format the table has."""

import pathlib
import re

import kvcache
from kvcache import _decode
from kvcache._proto.kvcache.v1 import types_pb2
from kvcache.types import parse_dtype, parse_storage

_TABLE = pathlib.Path(__file__).resolve().parents[2] / "kernels/include/kvc/kernels/dtype.h"


def _rows(macro: str) -> list:
    """(wire number, wire suffix, name) of each X(...) row of `macro` in dtype.h."""
    text = _TABLE.read_text()
    body = re.search(rf"#define {macro}\(X\)((?:[^\n]*\\\n)*[^\n]*)", text)
    assert body, f"{macro} not found in {_TABLE}"
    return [(int(w), p, n) for _, _, w, p, n in
            re.findall(r'X\((\w+), (\d+), (\d+), (\w+), "([\w]+)"\)', body.group(1))]


def _same(enum: type, proto_enum, prefix: str, rows: list) -> None:
    proto = {name[len(prefix):]: value for name, value in proto_enum.items()}
    assert proto.pop("UNSPECIFIED") == 0 and enum.POOL == 0
    assert {m.name: int(m) for m in enum if m.name != "POOL"} == proto
    assert {p: w for w, p, _ in rows} == proto, "dtype.h's rows differ from the proto"


def test_storage_formats_are_the_protos_and_the_kernels_table() -> None:
    rows = _rows("KVC_STORAGE_FORMATS")
    assert len(rows) >= 8
    _same(kvcache.StorageFormat, types_pb2.StorageFormat, "STORAGE_FORMAT_", rows)
    for wire, _, name in rows:
        assert parse_storage(name) == wire, name  # the names C++ and Python print
        assert wire in _decode.DECODABLE, f"the Python client cannot decode {name}"


def test_dtypes_are_the_protos_and_the_kernels_table() -> None:
    rows = _rows("KVC_DTYPES")
    _same(kvcache.DType, types_pb2.DType, "DTYPE_", rows)
    for wire, _, name in rows:
        assert parse_dtype(name) == wire, name
