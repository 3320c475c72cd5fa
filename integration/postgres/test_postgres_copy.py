"""twophase-postgres's binary COPY (sinks/_postgres_copy.py): every type it sends binary reads back exactly as the CSV
COPY's rows (NULLs, empty values, negatives, dates and timestamps before 2000, widened integers and floats, chunks of
``batchSize`` rows of a sliced batch), and a batch with a numeric column goes as CSV."""

from __future__ import annotations

import datetime
import decimal

import pyarrow as pa

from twophase.sink import TransactionContext, run_task
from twophase.sinks._postgres_copy import binary_types
from twophase.sinks.postgres import PostgresSink

DDL = ("id int8, b bool, i2 int2, i4 int4, i4w int8, f4 float4, f4w float8, f8 float8, s text, vc varchar(20), "
       "by bytea, d date, ts timestamp, tz timestamptz, tsm timestamp")


def _batch() -> pa.RecordBatch:
    n = 7
    return pa.RecordBatch.from_pydict({
        "id": pa.array(range(n), pa.int64()),
        "b": pa.array([True, None, False] * 2 + [None]),
        "i2": pa.array([1, None, -32768, 32767, 0, 5, None], pa.int16()),
        "i4": pa.array([2, 3, None, -2**31, 2**31 - 1, 0, 1], pa.int32()),
        "i4w": pa.array([7, -8, None, 9, 10, 11, 12], pa.int32()),
        "f4": pa.array([1.5, None, 0.1, -0.0, float("inf"), float("nan"), 3.25], pa.float32()),
        "f4w": pa.array([0.1, 2.5, None, 1e30, -1e-30, 0.0, 7.0], pa.float64()),
        "f8": pa.array([0.1, float("-inf"), None, 1e308, 5e-324, -1.0, 2.0]),
        "s": pa.array(["héllo", None, "", "a,b\n\"c\"", "\\x00", "日本", "tab\t"]),
        "vc": pa.array(["x", "y", None, "", "zz", "w", "v"]),
        "by": pa.array([b"\x00\x01", None, b"", b"\\", b"\xff" * 3, b"a", b"b"]),
        "d": pa.array([datetime.date(1970, 1, 1), datetime.date(1999, 12, 31), None, datetime.date(2000, 1, 1),
                       datetime.date(1, 1, 1), datetime.date(9999, 12, 31), datetime.date(2024, 2, 29)]),
        "ts": pa.array([datetime.datetime(2024, 1, 2, 3, 4, 5, 6), None, datetime.datetime(1900, 1, 1),
                        datetime.datetime(2000, 1, 1), datetime.datetime(1999, 12, 31, 23, 59, 59, 999999),
                        datetime.datetime(1, 1, 1), datetime.datetime(9999, 12, 31, 23, 59, 59)], pa.timestamp("us")),
        "tz": pa.array([datetime.datetime(2024, 1, 2, 3, 4, 5, 6), None, datetime.datetime(1960, 1, 1)] * 2 + [None],
                       pa.timestamp("us", tz="UTC")),
        "tsm": pa.array([datetime.datetime(2024, 1, 2, 3, 4, 5, 123000), None] * 3 + [None], pa.timestamp("ms")),
    })


def _load(pg, tmp_path, table: str, batch: pa.RecordBatch, **kw) -> list:
    sink = PostgresSink(url=pg.url, table=table, sink_id=f"copy-{table}", log_location=str(tmp_path / table),
                        batchSize=2, **kw)
    sink.validate_destination()
    ack = run_task(sink, TransactionContext(sink.sink_id, 0, "0"), [batch])
    from twophase import testing
    testing.commit(sink, ack.handle)
    sink.close()
    return pg.sql(f"SELECT * FROM {table} ORDER BY id")


def test_pg_binary_copy_reads_back_as_the_csv_copy(pg, tmp_path):
    batch = _batch().slice(1)  # a sliced batch: the buffers' offsets are not 0
    binary, csv = pg.new_table(DDL, prefix="bin"), pg.new_table(DDL, prefix="csv")
    probe = PostgresSink(url=pg.url, table=binary, sink_id="probe")
    assert binary_types(batch.schema, probe.columns(probe._driver_conn())) is not None  # it really goes binary
    probe.close()
    got_binary = _load(pg, tmp_path, binary, batch)
    got_csv = _load(pg, tmp_path, csv, batch, copyFormat="csv")
    assert len(got_binary) == 6
    norm = lambda rows: [tuple("nan" if isinstance(v, float) and v != v else v for v in r) for r in rows]  # noqa: E731
    assert norm(got_binary) == norm(got_csv)


def test_pg_a_numeric_column_goes_as_csv(pg, tmp_path):
    table = pg.new_table("id int8, n numeric(10,2), s text", prefix="num")
    batch = pa.RecordBatch.from_pydict({"id": pa.array([1, 2], pa.int64()),
                                        "n": pa.array([decimal.Decimal("1.25"), None], pa.decimal128(10, 2)),
                                        "s": ["a", None]})
    sink = PostgresSink(url=pg.url, table=table, sink_id="num")
    assert binary_types(batch.schema, sink.columns(sink._driver_conn())) is None
    sink.close()
    assert _load(pg, tmp_path, table, batch) == [(1, decimal.Decimal("1.25"), "a"), (2, None, None)]


def test_pg_a_float32_into_a_float8_column_goes_as_csv(pg, tmp_path):
    """Widened exactly, a float32 reads back as 1.0000000150474662e+30 where the CSV COPY's shortest text gave 1e+30
    (what such a column held before binary COPY): such a batch stays CSV."""
    table = pg.new_table("id int8, f float8", prefix="f4w")
    batch = pa.RecordBatch.from_pydict({"id": pa.array([1], pa.int64()), "f": pa.array([1e30], pa.float32())})
    sink = PostgresSink(url=pg.url, table=table, sink_id="f4w")
    assert binary_types(batch.schema, sink.columns(sink._driver_conn())) is None
    sink.close()
    assert _load(pg, tmp_path, table, batch) == [(1, 1e30)]
