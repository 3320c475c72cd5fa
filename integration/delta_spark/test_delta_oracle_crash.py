"""Delta's own engine judges twophase-delta under the crash chain (issue 24, the oracle's last point).

A twophase-delta streaming query (``foreachBatch(twophase.spark.foreach_batch(DeltaSink))``, partitioned by
``grp``, in a child process: ``delta_chain_job.py``) is SIGKILLed at each point of the crash chain in turn
(``integration.crash_chain``: ``after_pre_commit``, ``mid_commit``, ``after_commit``; every protocol point with
``TWOPHASE_FULL_MATRIX=1``), each run restarting from the previous crash, then runs clean. Meanwhile, in this
process, delta-spark's ``readStream.format("delta")`` consumes the table into a second Delta table
(``writeStream.format("delta")``, Delta's own exactly-once sink), restarted from its checkpoint after each crash.

After every crash, Delta's reader (``spark.read.format("delta")``) sees in the twophase table every batch before
the crashed one and, for the points after the Delta commit, the crashed one: each whole, none twice; one
``WRITE`` version per committed batch; and the downstream table holds exactly the twophase table's rows (no
duplicate, none missing). After the clean run: every input row exactly once in both tables, time travel to every
version adds one whole batch, and twophase's log has nothing unfinished.
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter

import pytest

from integration.crash_chain import CrashChain, chain_points
from integration.fileio import ROOT, check_exactly_once, make_input
from integration.jobrun import job_env, run_in_own_session

pytestmark = [pytest.mark.spark, pytest.mark.slow]

JOB = os.path.join(ROOT, "integration", "delta_spark", "delta_chain_job.py")
POINTS = chain_points()
FILES, ROWS = 1 + len(POINTS) + 1, 40  # batch 0, one per crash point, one only the clean run writes


def ids_of(spark, table: str, **options) -> list[int]:
    if not os.path.exists(os.path.join(table, "_delta_log")):
        return []
    r = spark.read.format("delta")
    for k, v in options.items():
        r = r.option(k, v)
    return [row["id"] for row in r.load(table).select("id").collect()]


def writes(spark, table: str) -> list[int]:
    """The versions of the table's WRITE commits (DESCRIBE HISTORY)."""
    h = spark.sql(f"DESCRIBE HISTORY delta.`{table}`").collect()
    return sorted(r["version"] for r in h if r["operation"] == "WRITE")


class Downstream:
    """delta-spark's streaming copy of the twophase table into another Delta table (Delta's exactly-once sink)."""

    def __init__(self, spark, table: str, out: str, ck: str) -> None:
        self.spark, self.table, self.out, self.ck = spark, table, out, ck
        self.query = None
        self.starts = 0

    def start(self) -> None:
        self.query = (self.spark.readStream.format("delta").option("maxFilesPerTrigger", 2).load(self.table)
                      .writeStream.format("delta").option("checkpointLocation", self.ck)
                      .trigger(processingTime="1 second").start(self.out))
        self.starts += 1

    def catch_up(self) -> list[int]:
        """Everything the twophase table has now, copied; the downstream table's ids."""
        assert self.query is not None
        deadline = time.monotonic() + 120
        while True:
            self.query.processAllAvailable()
            assert self.query.exception() is None, f"the downstream Delta query failed: {self.query.exception()}"
            got = ids_of(self.spark, self.out)
            if len(got) >= len(ids_of(self.spark, self.table)) or time.monotonic() > deadline:
                return got

    def restart(self) -> None:
        if self.query is not None:
            self.query.stop()
        self.start()

    def stop(self) -> None:
        if self.query is not None:
            self.query.stop()


@pytest.fixture(scope="module")
def chain(spark, tmp_path_factory):
    work = tmp_path_factory.mktemp("delta-oracle-chain")
    inp, table, ck = str(work / "in"), str(work / "table"), str(work / "ck")
    ids = make_input(inp, FILES, ROWS)
    down = Downstream(spark, table, str(work / "down"), str(work / "down-ck"))

    def run(fault, marker, log_path) -> int:
        cmd = [sys.executable, JOB, "--input", inp, "--table", table, "--checkpoint", ck,
               "--options", '{"partitionBy": "grp"}']
        return run_in_own_session(cmd, env=job_env(fault, marker), timeout=300, log_path=log_path).returncode

    def check_tables(committed: int, what: str) -> None:
        up = ids_of(spark, table)
        per_file = Counter(i // ROWS for i in up)
        report = check_exactly_once(ids, up)
        state = f"{what}: twophase table {report.line()}, input files {sorted(per_file)}"
        assert report.duplicated == 0 and report.unexpected == 0, state
        assert all(n == ROWS for n in per_file.values()), f"a batch is partly visible; {state}"
        assert len(per_file) == committed, f"expected {committed} batches; {state}"
        assert len(writes(spark, table)) == committed, f"one WRITE version per batch: {writes(spark, table)}; {state}"
        if down.query is None:
            down.start()  # the table exists now (batch 0 is committed before the first crash)
        got = down.catch_up()
        downstream = check_exactly_once(up, got)
        print(f"{what}: twophase table {report.line()}; downstream against it: {downstream.line()}")
        assert downstream.ok, f"downstream Delta table against the twophase table: {downstream.line()}; {state}"

    def check_crashed(point: str, cid: int) -> None:
        committed = cid + 1 if point in ("mid_commit", "after_commit") else cid  # one Delta version: all or nothing
        check_tables(committed, f"after the crash at {point}@{cid}")
        down.restart()  # the downstream query restarts from its own checkpoint too

    def check_final() -> None:
        check_tables(FILES, "after the clean run")
        report = check_exactly_once(ids, ids_of(spark, table))
        assert report.ok, report.line()
        downstream = check_exactly_once(ids, down.catch_up())
        assert downstream.ok, downstream.line()
        # time travel: version 0 creates the table, each later version adds one whole input file, none twice
        versions = writes(spark, table)
        assert versions == list(range(1, FILES + 1)), versions
        seen: set[int] = set()
        for v in [0] + versions:
            got = ids_of(spark, table, versionAsOf=v)
            assert len(got) == len(set(got)) and seen <= set(got), f"version {v}"
            added = set(got) - seen
            assert v == 0 and not added or len({i // ROWS for i in added}) == 1 and len(added) == ROWS, f"version {v}"
            seen = set(got)
        from twophase.log import TransactionLog
        from twophase.naming import default_log_location
        sink_id = f"delta:{table}"
        assert TransactionLog.open(default_log_location(table, sink_id), sink_id).unfinished() == []

    c = CrashChain(POINTS, run, check_crashed, check_final, str(work))
    yield c
    down.stop()


@pytest.mark.parametrize("point", POINTS)
def test_delta_oracle_crash_chain(chain: CrashChain, point: str) -> None:
    chain.crash(point)


def test_delta_oracle_crash_chain_final_restart(chain: CrashChain) -> None:
    chain.finish()
