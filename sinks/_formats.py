"""Row formats for file-like sinks: Parquet, JSON lines and CSV writers over a binary stream.

One small writer class per format, all with the same surface: ``write(batch)``, ``bytes_written``,
``close()``. The file and S3 sinks share them.
"""

from __future__ import annotations

import base64
import datetime as _dt
import decimal
import json
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Callable, MutableMapping, Optional

import pyarrow as pa

from twophase.errors import ConfigurationError

FORMATS = ("parquet", "json", "csv")
EXTENSIONS = {"parquet": "parquet", "json": "json", "csv": "csv"}


class FormatWriter:
    """Writes Arrow record batches of one schema into a binary stream in one format."""

    def __init__(self, stream: BinaryIO, schema: pa.Schema) -> None:
        self.stream = stream
        self.schema = schema
        self.records = 0

    @property
    def bytes_written(self) -> int:
        return self.stream.tell()

    def write(self, batch: pa.RecordBatch) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Finish the format (footer); does not close ``stream``."""


class ParquetFormatWriter(FormatWriter):
    """Parquet, with Arrow batches (Spark sends 10k rows at a time) coalesced into row groups of up to
    ``row_group_bytes`` of Arrow data, so files have a few large row groups, as Spark's writer makes."""

    def __init__(self, stream: BinaryIO, schema: pa.Schema, compression: str = "snappy",
                 row_group_bytes: int = 64 << 20) -> None:
        super().__init__(stream, schema)
        import pyarrow.parquet as pq
        self._w = pq.ParquetWriter(stream, schema, compression=None if compression == "none" else compression)
        self._buffer: list[pa.RecordBatch] = []
        self._buffered = 0
        self._row_group_bytes = row_group_bytes

    @property
    def bytes_written(self) -> int:
        return self.stream.tell() + self._buffered  # buffered Arrow bytes overestimate: rolls a little early

    def write(self, batch: pa.RecordBatch) -> None:
        self._buffer.append(batch)
        self._buffered += batch.nbytes
        self.records += batch.num_rows
        if self._buffered >= self._row_group_bytes:
            self._flush()

    def _flush(self) -> None:
        if self._buffer:
            self._w.write_table(pa.Table.from_batches(self._buffer), row_group_size=1 << 30)
            self._buffer, self._buffered = [], 0

    def close(self) -> None:
        self._flush()
        self._w.close()


def _json_default(v: Any) -> Any:
    if isinstance(v, (_dt.datetime, _dt.date, _dt.time)):
        return v.isoformat()
    if isinstance(v, decimal.Decimal):
        return str(v)
    if isinstance(v, (bytes, bytearray)):
        return base64.b64encode(bytes(v)).decode()
    if isinstance(v, _dt.timedelta):
        return v.total_seconds()
    return str(v)


class JsonLinesFormatWriter(FormatWriter):
    def write(self, batch: pa.RecordBatch) -> None:
        lines = [json.dumps(r, default=_json_default, separators=(",", ":")) for r in batch.to_pylist()]
        if lines:
            self.stream.write(("\n".join(lines) + "\n").encode())
        self.records += batch.num_rows


class CsvFormatWriter(FormatWriter):
    def __init__(self, stream: BinaryIO, schema: pa.Schema) -> None:
        super().__init__(stream, schema)
        import pyarrow.csv as pacsv
        self._w = pacsv.CSVWriter(stream, schema)

    def write(self, batch: pa.RecordBatch) -> None:
        self._w.write_batch(batch)
        self.records += batch.num_rows

    def close(self) -> None:
        self._w.close()


def open_format_writer(fmt: str, stream: BinaryIO, schema: pa.Schema, *, compression: str = "snappy") -> FormatWriter:
    if fmt == "parquet":
        return ParquetFormatWriter(stream, schema, compression)
    if fmt == "json":
        return JsonLinesFormatWriter(stream, schema)
    if fmt == "csv":
        return CsvFormatWriter(stream, schema)
    raise ConfigurationError(f"option 'format' must be one of {', '.join(FORMATS)}, got {fmt!r}")


_ESCAPE = set('"#%\'*/:=?\\\x7f{[]^')


def escape_partition_value(v: Any) -> str:
    """Hive-style path escaping of a partition value (as Spark does); None -> __HIVE_DEFAULT_PARTITION__."""
    if v is None:
        return "__HIVE_DEFAULT_PARTITION__"
    s = v.isoformat() if isinstance(v, (_dt.date, _dt.datetime)) else str(v)
    if s == "":
        return "__HIVE_DEFAULT_PARTITION__"
    return "".join(f"%{ord(c):02X}" if c in _ESCAPE or ord(c) < 0x20 else c for c in s)


def split_by_partition(batch: pa.RecordBatch, columns: tuple[str, ...]) -> list[tuple[str, pa.RecordBatch]]:
    """Split ``batch`` by the values of ``columns`` into (``a=1/b=x``, rows without those columns)."""
    if not columns:
        return [("", batch)]
    import pyarrow.compute as pc
    table = pa.Table.from_batches([batch])
    data_cols = [c for c in table.column_names if c not in columns]
    keys = table.select(list(columns)).group_by(list(columns)).aggregate([]).to_pylist()
    out = []
    for key in keys:
        mask = None
        for c in columns:
            col = table.column(c)
            m = pc.is_null(col) if key[c] is None else pc.fill_null(pc.equal(col, pa.scalar(key[c], col.type)), False)
            mask = m if mask is None else pc.and_(mask, m)
        part = table.filter(mask).select(data_cols).combine_chunks()
        rel = "/".join(f"{escape_partition_value(c)}={escape_partition_value(key[c])}" for c in columns)
        for b in part.to_batches():
            out.append((rel, b))
    return out


def part_file_name(checkpoint_id: int, task_id: str, attempt_uid: str, seq: int, ext: str) -> str:
    """``part-<checkpoint>-<task>-<attempt>-<seq>.<ext>``: unique per attempt, sorted by checkpoint."""
    task = int(task_id) if task_id.isdigit() else task_id
    return f"part-{checkpoint_id:08d}-{task:>05}-{attempt_uid}-{seq:03d}.{ext}"


@dataclass(kw_only=True)
class FileLikeTransaction:
    """In-task state shared by file-like sinks: open files per partition directory, finished ones."""

    context: Any  # twophase.sink.TransactionContext
    open_files: dict[str, Any] = field(default_factory=dict)
    closed: list[dict[str, Any]] = field(default_factory=list)
    seq: int = 0
    records: int = 0

    def next_name(self, ext: str) -> str:
        """The next :func:`part_file_name` of this transaction."""
        c = self.context
        name = part_file_name(c.checkpoint_id, c.task_id, c.attempt_uid, self.seq, ext)
        self.seq += 1
        return name


def slices(batch: pa.RecordBatch, max_bytes: int) -> list[pa.RecordBatch]:
    """Cut ``batch`` into slices of about ``max_bytes`` in memory, so a file rolls close to its limit."""
    if batch.num_rows <= 1 or batch.nbytes <= max_bytes:
        return [batch]
    rows = max(1, int(batch.num_rows * max_bytes / batch.nbytes))
    return [batch.slice(i, rows) for i in range(0, batch.num_rows, rows)]


def write_rolling(open_files: MutableMapping[str, Any], batch: pa.RecordBatch, partition_by: tuple[str, ...],
                  max_bytes: int, open_file: Callable[[str, pa.Schema], Any], close_file: Callable[[Any], None],
                  observe: Optional[Callable[[Any, pa.RecordBatch], None]] = None) -> int:
    """Route ``batch`` to one open file per Hive partition directory, rolling past ``max_bytes``.

    The loop every file-like sink (files, S3, Delta) shares. ``open_files`` maps a partition directory
    (``""`` when unpartitioned) to an object with a ``writer`` (:class:`FormatWriter`);
    ``open_file(part_rel, schema)`` opens one, ``close_file(f)`` finishes one that reached the limit,
    ``observe(f, piece)`` sees every piece written (statistics). Returns the rows written.
    """
    for part_rel, part in split_by_partition(batch, partition_by):
        for piece in slices(part, max_bytes // 4):
            f = open_files.get(part_rel)
            if f is None:
                f = open_files[part_rel] = open_file(part_rel, piece.schema)
            f.writer.write(piece)
            if observe is not None:
                observe(f, piece)
            if f.writer.bytes_written >= max_bytes:
                close_file(open_files.pop(part_rel))
    return batch.num_rows
