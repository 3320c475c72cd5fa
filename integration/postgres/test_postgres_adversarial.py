"""twophase-postgres, an adversarial review of its newest paths (issue 23; session 14): binary and CSV COPY against
psycopg's INSERT of the same rows, bit for bit; a database whose encoding is not UTF-8; a zombie driver's late
commit of a batch another driver committed; two drivers completing one batch at once; two sinks on one table, the
same sink id on another table and another database, and foreign gids named like ours."""

from __future__ import annotations

import datetime as dt
import decimal
import struct
import threading
import uuid

import psycopg
import pyarrow as pa
import pytest

from twophase import testing
from twophase.coordinator import CheckpointCoordinator
from twophase.errors import DataLossError, TwoPhaseError
from twophase.sink import CommitStatus, TransactionContext, run_task
from twophase.sinks.postgres import PostgresSink
from twophase.states import CheckpointState

D = decimal.Decimal
UTC = dt.timezone.utc
F4 = [float("nan"), float("inf"), float("-inf"), -0.0, 1.4e-45, 3.4028234663852886e38, 0.1, None, 1e-38,
      16777217.0, 1.0, -2.5]
#: column -> (PostgreSQL type, Arrow type as Spark's to_arrow_schema gives it, 12 values)
TYPES = {
    "id": ("int8", pa.int64(), list(range(12))),
    "b": ("bool", pa.bool_(), [True, False, None] * 4),
    "i1": ("int2", pa.int8(), [-128, 127, 0, None, -1, 1, 5, 6, 7, 8, 9, 10]),
    "i2": ("int2", pa.int16(), [-32768, 32767, None, 0] * 3),
    "i4": ("int4", pa.int32(), [-2**31, 2**31 - 1, None, 0] * 3),
    "i8": ("int8", pa.int64(), [-2**63, 2**63 - 1, None, 0] * 3),
    "f4": ("float4", pa.float32(), F4),
    "f8": ("float8", pa.float64(), [float("nan"), float("inf"), float("-inf"), -0.0, 5e-324, 1.7976931348623157e308,
                                    0.1, None, 2.2250738585072014e-308, 0.30000000000000004, 1 / 3, -1e-300]),
    "s": ("text", pa.string(), ["", None, "a\\b", "line\nbreak\r\n", "\U0001F600 non-BMP", "quote\"'", "\\.", "tab\t,",
                                "NULL", "\\N", " lead", "é"]),
    "vc": ("varchar(8)", pa.string(), ["", None, "\\", "\n", "\U0001F600", "x" * 8, "\\.", ",", "NULL", "\\N", " ", "é"]),
    "by": ("bytea", pa.binary(), [b"", None, b"\x00", b"\\x00", b"\xff\x00\n", b"a,b", b"\r\n", b"\\.", b"N", b"xxx",
                                  b"\x00" * 5, b"z"]),
    "d": ("date", pa.date32(), [dt.date(1, 1, 1), dt.date(9999, 12, 31), None, dt.date(1969, 12, 31),
                                dt.date(1970, 1, 1), dt.date(2000, 1, 1), dt.date(1999, 12, 31), dt.date(1582, 10, 4),
                                dt.date(1582, 10, 15), dt.date(1900, 2, 28), dt.date(2024, 2, 29), dt.date(100, 3, 1)]),
    "ts": ("timestamp", pa.timestamp("us"), [
        dt.datetime(1, 1, 1), dt.datetime(9999, 12, 31, 23, 59, 59, 999999), None,
        dt.datetime(1969, 12, 31, 23, 59, 59, 999999), dt.datetime(1969, 12, 31, 23, 59, 59, 1),
        dt.datetime(1970, 1, 1, 0, 0, 0, 1), dt.datetime(1582, 10, 4, 12), dt.datetime(1900, 1, 1, 0, 0, 0, 500000),
        dt.datetime(2000, 1, 1), dt.datetime(1999, 12, 31, 23, 59, 59, 999999), dt.datetime(2024, 2, 29, 1, 2, 3, 456789),
        dt.datetime(1, 1, 1, 0, 0, 0, 1)]),
    "tz": ("timestamptz", pa.timestamp("us", tz="UTC"), [
        dt.datetime(1, 1, 1, tzinfo=UTC), dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC), None,
        dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC), dt.datetime(1969, 12, 31, 23, 59, 59, 1, tzinfo=UTC),
        dt.datetime(1970, 1, 1, 0, 0, 0, 1, tzinfo=UTC), dt.datetime(1582, 10, 4, 12, tzinfo=UTC),
        dt.datetime(1900, 1, 1, 0, 0, 0, 500000, tzinfo=UTC), dt.datetime(2000, 1, 1, tzinfo=UTC),
        dt.datetime(1883, 11, 18, 12, tzinfo=UTC), dt.datetime(2024, 2, 29, 1, 2, 3, 456789, tzinfo=UTC),
        dt.datetime(1, 1, 1, 0, 0, 0, 1, tzinfo=UTC)]),
}
#: numeric columns (CSV COPY in either copyFormat: no binary form)
NUMERIC = {
    "n38": ("numeric(38,0)", pa.decimal128(38, 0), [D("9" * 38), D("-" + "9" * 38), None, D(0), D(1), D(-1),
                                                     D(10**37), D(-(10**37)), D(5), D(6), D(7), D(8)]),
    "n3838": ("numeric(38,38)", pa.decimal128(38, 38), [D("0." + "9" * 38), D("-0." + "9" * 38), None, D(0),
                                                         D("1e-38"), D("-1e-38"), D("0.5"), D("-0.5"), D("0.1"),
                                                         D("0.2"), D("0.3"), D("0.4")]),
    "n102": ("numeric(10,2)", pa.decimal128(10, 2), [D("-0.01"), D("99999999.99"), None, D("0.00"),
                                                      D("-99999999.99"), D("1.50"), D(1), D(2), D(3), D(4), D(5), D(6)]),
    "nu": ("numeric", pa.decimal128(20, 4), [D("-0.0001"), D("1234567890123456.7890"), None, D("0.0000"), D(1), D(2),
                                             D(3), D(4), D(5), D(6), D(7), D(8)]),
}


def _batch(cols: dict) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array(v, t) for (_, t, v) in cols.values()], names=list(cols))


def _exact(v):
    """A value compared bit for bit: a float by its IEEE bytes (NaN, -0.0), a decimal by its text (scale)."""
    if isinstance(v, float):
        return ("float8", struct.pack(">d", v))
    if isinstance(v, decimal.Decimal):
        return ("numeric", str(v))
    return v


def _table(url: str, cols: dict) -> str:
    name = f"public.adv_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(url, autocommit=True) as c:
        c.execute(f"CREATE TABLE {name} ({', '.join(f'{k} {t}' for k, (t, _, _) in cols.items())})")
    return name


def _read(url: str, table: str) -> list:
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("SET TIME ZONE 'UTC'")
        return [tuple(map(_exact, r)) for r in c.execute(f"SELECT * FROM {table} ORDER BY id").fetchall()]


def _through_sink(url: str, tmp_path, cols: dict, batch: pa.RecordBatch, **kw) -> list:
    table = _table(url, cols)
    sink = PostgresSink(url=url, table=table, sink_id=f"adv-{table}", log_location=str(tmp_path / table),
                        batchSize=5, **kw)
    sink.validate_destination()
    ack = run_task(sink, TransactionContext(sink.sink_id, 0, "0"), [batch])
    testing.commit(sink, ack.handle)
    sink.close()
    return _read(url, table)


def _through_insert(url: str, cols: dict, batch: pa.RecordBatch) -> list:
    table = _table(url, cols)
    with psycopg.connect(url, autocommit=True) as c, c.cursor() as cur:
        cur.executemany(f"INSERT INTO {table} VALUES ({', '.join(['%s'] * len(cols))})",
                        [tuple(r.values()) for r in batch.to_pylist()])
    return _read(url, table)


@pytest.mark.parametrize("numeric", [False, True], ids=["binary-able", "with-numeric"])
def test_pg_adv_every_accepted_type_round_trips_bit_exactly_through_binary_and_csv_copy_as_through_insert(
        pg, tmp_path, numeric):
    """Every Arrow type a Spark column arrives as (boolean, byte/short/int/long extremes, float NaN/Infinity/-0.0/
    subnormals, double likewise, strings with backslashes, newlines, quotes, '\\.', 'NULL', non-BMP characters,
    varchar, bytea with NUL bytes, dates 0001-9999 across the Julian/Gregorian switch, timestamps with and without
    time zone before 1970 with microseconds, numeric at 38 digits and scale 38, negative) and nulls in every column:
    the rows read back from copyFormat=auto (binary COPY, or CSV for a batch with a numeric column) and
    copyFormat=csv are the rows psycopg's INSERT of the same values gives, bit for bit."""
    cols = {**TYPES, **(NUMERIC if numeric else {})}
    batch = _batch(cols)
    expected = _through_insert(pg.url, cols, batch)
    for fmt in ("auto", "csv"):
        got = _through_sink(pg.url, tmp_path, cols, batch.slice(0), copyFormat=fmt)
        diff = [(r[0], name, g, e) for r, ex in zip(got, expected) for name, g, e in zip(cols, r, ex) if g != e]
        assert len(got) == len(expected) and not diff, (fmt, diff[:10])


def test_pg_adv_a_float32_into_a_float8_column_reads_back_as_the_same_float32(pg, tmp_path):
    """float32 into a float8 column goes as CSV (its shortest text, documented in sinks/_postgres_copy.py): not the
    exactly widened double psycopg's INSERT sends, but the same float32 when read back as real (bits compared)."""
    cols = {"id": ("int8", pa.int64(), list(range(12))), "f": ("float8", pa.float32(), F4)}
    table = _table(pg.url, cols)
    sink = PostgresSink(url=pg.url, table=table, sink_id="adv-f4w", log_location=str(tmp_path / "f4w"))
    sink.validate_destination()
    testing.commit(sink, run_task(sink, TransactionContext(sink.sink_id, 0, "0"), [_batch(cols)]).handle)
    sink.close()
    with psycopg.connect(pg.url, autocommit=True) as c:
        got = [r[0] for r in c.execute(f"SELECT f::float4 FROM {table} ORDER BY id").fetchall()]
    bits = lambda v: None if v is None else struct.pack(">f", v)  # noqa: E731
    assert [bits(v) for v in got] == [bits(v) for v in F4]


def test_pg_adv_a_latin1_database_stores_the_characters_not_their_utf8_bytes(pg, tmp_path):
    """Found in session 14: COPY sends UTF-8 bytes, but a connection's client_encoding was the database's (or a
    role's, or PGCLIENTENCODING's): in a LATIN1 database 'é' was stored as 'Ã©' by binary and CSV COPY alike,
    silently. Now every connection of the sink speaks UTF-8: 'é' is stored as 'é', and a character the database's
    encoding cannot hold is a named task error with nothing of the transaction kept."""
    with psycopg.connect(pg.url, autocommit=True) as c:
        if not c.execute("SELECT 1 FROM pg_database WHERE datname = 'adv_latin1'").fetchone():
            c.execute("CREATE DATABASE adv_latin1 ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0")
    url = pg.url.rsplit("/", 1)[0] + "/adv_latin1"
    cols = {"id": ("int8", pa.int64(), [1, 2]), "s": ("text", pa.string(), ["é", "ÿ plain ascii"])}
    for fmt in ("auto", "csv"):
        got = _through_sink(url, tmp_path, cols, _batch(cols), copyFormat=fmt)
        assert [r[1] for r in got] == ["é", "ÿ plain ascii"], (fmt, got)
        table = _table(url, cols)
        sink = PostgresSink(url=url, table=table, sink_id=f"adv-enc-{fmt}", log_location=str(tmp_path / f"e{fmt}"),
                            copyFormat=fmt)
        sink.validate_destination()
        with pytest.raises(TwoPhaseError, match="LATIN1|encoding"):
            run_task(sink, TransactionContext(sink.sink_id, 0, "0"),
                     [pa.RecordBatch.from_pydict({"id": [1], "s": ["\U0001F600"]})])
        assert pg.prepared(sink.gid_prefix) == [] and _read(url, table) == []
        sink.close()


def test_pg_adv_a_nul_character_in_a_text_column_is_a_named_task_error_and_nothing_stays(pg, tmp_path):
    """PostgreSQL's text cannot hold U+0000 (a Spark string can): the task fails with an error naming the COPY and
    the server's reason, through both formats, and nothing of its transaction is prepared or visible."""
    cols = {"id": ("int8", pa.int64(), [1, 2]), "s": ("text", pa.string(), ["ok", "a\x00b"])}
    for fmt in ("auto", "csv"):
        table = _table(pg.url, cols)
        sink = PostgresSink(url=pg.url, table=table, sink_id=f"adv-nul-{fmt}", log_location=str(tmp_path / fmt),
                            copyFormat=fmt)
        sink.validate_destination()
        with pytest.raises(TwoPhaseError, match=r"COPY.*0x00") as e:
            run_task(sink, TransactionContext(sink.sink_id, 0, "0"), [_batch(cols)])
        assert "twophase-pg-pw" not in str(e.value)
        assert pg.prepared(sink.gid_prefix) == [] and _read(pg.url, table) == []
        sink.close()


def test_pg_adv_every_spark_type_without_an_exact_form_is_refused_on_the_driver(pg, tmp_path):
    """The Spark types that cannot round-trip (arrays incl. nested nulls, maps, structs, void, intervals, variant,
    time, char/varchar) are refused by the driver's check (foreach_batch and the registered format call it) with a
    ConfigurationError naming the column, whatever the table column's type; the accepted ones pass."""
    from pyspark.sql import types as T
    from twophase.errors import ConfigurationError
    refused = {"arr": T.ArrayType(T.ArrayType(T.IntegerType(), True), True), "m": T.MapType(T.StringType(), T.IntegerType()),
               "st": T.StructType([T.StructField("a", T.IntegerType())]), "nul": T.NullType(),
               "dti": T.DayTimeIntervalType(), "ymi": T.YearMonthIntervalType(), "ci": T.CalendarIntervalType(),
               "var": T.VariantType(), "ch": T.CharType(3), "vch": T.VarcharType(3)}
    if hasattr(T, "TimeType"):
        refused["tm"] = T.TimeType()
    accepted = {"b": T.BooleanType(), "i1": T.ByteType(), "i2": T.ShortType(), "i4": T.IntegerType(),
                "i8": T.LongType(), "f4": T.FloatType(), "f8": T.DoubleType(), "s": T.StringType(),
                "by": T.BinaryType(), "d": T.DateType(), "tz": T.TimestampType(), "ts": T.TimestampNTZType(),
                "n": T.DecimalType(38, 38)}
    pg_types = {"b": "bool", "i1": "int2", "i2": "int2", "i4": "int4", "i8": "int8", "f4": "float4", "f8": "float8",
                "s": "text", "by": "bytea", "d": "date", "tz": "timestamptz", "ts": "timestamp", "n": "numeric"}
    columns = ", ".join([f"{c} {pg_types[c]}" for c in accepted] + [f"{c} text" for c in refused])
    table = pg.new_table(columns, prefix="sparkty")
    sink = PostgresSink(url=pg.url, table=table, sink_id="adv-sparkty", log_location=str(tmp_path / "l"))
    sink.check_spark_schema(T.StructType([T.StructField(c, t) for c, t in accepted.items()]))
    for name, t in refused.items():
        with pytest.raises(ConfigurationError, match=repr(name)):
            sink.check_spark_schema(T.StructType([T.StructField("s", T.StringType()), T.StructField(name, t)]))
    sink.close()


# --------------------------------------------------------------------------- two drivers


def _sink(pg, tmp_path, table: str, sink_id: str = "adv-zombie", **kw) -> PostgresSink:
    s = PostgresSink(url=pg.url, table=table, sink_id=sink_id, log_location=str(tmp_path / f"log-{sink_id}"), **kw)
    s.validate_destination()
    return s


def _rows(ids: list[int]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"id": ids, "v": ["row"] * len(ids)})


def test_pg_adv_a_zombie_drivers_late_commit_of_a_batch_committed_and_pruned_meanwhile_is_not_lost(pg, tmp_path):
    """Found in session 14: driver A recorded batch 0 COMPLETED and paused (a zombie, not dead) before COMMIT
    PREPARED; the restarted driver B recovered (committed batch 0) and went on, and its sweep after batch 2 pruned
    the marker rows of checkpoints below 2. A woke up: its COMMIT PREPARED found no gid and no marker and declared
    batch 0 LOST ('its rows are not in the table', 'twophase log resolve ... --accept-loss') while its rows were in
    the table. The log has batch 0 COMMITTED with that gid: the commit is ALREADY_COMMITTED."""
    table = pg.new_table("id bigint NOT NULL, v text", prefix="zombie")
    a = _sink(pg, tmp_path, table)
    ack = run_task(a, TransactionContext(a.sink_id, 0, "0"), [_rows([1])])
    log = a.transaction_log()
    log.transition(0, CheckpointState.PENDING)
    log.transition(0, CheckpointState.COMPLETED, handles={"0": dict(ack.handle)})  # A pauses here
    b = _sink(pg, tmp_path, table)
    assert CheckpointCoordinator(b).recover().committed == [0]
    for cid in (1, 2):
        b_ack = run_task(b, TransactionContext(b.sink_id, cid, "0"), [_rows([cid + 1])])
        CheckpointCoordinator(b).complete_batch(cid, [b_ack], expected_tasks=["0"])
    assert pg.ids(table) == [1, 2, 3]
    assert testing.commit(a, ack.handle) is CommitStatus.ALREADY_COMMITTED  # A wakes up
    assert pg.ids(table) == [1, 2, 3]
    a.close()
    b.close()


def test_pg_adv_a_late_commit_of_a_gid_its_log_never_committed_is_still_lost(pg, tmp_path):
    """The other side of the zombie fix: a gid that is gone without a marker while the log's record is not COMMITTED
    (an operator's ROLLBACK PREPARED) stays LOST."""
    table = pg.new_table("id bigint NOT NULL, v text", prefix="lost")
    a = _sink(pg, tmp_path, table, sink_id="adv-lost")
    ack = run_task(a, TransactionContext(a.sink_id, 0, "0"), [_rows([1])])
    log = a.transaction_log()
    log.transition(0, CheckpointState.PENDING)
    log.transition(0, CheckpointState.COMPLETED, handles={"0": dict(ack.handle)})
    pg.sql(f"ROLLBACK PREPARED '{ack.handle['txn']['gid']}'")
    with pytest.raises(DataLossError, match="rolled back"):
        testing.commit(a, ack.handle)
    a.close()


def test_pg_adv_two_completers_of_one_batch_at_once_commit_it_once(pg, tmp_path):
    """The commit of one batch run twice at once (two drivers' commit workers with the same acks, each holding the
    completion guard): one commits, the other waits on the fence locks and finds the batch decided; every row once,
    nothing left prepared."""
    table = pg.new_table("id bigint PRIMARY KEY, v text", prefix="twice")
    sinks = [_sink(pg, tmp_path, table, sink_id="adv-twice") for _ in range(2)]
    acks = [run_task(sinks[0], TransactionContext("adv-twice", 4, str(t)), [_rows([t * 10, t * 10 + 1])])
            for t in range(3)]
    outcomes, errors = [], []

    def complete(sink: PostgresSink) -> None:
        try:
            with sink.completion_guard(4, acks):
                outcomes.append(CheckpointCoordinator(sink).complete_batch(4, acks, expected_tasks=["0", "1", "2"]))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=complete, args=(s,)) for s in sinks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert sorted(o.value for o in outcomes) == ["ALREADY_COMMITTED", "COMMITTED"], outcomes
    assert pg.ids(table) == [0, 1, 10, 11, 20, 21]
    assert pg.prepared(sinks[0].gid_prefix) == []
    for s in sinks:
        s.close()


# --------------------------------------------------------------------------- ownership


def test_pg_adv_the_sweeps_take_only_this_sinks_gids_on_this_table_in_this_database(pg, tmp_path):
    """A second sink on the same table, the same sink id on another table, the same sink id and table name in another
    database, and foreign prepared transactions named with this sink's prefix (not made by gid()): the sweep after a
    commit, the dead-attempt roller and the runtime's ABORTED rollback of sink A take A's own dead gids only."""
    from twophase.sinks._postgres_attempts import rollback_aborted, rollback_dead
    table = pg.new_table("id bigint NOT NULL, v text", prefix="own")
    other_table = pg.new_table("id bigint NOT NULL, v text", prefix="own2")
    with psycopg.connect(pg.url, autocommit=True) as c:
        if not c.execute("SELECT 1 FROM pg_database WHERE datname = 'adv_other'").fetchone():
            c.execute("CREATE DATABASE adv_other")
    other_db = pg.url.rsplit("/", 1)[0] + "/adv_other"
    with psycopg.connect(other_db, autocommit=True) as c:
        c.execute(f"CREATE TABLE IF NOT EXISTS {table} (id bigint NOT NULL, v text)")

    def prepared_by(sink_id: str, t: str, url: str = pg.url) -> tuple[PostgresSink, str]:
        s = PostgresSink(url=url, table=t, sink_id=sink_id, log_location=str(tmp_path / f"log-{sink_id}"))
        s.validate_destination()
        gid = run_task(s, TransactionContext(sink_id, 1, "0"), [_rows([1])]).handle["txn"]["gid"]
        s.close()
        return s, gid

    _, mine = prepared_by("adv-own", table)
    a = PostgresSink(url=pg.url, table=table, sink_id="adv-own", log_location=str(tmp_path / "log-adv-own"))  # new run
    others = [prepared_by("adv-own-b", table)[1], prepared_by("adv-own", other_table)[1],
              prepared_by("adv-own", table, other_db)[1]]
    # foreign transactions named with A's prefix: not of the form gid() makes
    foreign = [a.gid_prefix + "00000000000000000001", a.gid_prefix + "x_y", a.gid_prefix.rstrip("_") + "0_1_2_3"]
    for f in foreign:
        with psycopg.connect(pg.url) as c:
            c.execute(f"PREPARE TRANSACTION '{f}'")
    try:
        log = a.transaction_log()
        log.transition(1, CheckpointState.PENDING)
        log.transition(1, CheckpointState.ABORTED, reason="test")
        assert rollback_dead(a, a._driver_conn(), lambda cid: True) == [mine]
        _, mine2 = prepared_by("adv-own", table)
        assert rollback_aborted(a, a._driver_conn(), log) == [mine2]
        _, mine3 = prepared_by("adv-own", table)
        a.create_committer().abort_lingering(10**9, None)
        left = set(pg.prepared("tp_"))
        with psycopg.connect(other_db, autocommit=True) as c:
            left |= {r[0] for r in c.execute("SELECT gid FROM pg_prepared_xacts")}
        assert mine3 not in left and {*others, *foreign} <= left
    finally:
        for g in [*foreign, *others]:
            for url in (pg.url, other_db):
                with psycopg.connect(url, autocommit=True) as c:
                    if c.execute("SELECT 1 FROM pg_prepared_xacts WHERE gid = %s AND database = current_database()",
                                 (g,)).fetchone():
                        c.execute(f"ROLLBACK PREPARED '{g}'")
        a.close()


# --------------------------------------------------------------------------- a server that stops answering


def _server_pids(pg) -> list[int]:
    import os
    from integration.nemesis.harness import descendants
    if not pg.directory:
        pytest.skip("an external server (TWOPHASE_PG_URL): no local process to pause")
    with open(os.path.join(pg.directory, "data", "postmaster.pid")) as f:
        pid = int(f.readline())
    return [pid] + descendants(pid)


def _signal(pids: list[int], sig: int) -> None:
    """``sig`` to each of ``pids``; a backend that ended since it was listed (a closed connection's) is skipped."""
    import os
    for p in pids:
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass


def test_pg_adv_a_commit_waiting_on_a_paused_server_warns_while_it_waits_then_commits(pg, tmp_path, caplog,
                                                                                     monkeypatch):
    """Found in session 14: the server SIGSTOPped (postmaster and backends) while the driver's COMMIT PREPARED is on
    its way: its kernel answers TCP keepalives and statement_timeout cannot fire in a stopped process, so the commit
    waited the whole pause (hours, for a hung host) and nothing said why. Now the sink warns
    (postgres_statement_waiting, naming the statement and the gid, never the password) every WAIT_WARN_S seconds
    while it waits; once the server answers, the commit completes (every row once)."""
    import logging
    import signal
    import time
    table = pg.new_table("id bigint NOT NULL, v text", prefix="pause")
    sink = _sink(pg, tmp_path, table, sink_id="adv-pause")
    monkeypatch.setattr(PostgresSink, "WAIT_WARN_S", 0.5, raising=False)
    ack = run_task(sink, TransactionContext(sink.sink_id, 0, "0"), [_rows([1, 2])])
    sink._driver_conn()  # the driver's connection is open before the pause (a connect would time out: named)
    pids = _server_pids(pg)
    result: dict = {}

    def commit() -> None:
        try:
            result["status"] = sink.commit(ack.handle["txn"])
        except Exception as e:  # noqa: BLE001 - reported below
            result["error"] = e

    with caplog.at_level(logging.WARNING, logger="twophase"):
        _signal(pids, signal.SIGSTOP)
        try:
            t = threading.Thread(target=commit)
            t.start()
            t.join(2.5)
            assert t.is_alive(), result
        finally:
            _signal(pids, signal.SIGCONT)
        t.join(30)
        time.sleep(0.6)  # no warning after the wait ended
    waiting = [r.getMessage() for r in caplog.records if "postgres_statement_waiting" in r.getMessage()]
    assert waiting and all("COMMIT PREPARED" in m and ack.handle["txn"]["gid"] in m for m in waiting), waiting
    assert not any("twophase-pg-pw" in m for m in waiting)
    assert "error" not in result, result
    assert pg.ids(table) == [1, 2] and pg.prepared(sink.gid_prefix) == []
    sink.close()


def test_pg_adv_a_completer_waiting_on_a_fence_lock_warns_while_it_waits(pg, tmp_path, caplog, monkeypatch):
    """Found in session 14: the completion guard's pg_advisory_lock waits without a timeout on a roller that holds
    the gid's fence lock (a dead-attempt rollback of another run, paused between its try-lock and its unlock: a
    SIGSTOPped zombie executor): the batch's commit hung, silently. Now it warns while it waits, and completes once the
    lock is free."""
    import logging
    from twophase.sinks._postgres_attempts import _KEY
    table = pg.new_table("id bigint NOT NULL, v text", prefix="fence")
    sink = _sink(pg, tmp_path, table, sink_id="adv-fencewait")
    monkeypatch.setattr(PostgresSink, "WAIT_WARN_S", 0.5, raising=False)
    ack = run_task(sink, TransactionContext(sink.sink_id, 3, "0"), [_rows([5])])
    holder = psycopg.connect(pg.url, autocommit=True)  # the paused roller's session
    holder.execute(f"SELECT pg_advisory_lock({_KEY})", (ack.handle["txn"]["gid"],))
    timer = threading.Timer(2.0, holder.close)
    with caplog.at_level(logging.WARNING, logger="twophase"):
        timer.start()
        with sink.completion_guard(3, [ack]):
            outcome = CheckpointCoordinator(sink).complete_batch(3, [ack], expected_tasks=["0"])
    timer.join()
    assert outcome.value == "COMMITTED" and pg.ids(table) == [5]
    waiting = [r.getMessage() for r in caplog.records if "postgres_statement_waiting" in r.getMessage()]
    assert waiting and all("fence lock" in m for m in waiting), waiting
    sink.close()


def test_pg_adv_one_sink_id_in_two_queries_on_one_table_never_loses_a_decided_batch(pg, tmp_path):
    """Found in session 14, a gid prefix collision by configuration: two queries (two checkpoint locations, so two
    logs) given the same sinkId write one table. Query 1 recorded batch 5 COMPLETED and is about to COMMIT PREPARED;
    query 2 committed its batch 7, and its sweep (checkpoints <= 7 of its prefix, which is query 1's too) rolled back
    query 1's batch 5: query 1's commit was LOST. Now the first log to validate claims the prefix (a row of the marker
    table) and the second query is refused at its start, naming both logs and how to release the claim."""
    table = pg.new_table("id bigint NOT NULL, v text", prefix="twoq")
    q1 = PostgresSink(url=pg.url, table=table, sink_id="adv-shared", log_location=str(tmp_path / "q1"))
    q2 = PostgresSink(url=pg.url, table=table, sink_id="adv-shared", log_location=str(tmp_path / "q2"))
    q1.validate_destination()
    ack1 = run_task(q1, TransactionContext(q1.sink_id, 5, "0"), [_rows([1])])
    log = q1.transaction_log()
    log.transition(5, CheckpointState.PENDING)
    log.transition(5, CheckpointState.COMPLETED, handles={"0": dict(ack1.handle)})
    from twophase.errors import ConfigurationError
    try:
        q2.validate_destination()
        ack2 = run_task(q2, TransactionContext(q2.sink_id, 7, "0"), [_rows([2])])
        CheckpointCoordinator(q2).complete_batch(7, [ack2], expected_tasks=["0"])
    except ConfigurationError as e:  # the second query refused at its start
        assert "sink_id" in str(e) and str(tmp_path / "q1") in str(e) and "DELETE FROM" in str(e), str(e)
    testing.commit(q1, ack1.handle)
    assert 1 in pg.ids(table)
    q1.validate_destination()  # the owner itself, again (every batch, every restart)
    q3 = PostgresSink(url=pg.url, table=table, sink_id="adv-shared", log_location=str(tmp_path / "q1") + "/")
    q3.validate_destination()  # the same log, written with a trailing slash
    for s in (q1, q2, q3):
        s.close()


def test_pg_adv_a_connect_to_a_paused_server_fails_after_the_urls_connect_timeout_naming_the_timeout(pg, tmp_path):
    """Found in session 14: the sink passed connect_timeout=30 over the url's own (libpq's keywords override the
    conninfo), so a url's connect_timeout was ignored; and the timeout's error said 'check host, port and database',
    which is not what a paused or overloaded server needs. Now the url's connect_timeout holds (30 s without one),
    and the retriable error names the timeout."""
    import signal
    import time
    from twophase.errors import ConfigurationError
    table = pg.new_table("id bigint NOT NULL, v text", prefix="ctimeout")
    sink = PostgresSink(url=pg.url + "?connect_timeout=2", table=table, sink_id="adv-ctimeout",
                        log_location=str(tmp_path / "l"))
    pids = _server_pids(pg)
    _signal(pids, signal.SIGSTOP)
    try:
        start = time.monotonic()
        with pytest.raises(ConfigurationError) as e:
            sink.connect(autocommit=True)
        took = time.monotonic() - start
    finally:
        _signal(pids, signal.SIGCONT)
    assert took < 10, took
    assert e.value.retriable and "did not answer within" in str(e.value) and "twophase-pg-pw" not in str(e.value)


def test_pg_adv_the_drivers_checks_and_sweep_warn_while_a_paused_server_keeps_them_waiting(pg, tmp_path, caplog,
                                                                                          monkeypatch):
    """The other driver-side statements on an open connection (the destination check before every batch, the sweep
    at recovery and after a commit) wait on a paused server too: each warns postgres_statement_waiting while it
    waits, then completes."""
    import logging
    import signal
    table = pg.new_table("id bigint NOT NULL, v text", prefix="pausechk")
    sink = _sink(pg, tmp_path, table, sink_id="adv-pausechk")
    monkeypatch.setattr(PostgresSink, "WAIT_WARN_S", 0.5, raising=False)
    calls = {"validate_destination": sink.validate_destination,
             "sweep": lambda: sink.create_committer().abort_lingering(5, 4)}
    for name, call in calls.items():
        caplog.clear()
        pids = _server_pids(pg)
        done: list = []

        def run(call=call) -> None:
            call()
            done.append(True)

        t = threading.Thread(target=run)
        with caplog.at_level(logging.WARNING, logger="twophase"):
            _signal(pids, signal.SIGSTOP)
            try:
                t.start()
                t.join(1.8)
                assert t.is_alive(), name
            finally:
                _signal(pids, signal.SIGCONT)
            t.join(30)
        assert done == [True], name  # completed after the pause
        waiting = [r.getMessage() for r in caplog.records if "postgres_statement_waiting" in r.getMessage()]
        assert waiting, name
    sink.close()
