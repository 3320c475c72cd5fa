"""Spark SQL types in twophase sinks: the ONE place that knows how a Spark column reaches a sink and whether it survives.

What a ``DataSourceStreamArrowWriter`` receives (Spark 4, checked on a real stream): Spark's Arrow
converters build each batch with ``spark.sql.session.timeZone``, so

=====================  ==========================================  =====================================
Spark type             Arrow type in the writer                    driver-side :func:`arrow_schema`
=====================  ==========================================  =====================================
timestamp              ``timestamp[us, tz=<session time zone>]``   ``timestamp[us, tz=UTC]`` (same instants)
timestamp_ntz          ``timestamp[us]``                           same
date                   ``date32``                                  same
decimal(p, s)          ``decimal128(p, s)``                        same
string / binary        ``string`` / ``binary`` (``large_*`` with   ``string`` / ``binary``
                       ``spark.sql.execution.arrow.useLargeVarTypes``)
boolean, byte, short,  ``bool``, ``int8``, ``int16``, ``int32``,   same
int, long, float,      ``int64``, ``float32``, ``float64``
double
array / map / struct   ``list<element>`` / ``map<key, value>`` /   same
                       ``struct``
=====================  ==========================================  =====================================

Invariants (``test_types_*`` in ``integration/test_types.py``):

1. Every column of a stream either round-trips exactly through the sink (the values read back equal what
   Spark wrote: instants, decimal digits, NaN, map entry order, nulls at every level) or the query is
   refused here, on the driver, before any data moves, with a :class:`ConfigurationError` naming the
   column (a path such as ``m.value`` inside nested types), its Spark type and the fix.
2. The refusals depend only on the Spark schema, the sink and its format; the value encodings of JSON
   and CSV live in :mod:`twophase.sinks._formats` (:func:`twophase.sinks._formats.format_problem` says what a file format
   cannot hold), so the file and S3 sinks (and the embedded runtime) share them.
3. Hive partition columns are restricted to types whose directory name (Delta: partition value) reads
   back as the same value: strings, integers, booleans, dates, and decimals except in Delta.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import pyarrow as pa
from pyspark.sql import types as T

from twophase.sinks._formats import format_problem
from twophase.errors import ConfigurationError

#: the Arrow timezone of ``timestamp`` columns in driver-side schemas: batches carry the session time
#: zone instead, which names the same instants (Delta and Parquet store UTC either way). It must be UTC:
#: deltalake refuses any other zone in a table schema.
DRIVER_TIMEZONE = "UTC"

#: what a sink's ``format`` may be here: the file formats, plus the Delta and Kafka sinks
SINK_FORMATS = ("parquet", "json", "csv", "orc", "text", "delta", "kafka")

_PARTITION_TYPES = (T.StringType, T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.BooleanType,
                    T.DecimalType, T.DateType)
#: deltalake (1.x) misreads negative decimal partition values below 1 ('-0.5' -> '0.-5'): no decimals there
_DELTA_PARTITION_TYPES = tuple(t for t in _PARTITION_TYPES if t is not T.DecimalType)


def arrow_schema(schema: T.StructType) -> pa.Schema:
    """The Arrow schema of a Spark stream as the driver sees it (``timestamp`` in UTC, see module table).

    Call :func:`check_columns` first: it refuses the Spark types that have no faithful Arrow form.
    """
    from pyspark.sql.pandas.types import to_arrow_schema
    return to_arrow_schema(schema, timezone=DRIVER_TIMEZONE, prefers_large_types=False)


def _spark_only_problem(dt: T.DataType, path: str) -> Optional[tuple[str, str]]:
    """(path, fix) for Spark types no twophase sink stores faithfully, wherever they are nested; else None."""
    if isinstance(dt, T.ArrayType):
        return _spark_only_problem(dt.elementType, f"{path}.element")
    if isinstance(dt, T.MapType):
        return (_spark_only_problem(dt.keyType, f"{path}.key")
                or _spark_only_problem(dt.valueType, f"{path}.value"))
    if isinstance(dt, T.StructType):
        for f in dt.fields:
            p = _spark_only_problem(f.dataType, f"{path}.{f.name}")
            if p is not None:
                return p
        return None
    if isinstance(dt, T.NullType):
        return path, "give it a concrete type, e.g. cast(null as string)"
    if isinstance(dt, (T.DayTimeIntervalType, T.YearMonthIntervalType, T.CalendarIntervalType)):
        return path, "convert it to a number (e.g. cast(... as bigint) seconds or months) or cast it to string"
    if isinstance(dt, T.VariantType):
        return path, "serialize it with to_json(...)"
    if isinstance(dt, T.UserDefinedType):
        return path, "convert it to its SQL type (a plain struct/array column) before writing"
    if isinstance(dt, (T.BooleanType, T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.FloatType,
                       T.DoubleType, T.DecimalType, T.StringType, T.BinaryType, T.DateType, T.TimestampType,
                       T.TimestampNTZType)):
        return None
    # time, geometry, geography, char/varchar in a stream, and whatever a later Spark adds
    return path, "cast it to string (or to a supported type) in the query"


def _spark_type_at(dt: T.DataType, sub: str) -> T.DataType:
    """The Spark type at ``sub`` (``.element``, ``.key``, ``.value``, ``.<field>``) inside ``dt``."""
    for part in [p for p in sub.split(".") if p]:
        if isinstance(dt, T.ArrayType) and part == "element":
            dt = dt.elementType
        elif isinstance(dt, T.MapType) and part in ("key", "value"):
            dt = dt.keyType if part == "key" else dt.valueType
        elif isinstance(dt, T.StructType) and part in dt.names:
            dt = dt[part].dataType
        else:
            break
    return dt


def _refuse(sink: str, name: str, col: T.DataType, path: str, what: str, fix: str) -> ConfigurationError:
    inner = _spark_type_at(col, path[len(name):])
    where = f"column {name!r} ({col.simpleString()})"
    if path != name:
        where += f" at {path!r} ({inner.simpleString()})"
    return ConfigurationError(f"{sink}: {where} cannot be written {what} without changing its values; {fix}")


def check_columns(sink: str, schema: T.StructType, fmt: str, *, partition_by: Sequence[str] = ()) -> None:
    """Refuse, on the driver, every column ``fmt`` cannot round-trip exactly (invariants 1-3).

    ``fmt`` is one of :data:`SINK_FORMATS`: a file format of twophase-file / twophase-s3, ``delta``
    (Parquet data files) or ``kafka`` (see :func:`check_kafka_columns`).
    """
    if fmt not in SINK_FORMATS:
        raise ValueError(f"unknown sink format {fmt!r}")
    if fmt == "kafka":
        check_kafka_columns(sink, schema)
        return
    what = "to Delta" if fmt == "delta" else f"as {fmt}"
    if fmt == "text":
        data = [f for f in schema.fields if f.name not in partition_by]
        if len(data) != 1 or not isinstance(data[0].dataType, T.StringType):
            cols = ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in data)
            raise ConfigurationError(f"{sink}: format=text writes exactly one string column (besides partitionBy "
                                     f"columns), the stream has: {cols}; select one, e.g. "
                                     ".selectExpr(\"to_json(struct(*)) AS value\")")
    for f in schema.fields:
        problem = _spark_only_problem(f.dataType, f.name)
        if problem is None and fmt in ("json", "csv"):
            from pyspark.sql.pandas.types import to_arrow_type
            found = format_problem(fmt, to_arrow_type(f.dataType, timezone=DRIVER_TIMEZONE))
            if found is not None:
                problem = (f.name + found[0], found[1])
        if problem is not None:
            raise _refuse(sink, f.name, f.dataType, problem[0], what, problem[1])
    check_partition_columns(sink, schema, fmt, partition_by)


def check_partition_columns(sink: str, schema: T.StructType, fmt: str, partition_by: Sequence[str]) -> None:
    """Refuse partition columns whose values do not read back from partition values (invariant 3)."""
    types = {f.name: f.dataType for f in schema.fields}
    allowed = _DELTA_PARTITION_TYPES if fmt == "delta" else _PARTITION_TYPES
    for c in partition_by:
        dt = types.get(c)
        if dt is not None and not isinstance(dt, allowed):
            kinds = ", ".join(t.typeName() for t in allowed)
            raise ConfigurationError(
                f"{sink}: option 'partitionBy' names column {c!r} ({dt.simpleString()}), whose values do not read back "
                "exactly from partition values; partition by a column derived from it (e.g. to_date(ts), "
                f"date_format(ts, 'yyyy-MM-dd-HH') or cast(... as string)) or by a column of type {kinds}")


#: Spark's Kafka sink columns and the types it accepts (key/value: string or binary)
_KAFKA_COLUMNS: dict[str, tuple[tuple[type, ...], str]] = {
    "key": ((T.StringType, T.BinaryType), "cast it to string or binary, e.g. cast(key as string) or to_json(...)"),
    "value": ((T.StringType, T.BinaryType), "cast it to string or binary, e.g. to_json(struct(*)) or cast(value as string)"),
    "topic": ((T.StringType,), "cast it to string"),
    "partition": ((T.IntegerType,), "cast it to int"),
}


def check_kafka_columns(sink: str, schema: T.StructType) -> None:
    """Column types of Spark's Kafka sink: key/value string or binary, topic string, partition int,
    headers ``array<struct<key: string, value: binary>>`` (value may also be string). Unknown columns are
    left to :class:`twophase.sinks.kafka.KafkaSinkOptions`, which refuses them."""
    for f in schema.fields:
        if f.name in _KAFKA_COLUMNS:
            allowed, fix = _KAFKA_COLUMNS[f.name]
            if not isinstance(f.dataType, allowed):
                raise ConfigurationError(f"{sink}: column {f.name!r} is {f.dataType.simpleString()}, but Kafka's "
                                         f"{f.name} must be {' or '.join(a.typeName() for a in allowed)}; {fix}")
        elif f.name == "headers" and not _kafka_headers_ok(f.dataType):
            raise ConfigurationError(f"{sink}: column 'headers' is {f.dataType.simpleString()}, but Kafka headers "
                                     "must be array<struct<key:string,value:binary>>; build them with "
                                     "array(struct(cast(k as string) as key, cast(v as binary) as value), ...)")


def _kafka_headers_ok(dt: Any) -> bool:
    if not isinstance(dt, T.ArrayType) or not isinstance(dt.elementType, T.StructType):
        return False
    fields = {f.name: f.dataType for f in dt.elementType.fields}
    return (set(fields) == {"key", "value"} and isinstance(fields["key"], T.StringType)
            and isinstance(fields["value"], (T.BinaryType, T.StringType)))
