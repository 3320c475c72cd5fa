"""Issue 8's silent-loss scenarios through the public API, on a real local Spark.

- two streaming queries append to one Delta table (Delta's ordinary multi-writer case) with distinct
  ``sink.id``s: both work, neither sweeps the other's files, the table reads back whole;
- a deleted and recreated checkpoint (a new query id at the same location, batch ids from 0) is refused
  with QueryMismatchError instead of having its batches taken for the old query's committed ones, for
  ``twophase-file`` and ``twophase-delta``; a new ``sink.id`` is the documented way on;
- ``foreach_batch`` on a batch with no partitions completes, and its replay is a no-op.
"""

from __future__ import annotations

import shutil

import pytest

from integration.fileio import check_exactly_once, make_input, read_ids, staging_leftovers

pytestmark = pytest.mark.spark

SCHEMA = "id LONG, grp STRING, payload STRING"


@pytest.fixture(scope="module")
def spark():
    from integration.spark_session import make_spark
    s = make_spark("twophase-silent-loss")
    yield s  # on the shared context: not stopped (integration/spark_session.py)


def _start(spark, fmt, input_dir, path, ck, **options):
    df = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(input_dir).repartition(2)
    w = (df.writeStream.format(fmt).option("path", path).option("checkpointLocation", ck)
         .trigger(availableNow=True))
    for k, v in options.items():
        w = w.option(k, v)
    return w.start()


def _finish(q, timeout=240):
    """The query's error (None if it ended cleanly); awaitTermination re-raises a failed query's error."""
    try:
        assert q.awaitTermination(timeout), "query did not finish in time"
    except AssertionError:
        raise
    except Exception as e:  # StreamingQueryException
        return e
    return q.exception()


def _delta_ids(uri):
    from deltalake import DeltaTable
    return DeltaTable(uri).to_pyarrow_table(columns=["id"]).column("id").to_pylist()


def test_sink_inv5_two_queries_append_to_one_delta_table(spark, tmp_path):
    table = str(tmp_path / "table")
    ids_a = make_input(str(tmp_path / "in-a"), 4, 200)
    ids_b = make_input(str(tmp_path / "in-b"), 4, 200, start=10_000)
    # the table exists before both start (two creators racing is delta-rs's business, not this test's)
    _finish(_start(spark, "twophase-delta", str(tmp_path / "in-a"), table, str(tmp_path / "ck-a"), **{"sink.id": "a"}))
    more_a = make_input(str(tmp_path / "in-a"), 4, 200, start=len(ids_a))
    qa = _start(spark, "twophase-delta", str(tmp_path / "in-a"), table, str(tmp_path / "ck-a"), **{"sink.id": "a"})
    qb = _start(spark, "twophase-delta", str(tmp_path / "in-b"), table, str(tmp_path / "ck-b"), **{"sink.id": "b"})
    errors = [_finish(qa), _finish(qb)]
    assert errors == [None, None], [str(e) for e in errors]
    report = check_exactly_once(ids_a + more_a + ids_b, _delta_ids(table))  # reads every referenced file
    assert report.ok, report.line()


def test_log_inv5_reset_checkpoint_is_refused_not_dropped(spark, tmp_path):
    """Deleting the checkpoint gives the restarted query a new id and batch ids from 0: refused, loudly."""
    for fmt in ("twophase-file", "twophase-delta"):
        base = tmp_path / fmt
        inp, out, ck = str(base / "in"), str(base / "out"), str(base / "ck")
        ids = make_input(inp, 3, 100)
        assert _finish(_start(spark, fmt, inp, out, ck)) is None
        read = (lambda: read_ids(out)) if fmt == "twophase-file" else (lambda: _delta_ids(out))
        assert check_exactly_once(ids, read()).ok
        shutil.rmtree(ck)  # the user resets the query's checkpoint, keeps the output
        more = make_input(inp, 2, 100, start=len(ids))
        err = _finish(_start(spark, fmt, inp, out, ck))
        assert err is not None, f"{fmt}: the reset query ran as if nothing happened"
        assert "belongs to the streaming query" in str(err) and "sink.id" in str(err), str(err)
        assert check_exactly_once(ids, read()).ok  # nothing of the refused query was committed
        # the documented way on: a new sink.id; the new query re-reads all input (its checkpoint is new)
        shutil.rmtree(ck)
        assert _finish(_start(spark, fmt, inp, out, ck, **{"sink.id": f"{fmt}-2"})) is None
        report = check_exactly_once(ids + ids + more, read())
        assert report.found == 2 * len(ids) + len(more) and report.missing == 0, report.line()
        if fmt == "twophase-file":
            assert staging_leftovers(out) == []


def test_foreach_batch_empty_batch_completes_and_replays(spark, tmp_path):
    from twophase.sinks.files import FileSink
    import twophase.spark
    out = str(tmp_path / "out")
    sink = FileSink.from_options({"path": out})
    fn = twophase.spark.foreach_batch(sink, owner=str(tmp_path / "ck"))
    assert callable(twophase.spark.foreach_batch)  # a second call in one process works too (it did not)
    twophase.spark.foreach_batch(sink, owner=str(tmp_path / "ck"))
    empty = spark.createDataFrame(spark.sparkContext.emptyRDD(), SCHEMA)
    assert empty.rdd.getNumPartitions() == 0
    fn(empty, 0)
    fn(empty, 0)  # the identical replay
    full = spark.createDataFrame([(i, "g", "p") for i in range(10)], SCHEMA)
    fn(full, 1)
    fn(full, 1)  # a replay of a committed batch writes nothing
    assert sorted(read_ids(out)) == list(range(10))
    assert staging_leftovers(out) == []
