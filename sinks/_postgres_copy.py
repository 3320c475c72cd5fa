"""twophase-postgres: the COPY payload of an Arrow batch, PostgreSQL's binary COPY format built from Arrow's buffers
with numpy (no per-row Python), or CSV (Arrow's C++ writer) where a column's type has no binary form here.

Binary COPY (``COPY ... FROM STDIN (FORMAT binary)``): a header, then per row a big-endian int16 field count and per
field a big-endian int32 length (-1: NULL) and the value in the TARGET column's binary form, then an int16 -1.
The server does not parse numbers, dates or timestamps from text, which is what it spends its time on in a CSV
COPY of such columns. The forms written (pg_type.typname of the table's column):

==============================  =====================================================================
bool                            1 byte
int2 / int4 / int8              big-endian, of the column's width (an Arrow int32 into an int8 column is widened)
float4 / float8                 big-endian IEEE 754 (an Arrow float32 into a float8 column goes as CSV: its
                                shortest text, 1e+30, is what the column held before, not the exact 1.00000001505e+30)
text / varchar                  the UTF-8 bytes
bytea                           the bytes
date                            int32 days since 2000-01-01
timestamp / timestamptz         int64 microseconds since 2000-01-01 (UTC for timestamptz)
==============================  =====================================================================

``numeric`` (and any other type), nanosecond timestamps and float32 into float8 have no binary form here: a batch
with such a column is sent as CSV
(:func:`binary_types` returns None), as before.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

HEADER = b"PGCOPY\n\xff\r\n\x00" + b"\x00\x00\x00\x00" + b"\x00\x00\x00\x00"
TRAILER = b"\xff\xff"
_FIXED = {"bool": 1, "int2": 2, "int4": 4, "int8": 8, "float4": 4, "float8": 8, "date": 4, "timestamp": 8,
          "timestamptz": 8}
_VAR = ("text", "varchar", "bytea")
_PG_EPOCH_DAYS = 10957                     # 2000-01-01 - 1970-01-01
_PG_EPOCH_US = _PG_EPOCH_DAYS * 86400 * 1_000_000
_US = {"s": 1_000_000, "ms": 1000, "us": 1, "ns": None}


def binary_types(schema: Any, columns: dict) -> Optional[list[str]]:
    """The target column types of ``schema``'s fields if every one has a binary form here, else None (CSV)."""
    import pyarrow as pa
    out = []
    for field in schema:
        col = columns.get(field.name)
        if col is None:
            return None
        t = col.typname
        if t in _VAR or t in _FIXED:
            if pa.types.is_timestamp(field.type) and field.type.unit == "ns":
                return None  # nanoseconds: PostgreSQL keeps microseconds (the CSV path truncates the same way)
            if pa.types.is_float32(field.type) and t == "float8":
                return None  # widened exactly it reads 1.0000000150474662e+30 where CSV's shortest text gave 1e+30
            out.append(t)
        else:
            return None
    return out


def _fixed_values(col: Any, typname: str) -> Any:
    """The column's values as a numpy array of the target's big-endian binary form (NULLs as zeros)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    t = col.type
    if typname == "bool":
        arr = pc.fill_null(col, False).to_numpy(zero_copy_only=False).astype(np.uint8)
        return arr
    if typname in ("int2", "int4", "int8"):
        dt = {"int2": ">i2", "int4": ">i4", "int8": ">i8"}[typname]
        return pc.fill_null(col, 0).to_numpy(zero_copy_only=False).astype(dt)
    if typname in ("float4", "float8"):
        dt = ">f4" if typname == "float4" else ">f8"
        return pc.fill_null(col, 0).to_numpy(zero_copy_only=False).astype(dt)
    if typname == "date":
        days = pc.fill_null(col.cast(pa.int32()), 0)
        return (days.to_numpy(zero_copy_only=False).astype(np.int64) - _PG_EPOCH_DAYS).astype(">i4")
    # timestamp / timestamptz: microseconds since 2000-01-01
    raw = pc.fill_null(col.cast(pa.int64()), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    return (raw * _US[t.unit] - _PG_EPOCH_US).astype(">i8")


def _binary_from(data: Any, offsets: Any) -> Any:
    """A pyarrow binary array over numpy ``data`` (uint8) and ``offsets`` (n + 1, int32 or int64)."""
    import numpy as np
    import pyarrow as pa
    large = offsets[-1] >= 2 ** 31
    off = offsets.astype(np.int64 if large else np.int32)
    return pa.Array.from_buffers(pa.large_binary() if large else pa.binary(), len(off) - 1,
                                 [None, pa.py_buffer(off), pa.py_buffer(np.ascontiguousarray(data))])


def encode_binary(batch: Any, types: Sequence[str], *, header: bool = True, trailer: bool = True) -> bytes:
    """The rows of ``batch`` in binary COPY form, each column in the form of ``types``; with the stream's header
    (its first chunk) and trailer (its last).

    Each row is the element-wise concatenation (Arrow's ``binary_join_element_wise``, in C++) of pieces: the field
    count, then per column its length prefix and value (a fixed-width column: one piece of prefix and value, built
    with numpy; a text or bytea column: a prefix piece and the column's own buffers)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    n = batch.num_rows
    if n == 0:
        return (HEADER if header else b"") + (TRAILER if trailer else b"")
    pieces = [_binary_from(np.tile(np.frombuffer(np.array([batch.num_columns], ">i2").tobytes(), np.uint8), n),
                           np.arange(n + 1, dtype=np.int64) * 2)]
    for col, typname in zip(batch.columns, types):
        valid = None if col.null_count == 0 else np.asarray(col.is_valid().to_numpy(zero_copy_only=False), bool)
        if typname in _FIXED:
            width = _FIXED[typname]
            values = _fixed_values(col, typname).view(np.uint8).reshape(n, width)
            lens = np.full(n, width, np.int64) if valid is None else np.where(valid, width, -1)
            mat = np.empty((n, 4 + width), np.uint8)
            mat[:, :4] = lens.astype(">i4").view(np.uint8).reshape(n, 4)
            mat[:, 4:] = values
            if valid is None:
                pieces.append(_binary_from(mat.reshape(-1), np.arange(n + 1, dtype=np.int64) * (4 + width)))
            else:  # a NULL is its prefix (-1) alone
                keep = np.ones((n, 4 + width), bool)
                keep[~valid, 4:] = False
                sizes = np.where(valid, 4 + width, 4)
                offsets = np.zeros(n + 1, np.int64)
                np.cumsum(sizes, out=offsets[1:])
                pieces.append(_binary_from(mat[keep], offsets))
        else:
            large = pa.types.is_large_string(col.type) or pa.types.is_large_binary(col.type)
            data = pc.fill_null(col.cast(pa.large_binary() if large else pa.binary()), b"")
            sizes = pc.binary_length(data).to_numpy(zero_copy_only=False).astype(np.int64)
            lens = sizes if valid is None else np.where(valid, sizes, -1)
            pieces.append(_binary_from(lens.astype(">i4").view(np.uint8), np.arange(n + 1, dtype=np.int64) * 4))
            pieces.append(data.cast(pa.large_binary()) if not large and any(
                pa.types.is_large_binary(p.type) for p in pieces) else data)
    if any(pa.types.is_large_binary(p.type) for p in pieces):
        pieces = [p.cast(pa.large_binary()) for p in pieces]
    rows = pc.binary_join_element_wise(*pieces, b"")
    off_dt = np.int64 if pa.types.is_large_binary(rows.type) else np.int32
    offsets = np.frombuffer(rows.buffers()[1], off_dt, count=n + 1, offset=rows.offset * np.dtype(off_dt).itemsize)
    body = memoryview(rows.buffers()[2])[int(offsets[0]):int(offsets[-1])]
    return b"".join(((HEADER if header else b""), body, (TRAILER if trailer else b"")))


__all__ = ["binary_types", "encode_binary"]
