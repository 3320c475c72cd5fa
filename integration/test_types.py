"""Every Spark SQL type a user streams, through every twophase file-like sink (see sinks/_spark_types.py).

Each type either round-trips exactly (read back and compared value by value with what Spark wrote:
instants, decimal digits, NaN and -0.0, map entry order, nulls at every level) or the query is refused
on the driver, before anything is written, with a ConfigurationError naming the column, its type and
the fix. The session time zone is America/Los_Angeles, so a time zone shift would show.

One SparkSession for the module; every query reads a Parquet input with trigger availableNow.
"""

from __future__ import annotations

import datetime as dt
import glob
import io
import json
import os
import re
import time
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.spark

UTC = dt.timezone.utc
DDL = ("id int, ts timestamp, ntz timestamp_ntz, d date, dec decimal(38,18), bin binary, s string, b boolean, "
       "i8 tinyint, i16 smallint, i32 int, i64 bigint, f float, dbl double, arr array<bigint>, "
       "m map<string,double>, st struct<x:bigint,y:string,t:timestamp>, "
       "nest array<struct<k:string,v:map<string,date>>>")
ATOMIC = ["id", "ts", "ntz", "d", "dec", "s", "b", "i8", "i16", "i32", "i64", "f", "dbl"]  # what CSV holds
NAN, INF = float("nan"), float("inf")

ROWS = [
    # DST gap in the session zone (02:30 local does not exist on 2024-03-10), 38 digits, the int minima
    (1, dt.datetime(2024, 3, 10, 10, 30, 0, 123456, tzinfo=UTC), dt.datetime(2024, 3, 10, 2, 30, 0, 654321),
     dt.date(2024, 2, 29), Decimal("12345678901234567890.123456789012345678"), b"\x00\xff\n,\"",
     'quote " comma , é 😀', True, -128, -32768, -2**31, -2**63, 0.1, NAN, [1, None, 3],
     {"b": 1.5, "a": None, "c": NAN}, (None, "", dt.datetime(2000, 1, 1, tzinfo=UTC)),
     [("x", {"d": dt.date(1, 1, 1), "e": None}), None]),
    # before the epoch, the last microsecond of 9999, tiny decimal, empty everything
    (2, dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC), dt.datetime(9999, 12, 31, 23, 59, 59, 999999),
     dt.date(1900, 1, 1), Decimal("-0.000000000000000001"), b"", "", False, 127, 32767, 2**31 - 1, 2**63 - 1,
     -INF, -0.0, [], {}, (1, None, None), []),
    # nulls in every column
    (3,) + (None,) * 17,
    # zero with a scale (str() would say 0E-18), infinities, NaN as float, a newline in a string
    (4, dt.datetime(2024, 11, 3, 9, 30, tzinfo=UTC), dt.datetime(1, 1, 1), dt.date(1, 1, 1), Decimal("0E-18"),
     b"x", "line1\nline2", None, 0, 0, 0, 0, NAN, INF, [None], {"k": -0.0}, (None, None, None), [("", {})]),
]


@pytest.fixture(scope="module")
def spark():
    from integration.spark_session import make_spark
    s = make_spark("twophase-types-tests", conf={
        "spark.sql.session.timeZone": "America/Los_Angeles",
        "spark.sql.parquet.datetimeRebaseModeInWrite": "CORRECTED",
        "spark.sql.parquet.int96RebaseModeInWrite": "CORRECTED",
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS"})
    yield s  # on the shared context: not stopped (integration/spark_session.py)


@pytest.fixture(scope="module")
def source(spark, tmp_path_factory) -> str:
    """A Parquet input with every type (two files, so two tasks write)."""
    path = str(tmp_path_factory.mktemp("types") / "in")
    spark.createDataFrame(ROWS, DDL).repartition(2).write.parquet(path)
    return path


def norm(v: Any) -> Any:
    """A comparable form: floats by repr (NaN, -0.0), instants in UTC, maps (Arrow entry lists) in order."""
    from pyspark.sql import Row
    if isinstance(v, float):
        return ("float", repr(v))
    if isinstance(v, dt.datetime):
        return ("instant", v.astimezone(UTC).isoformat()) if v.tzinfo else ("local", v.isoformat())
    if isinstance(v, Row):
        return norm(v.asDict(recursive=False))
    if isinstance(v, dict):  # a struct (Arrow) or a struct/map as Spark returns it: unordered
        return ("dict", sorted((repr(k), norm(x)) for k, x in v.items()))
    if isinstance(v, tuple):  # a map entry from Arrow
        return tuple(norm(x) for x in v)
    if isinstance(v, list):
        return [norm(x) for x in v]
    if isinstance(v, (bytes, bytearray)):
        return bytes(v)
    return v


def _type_shape(t: pa.DataType) -> str:
    """An Arrow type without time zones (session zone vs UTC: the same instants) and child field names."""
    return re.sub(r" \('[^']*'\)", "", re.sub(r"tz=[^,>\]]+", "tz=*", str(t)))


def arrow_rows(table: pa.Table) -> list[Any]:
    return [norm(r) for r in table.sort_by("id").to_pylist()]


def spark_rows(df) -> list[Any]:
    return [norm(r) for r in df.orderBy("id").collect()]


def expected_arrow(spark, source: str, cols: list[str]) -> pa.Table:
    return spark.read.schema(DDL).parquet(source).select(*cols).toArrow()


def run(spark, source: str, fmt: str, options: dict[str, str], *, cols: list[str] | str = "*",
        exprs: list[str] | None = None, timeout: float = 240) -> str:
    """Stream the input into ``fmt``; return '' on success or the error text."""
    df = spark.readStream.schema(DDL).parquet(source)
    df = df.selectExpr(*exprs) if exprs else df.select(*(cols if isinstance(cols, list) else [cols]))
    try:
        w = df.writeStream.format(fmt).trigger(availableNow=True)
        for k, v in options.items():
            w = w.option(k, v)
        q = w.start()
        assert q.awaitTermination(timeout), "query did not finish"
        err = q.exception()
    except AssertionError:
        raise
    except Exception as e:
        return str(e)
    return "" if err is None else str(err)


# --------------------------------------------------------------------------- round trips


def test_types_file_parquet_round_trips_every_type(spark, source, tmp_path):
    out = str(tmp_path / "out")
    assert run(spark, source, "twophase-file", {"path": out, "checkpointLocation": str(tmp_path / "ck")}) == ""
    cols = [f.name for f in spark.read.schema(DDL).parquet(source).schema.fields]
    want = expected_arrow(spark, source, cols)
    got = pa.concat_tables([pq.read_table(p) for p in sorted(glob.glob(f"{out}/*.parquet"))])
    assert got.num_rows == len(ROWS)
    for f in want.schema:  # same Arrow types; zones may differ (session zone vs UTC: the same instants)
        g = got.schema.field(f.name).type
        assert _type_shape(g) == _type_shape(f.type), (f.name, g, f.type)
    assert arrow_rows(got) == arrow_rows(want)
    assert spark_rows(spark.read.schema(DDL).parquet(out)) == spark_rows(spark.read.schema(DDL).parquet(source))


def test_types_file_json_round_trips_every_type(spark, source, tmp_path):
    out = str(tmp_path / "out")
    assert run(spark, source, "twophase-file", {"path": out, "format": "json",
                                                "checkpointLocation": str(tmp_path / "ck")}) == ""
    back = spark.read.schema(DDL).option("mode", "FAILFAST").json(out)
    assert spark_rows(back) == spark_rows(spark.read.schema(DDL).parquet(source))
    # strict JSON (no bare NaN), maps as objects in entry order, instants in UTC, plain decimals
    lines = {}
    for p in glob.glob(f"{out}/*.json"):
        for line in open(p, encoding="utf-8"):
            r = json.loads(line, object_pairs_hook=list, parse_constant=lambda c: pytest.fail(f"bare {c} in {line}"))
            lines[dict(r)["id"]] = dict(r)
    want_m = [r["m"] for r in expected_arrow(spark, source, ["id", "m"]).to_pylist() if r["id"] == 1][0]
    assert [k for k, _ in lines[1]["m"]] == [k for k, _ in want_m] and len(want_m) == 3  # entry order kept
    assert lines[1]["ts"] == "2024-03-10T10:30:00.123456Z" and lines[1]["ntz"] == "2024-03-10T02:30:00.654321"
    assert lines[4]["dec"] == "0.000000000000000000" and lines[4]["f"] == "NaN" and lines[4]["dbl"] == "Infinity"


def test_types_file_csv_round_trips_atomic_types(spark, source, tmp_path):
    out = str(tmp_path / "out")
    assert run(spark, source, "twophase-file", {"path": out, "format": "csv",
                                                "checkpointLocation": str(tmp_path / "ck")}, cols=ATOMIC) == ""
    schema = ", ".join(x for x in DDL.split(", ") if x.split(" ")[0] in ATOMIC)
    # RFC 4180: "" quotes, an empty unquoted field is null and "" is the empty string
    back = (spark.read.schema(schema).option("header", "true").option("escape", '"').option("multiLine", "true")
            .option("nullValue", "\u0000").option("mode", "FAILFAST").csv(out))
    assert spark_rows(back) == spark_rows(spark.read.schema(DDL).parquet(source).select(*ATOMIC))
    import duckdb
    n_empty, n_null = duckdb.sql(f"select count(*) filter (where s = ''), count(*) filter (where s is null) "
                                 f"from read_csv('{out}/*.csv', header=true, all_varchar=true, allow_quoted_nulls=false)").fetchall()[0]
    assert (n_empty, n_null) == (1, 1)


def test_types_s3_parquet_round_trips_every_type(spark, source, tmp_path, s3_server):
    bucket = s3_server.new_bucket()
    opts = {"path": f"s3://{bucket}/out", "checkpointLocation": str(tmp_path / "ck"), **s3_server.options()}
    assert run(spark, source, "twophase-s3", opts) == ""
    client = s3_server.client()
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="out/")["Contents"]
            if o["Key"].endswith(".parquet") and "/_" not in o["Key"]]
    got = pa.concat_tables([pq.read_table(io.BytesIO(client.get_object(Bucket=bucket, Key=k)["Body"].read()))
                            for k in keys])
    cols = [f.name for f in spark.read.schema(DDL).parquet(source).schema.fields]
    assert arrow_rows(got) == arrow_rows(expected_arrow(spark, source, cols))


def _delta_stats_are_valid() -> bool:
    """Whether twophase.sinks.delta writes Delta-valid statistics for infinities and struct columns (the patch in
    the type work's report: non-finite float min/max and nested nullCount are left out)."""
    from twophase.sinks.delta import _Stats
    b = pa.record_batch({"f": pa.array([INF]), "st": pa.array([{"x": 1}])})
    stats = _Stats(b.schema)
    stats.update(b)
    try:
        parsed = json.loads(stats.to_json(), parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    except ValueError:
        return False
    return not isinstance(parsed["nullCount"].get("st"), int)


@pytest.mark.xfail(not _delta_stats_are_valid(), strict=True,
                   reason="sinks/delta.py _Stats writes Infinity and a number as a struct's nullCount: delta-rs then "
                          "cannot read the table (patch in the report)")
def test_types_delta_round_trips_every_type(spark, source, tmp_path):
    from deltalake import DeltaTable
    table = str(tmp_path / "table")
    assert run(spark, source, "twophase-delta", {"path": table, "checkpointLocation": str(tmp_path / "ck")}) == ""
    t = DeltaTable(table)
    types = {f.name: f.type for f in t.schema().fields}
    assert str(types["ts"]) == str(t.schema().fields[1].type) and "timestamp" in str(types["ts"]).lower()
    assert "timestamp_ntz" in str(types["ntz"]).lower() and "decimal(38,18)" in str(types["dec"]).lower()
    assert "timestampNtz" in (t.protocol().writer_features or [])
    cols = [f.name for f in spark.read.schema(DDL).parquet(source).schema.fields]
    got = t.to_pyarrow_table()
    assert arrow_rows(got) == arrow_rows(expected_arrow(spark, source, cols))
    # a second query (its own sink id) appends through the existing table: the schema check against it passes
    assert run(spark, source, "twophase-delta", {"path": table, "checkpointLocation": str(tmp_path / "ck2"),
                                                 "sink.id": "second"}) == ""
    assert DeltaTable(table).to_pyarrow_table().num_rows == 2 * len(ROWS)


@pytest.mark.parametrize("fmt", ["twophase-file", "twophase-delta"])
def test_types_partition_values_of_boolean_date_decimal_round_trip(spark, source, tmp_path, fmt):
    """Hive directories of booleans (true/false, as Spark writes them), dates, decimals and nulls read back."""
    out = str(tmp_path / "out")
    cols = ["id", "b", "d", "dec", "s"]
    parts = "b,d,dec" if fmt == "twophase-file" else "b,d"  # Delta refuses decimals (see REFUSED)
    assert run(spark, source, fmt, {"path": out, "checkpointLocation": str(tmp_path / "ck"),
                                    "partitionBy": parts}, cols=cols) == ""
    want = spark_rows(spark.read.schema(DDL).parquet(source).select(*cols))
    if fmt == "twophase-delta":
        from deltalake import DeltaTable
        assert arrow_rows(DeltaTable(out).to_pyarrow_table().select(cols)) == arrow_rows(
            expected_arrow(spark, source, cols))
    else:
        schema = "id int, s string, b boolean, d date, dec decimal(38,18)"
        assert spark_rows(spark.read.schema(schema).parquet(out).select(*cols)) == want
    assert os.path.isdir(os.path.join(out, "b=true")) and os.path.isdir(os.path.join(out, "b=false"))


def test_types_delta_rate_source_quick_start(spark, tmp_path):
    """The quick start's shape: rate (timestamp, value) -> twophase-delta (failed with an AssertionError before)."""
    from deltalake import DeltaTable
    table, ck = str(tmp_path / "table"), str(tmp_path / "ck")
    q = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 50).load()
         .writeStream.format("twophase-delta").option("path", table).option("checkpointLocation", ck)
         .trigger(processingTime="1 second").start())
    try:
        deadline = time.monotonic() + 120
        while (q.lastProgress is None or q.lastProgress["batchId"] < 1) and q.exception() is None:
            assert time.monotonic() < deadline, "no batch in time"
            time.sleep(0.5)
        assert q.exception() is None, str(q.exception())
    finally:
        q.stop()
    t = DeltaTable(table).to_pyarrow_table()
    assert t.num_rows >= 50 and t.num_rows % 50 == 0
    assert sorted(t.column("value").to_pylist()) == list(range(t.num_rows))
    assert pa.types.is_timestamp(t.schema.field("timestamp").type) and t.schema.field("timestamp").type.tz is not None


# --------------------------------------------------------------------------- refusals, on the driver, nothing written


REFUSED = [
    ("twophase-file", {"format": "csv"}, ["id", "arr"], ["column 'arr' (array<bigint>)", "as csv", "to_json"]),
    ("twophase-file", {"format": "csv"}, ["id", "st"], ["column 'st' (struct<", "to_json"]),
    ("twophase-file", {"format": "csv"}, ["id", "m"], ["column 'm' (map<string,double>)", "to_json"]),
    ("twophase-file", {"format": "csv"}, ["id", "bin"], ["column 'bin' (binary)", "base64"]),
    ("twophase-file", {"format": "json"}, ["id", "map(i32, s) as mi"],
     ["column 'mi' (map<int,string>) at 'mi.key' (int)", "as json", "transform_keys"]),
    ("twophase-file", {"format": "json"}, ["id", "array(map(i8, s)) as am"], ["at 'am.element.key' (tinyint)"]),
    ("twophase-file", {}, ["id", "make_dt_interval(1) as iv"], ["column 'iv' (interval day to second)", "cast"]),
    ("twophase-file", {}, ["id", "null as n"], ["column 'n' (void)", "cast(null as string)"]),
    ("twophase-file", {"partitionBy": "ts"}, ["id", "ts"], ["option 'partitionBy'", "'ts' (timestamp)", "to_date(ts)"]),
    ("twophase-file", {"partitionBy": "dbl"}, ["id", "dbl"], ["option 'partitionBy'", "'dbl' (double)"]),
    ("twophase-file", {"partitionBy": "bin"}, ["id", "bin"], ["option 'partitionBy'", "'bin' (binary)"]),
    ("twophase-delta", {}, ["id", "make_ym_interval(1, 2) as iv"], ["column 'iv' (interval year to month)", "to Delta"]),
    ("twophase-delta", {}, ["id", "named_struct('n', null) as sn"], ["column 'sn' (struct<n:void>) at 'sn.n' (void)"]),
    ("twophase-delta", {"partitionBy": "ts"}, ["id", "ts"], ["option 'partitionBy'", "'ts' (timestamp)"]),
    ("twophase-delta", {"partitionBy": "dec"}, ["id", "dec"], ["option 'partitionBy'", "'dec' (decimal(38,18))"]),
]


@pytest.mark.parametrize("fmt, options, exprs, fragments", REFUSED,
                         ids=[f"{r[0]}-{r[1].get('format', r[1].get('partitionBy', 'parquet'))}-{r[2][-1].split()[-1]}"
                              for r in REFUSED])
def test_types_refused_on_the_driver_before_any_write(spark, source, tmp_path, fmt, options, exprs, fragments):
    out = tmp_path / "out"
    msg = run(spark, source, fmt, {"path": str(out), "checkpointLocation": str(tmp_path / "ck"), **options},
              exprs=exprs)
    assert "ConfigurationError" in msg, msg
    for f in fragments:
        assert f in msg, (f, msg)
    assert not out.exists(), "nothing may be written (not even the directory) for a refused column"
