"""Row formats for file-like sinks: Parquet, ORC, JSON lines, CSV and text writers over a binary stream.

One small writer class per format, all with the same surface: ``write(batch)``, ``records``,
``bytes_written``, ``close()``. The file and S3 sinks share them, and their options
(:data:`FORMAT_OPTIONS`, validated once by :func:`format_options` into a :class:`FormatOptions`), named as
in Spark's file sink: ``format``, ``compression``, ``maxRecordsPerFile``, and for CSV ``header``, ``sep``
(``delimiter``), ``quote``, ``nullValue``.
"""

from __future__ import annotations

import base64
import bz2
import datetime as _dt
import decimal
import gzip
import json
import math
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable, Mapping, MutableMapping, Optional

import pyarrow as pa

from twophase.errors import ConfigurationError
from twophase.options import Option, parse_bool, parse_choice, parse_positive_int

FORMATS = ("parquet", "json", "csv", "orc", "text")
EXTENSIONS = {"parquet": "parquet", "json": "json", "csv": "csv", "orc": "orc", "text": "txt"}
#: the codecs of each format; the first is the default (Spark's: snappy for Parquet and ORC, none for text formats)
COMPRESSIONS: dict[str, tuple[str, ...]] = {
    "parquet": ("snappy", "zstd", "gzip", "lz4", "none"), "orc": ("snappy", "zstd", "zlib", "lz4", "none"),
    "json": ("none", "gzip", "bzip2"), "csv": ("none", "gzip", "bzip2"), "text": ("none", "gzip", "bzip2")}
#: whole-stream codecs of the text formats and the suffix Spark gives their files
_STREAM_SUFFIX = {"gzip": ".gz", "bzip2": ".bz2"}

#: the format options of the file and S3 sinks (Spark's names)
FORMAT_OPTIONS: tuple[Option[Any], ...] = (
    Option("format", parse_choice(*FORMATS), "parquet", help="parquet, orc, json (JSON lines), csv or text"),
    Option("compression", str, help="parquet: snappy (default), zstd, gzip, lz4, none; orc: snappy (default), zstd, "
                                    "zlib, lz4, none; json, csv, text: none (default), gzip, bzip2"),
    Option("maxRecordsPerFile", parse_positive_int, help="roll to a new file after this many records"),
    Option("header", parse_bool, help="csv: write the column names as the first line (default true)"),
    Option("sep", str, help="csv: the field separator, one character (default ',')"),
    Option("delimiter", str, help="csv: the same as sep"),
    Option("quote", str, help='csv: the quote character; only the default " is supported'),
    Option("nullValue", str, help="csv: how a null is written (default: an empty, unquoted field)"),
)


@dataclass(frozen=True)
class FormatOptions:
    """Validated format options (see :data:`FORMAT_OPTIONS`)."""

    format: str = "parquet"
    compression: str = "snappy"
    max_records_per_file: Optional[int] = None
    header: bool = True
    sep: str = ","
    null_value: str = ""

    @property
    def extension(self) -> str:
        """``parquet``, ``json.gz``, ``csv.bz2``, ``txt``... (Parquet and ORC codecs are inside the file)."""
        return EXTENSIONS[self.format] + _STREAM_SUFFIX.get(self.compression, "")


def format_options(o: Mapping[str, Any], *, sink: str) -> FormatOptions:
    """The :class:`FormatOptions` of parsed options ``o`` (the keys of :data:`FORMAT_OPTIONS`); an option that
    does not apply to the format, or a value it cannot take, is a ConfigurationError naming it and the fix."""
    fmt = o["format"]
    codecs = COMPRESSIONS[fmt]
    compression = str(o["compression"] or codecs[0]).strip().lower()
    if compression == "uncompressed":
        compression = "none"
    if compression not in codecs:
        raise ConfigurationError(f"{sink}: option 'compression'={compression!r} does not apply to format={fmt}; "
                                 f"use one of {', '.join(codecs)}")
    csv_only = [k for k in ("header", "sep", "delimiter", "quote", "nullValue") if o.get(k) is not None]
    if csv_only and fmt != "csv":
        raise ConfigurationError(f"{sink}: option(s) {csv_only} apply to format=csv only; drop them or set "
                                 "option format=csv")
    if o.get("sep") is not None and o.get("delimiter") is not None and o["sep"] != o["delimiter"]:
        raise ConfigurationError(f"{sink}: options 'sep' and 'delimiter' disagree; give one of them")
    sep = o.get("sep") if o.get("sep") is not None else o.get("delimiter")
    sep = "," if sep is None else ("\t" if sep == "\\t" else sep)  # Spark takes the two characters \t for a tab
    if len(sep) != 1 or sep in ('"', "\n", "\r"):
        raise ConfigurationError(f"{sink}: option 'sep' must be one character other than a quote or a line break "
                                 f"(e.g. ',', ';', '|', '\\t'), got {sep!r}")
    if o.get("quote") is not None and o["quote"] != '"':
        raise ConfigurationError(f"{sink}: option 'quote'={o['quote']!r}: only the RFC 4180 quote '\"' is supported "
                                 "(a quote inside a value is doubled); drop the option")
    return FormatOptions(format=fmt, compression=compression, max_records_per_file=o.get("maxRecordsPerFile"),
                         header=True if o.get("header") is None else bool(o["header"]), sep=sep,
                         null_value=o.get("nullValue") or "")


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
    """Fallback for values no :func:`_json_encoder` covers (the embedded runtime's Python objects)."""
    if isinstance(v, (_dt.datetime, _dt.date, _dt.time)):
        return v.isoformat()
    if isinstance(v, decimal.Decimal):
        return format(v, "f")
    if isinstance(v, (bytes, bytearray)):
        return base64.b64encode(bytes(v)).decode()
    if isinstance(v, _dt.timedelta):
        return v.total_seconds()
    return str(v)


# --------------------------------------------------------------------------- value encodings of JSON and CSV
#
# Invariant: a value written as JSON or CSV reads back as the same value with the column's type (Spark's
# JSON reader with the stream's schema; for CSV any RFC 4180 reader, e.g. Spark with
# .option("escape", '"'), DuckDB, pyarrow):
#
# - timestamp with a time zone: ISO 8601 in UTC with microseconds, ``2024-05-01T12:00:00.000001Z``
#   (Spark sends the session time zone; the instant is what counts, and UTC names it unambiguously);
# - timestamp without a time zone (timestamp_ntz): ``2024-05-01T12:00:00.000001``, no zone;
# - date: ``2024-05-01``; decimal: plain digits with the column's scale (``0.00000000``, never ``0E-8``),
#   a JSON string so no reader goes through a binary float;
# - float/double: shortest repr; NaN and infinities as Spark writes them: JSON ``"NaN"``, ``"Infinity"``,
#   ``"-Infinity"`` (valid JSON), CSV ``NaN``, ``Inf``, ``-Inf`` (Spark's CSV defaults);
# - binary: base64 in JSON (Spark's convention); not CSV (:func:`format_problem`);
# - map: a JSON object in the map's entry order (string keys only, :func:`format_problem`); arrays and
#   structs as JSON arrays and objects; not CSV;
# - null: JSON ``null`` at every level; CSV an empty unquoted field, while an empty string is ``""``.


def format_problem(fmt: str, t: pa.DataType) -> Optional[tuple[str, str]]:
    """``(where, fix)`` if file format ``fmt`` cannot hold every value of Arrow type ``t`` exactly, else None.

    ``where`` is the path inside the type (``""``, ``".key"``, ``".element.x"``); ``fix`` tells the user what
    to do. Parquet holds every type Spark sends (see :mod:`twophase.sinks._spark_types`).
    """
    if fmt == "csv":
        if pa.types.is_nested(t):
            return "", "serialize it with to_json(...) or use option format=json or parquet"
        if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
            return "", "encode it with base64(...) (or cast it to string if it is text) or use option format=json or parquet"
        return None
    if fmt == "json":
        if pa.types.is_map(t):
            if not (pa.types.is_string(t.key_type) or pa.types.is_large_string(t.key_type)):
                return ".key", ("JSON object keys are strings and Spark's JSON reader reads only string-keyed maps: "
                                "cast the keys, e.g. transform_keys(m, (k, v) -> cast(k as string)), or use option "
                                "format=parquet")
            found = format_problem(fmt, t.item_type)
            return None if found is None else (".value" + found[0], found[1])
        if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
            found = format_problem(fmt, t.value_type)
            return None if found is None else (".element" + found[0], found[1])
        if pa.types.is_struct(t):
            for i in range(t.num_fields):
                found = format_problem(fmt, t.field(i).type)
                if found is not None:
                    return f".{t.field(i).name}" + found[0], found[1]
        return None
    return None


def _utc_iso(v: _dt.datetime) -> str:
    return v.astimezone(_dt.timezone.utc).replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def _json_float(v: float) -> Any:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    return v


def _json_encoder(t: pa.DataType) -> Optional[Callable[[Any], Any]]:
    """A function turning a non-null ``to_pylist()`` value of type ``t`` into its JSON value; None if the value
    is already its own JSON value (strings, integers, booleans, and nested values of those)."""
    if pa.types.is_timestamp(t):
        return _utc_iso if t.tz is not None else (lambda v: v.isoformat(timespec="microseconds"))
    if pa.types.is_date(t) or pa.types.is_time(t):
        return lambda v: v.isoformat()
    if pa.types.is_decimal(t):
        return lambda v: format(v, "f")
    if pa.types.is_floating(t):
        return _json_float
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return lambda v: base64.b64encode(v).decode()
    if pa.types.is_duration(t):
        return lambda v: v.total_seconds()
    if pa.types.is_map(t):
        ke, ve = _json_encoder(t.key_type), _json_encoder(t.item_type)
        kf = (lambda k: k if isinstance(k, str) else json.dumps(k)) if ke is None else (lambda k: str(ke(k)))
        vf = _nullable(ve)
        return lambda v: {kf(k): vf(x) for k, x in v}
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        e = _json_encoder(t.value_type)
        if e is None:
            return None
        ef = _nullable(e)
        return lambda v: [ef(x) for x in v]
    if pa.types.is_struct(t):
        encs = [(t.field(i).name, _json_encoder(t.field(i).type)) for i in range(t.num_fields)]
        if all(e is None for _, e in encs):
            return None
        fs = [(n, _nullable(e)) for n, e in encs]
        return lambda v: {n: f(v[n]) for n, f in fs}
    return None


def _nullable(e: Optional[Callable[[Any], Any]]) -> Callable[[Any], Any]:
    if e is None:
        return lambda v: v
    return lambda v: None if v is None else e(v)


def json_rows(batch: pa.RecordBatch) -> list[dict[str, Any]]:
    """The rows of ``batch`` as JSON-ready dicts (see the value encodings above)."""
    names = batch.schema.names
    columns = []
    for col, f in zip(batch.columns, batch.schema):
        values = col.to_pylist()
        e = _json_encoder(f.type)
        if e is not None:
            values = [None if v is None else e(v) for v in values]
        columns.append(values)
    return [dict(zip(names, row)) for row in zip(*columns)]


def csv_column(col: pa.Array, name: str = "?") -> pa.Array:
    """``col`` in its CSV form (see the value encodings above): numbers, booleans, dates and strings as they
    are; timestamps, decimals and floats as strings. Raises ConfigurationError for what CSV cannot hold."""
    import pyarrow.compute as pc
    t = col.type
    found = format_problem("csv", t)
    if found is not None:
        raise ConfigurationError(f"column {name!r} of type {t} cannot be written as csv; {found[1]}")
    if pa.types.is_timestamp(t):
        if t.tz is not None:
            return pc.strftime(col.cast(pa.timestamp(t.unit, "UTC")), format="%Y-%m-%dT%H:%M:%SZ")
        return pc.strftime(col, format="%Y-%m-%dT%H:%M:%S")
    if pa.types.is_decimal(t):
        return pa.array([None if v is None else format(v, "f") for v in col.to_pylist()], pa.string())
    if pa.types.is_floating(t):
        s = col.cast(pa.string())
        s = pc.if_else(pc.is_nan(col), pa.scalar("NaN"), s)
        s = pc.if_else(pc.equal(col, pa.scalar(float("inf"), t)), pa.scalar("Inf"), s)
        return pc.if_else(pc.equal(col, pa.scalar(float("-inf"), t)), pa.scalar("-Inf"), s)
    return col


class JsonLinesFormatWriter(FormatWriter):
    """JSON lines (see the value encodings above); every line is strict JSON (no bare NaN)."""

    def write(self, batch: pa.RecordBatch) -> None:
        lines = [json.dumps(r, default=_json_default, separators=(",", ":"), allow_nan=False)
                 for r in json_rows(batch)]
        if lines:
            self.stream.write(("\n".join(lines) + "\n").encode())
        self.records += batch.num_rows


class CsvFormatWriter(FormatWriter):
    """RFC 4180 CSV (see the value encodings above), a header line unless ``header=False``, fields separated by
    ``sep``, nulls written as ``null_value`` (default: an empty unquoted field, while an empty string is
    ``""``); nested and binary columns are refused."""

    def __init__(self, stream: BinaryIO, schema: pa.Schema, *, header: bool = True, sep: str = ",",
                 null_value: str = "") -> None:
        super().__init__(stream, schema)
        import pyarrow.csv as pacsv
        for f in schema:
            found = format_problem("csv", f.type)
            if found is not None:
                raise ConfigurationError(f"column {f.name!r} of type {f.type} cannot be written as csv; {found[1]}")
        self._null = null_value
        self._encoded = pa.schema([pa.field(f.name, self._column(pa.nulls(0, f.type), f.name).type) for f in schema])
        self._w = pacsv.CSVWriter(stream, self._encoded,
                                  write_options=pacsv.WriteOptions(include_header=header, delimiter=sep))

    def _column(self, col: pa.Array, name: str) -> pa.Array:
        out = csv_column(col, name)
        if self._null:
            import pyarrow.compute as pc
            out = pc.fill_null(out.cast(pa.string()), self._null)
        return out

    def write(self, batch: pa.RecordBatch) -> None:
        cols = [self._column(c, n) for c, n in zip(batch.columns, batch.schema.names)]
        self._w.write_batch(pa.RecordBatch.from_arrays(cols, schema=self._encoded))
        self.records += batch.num_rows

    def close(self) -> None:
        self._w.close()


class OrcFormatWriter(FormatWriter):
    """ORC through pyarrow (one stripe per ~64 MiB), as Spark's ORC writer."""

    def __init__(self, stream: BinaryIO, schema: pa.Schema, compression: str = "snappy") -> None:
        super().__init__(stream, schema)
        import pyarrow.orc as orc
        self._w = orc.ORCWriter(stream, compression="uncompressed" if compression == "none" else compression)

    def write(self, batch: pa.RecordBatch) -> None:
        self._w.write(pa.Table.from_batches([batch]))
        self.records += batch.num_rows

    def close(self) -> None:
        self._w.close()


class TextFormatWriter(FormatWriter):
    """Spark's text format: one string column, one line per row (a null is an empty line, as Spark writes it)."""

    def __init__(self, stream: BinaryIO, schema: pa.Schema) -> None:
        super().__init__(stream, schema)
        if len(schema) != 1 or not (pa.types.is_string(schema[0].type) or pa.types.is_large_string(schema[0].type)):
            cols = ", ".join(f"{f.name} {f.type}" for f in schema)
            raise ConfigurationError(f"format=text writes exactly one string column (besides partitionBy columns), "
                                     f"got: {cols}; select one, e.g. .selectExpr(\"to_json(struct(*)) AS value\")")

    def write(self, batch: pa.RecordBatch) -> None:
        values = batch.column(0).to_pylist()
        if values:
            self.stream.write(("\n".join("" if v is None else v for v in values) + "\n").encode())
        self.records += batch.num_rows


class _CompressedStream:
    """A whole-stream codec (gzip, bzip2) in front of ``raw``; :meth:`tell` counts compressed bytes (what
    rolling by size measures), :meth:`finish` ends the codec's stream without closing ``raw``."""

    def __init__(self, raw: BinaryIO, codec: str) -> None:
        self.raw = raw
        self._gz = gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) if codec == "gzip" else None  # type: ignore[arg-type]
        self._bz = bz2.BZ2Compressor() if codec == "bzip2" else None

    def write(self, data: bytes) -> int:
        if self._gz is not None:
            self._gz.write(data)
        else:
            assert self._bz is not None
            out = self._bz.compress(data)
            if out:
                self.raw.write(out)
        return len(data)

    closed = False

    def writable(self) -> bool:
        return True

    def flush(self) -> None:
        pass

    def tell(self) -> int:
        return self.raw.tell()

    def finish(self) -> None:
        if self._gz is not None:
            self._gz.close()
        elif self._bz is not None:
            self.raw.write(self._bz.flush())


class _Compressed(FormatWriter):
    """A text format writer whose bytes go through a :class:`_CompressedStream`."""

    def __init__(self, inner: FormatWriter, stream: _CompressedStream) -> None:
        # no FormatWriter.__init__: the record count is the inner writer's, the size the raw stream's
        self.inner, self.codec = inner, stream
        self.stream, self.schema = stream.raw, inner.schema

    @property
    def records(self) -> int:  # type: ignore[override]
        return self.inner.records

    def write(self, batch: pa.RecordBatch) -> None:
        self.inner.write(batch)

    def close(self) -> None:
        self.inner.close()
        self.codec.finish()


def open_format_writer(fmt: Any, stream: BinaryIO, schema: pa.Schema, *, compression: Optional[str] = None) -> FormatWriter:
    """The writer of :class:`FormatOptions` ``fmt`` (or a format name, with ``compression``) over ``stream``."""
    if isinstance(fmt, str):
        if fmt not in FORMATS:
            raise ConfigurationError(f"option 'format' must be one of {', '.join(FORMATS)}, got {fmt!r}")
        fmt = FormatOptions(format=fmt, compression=compression or COMPRESSIONS[fmt][0])
    if fmt.format == "parquet":
        return ParquetFormatWriter(stream, schema, fmt.compression)
    if fmt.format == "orc":
        return OrcFormatWriter(stream, schema, fmt.compression)
    codec = _CompressedStream(stream, fmt.compression) if fmt.compression in _STREAM_SUFFIX else None
    target: Any = codec if codec is not None else stream
    inner: FormatWriter
    if fmt.format == "json":
        inner = JsonLinesFormatWriter(target, schema)
    elif fmt.format == "csv":
        inner = CsvFormatWriter(target, schema, header=fmt.header, sep=fmt.sep, null_value=fmt.null_value)
    else:
        inner = TextFormatWriter(target, schema)
    return inner if codec is None else _Compressed(inner, codec)


_ESCAPE = set('"#%\'*/:=?\\\x7f{[]^')


def escape_partition_value(v: Any) -> str:
    """Hive-style path escaping of a partition value (as Spark does); None -> __HIVE_DEFAULT_PARTITION__."""
    if v is None:
        return "__HIVE_DEFAULT_PARTITION__"
    if isinstance(v, bool):
        s = "true" if v else "false"  # as Spark writes it (and as Delta's partition values must be)
    elif isinstance(v, decimal.Decimal):
        s = format(v, "f")  # never 0E-8
    else:
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


def slices(batch: pa.RecordBatch, max_bytes: int) -> list[pa.RecordBatch]:
    """Cut ``batch`` into slices of about ``max_bytes`` in memory, so a file rolls close to its limit."""
    if batch.num_rows <= 1 or batch.nbytes <= max_bytes:
        return [batch]
    rows = max(1, int(batch.num_rows * max_bytes / batch.nbytes))
    return [batch.slice(i, rows) for i in range(0, batch.num_rows, rows)]


def write_rolling(open_files: MutableMapping[str, Any], batch: pa.RecordBatch, partition_by: tuple[str, ...],
                  max_bytes: int, open_file: Callable[[str, pa.Schema], Any], close_file: Callable[[Any], None],
                  observe: Optional[Callable[[Any, pa.RecordBatch], None]] = None,
                  max_records: Optional[int] = None) -> int:
    """Route ``batch`` to one open file per Hive partition directory, rolling past ``max_bytes`` or at
    ``max_records`` records (Spark's ``maxRecordsPerFile``: no file holds more).

    The loop every file-like sink (files, S3, Delta) shares. ``open_files`` maps a partition directory
    (``""`` when unpartitioned) to an object with a ``writer`` (:class:`FormatWriter`);
    ``open_file(part_rel, schema)`` opens one, ``close_file(f)`` finishes one that reached a limit,
    ``observe(f, piece)`` sees every piece written (statistics). Returns the rows written.
    """
    for part_rel, part in split_by_partition(batch, partition_by):
        for piece in slices(part, max_bytes // 4):
            first = True
            while first or piece.num_rows:
                first = False
                f = open_files.get(part_rel)
                if f is None:
                    f = open_files[part_rel] = open_file(part_rel, piece.schema)
                chunk = piece
                if max_records is not None and f.writer.records + piece.num_rows > max_records:
                    chunk = piece.slice(0, max_records - f.writer.records)
                piece = piece.slice(chunk.num_rows)
                f.writer.write(chunk)
                if observe is not None:
                    observe(f, chunk)
                if f.writer.bytes_written >= max_bytes or (max_records is not None
                                                           and f.writer.records >= max_records):
                    close_file(open_files.pop(part_rel))
    return batch.num_rows
