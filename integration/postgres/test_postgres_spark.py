"""twophase-postgres through ``twophase.spark.foreach_batch`` on a real Spark and a real PostgreSQL: every row once,
also when Spark re-runs the last batch (its commit-log entry removed); a column the table cannot take is refused on
the driver before any data moves."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from integration.fileio import check_exactly_once, make_input, run_foreach_batch
from twophase.errors import ConfigurationError
from twophase.sinks.postgres import PostgresSink


@pytest.fixture(scope="module")
def spark():
    from integration.spark_session import make_spark
    s = make_spark("twophase-postgres-tests")
    yield s  # on the shared context: not stopped (integration/spark_session.py)


def test_pg_spark_foreach_batch_every_row_once_and_a_rerun_batch_is_not_written_twice(spark, pg, tmp_path):
    from twophase.spark import foreach_batch
    table = pg.new_table("id bigint NOT NULL, grp text, payload text")
    inp, ck = str(tmp_path / "in"), str(tmp_path / "ck")
    ids = make_input(inp, 3, 50)
    sink = PostgresSink(url=pg.url, table=table, sink_id="pg-spark")
    run_foreach_batch(spark, inp, foreach_batch(sink, owner=ck), ck)
    report = check_exactly_once(ids, pg.ids(table))
    assert report.ok, report.line()
    commits = sorted(os.listdir(os.path.join(ck, "commits")), key=lambda n: int(n) if n.isdigit() else -1)
    last = os.path.join(ck, "commits", [n for n in commits if n.isdigit()][-1])
    for p in (last, os.path.join(os.path.dirname(last), f".{os.path.basename(last)}.crc")):
        if os.path.exists(p):
            os.unlink(p)
    run_foreach_batch(spark, inp, foreach_batch(sink, owner=ck), ck)  # Spark re-runs it: the log says committed
    report = check_exactly_once(ids, pg.ids(table))
    assert report.ok, report.line()
    assert pg.prepared(sink.gid_prefix) == []
    assert pg.sql(f"SELECT count(*) FROM {table} WHERE payload <> 'row-' || id") == [(0,)]


def test_pg_spark_a_column_the_table_cannot_take_is_refused_on_the_driver(spark, pg, tmp_path):
    from pyspark.sql import functions as F
    from twophase.spark import foreach_batch
    table = pg.new_table("id bigint NOT NULL, grp text, payload text")
    inp, ck = str(tmp_path / "in"), str(tmp_path / "ck")
    make_input(inp, 1, 5)
    sink = PostgresSink(url=pg.url, table=table, sink_id="pg-spark-bad")
    with pytest.raises(Exception) as e:
        run_foreach_batch(spark, inp, foreach_batch(sink, owner=ck), ck,
                          transform=lambda df: df.withColumn("grp", F.array("grp")))
    assert "ConfigurationError" in str(e.value) or isinstance(e.value, ConfigurationError)
    assert "'grp'" in str(e.value) and "cannot write" in str(e.value)
    assert pg.ids(table) == [] and pg.prepared(sink.gid_prefix) == []


def test_pg_spark_a_dead_attempt_of_an_earlier_run_does_not_block_the_rerun_batch(spark, pg, tmp_path):
    """Review finding: a run died after a task's PREPARE and before its ack (no COMPLETED record), so recovery
    does not commit it and the sweep (checkpoints <= the highest committed) does not take it. Its prepared
    transaction holds its primary keys; the re-run batch's task inserting them waited lockTimeout and failed
    on every retry and restart. Now foreach_batch rolls the batch's leftovers back before its tasks start."""
    from twophase.sink import TransactionContext
    from twophase.spark import foreach_batch
    table = pg.new_table("id bigint PRIMARY KEY, grp text, payload text")
    inp, ck = str(tmp_path / "in"), str(tmp_path / "ck")
    ids = make_input(inp, 2, 5)
    dead = PostgresSink(url=pg.url, table=table, sink_id="pg-spark-dead", log_location=str(tmp_path / "dead"))
    for cid, lo in ((0, 0), (1, 5)):  # one dead attempt in each batch, holding keys the re-run writes
        txn = dead.begin_transaction(TransactionContext("pg-spark-dead", cid, "0"))
        dead.write(txn, pa.RecordBatch.from_pydict({"id": [lo, lo + 1], "grp": ["x", "x"], "payload": ["d", "d"]}))
        dead.pre_commit(txn)
    assert len(pg.prepared(dead.gid_prefix)) == 2
    sink = PostgresSink(url=pg.url, table=table, sink_id="pg-spark-dead", lockTimeout=2)
    run_foreach_batch(spark, inp, foreach_batch(sink, owner=ck), ck)
    report = check_exactly_once(ids, pg.ids(table))
    assert report.ok, report.line()
    assert pg.prepared(sink.gid_prefix) == []
    assert pg.sql(f"SELECT count(*) FROM {table} WHERE payload <> 'row-' || id") == [(0,)]
    dead.close()
