"""Delta's own writers on a table twophase-delta appends to (issue 24, the neighbour; delta-spark 4.4 in
``.venv-delta``, see conftest.py): delta-spark runs OPTIMIZE and DELETE while a twophase-delta query appends.

Checked: the query never fails (delta-rs retries its blind append over Delta's commits), a DELETE that meets a
concurrent append is retried (Delta's ConcurrentAppendException, named), every row not deleted is in the table
exactly once, a deleted row is one that a version before the DELETE held (time travel tells which), every
version reads, and the history has one WRITE per twophase batch beside Delta's OPTIMIZE and DELETE commits.
"""

from __future__ import annotations

import time

import pytest

from integration.fileio import INPUT_SCHEMA, check_exactly_once, make_input

pytestmark = [pytest.mark.spark]


def _ids(spark, table: str, **options) -> list[int]:
    r = spark.read.format("delta")
    for k, v in options.items():
        r = r.option(k, v)
    return [row["id"] for row in r.load(table).select("id").collect()]


def _retrying(spark, sql: str, deadline: float) -> None:
    """Run a Delta command; a conflict with twophase's concurrent append (ConcurrentAppendException and the like,
    which Delta names) is retried, as a user's job would."""
    while True:
        try:
            spark.sql(sql).collect()
            return
        except Exception as e:  # noqa: BLE001 - Delta's conflict exceptions come through py4j
            if "Concurrent" not in str(e) or time.monotonic() > deadline:
                raise


def test_neighbour_optimize_and_delete_while_twophase_appends(spark, tmp_path):
    inp, table, ck = str(tmp_path / "in"), str(tmp_path / "table"), str(tmp_path / "ck")
    ids = make_input(inp, 1, 40)
    q = (spark.readStream.schema(INPUT_SCHEMA).option("maxFilesPerTrigger", 1).json(inp)
         .writeStream.format("twophase-delta").option("path", table).option("checkpointLocation", ck)
         .option("partitionBy", "grp").trigger(processingTime="100 milliseconds").start())
    deadline = time.monotonic() + 180
    try:
        q.processAllAvailable()
        for k in range(1, 5):
            ids += make_input(inp, 1, 40, start=40 * k)
            if k % 2:
                _retrying(spark, f"OPTIMIZE delta.`{table}`", deadline)
            else:
                _retrying(spark, f"DELETE FROM delta.`{table}` WHERE id % 7 = 0", deadline)
            assert q.exception() is None, q.exception()
        q.processAllAvailable()
        assert q.exception() is None, q.exception()
    finally:
        q.stop()
    history = sorted(spark.sql(f"DESCRIBE HISTORY delta.`{table}`").collect(), key=lambda r: r["version"])
    ops = [r["operation"] for r in history]
    assert ops.count("WRITE") == 5 and ops.count("DELETE") == 2 and ops.count("OPTIMIZE") == 2, ops
    deleted: set[int] = set()
    for r in history:  # every version reads; a DELETE removes exactly the id % 7 == 0 rows its parent held
        at = _ids(spark, table, versionAsOf=r["version"])
        assert len(at) == len(set(at)), f"version {r['version']} ({r['operation']}) has a row twice"
        if r["operation"] == "DELETE":
            before = _ids(spark, table, versionAsOf=r["version"] - 1)
            deleted |= {i for i in before if i % 7 == 0}
            assert not any(i % 7 == 0 for i in at)
    assert deleted, "no DELETE removed a row: the test did not test"
    report = check_exactly_once([i for i in ids if i not in deleted], _ids(spark, table))
    assert report.ok, report.line()
