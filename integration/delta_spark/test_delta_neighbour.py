"""Delta's own writers on a table twophase-delta appends to (issue 24, the neighbour; delta-spark 4.4 in
``.venv-delta``, see conftest.py): delta-spark runs OPTIMIZE (and ZORDER), DELETE, UPDATE, MERGE and VACUUM,
and a delta-spark streaming query appends, while a twophase-delta query appends to the same table.

Checked: the twophase query never fails (delta-rs retries its blind append over Delta's commits) except where
it must, loudly; a Delta command that meets a concurrent append is retried (Delta names the conflict,
ConcurrentAppendException and the like); each twophase batch is ONE commit of the table, carrying its app
transaction ``(sink id, batch id)``, and adds exactly that batch's rows (duplicates and missing counted per
batch, by the rows' ids, from the Delta log's ``txn`` actions); rows a DML changed or inserted are accounted
for; every version reads (time travel), except versions whose files VACUUM removed on purpose.

The races are real, their order made deterministic with gates: a file whose presence makes one of the two tasks
of a twophase batch wait in Spark's Python worker, so an UPDATE, a MERGE and a batch of Delta's own stream
commit while a twophase batch is between its first task's pre-commit and its Delta commit; and a file whose
presence makes twophase's commit wait after it read the table's version (``TWOPHASE_DELTA_COMMIT_GATE``), so an
UPDATE and a MERGE commit between twophase's read and its commit (delta-rs commits the append after them).

VACUUM: with retention respected it never deletes what a twophase batch wrote; ``RETAIN 0 HOURS`` (Delta's
retention check off) between a batch's pre-commit and its decision deletes the batch's files, which no Delta
version references yet: the check before the decision (``DeltaCommitter.check_prepared``) finds them gone and
declines the batch (CheckpointDeclinedError naming it; nothing decided, nothing LOST); the restarted query runs
it again. The native path (``native_sink("delta")``) likewise, VACUUM run between its rename into the table and
its decision.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import tempfile
import time
import urllib.parse
from collections import Counter

import pytest

from integration.fileio import INPUT_SCHEMA, check_exactly_once, make_input
from twophase.sinks.delta import COMMIT_GATE_ENV

pytestmark = [pytest.mark.spark]

SINK_ID = "neighbour"
ROWS = 40  # rows per input file = per twophase batch (maxFilesPerTrigger 1)
# twophase-delta's commit gate (sinks/delta.py _commit_gate): set at import, before the session's JVM starts,
# so that the Python workers that commit inherit it
if COMMIT_GATE_ENV not in os.environ:
    os.environ[COMMIT_GATE_ENV] = tempfile.mkdtemp(prefix="twophase-delta-commit-gate-")
    atexit.register(shutil.rmtree, os.environ[COMMIT_GATE_ENV], True)
COMMIT_GATES = os.environ[COMMIT_GATE_ENV]


def _ids(spark, table: str, **options) -> list[int]:
    r = spark.read.format("delta")
    for k, v in options.items():
        r = r.option(k, v)
    return [row["id"] for row in r.load(table).select("id").collect()]


def _rows(spark, table: str) -> dict[int, str]:
    return {r["id"]: r["payload"] for r in spark.read.format("delta").load(table).select("id", "payload").collect()}


def _history(spark, table: str) -> list:
    return sorted(spark.sql(f"DESCRIBE HISTORY delta.`{table}`").collect(), key=lambda r: r["version"])


def _retrying(spark, sql: str, deadline: float, conflicts: list[str] | None = None) -> None:
    """Run a Delta command; a conflict with twophase's concurrent append (ConcurrentAppendException and the like,
    which Delta names) is retried, as a user's job would. Each conflict's name is appended to ``conflicts``."""
    while True:
        try:
            spark.sql(sql).collect()
            return
        except Exception as e:  # noqa: BLE001 - Delta's conflict exceptions come through py4j
            if "Concurrent" not in str(e) or time.monotonic() > deadline:
                raise
            if conflicts is not None:
                conflicts.append(next((w for w in str(e).replace(":", " ").split() if "Concurrent" in w), "Concurrent"))


def _txns(table: str, app_id: str) -> dict[int, int]:
    """``{table version: txn version}`` of every commit carrying an app transaction of ``app_id`` (the Delta
    log's JSON entries, which delta-spark keeps for 30 days whatever its checkpoints)."""
    log = os.path.join(table, "_delta_log")
    out: dict[int, int] = {}
    for name in sorted(os.listdir(log)):
        if not (name.endswith(".json") and name[:-5].isdigit()):
            continue
        with open(os.path.join(log, name)) as f:
            for line in f:
                action = json.loads(line)
                if "txn" in action and action["txn"]["appId"] == app_id:
                    assert int(name[:-5]) not in out, f"version {name} has two txn actions of {app_id}"
                    out[int(name[:-5])] = int(action["txn"]["version"])
    return out


def check_batches(spark, table: str, batches: list[list[int]], *, app_id: str = SINK_ID,
                  versions: dict[int, list[int]] | None = None) -> dict[int, list[int]]:
    """Each twophase batch is ONE commit of the table with its app transaction ``(app_id, batch id)``, batch ids
    0.. each once, and that commit adds exactly one input batch's rows and removes nothing (counted by id:
    duplicates and missing per batch); every input batch is some commit's. Returns the ids of every version
    read (``versions``, a cache)."""
    versions = {} if versions is None else versions

    def at(v: int) -> list[int]:
        if v not in versions:
            versions[v] = _ids(spark, table, versionAsOf=v) if v >= 0 else []
        return versions[v]

    txns = _txns(table, app_id)
    assert sorted(txns.values()) == list(range(len(batches))), f"twophase batches in the log: {sorted(txns.values())}"
    by_first = {min(b): b for b in batches}
    matched: Counter[int] = Counter()
    for v, batch_id in sorted(txns.items()):
        added = Counter(at(v)) - Counter(at(v - 1))
        removed = Counter(at(v - 1)) - Counter(at(v))
        assert not removed, f"twophase batch {batch_id} (version {v}) removed rows {sorted(removed)[:10]}"
        first = min(added) if added else None
        assert first in by_first, f"twophase batch {batch_id} (version {v}) added no input batch: {sorted(added)[:10]}"
        report = check_exactly_once(by_first[first], list(added.elements()))
        assert report.ok, f"twophase batch {batch_id} (version {v}): {report.line()}"
        matched[first] += 1
    assert all(matched[f] == 1 for f in by_first), f"input batches not committed once: {dict(matched)}"
    return versions


def every_version_reads(spark, table: str, versions: dict[int, list[int]], from_version: int = 0) -> list:
    """Time travel to every version from ``from_version``: it reads, and no row is there twice."""
    history = _history(spark, table)
    for r in history:
        if r["version"] < from_version:
            continue
        if r["version"] not in versions:
            versions[r["version"]] = _ids(spark, table, versionAsOf=r["version"])
        got = versions[r["version"]]
        assert len(got) == len(set(got)), f"version {r['version']} ({r['operation']}) has a row twice"
    return history


# --------------------------------------------------------------------------- gates


def gate_functions(folder: str):
    """``gated``: ``gated(name)`` is a mapInArrow function that Spark ships to its Python workers (a closure, so
    it is pickled by value: this test module is not importable there). While the file ``<folder>/gate-<name>``
    exists, the task holding a batch's first row (id % ROWS == 0) waits, so one task of a twophase batch has
    pre-committed while the other has not. It writes ``gate-<name>.entered`` when it starts waiting. A gate opens by itself after 120 s."""

    def wait(name: str) -> None:
        gate = os.path.join(folder, f"gate-{name}")
        if not os.path.exists(gate):
            return
        open(gate + ".entered", "a").close()
        deadline = time.monotonic() + 120
        while os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.02)

    def gated(name: str):
        def fn(batches):
            for b in batches:
                if any(i % ROWS == 0 for i in b.column("id").to_pylist()):
                    wait(name)
                yield b
        return fn

    return gated


class Gate:
    """The test's side of a gate (see :func:`gate_functions`)."""

    def __init__(self, folder: str, name: str) -> None:
        self.path = os.path.join(folder, f"gate-{name}")

    def close(self) -> None:
        if os.path.exists(self.path + ".entered"):  # a late waiter of the previous round
            os.remove(self.path + ".entered")
        open(self.path, "w").close()

    def open(self) -> None:
        if os.path.exists(self.path):
            os.remove(self.path)

    def wait_entered(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while not os.path.exists(self.path + ".entered"):
            assert time.monotonic() < deadline, f"nothing reached {self.path}"
            time.sleep(0.02)
        os.remove(self.path + ".entered")


def commit_gate() -> Gate:
    """The gate in twophase-delta's commit: closed, a commit that has read the table's version waits before its
    Delta commit (see :func:`wait_commit_entered`)."""
    gate = Gate(COMMIT_GATES, "unused")
    gate.path = os.path.join(COMMIT_GATES, "delta-commit")
    return gate


def wait_commit_entered(timeout: float = 90) -> tuple[int, int]:
    """``(checkpoint id, table version it read)`` of the commit that reached the closed commit gate."""
    path = os.path.join(COMMIT_GATES, "delta-commit.entered")
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(FileNotFoundError):
            with open(path) as f:
                text = f.read()
            if text.endswith("\n"):
                os.remove(path)
                cid, version = text.split()[:2]
                return int(cid), int(version)
        assert time.monotonic() < deadline, "no twophase commit reached the commit gate"
        time.sleep(0.02)


def wait_one_task_of_two_done(spark, q, timeout: float = 90) -> None:
    """Until a running stage of two tasks (a twophase batch's write) has one task done: that task has
    pre-committed (its files are written and synced, its ack returned); the other waits at a gate."""
    tracker = spark.sparkContext.statusTracker()
    deadline = time.monotonic() + timeout
    while True:
        for sid in tracker.getActiveStageIds():
            info = tracker.getStageInfo(sid)
            if info is not None and info.numTasks == 2 and info.numCompletedTasks >= 1:
                return
        assert q.exception() is None, q.exception()
        assert time.monotonic() < deadline, "no twophase batch with one of its two tasks pre-committed"
        time.sleep(0.05)


def wait_batch_committed(table: str, batch_id: int, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while batch_id not in _txns(table, SINK_ID).values():
        assert time.monotonic() < deadline, f"twophase batch {batch_id} was not committed"
        time.sleep(0.05)


def start_twophase(spark, inp: str, table: str, ck: str, gated=None):
    """The twophase-delta query: one input file per batch, two tasks per batch (each writes its own files; ONE
    Delta commit for both), partitioned by grp."""
    df = spark.readStream.schema(INPUT_SCHEMA).option("maxFilesPerTrigger", 1).json(inp)
    if gated is not None:
        df = df.repartition(2).mapInArrow(gated, INPUT_SCHEMA)
    return (df.writeStream.format("twophase-delta").option("path", table).option("checkpointLocation", ck)
            .option("partitionBy", "grp").option("sink.id", SINK_ID)
            .trigger(processingTime="100 milliseconds").start())


def _values(ids: list[int], payload) -> str:
    return ", ".join(f"({i}L, 'g{i % 3}', '{payload(i)}')" for i in ids)


def _merge(table: str, matched: list[int], new: list[int], set_payload: str) -> str:
    """MERGE source rows into the table: ``matched`` ids (twophase's rows) get the source payload 'm<...>'
    through ``set_payload`` (an SQL expression of ``s.payload``), ``new`` ids are inserted with 'ins-<id>'."""
    rows = _values(matched, lambda i: "merged") + ", " + _values(new, lambda i: f"ins-{i}")
    return (f"MERGE INTO delta.`{table}` t USING (SELECT * FROM VALUES {rows} AS s(id, grp, payload)) s "
            f"ON t.id = s.id WHEN MATCHED THEN UPDATE SET payload = {set_payload} "
            "WHEN NOT MATCHED THEN INSERT *")


# --------------------------------------------------------------------------- tests


def test_neighbour_optimize_zorder_and_delete_while_twophase_appends(spark, tmp_path):
    inp, table, ck = str(tmp_path / "in"), str(tmp_path / "table"), str(tmp_path / "ck")
    batches = [make_input(inp, 1, ROWS)]
    q = start_twophase(spark, inp, table, ck)
    deadline = time.monotonic() + 180
    t = f"delta.`{table}`"
    try:
        q.processAllAvailable()
        for k, sql in enumerate([f"OPTIMIZE {t}", f"DELETE FROM {t} WHERE id % 7 = 0", f"OPTIMIZE {t} ZORDER BY (id)",
                                 f"DELETE FROM {t} WHERE id % 7 = 0"], start=1):
            batches.append(make_input(inp, 1, ROWS, start=ROWS * k))  # the query picks it up within 100 ms
            _retrying(spark, sql, deadline)
            assert q.exception() is None, q.exception()
        q.processAllAvailable()
        assert q.exception() is None, q.exception()
    finally:
        q.stop()
    versions = check_batches(spark, table, batches)
    history = every_version_reads(spark, table, versions)
    ops = [r["operation"] for r in history]
    # the plain OPTIMIZE commits nothing when the table has no bin of two or more small files at that moment
    # (seen on a fresh clone: its first run had one OPTIMIZE commit); OPTIMIZE ZORDER BY always rewrites
    assert ops.count("WRITE") == 5 and ops.count("DELETE") == 2 and ops.count("OPTIMIZE") in (1, 2), ops
    assert any("id" in (r["operationParameters"] or {}).get("zOrderBy", "") for r in history), "no ZORDER commit"
    deleted: set[int] = set()
    for r in history:  # a DELETE removes exactly the id % 7 == 0 rows its parent held
        if r["operation"] == "DELETE":
            deleted |= {i for i in versions[r["version"] - 1] if i % 7 == 0}
            assert not any(i % 7 == 0 for i in versions[r["version"]])
    assert deleted, "no DELETE removed a row: the test did not test"
    report = check_exactly_once([i for b in batches for i in b if i not in deleted], _ids(spark, table))
    assert report.ok, report.line()


def test_neighbour_update_and_merge_race_twophase_batches(spark, tmp_path):
    """UPDATE and MERGE (delta-spark) on rows twophase wrote, in both orders of a real race:

    1. batch 1's first task has pre-committed (its files are written, not in the log), its second waits at a
       gate: an UPDATE and a MERGE commit; then batch 1 commits over them;
    2. forced: twophase's commit of batch 2 (then 3) has read the table's version and waits at the commit gate
       (sinks/delta.py ``_commit_gate``); an UPDATE (then a MERGE) commits; then delta-rs commits the batch's
       blind append after the DML's version (read < DML < batch, proven from the versions). Before this, the
       DML was started 0.5 s before the batch's last task was let go: a race, its order not known.
    """
    folder = str(tmp_path)
    inp, table, ck = str(tmp_path / "in"), str(tmp_path / "table"), str(tmp_path / "ck")
    gated = gate_functions(folder)
    batch_gate = Gate(folder, "batch")
    t = f"delta.`{table}`"
    batches = [make_input(inp, 1, ROWS)]
    q = start_twophase(spark, inp, table, ck, gated("batch"))
    deadline = time.monotonic() + 240
    conflicts: list[str] = []
    forced: list[tuple] = []
    try:
        q.processAllAvailable()
        # 1. DML between batch 1's pre-commit and its commit
        batch_gate.close()
        batches.append(make_input(inp, 1, ROWS, start=ROWS))
        batch_gate.wait_entered()
        wait_one_task_of_two_done(spark, q)
        _retrying(spark, f"UPDATE {t} SET payload = 'u1' WHERE id < 20", deadline, conflicts)
        _retrying(spark, _merge(table, list(range(20, 30)), list(range(900000, 900005)), "'m1'"), deadline, conflicts)
        assert 1 not in _txns(table, SINK_ID).values(), "batch 1 committed through its gate"
        batch_gate.open()
        wait_batch_committed(table, 1)
        # 2. forced: twophase's commit of batch 2 (then 3) has read the table's version (and checked its files);
        # it waits at the commit gate while an UPDATE (then a MERGE) commits; delta-rs then meets the newer
        # version and commits its blind append after it (a conflict would fail the query, named)
        mid = {2: f"UPDATE {t} SET payload = 'u2' WHERE id >= 40 AND id < 60",
               3: _merge(table, list(range(60, 70)), list(range(900010, 900015)), "'m2'")}
        gate = commit_gate()
        for b, sql in mid.items():
            gate.close()
            batches.append(make_input(inp, 1, ROWS, start=ROWS * b))
            cid, read = wait_commit_entered()
            assert cid == b, (cid, b)
            _retrying(spark, sql, deadline, conflicts)
            dml = _history(spark, table)[-1]
            assert dml["operation"] in ("UPDATE", "MERGE") and dml["version"] > read, (dml, read)
            assert b not in _txns(table, SINK_ID).values(), f"batch {b} committed through the commit gate"
            gate.open()
            wait_batch_committed(table, b)
            mine = next(v for v, x in _txns(table, SINK_ID).items() if x == b)
            assert read < dml["version"] < mine, (read, dml["version"], mine)
            forced.append((b, read, dml["operation"], dml["version"], mine))
        q.processAllAvailable()
        assert q.exception() is None, q.exception()
    finally:
        batch_gate.open()
        commit_gate().open()
        q.stop()
    print("Delta conflicts retried:", conflicts)
    print("forced (batch, version twophase read, DML, its version, twophase's version):", forced)
    assert len(forced) == 2
    versions = check_batches(spark, table, batches)
    history = every_version_reads(spark, table, versions)
    ops = [r["operation"] for r in history]
    assert ops.count("WRITE") == 4 and ops.count("UPDATE") == 2 and ops.count("MERGE") == 2, ops
    txns = _txns(table, SINK_ID)
    assert {r["version"] for r in history if r["operation"] == "WRITE"} == set(txns), "a WRITE without its txn"
    at = {b: v for v, b in txns.items()}
    dml = [r["version"] for r in history if r["operation"] in ("UPDATE", "MERGE")]
    # the first UPDATE and MERGE landed between batch 1's pre-commit and its commit
    assert at[0] < dml[0] < dml[1] < at[1], (at, dml)
    print("twophase batches at versions", at, "UPDATE/MERGE at", dml)
    inserted = list(range(900000, 900005)) + list(range(900010, 900015))
    rows = _rows(spark, table)
    report = check_exactly_once([i for b in batches for i in b] + inserted, _ids(spark, table))
    assert report.ok, report.line()

    def want(i: int) -> str:
        if i >= 900000:
            return f"ins-{i}"
        return "u1" if i < 20 else "m1" if i < 30 else "u2" if 40 <= i < 60 else "m2" if 60 <= i < 70 else f"row-{i}"
    wrong = {i: p for i, p in rows.items() if p != want(i)}
    assert not wrong, f"rows whose payload the DML did not set as it should: {dict(list(wrong.items())[:10])}"


def _error_text(q) -> str:
    """The query's exception with every cause's message (the Python sink's error is a cause of Spark's
    'Writing job failed')."""
    j = q._jsq.exception()
    if j.isEmpty():
        return ""
    e, parts = j.get(), []
    while e is not None and len(parts) < 20:
        parts.append(str(e.getMessage()))
        e = e.getCause()
    return "\n".join(parts)


def _terminated(q, timeout: float = 120) -> bool:
    """Whether the query stopped within ``timeout`` (with its exception, if any, in ``q.exception()``)."""
    try:
        return bool(q.awaitTermination(timeout))
    except Exception:  # noqa: BLE001 - StreamingQueryException: the query failed, which is what is waited for
        return True


def _untracked(spark, table: str) -> set[str]:
    """Data files on disk that the table's newest version does not reference (relative paths)."""
    referenced = {os.path.normpath(urllib.parse.unquote(urllib.parse.urlparse(r["p"]).path))
                  for r in spark.read.format("delta").load(table).selectExpr("_metadata.file_path AS p")
                  .distinct().collect()}
    on_disk = set()
    for root, dirs, files in os.walk(table):
        dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
        on_disk |= {os.path.normpath(os.path.join(root, f)) for f in files if f.endswith(".parquet")}
    return {os.path.relpath(p, table) for p in on_disk - referenced}


def test_neighbour_vacuum_and_a_twophase_batch_in_flight(spark, tmp_path):
    """VACUUM while a twophase batch is between its pre-commit and its commit (one task's files written, no Delta
    version references them yet):

    - with retention respected (the default 7 days; RETAIN 1 HOURS), the batch's files are younger than the
      retention: they survive and the batch commits, exactly once;
    - with nothing in flight, RETAIN 0 HOURS deletes what OPTIMIZE replaced, never a file the newest version
      references nor twophase's own folder (_twophase/: VACUUM skips hidden folders): the query goes on;
    - RETAIN 0 HOURS (Delta's retention check turned off) during the window, before the decision, deletes the
      batch's pre-committed files: the check before the decision finds them gone and declines the batch
      (CheckpointDeclinedError naming it, its other files aborted, the table unchanged); the restarted query
      runs it again: every batch in the table once, no LOST record (before: DataLossError, LOST until
      ``twophase log resolve --accept-loss``).
    """
    folder = str(tmp_path)
    inp, table, ck = str(tmp_path / "in"), str(tmp_path / "table"), str(tmp_path / "ck")
    gated = gate_functions(folder)
    gate = Gate(folder, "batch")
    t = f"delta.`{table}`"
    batches = [make_input(inp, 1, ROWS)]
    q = start_twophase(spark, inp, table, ck, gated("batch"))
    deadline = time.monotonic() + 240
    t0 = time.monotonic()

    def phase(what: str) -> None:
        print(f"{time.monotonic() - t0:6.1f} s {what}")
    # VACUUM lists the table in this many tasks (default 10000: a minute on two slots, one held by the gate)
    spark.conf.set("spark.sql.sources.parallelPartitionDiscovery.parallelism", "2")
    try:
        q.processAllAvailable()
        _retrying(spark, f"OPTIMIZE {t}", deadline)
        phase("batch 0, OPTIMIZE")
        # retention respected: the in-flight batch's files survive VACUUM, and the batch commits
        gate.close()
        batches.append(make_input(inp, 1, ROWS, start=ROWS))
        gate.wait_entered()
        wait_one_task_of_two_done(spark, q)
        in_flight = {p for p in _untracked(spark, table) if "-00000001-" in p}
        assert in_flight, "batch 1's pre-committed files are not on disk"
        _retrying(spark, f"VACUUM {t}", deadline)
        spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
        _retrying(spark, f"VACUUM {t} RETAIN 1 HOURS", deadline)
        assert all(os.path.exists(os.path.join(table, p)) for p in in_flight), "VACUUM deleted a fresh file"
        gate.open()
        wait_batch_committed(table, 1)
        q.processAllAvailable()
        versions = check_batches(spark, table, batches)
        every_version_reads(spark, table, versions)  # VACUUM took nothing
        phase("VACUUM kept the in-flight batch 1")
        # nothing in flight: RETAIN 0 HOURS removes what OPTIMIZE replaced, only that
        replaced = _untracked(spark, table)
        assert replaced, "OPTIMIZE replaced no file: the test did not test"
        _retrying(spark, f"VACUUM {t} RETAIN 0 HOURS", deadline)
        assert _untracked(spark, table) == set() and not any(os.path.exists(os.path.join(table, p)) for p in replaced)
        assert os.path.isdir(os.path.join(table, "_twophase")), "VACUUM deleted twophase's folder"
        report = check_exactly_once([i for b in batches for i in b], _ids(spark, table))
        assert report.ok, report.line()
        phase("VACUUM RETAIN 0 HOURS, nothing in flight")
        # RETAIN 0 HOURS inside the window, before the decision: the batch's files are deleted; the batch is
        # declined (nothing decided, every file of it aborted, retriable) and the restart runs it again
        gate.close()
        batches.append(make_input(inp, 1, ROWS, start=ROWS * 2))
        gate.wait_entered()
        wait_one_task_of_two_done(spark, q)
        in_flight = {p for p in _untracked(spark, table) if "-00000002-" in p}
        assert in_flight, "batch 2's pre-committed files are not on disk"
        _retrying(spark, f"VACUUM {t} RETAIN 0 HOURS", deadline)
        assert not any(os.path.exists(os.path.join(table, p)) for p in in_flight), "VACUUM kept untracked files"
        gate.open()
        assert _terminated(q), "the query went on after its batch's files were deleted"
    finally:
        spark.conf.unset("spark.databricks.delta.retentionDurationCheck.enabled")
        spark.conf.unset("spark.sql.sources.parallelPartitionDiscovery.parallelism")
        gate.open()
        q.stop()
    error = _error_text(q)
    # before DeltaCommitter.check_prepared: DataLossError, checkpoint 2 LOST until --accept-loss
    assert "CheckpointDeclinedError" in error and "checkpoint 2" in error and "gone" in error, error
    assert "DataLossError" not in error, error
    assert 2 not in _txns(table, SINK_ID).values()
    assert sorted(_ids(spark, table)) == sorted(i for b in batches[:2] for i in b), "the table changed"
    assert _untracked(spark, table) == set(), "the declined batch left files in the table"
    phase("batch 2 declined by name")
    # the restart (no operator) runs batch 2 again, then batch 3: every batch once, nothing LOST
    batches.append(make_input(inp, 1, ROWS, start=ROWS * 3))
    q = start_twophase(spark, inp, table, ck)
    try:
        q.processAllAvailable()
        assert q.exception() is None, q.exception()
    finally:
        q.stop()
    # versions before RETAIN 0 HOURS were read then (their replaced files are gone now): the cache has them
    versions = check_batches(spark, table, batches, versions=versions)
    every_version_reads(spark, table, versions, from_version=min(v for v, b in _txns(table, SINK_ID).items() if b >= 2))
    report = check_exactly_once([i for b in batches for i in b], _ids(spark, table))
    assert report.ok, report.line()
    assert_no_lost(table)
    phase("restarted: batches 2 and 3 committed once, nothing LOST")


def assert_no_lost(table: str, sink_id: str = SINK_ID) -> None:
    """twophase's log of ``sink_id`` on ``table`` has no LOST checkpoint."""
    from twophase.sinks.delta import DeltaSink
    from twophase.states import CheckpointState
    records = DeltaSink.from_options({"path": table, "sink.id": sink_id}).transaction_log().records()
    assert records and not [r.checkpoint_id for r in records if r.state is CheckpointState.LOST]


def test_neighbour_vacuum_before_the_native_paths_decision(spark, tmp_path):
    """The native path (``native_sink("delta")``): VACUUM RETAIN 0 HOURS (retention check off) runs after the
    driver renamed batch 1's files into the table (no Delta version references them) and before its decision
    (a hook in the test around the target's ``committables``, in the foreachBatch call). The check before the
    decision (the native committer is twophase-delta's) declines the batch: CheckpointDeclinedError naming it,
    nothing decided; the restart runs it again; every batch once, no LOST record (before: DataLossError)."""
    import twophase.spark
    inp, table, ck, sid = str(tmp_path / "in"), str(tmp_path / "table"), str(tmp_path / "ck"), "native-neighbour"
    sink = twophase.spark.native_sink("delta", path=table, checkpointLocation=ck, partitionBy="grp",
                                      **{"sink.id": sid})
    renamed_into_table = sink.target.committables
    vacuumed: list[list[str]] = []

    def committables(batch_id: int, *a, **k):
        out = renamed_into_table(batch_id, *a, **k)
        if batch_id == 1 and not vacuumed:
            files = [f["rel"] for c in out for f in c.files]
            spark.sql(f"VACUUM delta.`{table}` RETAIN 0 HOURS").collect()
            vacuumed.append([f for f in files if not os.path.exists(os.path.join(table, f))])
        return out
    sink.target.committables = committables

    def start():
        return (spark.readStream.schema(INPUT_SCHEMA).option("maxFilesPerTrigger", 1).json(inp).writeStream
                .foreachBatch(sink).option("checkpointLocation", ck).trigger(processingTime="100 milliseconds").start())
    batches = [make_input(inp, 1, ROWS)]
    spark.conf.set("spark.sql.sources.parallelPartitionDiscovery.parallelism", "2")
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    try:
        q = start()
        try:
            q.processAllAvailable()
            batches.append(make_input(inp, 1, ROWS, start=ROWS))
            assert _terminated(q), "the native query went on after its batch's files were deleted"
        finally:
            q.stop()
        error = _error_text(q)
        assert vacuumed and vacuumed[0], f"VACUUM deleted none of batch 1's files: {vacuumed}"
        assert "CheckpointDeclinedError" in error and "checkpoint 1" in error and "gone" in error, error
        assert "DataLossError" not in error, error
        assert sorted(_ids(spark, table)) == sorted(batches[0]) and list(_txns(table, sid).values()) == [0]
        batches.append(make_input(inp, 1, ROWS, start=ROWS * 2))
        q = start()
        try:
            q.processAllAvailable()
            assert q.exception() is None, q.exception()
        finally:
            q.stop()
    finally:
        spark.conf.unset("spark.databricks.delta.retentionDurationCheck.enabled")
        spark.conf.unset("spark.sql.sources.parallelPartitionDiscovery.parallelism")
    every_version_reads(spark, table, check_batches(spark, table, batches, app_id=sid))
    report = check_exactly_once([i for b in batches for i in b], _ids(spark, table))
    assert report.ok, report.line()
    assert _untracked(spark, table) == set(), "a declined attempt left files in the table"
    assert_no_lost(table, sid)


def test_neighbour_delta_spark_stream_appends_beside_twophase(spark, tmp_path):
    """A delta-spark streaming query (``writeStream.format("delta")``, Delta's SetTransaction keyed by its query
    id) and twophase-delta append to one table at once; once, deterministically, the Delta stream commits while
    a twophase batch is between its pre-commit and its commit. Both streams' rows exactly once, per batch."""
    folder = str(tmp_path)
    inp, theirs_in, table = str(tmp_path / "in"), str(tmp_path / "theirs"), str(tmp_path / "table")
    gated = gate_functions(folder)
    gate = Gate(folder, "batch")
    batches = [make_input(inp, 1, ROWS)]
    q = start_twophase(spark, inp, table, str(tmp_path / "ck"), gated("batch"))
    d = None
    theirs: list[list[int]] = []
    try:
        q.processAllAvailable()  # the table exists (twophase created it)
        theirs.append(make_input(theirs_in, 1, ROWS, start=100000))
        d = (spark.readStream.schema(INPUT_SCHEMA).option("maxFilesPerTrigger", 1).json(theirs_in)
             .writeStream.format("delta").option("checkpointLocation", str(tmp_path / "dck")).partitionBy("grp")
             .trigger(processingTime="100 milliseconds").start(table))
        d.processAllAvailable()
        for k in range(1, 5):
            if k == 2:
                q.processAllAvailable()  # batch 1 is done: the gate holds batch 2
                gate.close()
            batches.append(make_input(inp, 1, ROWS, start=ROWS * k))
            theirs.append(make_input(theirs_in, 1, ROWS, start=100000 + ROWS * k))
            if k == 2:  # Delta's stream commits its batch 2 while twophase's batch 2 is pre-committed
                gate.wait_entered()
                wait_one_task_of_two_done(spark, q)
                d.processAllAvailable()
                assert 2 not in _txns(table, SINK_ID).values()
                gate.open()
            time.sleep(0.3)
        q.processAllAvailable()
        d.processAllAvailable()
        assert q.exception() is None and d.exception() is None, (q.exception(), d.exception())
    finally:
        gate.open()
        q.stop()
        if d is not None:
            d.stop()
    versions = check_batches(spark, table, batches)
    versions = check_batches(spark, table, theirs, app_id=d.id, versions=versions)
    history = every_version_reads(spark, table, versions)
    ops = [r["operation"] for r in history]
    assert ops.count("WRITE") == 5 and ops.count("STREAMING UPDATE") == 5, ops
    mine, other = _txns(table, SINK_ID), _txns(table, d.id)
    assert min(v for v, b in other.items() if b == 2) < min(v for v, b in mine.items() if b == 2)
    report = check_exactly_once([i for b in batches + theirs for i in b], _ids(spark, table))
    assert report.ok, report.line()

