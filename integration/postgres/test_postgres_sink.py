"""twophase-postgres against a real PostgreSQL (Debian's packages, started by scripts/pg_server.sh): the conformance
suite, the commit / abort / recover invariants of sinks/postgres.py, and bad input. No Spark here."""

from __future__ import annotations

import datetime
import decimal
import logging
import math
import pickle
import time
from typing import Any

import pyarrow as pa
import pytest

from integration.postgres.server import PgServer, pg_server
from twophase import testing
from twophase.coordinator import CheckpointCoordinator
from twophase.errors import ConfigurationError, DataLossError, TwoPhaseError
from twophase.sink import CommitStatus, TransactionContext, run_task
from twophase.sinks.postgres import PostgresSink
from twophase.testing import CONFORMANCE_CHECKS, SinkHarness


class PgHarness(SinkHarness):
    """One table of the session's server; every sink of the harness writes it under its own sink id."""

    name = "postgres"

    def __init__(self, pg: PgServer, log_root: str) -> None:
        self.pg, self.log_root = pg, log_root
        self.table = pg.new_table()
        self.sinks: list[PostgresSink] = []

    def make_sink(self, sink_id: str) -> PostgresSink:
        sink = PostgresSink(url=self.pg.url, table=self.table, sink_id=sink_id,
                            log_location=f"{self.log_root}/log-{sink_id}")
        sink.validate_destination()
        self.sinks.append(sink)
        return sink

    def visible_ids(self) -> list[int]:
        return self.pg.ids(self.table)

    def leftovers(self, sink: Any) -> int:
        return len(self.pg.prepared(sink.gid_prefix))

    def close(self) -> None:
        for s in self.sinks:
            s.close()


@pytest.fixture
def harness(pg, tmp_path):
    h = PgHarness(pg, str(tmp_path))
    yield h
    h.close()


@pytest.mark.parametrize("check", CONFORMANCE_CHECKS, ids=lambda c: c.__name__.removeprefix("conformance_"))
def test_pg_conformance(harness, check) -> None:
    """Every sink invariant of twophase.sink, on twophase-postgres and a real server."""
    check(harness)


# --------------------------------------------------------------------------- helpers


def make(pg: PgServer, tmp_path: Any, table: str, sink_id: str = "pg-a", **kw: Any) -> PostgresSink:
    sink = PostgresSink(url=kw.pop("url", pg.url), table=table, sink_id=sink_id,
                        log_location=str(tmp_path / f"log-{sink_id}"), **kw)
    sink.validate_destination()
    return sink


def rows(lo: int, n: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"id": list(range(lo, lo + n)), "v": [f"v{i}" for i in range(lo, lo + n)]})


def ctx(sink: PostgresSink, cid: int, task: int = 0, attempt: int = 0) -> TransactionContext:
    return TransactionContext(sink.sink_id, cid, str(task), attempt)


def no_open_transaction(pg: PgServer, timeout: float = 20) -> bool:
    """No backend of a twophase connection is left in an open transaction (waited for: a closed client's backend
    ends asynchronously)."""
    deadline = time.monotonic() + timeout
    while True:
        n = pg.sql("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'twophase-%%' "
                   "AND state LIKE 'idle in transaction%%'")[0][0]
        if n == 0:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def prepare_unrecorded(sink: PostgresSink, cid: int, lo: int, n: int, task: int = 0) -> str:
    """A task that died right after PREPARE TRANSACTION, before the base recorded its handle: only the server
    knows of it (the sweep must find it in pg_prepared_xacts)."""
    txn = sink.begin_transaction(ctx(sink, cid, task))
    sink.write(txn, rows(lo, n))
    sink.pre_commit(txn)
    return txn["gid"]


# --------------------------------------------------------------------------- invariants


def test_pg_inv2_a_repeated_commit_is_already_committed_and_a_lost_one_is_data_loss(pg, tmp_path):
    """Invariant 2: the gid is gone after a commit and after a rollback; the marker tells them apart, also in a
    fresh sink object (another process) at recovery."""
    table = pg.new_table()
    sink = make(pg, tmp_path, table)
    ack = run_task(sink, ctx(sink, 0), [rows(0, 10)])
    assert pg.ids(table) == [] and len(pg.prepared(sink.gid_prefix)) == 1
    assert testing.commit(sink, ack.handle) is CommitStatus.COMMITTED
    assert testing.commit(sink, ack.handle) is CommitStatus.ALREADY_COMMITTED
    fresh = pickle.loads(pickle.dumps(sink))
    assert testing.commit(fresh, ack.handle, recovering=True) is CommitStatus.ALREADY_COMMITTED
    assert pg.ids(table) == list(range(10))
    lost = run_task(sink, ctx(sink, 1), [rows(10, 5)])
    pg.sql(f"ROLLBACK PREPARED '{lost.handle['txn']['gid']}'")  # an operator rolled it back
    with pytest.raises(DataLossError, match="rolled back.*--accept-loss"):
        testing.commit(fresh, lost.handle, recovering=True)
    assert pg.ids(table) == list(range(10))
    fresh.close()
    sink.close()


def test_pg_inv3_inv4_abort_never_touches_committed_rows_and_the_handle_is_only_the_gid(pg, tmp_path):
    """Invariants 3, 4: aborting a committed handle (twice, at recovery too) keeps its rows; a writer aborted
    before PREPARE leaves no prepared transaction and no open one; the handle is the gid alone, committed by a
    fresh sink object (another process)."""
    table = pg.new_table()
    sink = make(pg, tmp_path, table)
    ack = run_task(sink, ctx(sink, 0), [rows(0, 5)])
    assert ack.handle["txn"] == {"gid": sink.gid(ctx(sink, 0)).rsplit("_", 1)[0] + f"_R{sink.run_token}A"
                                        + ack.handle["attempt_uid"]}
    fresh = pickle.loads(pickle.dumps(sink))
    assert testing.commit(fresh, ack.handle) is CommitStatus.COMMITTED
    for recovering in (False, True, False):
        testing.abort(sink, ack.handle, recovering=recovering)
    assert pg.ids(table) == list(range(5))
    writer = sink.create_writer(ctx(sink, 1))
    writer.write(rows(5, 5))
    writer.abort()
    assert pg.prepared(sink.gid_prefix) == [] and pg.ids(table) == list(range(5))
    assert no_open_transaction(pg)
    fresh.close()
    sink.close()


def test_pg_inv5_the_sweep_rolls_back_only_its_own_prepared_transactions(pg, tmp_path):
    """Invariant 5: tasks that died after PREPARE (no pending record) are found in pg_prepared_xacts; sink A's
    sweep takes only A's gids of checkpoints <= n: never sink B's on the same table, nor those of A's sink id on
    another table, nor A's own of a newer checkpoint. Each of those then commits whole."""
    table, other_table = pg.new_table(), pg.new_table()
    a, b = make(pg, tmp_path, table, "pg-a"), make(pg, tmp_path, table, "pg-b")
    a_elsewhere = PostgresSink(url=pg.url, table=other_table, sink_id="pg-a", log_location=str(tmp_path / "log-2"))
    a_elsewhere.validate_destination()
    a_dead = prepare_unrecorded(a, 1, 0, 5)
    a_newer = run_task(a, ctx(a, 4), [rows(50, 5)])
    b_ack = run_task(b, ctx(b, 1), [rows(100, 5)])
    b_dead = prepare_unrecorded(b, 1, 200, 5, task=1)
    elsewhere = run_task(a_elsewhere, ctx(a_elsewhere, 1), [rows(300, 5)])
    assert testing.abort_lingering(a, 3) == 1
    assert pg.prepared(a.gid_prefix) == [a_newer.handle["txn"]["gid"]]
    assert a_dead not in pg.prepared()
    assert b_dead in pg.prepared() and b_ack.handle["txn"]["gid"] in pg.prepared()
    assert elsewhere.handle["txn"]["gid"] in pg.prepared()
    for sink, ack in ((a, a_newer), (b, b_ack), (a_elsewhere, elsewhere)):
        assert testing.commit(sink, ack.handle) is CommitStatus.COMMITTED
    assert pg.ids(table) == [*range(50, 55), *range(100, 105)]
    assert pg.ids(other_table) == list(range(300, 305))
    assert testing.abort_lingering(b, 1) == 1 and pg.prepared(b.gid_prefix) == []
    # a log shared by mistake between A's two tables: A's sweep reads the other's pending record, keeps its gid
    shared = PostgresSink(url=pg.url, table=other_table, sink_id="pg-a", log_location=str(tmp_path / "log-pg-a"))
    kept = run_task(shared, ctx(shared, 2), [rows(400, 5)])
    testing.abort_lingering(a, 3)
    assert testing.commit(shared, kept.handle) is CommitStatus.COMMITTED
    assert pg.ids(other_table) == [*range(300, 305), *range(400, 405)]
    for s in (a, b, a_elsewhere, shared):
        s.close()


def test_pg_inv5_markers_below_the_highest_committed_checkpoint_are_pruned(pg, tmp_path):
    """Invariant 2/5: the coordinator's sweep after each commit deletes the marker rows of checkpoints below the
    highest committed one (the log answers for those), and keeps the newest (a repeated commit of it)."""
    table = pg.new_table()
    sink = make(pg, tmp_path, table)
    log = sink.transaction_log()
    log.claim("owner")
    coord = CheckpointCoordinator(sink, log, sweep_after_commit=True)
    for cid in range(3):
        coord.complete_batch(cid, [run_task(sink, ctx(sink, cid), [rows(cid * 10, 10)])])
    markers = pg.sql("SELECT checkpoint_id FROM public._twophase_commits WHERE gid_prefix = %s", (sink.gid_prefix,))
    assert sorted(r[0] for r in markers) == [2]
    assert pg.ids(table) == list(range(30))
    sink.close()


def test_pg_inv5_an_old_prepared_transaction_is_warned_about(pg, tmp_path, caplog):
    """Invariant 5: a prepared transaction of the sink older than preparedWarnAfter is a structured warning
    naming its gid (it holds locks and holds back VACUUM); another sink's is not this sink's warning."""
    table = pg.new_table()
    sink = make(pg, tmp_path, table, preparedWarnAfter="0")
    other = make(pg, tmp_path, table, "pg-other")
    gid = prepare_unrecorded(sink, 0, 0, 3)
    prepare_unrecorded(other, 0, 10, 3)
    with caplog.at_level(logging.WARNING, logger="twophase"):
        assert sink.warn_old_prepared(sink._driver_conn()) == 1
    assert any("postgres_prepared_transaction_old" in r.getMessage() and gid in r.getMessage() for r in caplog.records)
    testing.abort_lingering(sink, 0)
    testing.abort_lingering(other, 0)
    sink.close()
    other.close()


def test_pg_inv6_types_round_trip_and_upsert_keys_merge(pg, tmp_path):
    """Every accepted Arrow type reads back equal (NULLs, NaN, infinities, instants, decimal digits, bytes,
    quotes and newlines in text); with upsertKeys a later checkpoint updates rows by key inside its prepared
    transaction (nothing visible before COMMIT PREPARED) and leaves no staging table."""
    table = pg.new_table(
        "id bigint PRIMARY KEY, i2 smallint, i4 integer, f4 real, f8 double precision, b boolean, s text, "
        "by bytea, d date, ts timestamptz, tn timestamp, n numeric(12,3)")
    utc = datetime.timezone.utc
    data = {
        "id": pa.array([1, 2, 3], pa.int64()),
        "i2": pa.array([-32768, None, 7], pa.int16()),
        "i4": pa.array([2 ** 31 - 1, 0, None], pa.int32()),
        "f4": pa.array([0.1, None, -1.5], pa.float32()),
        "f8": pa.array([1 / 3, float("nan"), float("-inf")], pa.float64()),
        "b": pa.array([True, False, None]),
        "s": pa.array(['a,"b"\nc', "", None]),
        "by": pa.array([b"\x00\xff", b"", None], pa.binary()),
        "d": pa.array([datetime.date(2024, 2, 29), None, datetime.date(1, 1, 1)]),
        "ts": pa.array([datetime.datetime(2024, 1, 1, 1, 2, 3, 456789, tzinfo=utc), None,
                        datetime.datetime(1970, 1, 1, tzinfo=utc)], pa.timestamp("us", tz="Europe/Paris")),
        "tn": pa.array([datetime.datetime(2024, 1, 1, 1, 2, 3, 456789), None, None], pa.timestamp("us")),
        "n": pa.array([decimal.Decimal("123456789.123"), decimal.Decimal("-0.001"), None], pa.decimal128(12, 3)),
    }
    sink = make(pg, tmp_path, table, upsertKeys="id")
    first = pa.RecordBatch.from_pydict(data)
    testing.commit(sink, run_task(sink, ctx(sink, 0), [first]).handle)
    got = pg.sql(f"SELECT id, i2, i4, f4, f8, b, s, by, d, ts, tn, n FROM {table} ORDER BY id")
    want = list(zip(*[first.column(i).to_pylist() for i in range(first.num_columns)]))
    for g, w in zip(got, want):
        for gv, wv, name in zip(g, w, first.schema.names):
            if isinstance(wv, float) and math.isnan(wv):
                assert math.isnan(gv), name
            elif name == "f4" and wv is not None:
                assert float(pa.scalar(gv, pa.float32()).as_py()) == wv, name
            elif name == "by" and wv is not None:
                assert bytes(gv) == wv, name
            else:
                assert gv == wv, (name, gv, wv)
    update = pa.RecordBatch.from_pydict({"id": [3, 4], "s": ["three", "four"]})
    ack = run_task(sink, ctx(sink, 1), [update])
    assert pg.sql(f"SELECT s FROM {table} WHERE id = 3") == [(None,)] and pg.ids(table) == [1, 2, 3]
    testing.commit(sink, ack.handle)
    assert pg.sql(f"SELECT id, s, i2 FROM {table} WHERE id >= 3 ORDER BY id") == [(3, "three", 7), (4, "four", None)]
    assert pg.sql("SELECT count(*) FROM pg_class WHERE relname LIKE '\\_twophase\\_stage\\_%'") == [(0,)]
    sink.close()


# --------------------------------------------------------------------------- bad input


def test_pg_inv1_bad_input_a_row_breaking_a_constraint_fails_the_task_and_nothing_of_the_batch_is_visible(pg, tmp_path):
    """Invariant 1: a CHECK violation in the second batch of a task fails the task with ConstraintViolationError
    (chained through the hook error); nothing of that task is visible or prepared, and the checkpoint (whose
    other task had pre-committed) is declined: none of the batch's rows are visible, no prepared transaction
    is left."""
    table = pg.new_table("id bigint NOT NULL CHECK (id < 100), v text")
    sink = make(pg, tmp_path, table)
    log = sink.transaction_log()
    log.claim("owner")
    coord = CheckpointCoordinator(sink, log, sweep_after_commit=True)
    good = run_task(sink, ctx(sink, 0, 0), [rows(0, 10)])
    with pytest.raises(TwoPhaseError) as e:
        run_task(sink, ctx(sink, 0, 1), [rows(10, 10), rows(95, 10)])
    assert "constraint" in str(e.value) and "PostgresSink.write" in str(e.value)
    assert pg.ids(table) == [] and pg.prepared(sink.gid_prefix) == [good.handle["txn"]["gid"]]
    coord.recover()  # the driver's next start: checkpoint 0 was never completed; its pre-committed task is aborted
    testing.abort_lingering(sink, 0)
    assert pg.ids(table) == [] and pg.prepared(sink.gid_prefix) == []
    assert no_open_transaction(pg)
    sink.close()


def test_pg_inv6_bad_input_a_wrong_password_is_a_clear_error_without_the_password(pg, tmp_path):
    """Invariant 6: a wrong password fails validate_destination with a ConfigurationError naming the option
    and the fix; neither the message, nor the sink's repr, nor the log output contains the password."""
    table = pg.new_table()
    secret = "Wr0ngPassw0rd-s3cret"
    url = pg.role("tp_writer", "right-one").replace(":right-one@", f":{secret}@")
    for u in (url, url.replace(f":{secret}@", "@") + f"?password={secret}"):
        sink = PostgresSink(url=u, table=table, sink_id="pg-pw", log_location=str(tmp_path / "log"))
        with pytest.raises(ConfigurationError) as e:
            sink.validate_destination()
        msg = str(e.value)
        assert "password authentication failed" in msg and "option 'url'" in msg, msg
        assert secret not in msg and secret not in repr(sink) and secret not in str(sink)


def test_pg_inv6_bad_input_missing_grants_table_and_columns_are_named_on_the_driver(pg, tmp_path):
    """Invariant 6: a role without INSERT, a missing table, an unknown column, a type that cannot round-trip,
    upsertKeys without a unique index: each refused before any data moves, naming the fix."""
    from pyspark.sql import types as T
    table = pg.new_table()
    url = pg.role("tp_reader", "pw-reader", f"GRANT SELECT ON {table} TO tp_reader")
    with pytest.raises(ConfigurationError, match=r"may not INSERT.*GRANT INSERT ON"):
        PostgresSink(url=url, table=table, sink_id="pg-r", log_location=str(tmp_path / "l")).validate_destination()
    with pytest.raises(ConfigurationError, match=r"option 'table'.*does not exist"):
        make(pg, tmp_path, "public.no_such_table")
    with pytest.raises(ConfigurationError, match=r"upsertKeys.*unique index.*ADD UNIQUE"):
        make(pg, tmp_path, table, upsertKeys="id")
    sink = make(pg, tmp_path, table)
    ok = T.StructType([T.StructField("id", T.LongType()), T.StructField("v", T.StringType())])
    sink.check_spark_schema(ok)
    for bad, pattern in (
            (T.StructField("extra", T.LongType()), r"'extra'.*not a column"),
            (T.StructField("v", T.ArrayType(T.StringType())), r"'v'.*cannot write"),
            (T.StructField("v", T.TimestampType()), r"'v'.*cannot round-trip.*timestamptz")):
        schema = T.StructType([f for f in ok.fields if f.name != bad.name] + [bad])
        with pytest.raises(ConfigurationError, match=pattern):
            sink.check_spark_schema(schema)
    with pytest.raises(ConfigurationError, match=r"NOT NULL.*\['id'\]"):
        sink.check_spark_schema(T.StructType([T.StructField("v", T.StringType())]))
    sink.close()


def test_pg_inv6_bad_input_max_prepared_transactions_zero_is_named_at_start(tmp_path):
    """Invariant 6: PostgreSQL's default max_prepared_transactions = 0 is refused by validate_destination,
    naming the setting and the fix (a server of its own, started with the default)."""
    with pg_server(max_prepared=0) as server:
        table = server.new_table()
        sink = PostgresSink(url=server.url, table=table, sink_id="pg-0", log_location=str(tmp_path / "log"))
        with pytest.raises(ConfigurationError, match=r"max_prepared_transactions is 0.*ALTER SYSTEM SET "
                                                     r"max_prepared_transactions.*restart"):
            sink.validate_destination()
        sink.close()


def test_pg_runs_in_the_embedded_runtime(pg, tmp_path):
    """``stream.sink_to(PostgresSink(...))`` in twophase's embedded runtime: every record once, nothing prepared left
    (two parallel subtasks share the sink object: one connection per transaction)."""
    from twophase.runtime import CheckpointConfig, CollectionSource, JobGraph, JobRunner
    table = pg.new_table()
    sink = PostgresSink(url=pg.url, table=table, sink_id="pg-runtime", log_location=str(tmp_path / "log"))
    g = JobGraph("pg-runtime")
    g.source(CollectionSource([[{"id": i, "v": f"v{i}"} for i in range(k, k + 25)] for k in (0, 25, 50)]), uid="src",
             parallelism=1).sink_to(sink, uid="sink", parallelism=2)
    JobRunner(g, checkpointing=CheckpointConfig(0.02), owner=str(tmp_path / "ck")).run()
    assert pg.ids(table) == list(range(75))
    assert pg.prepared(sink.gid_prefix) == []
    sink.close()
