"""Fast tests of the Delta sink on a local table (no server, no Spark): the driver and executor hooks."""

from __future__ import annotations

import contextlib
import os
import shutil
import urllib.parse

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from fakes import record_fsyncs

from twophase.sinks.delta import DeltaSink, _partition_values, _Stats
from twophase.coordinator import CheckpointCoordinator
from twophase.errors import ConfigurationError
from twophase.testing import abort, abort_lingering
from twophase.sink import CommitStatus, TransactionContext, run_task, sink_token

SCHEMA = pa.schema([("id", pa.int64()), ("p", pa.string()), ("v", pa.float64())])


def batch(start: int, n: int) -> pa.RecordBatch:
    return pa.record_batch({"id": pa.array(range(start, start + n), pa.int64()),
                            "p": pa.array(["a b" if i % 2 else "x:y" for i in range(n)]),
                            "v": pa.array([i / 2 for i in range(n)])}, schema=SCHEMA)


@pytest.fixture
def sink(tmp_path) -> DeltaSink:
    s = DeltaSink.from_options({"path": str(tmp_path / "t"), "partitionBy": "p"}, SCHEMA)
    s.validate_destination()
    s.transaction_log().claim("test")
    return s


def run_checkpoint(sink: DeltaSink, cid: int, tasks: int = 2):
    return [run_task(sink, TransactionContext(sink.sink_id, cid, str(t)), [batch(cid * 1000 + t * 100, 10)])
            for t in range(tasks)]


def test_delta_sink_inv1_one_delta_commit_per_checkpoint(sink) -> None:
    co = CheckpointCoordinator(sink)
    acks = run_checkpoint(sink, 0)
    assert DeltaTable(sink.uri).to_pyarrow_table().num_rows == 0  # written, not visible
    co.complete_batch(0, acks)
    dt = DeltaTable(sink.uri)
    assert dt.version() == 1 and dt.to_pyarrow_table().num_rows == 20
    assert dt.transaction_version(sink.sink_id) == 0
    assert sorted(set(dt.to_pyarrow_table().column("p").to_pylist())) == ["a b", "x:y"]


def test_delta_sink_inv2_checkpoint_already_in_the_table_is_skipped(sink) -> None:
    acks = run_checkpoint(sink, 3)
    c = sink.create_committer()
    handles = [c.decode(a.handle) for a in acks]
    assert {r.status for r in c.commit_checkpoint(3, handles)} == {CommitStatus.COMMITTED}
    # e.g. recovery after a crash before COMMITTED; an older checkpoint is also already in
    assert {r.status for r in c.commit_checkpoint(3, handles, recovering=True)} == {CommitStatus.ALREADY_COMMITTED}
    assert {r.status for r in c.commit_checkpoint(2, handles)} == {CommitStatus.ALREADY_COMMITTED}
    dt = DeltaTable(sink.uri)
    assert dt.version() == 1 and dt.to_pyarrow_table().num_rows == 20


def test_delta_sink_inv3_abort_deletes_only_the_handles_files(sink) -> None:
    co = CheckpointCoordinator(sink)
    co.complete_batch(0, run_checkpoint(sink, 0))
    before = set(sink.files.list_data())
    acks = run_checkpoint(sink, 1)
    for a in acks:
        abort(sink, a.handle)
    assert set(sink.files.list_data()) == before
    assert DeltaTable(sink.uri).to_pyarrow_table().num_rows == 20


def test_delta_sink_inv4_abort_lingering_deletes_unreferenced_files_once(sink) -> None:
    co = CheckpointCoordinator(sink, sweep_after_commit=False)
    co.complete_batch(0, run_checkpoint(sink, 0))
    run_checkpoint(sink, 1)  # a crashed attempt: files without a commit
    assert abort_lingering(sink, 0) == 0  # checkpoint 1 is not <= 0
    assert abort_lingering(sink, 1) == 0  # no final record of checkpoint 1 proves its files orphaned: kept
    run_checkpoint(sink, 2)  # another crashed attempt, then the re-run of checkpoint 2 commits
    co.complete_batch(2, run_checkpoint(sink, 2))
    committed = {f["rel"] for cid in (0, 2) for h in sink.transaction_log().get(cid).handles.values()
                 for f in h["files"]}
    assert abort_lingering(sink, 2) == 4  # the crashed attempt of 2; checkpoint 1 has still no record
    assert {r for r in sink.files.list_data() if "-00000001-" not in r} == committed
    assert DeltaTable(sink.uri).to_pyarrow_table().num_rows == 40
    run_checkpoint(sink, 2)
    assert abort_lingering(sink, 2) == 0  # checkpoint 2 was scanned already (watermark)


def test_delta_sink_inv5_schema_checks(sink, tmp_path) -> None:
    wider = SCHEMA.append(pa.field("extra", pa.string()))
    with pytest.raises(ConfigurationError, match="mergeSchema"):
        DeltaSink.from_options({"path": sink.uri}, wider).validate_destination()
    retyped = pa.schema([("id", pa.string()), ("p", pa.string()), ("v", pa.float64())])
    with pytest.raises(ConfigurationError, match="column 'id'"):
        DeltaSink.from_options({"path": sink.uri, "mergeSchema": "true"}, retyped).validate_destination()
    with pytest.raises(ConfigurationError, match="partitioned by"):
        DeltaSink.from_options({"path": sink.uri, "partitionBy": "id"}, SCHEMA).validate_destination()
    merged = DeltaSink.from_options({"path": sink.uri, "mergeSchema": "true"}, wider)
    merged.validate_destination()
    assert "extra" in [f.name for f in DeltaTable(sink.uri).schema().fields]
    assert merged.partition_by == ("p",)  # adopted from the table


def test_delta_partition_values_and_stats() -> None:
    assert _partition_values("a=x%3Ay/b=__HIVE_DEFAULT_PARTITION__", None) == {"a": "x:y", "b": None}
    st = _Stats(SCHEMA)
    st.update(batch(5, 3))
    assert '"numRecords":3' in st.to_json() and '"minValues":{"id":5' in st.to_json()


def test_delta_options_refuse_at_least_once(tmp_path) -> None:
    with pytest.raises(ConfigurationError, match="guarantee"):
        DeltaSink.from_options({"path": str(tmp_path), "guarantee": "at-least-once"})


def attempt(sink: DeltaSink, cid: int, task: int, rows: pa.RecordBatch, *, pre_commit: bool = True):
    """One attempt of task ``task`` of checkpoint ``cid``: pre-committed (its ack may never arrive) or left
    open as by a task that died while writing."""
    ctx = TransactionContext(sink.sink_id, cid, str(task))
    if pre_commit:
        return run_task(sink, ctx, [rows])
    sink.create_writer(ctx).write(rows)
    return None


def referenced(sink: DeltaSink) -> set[str]:
    """The data files the table's snapshot references (Add paths are URI-encoded)."""
    paths = pa.table(DeltaTable(sink.uri).get_add_actions(flatten=True)).column("path").to_pylist()
    return {urllib.parse.unquote(p) for p in paths}


def test_delta_sink_inv4_last_batch_loser_files_deleted_right_after_commit(sink) -> None:
    """The last batch of a run: task 0's first attempt pre-committed but its ack was lost (executor lost),
    another died while writing, the retry won. Right after the commit (the Spark adapter's path, no
    further batch, no recovery), no data file of the losers is left, and the committed rows are intact."""
    co = CheckpointCoordinator(sink, sweep_after_commit=sink.sweep_after_commit)  # as twophase.spark.datasource
    co.complete_batch(0, run_checkpoint(sink, 0), expected_tasks=["0", "1"])
    lost = attempt(sink, 1, 0, batch(1000, 10))
    attempt(sink, 1, 0, batch(1000, 10), pre_commit=False)
    winners = [attempt(sink, 1, 0, batch(1000, 10)), attempt(sink, 1, 1, batch(1100, 10))]
    assert co.complete_batch(1, winners, expected_tasks=["0", "1"]) == "COMMITTED"
    assert set(sink.files.list_data()) == referenced(sink)
    assert not any(f["rel"] in referenced(sink) for f in lost.handle["files"])
    assert sorted(DeltaTable(sink.uri).to_pyarrow_table().column("id").to_pylist()) == \
        sorted([*range(0, 10), *range(100, 110), *range(1000, 1010), *range(1100, 1110)])


def test_delta_sink_inv4_sweep_after_commit_never_lists_the_whole_table(sink) -> None:
    """The per-batch sweep never lists the whole table; it deletes each batch's loser and leaves another
    sink's file in the same directories untouched."""
    sink.files.list_data = lambda: (_ for _ in ()).throw(AssertionError("whole-table listing per batch"))
    other = DeltaSink.from_options({"path": sink.uri, "sink.id": "other"}, SCHEMA)
    other.transaction_log().claim("other")
    foreign = attempt(other, 1, 0, batch(0, 10))  # another query's pre-committed files, "its" checkpoint 1
    co = CheckpointCoordinator(sink, sweep_after_commit=sink.sweep_after_commit)
    for cid in (0, 1, 2):
        attempt(sink, cid, 0, batch(cid * 1000, 10))  # a loser per batch
        co.complete_batch(cid, run_checkpoint(sink, cid), expected_tasks=["0", "1"])
    assert set(_data_files(sink)) == referenced(sink) | {f["rel"] for f in foreign.handle["files"]}


def _data_files(sink: DeltaSink) -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(sink.uri):
        dirnames[:] = [d for d in dirnames if not d.startswith("_")]
        out += [os.path.relpath(os.path.join(dirpath, n), sink.uri) for n in filenames]
    return out


@contextlib.contextmanager
def directory_reads(root: str):
    """Every directory os.scandir / os.listdir read under ``root`` while active (os.walk uses os.scandir)."""
    seen: list[str] = []
    real_scandir, real_listdir = os.scandir, os.listdir

    def scandir(path=".", *a, **k):
        seen.append(os.path.abspath(os.fspath(path)))
        return real_scandir(path, *a, **k)

    def listdir(path=".", *a, **k):
        seen.append(os.path.abspath(os.fspath(path)))
        return real_listdir(path, *a, **k)

    os.scandir, os.listdir = scandir, listdir
    try:
        yield seen
    finally:
        os.scandir, os.listdir = real_scandir, real_listdir


@pytest.mark.parametrize("partitioned", [False, True])
def test_delta_sink_inv7_sweep_after_commit_reads_no_table_directory(tmp_path, partitioned) -> None:
    """The cost that grew with history: the sweep of a local table scanned the table root (every data file
    of an unpartitioned table) and each partition folder the batch wrote. Now the commit phase reads no
    directory of the table but its own record folder of the batch (and _delta_log), however many old
    files the table holds, and the batch's losers are still deleted right after the commit."""
    s = DeltaSink.from_options({"path": str(tmp_path / "t"), **({"partitionBy": "p"} if partitioned else {})}, SCHEMA)
    s.validate_destination()
    s.transaction_log().claim("test")
    co = CheckpointCoordinator(s, sweep_after_commit=s.sweep_after_commit)
    co.complete_batch(0, run_checkpoint(s, 0))
    data_dirs = {os.path.dirname(os.path.join(s.uri, r)) for r in _data_files(s)} | {s.uri}
    loser = attempt(s, 1, 0, batch(1000, 10))
    acks = run_checkpoint(s, 1)
    with directory_reads(s.uri) as seen:
        assert co.complete_batch(1, acks) == "COMMITTED"
    assert not data_dirs & set(seen), f"the sweep read table directories {sorted(data_dirs & set(seen))}"
    names = os.path.join(s.uri, "_twophase", sink_token(s.sink_id), "names")
    own = os.path.join(s.uri, "_twophase", sink_token(s.sink_id))  # the log (bounded by log.retain) and the records
    assert all(p.startswith((os.path.join(s.uri, "_delta_log"), own)) for p in seen if p.startswith(s.uri)), seen
    assert names + f"/{1:08d}" in seen
    assert os.path.join(s.uri, "_delta_log") not in seen  # its versions grow with every batch: probed, not listed
    assert not any(f["rel"] in _data_files(s) for f in loser.handle["files"])
    assert set(_data_files(s)) == referenced(s)
    assert not os.listdir(names)  # the records of swept batches are gone too


def test_delta_sink_inv7_loser_in_a_partition_the_winner_did_not_write_is_deleted_right_after_commit(sink) -> None:
    """A loser whose rows went to a partition no committed file of its batch is in (non-deterministic
    input): its attempt's record names it, so the sweep right after the commit deletes it."""
    co = CheckpointCoordinator(sink, sweep_after_commit=sink.sweep_after_commit)
    only = lambda p: pa.record_batch({"id": pa.array([1], pa.int64()), "p": pa.array([p]), "v": pa.array([0.5])},
                                     schema=SCHEMA)
    attempt(sink, 0, 0, only("z"), pre_commit=False)  # died while writing p=z
    attempt(sink, 0, 0, only("w"))  # pre-committed p=w, ack lost
    co.complete_batch(0, [attempt(sink, 0, 0, only("x:y"))])
    assert set(_data_files(sink)) == referenced(sink)


def test_delta_sink_inv7_zombie_writing_after_any_sweep_is_caught_by_a_later_whole_listing(tmp_path) -> None:
    """A zombie attempt of checkpoint 1 writes after the scoped sweep of 1, and again after the whole listing
    that covered 1: each file is deleted by the next whole listing (every log.retain // 2 = 3 checkpoints
    here), committed files never are, and no record folder of a swept checkpoint is left."""
    s = DeltaSink.from_options({"path": str(tmp_path / "t"), "log.retain": "6"}, SCHEMA)
    s.validate_destination()
    s.transaction_log().claim("test")
    co = CheckpointCoordinator(s, sweep_after_commit=s.sweep_after_commit)
    co.complete_batch(0, run_checkpoint(s, 0))
    co.complete_batch(1, run_checkpoint(s, 1))  # scoped sweep of 1
    zombie = attempt(s, 1, 0, batch(1000, 10))  # after it
    assert {f["rel"] for f in zombie.handle["files"]} <= set(_data_files(s))
    co.complete_batch(2, run_checkpoint(s, 2))  # 2 - (-1) >= 3: the whole table is listed
    assert set(_data_files(s)) == referenced(s)
    zombie = attempt(s, 1, 1, batch(1100, 10))  # the zombie writes again, after that whole listing
    for cid in (3, 4):
        co.complete_batch(cid, run_checkpoint(s, cid))  # scoped: 1 is not theirs
    assert {f["rel"] for f in zombie.handle["files"]} <= set(_data_files(s))
    co.complete_batch(5, run_checkpoint(s, 5))  # 5 - 2 >= 3: whole listing, 1's record still kept (retain 6)
    assert set(_data_files(s)) == referenced(s)
    assert DeltaTable(s.uri).to_pyarrow_table().num_rows == 6 * 20
    names = os.path.join(s.uri, "_twophase", sink_token(s.sink_id), "names")
    assert not os.listdir(names)


def test_delta_sink_inv4_whole_table_listing_catches_what_scoped_sweeps_miss(tmp_path) -> None:
    """A file no record names (an attempt of an older version, a record lost to a power cut), or a zombie's
    file written after the sweep: the whole-table listing, due every FULL_SWEEP_EVERY checkpoints (here
    log.retain // 2 = 3), deletes them while the log still has the records that prove them orphaned."""
    s = DeltaSink.from_options({"path": str(tmp_path / "t"), "partitionBy": "p", "log.retain": "6"}, SCHEMA)
    s.validate_destination()
    s.transaction_log().claim("test")
    co = CheckpointCoordinator(s, sweep_after_commit=s.sweep_after_commit)
    only_x = pa.record_batch({"id": pa.array([1], pa.int64()), "p": pa.array(["x:y"]), "v": pa.array([0.5])},
                             schema=SCHEMA)
    only_z = pa.record_batch({"id": pa.array([2], pa.int64()), "p": pa.array(["z"]), "v": pa.array([0.5])},
                             schema=SCHEMA)
    co.complete_batch(0, [attempt(s, 0, 0, only_x)])  # scoped
    attempt(s, 1, 0, only_z)  # the loser of checkpoint 1 wrote partition p=z ...
    shutil.rmtree(os.path.join(s.uri, "_twophase", sink_token(s.sink_id), "names", f"{1:08d}"))  # ... unrecorded
    co.complete_batch(1, [attempt(s, 1, 0, only_x)])  # scoped sweep: the records only
    assert any(r.startswith("p=z/") for r in s.files.list_data())
    attempt(s, 1, 0, only_x)  # a zombie of checkpoint 1 finishes after the sweep
    co.complete_batch(2, [attempt(s, 2, 0, only_x)])  # 2 - (-1) >= 3: the whole table is listed
    assert set(s.files.list_data()) == referenced(s)


STATS_SCHEMA = pa.schema([("s", pa.string()), ("ts", pa.timestamp("us", tz="UTC")), ("ntz", pa.timestamp("us")),
                          ("d", pa.decimal128(10, 2)), ("b", pa.bool_())])


def _stats_batch() -> pa.RecordBatch:
    import datetime as dt
    import decimal
    utc = dt.timezone.utc
    return pa.record_batch({
        "s": ["a" * 40 + "b", "a" * 40, "m", "\U0010ffff" * 40, "zz" + "\uffff" * 35, None],
        "ts": [dt.datetime(2024, 1, 1, 0, 0, 0, 1, tzinfo=utc), dt.datetime(2024, 5, 6, 7, 8, 9, 999_999, tzinfo=utc),
               None, dt.datetime(2023, 12, 31, 23, 59, 59, 500, tzinfo=utc), dt.datetime(2024, 2, 2, tzinfo=utc),
               dt.datetime(2024, 3, 3, 3, 3, 3, 3000, tzinfo=utc)],
        "ntz": [dt.datetime(2024, 1, 1, 12, 0, 0, 123_456)] * 5 + [None],
        "d": [decimal.Decimal("1.25")] * 6, "b": [True, False, True, None, True, False]}, schema=STATS_SCHEMA)


def test_delta_stats_inv_bounds_hold_for_strings_and_timestamps_rounded_outward() -> None:
    """Every min/max written bounds every value of the file (a reader skips files on them): string
    statistics are prefixes and incremented prefixes, timestamps milliseconds with the maximum rounded up.
    Fails if a bound is truncated the wrong way (a max below a value)."""
    import datetime as dt
    import json
    batch_ = _stats_batch()
    st = _Stats(STATS_SCHEMA)
    st.update(batch_)
    stats = json.loads(st.to_json())
    lo, hi = stats["minValues"], stats["maxValues"]
    strings = [v for v in batch_.column("s").to_pylist() if v is not None]
    assert lo["s"] == "a" * 32 and all(lo["s"].encode() <= v.encode() for v in strings)
    assert "s" not in hi  # the largest string is 40 x U+10FFFF: no short upper bound exists, so no max
    st2 = _Stats(STATS_SCHEMA)
    st2.update(batch_.slice(0, 3))
    hi2 = json.loads(st2.to_json())["maxValues"]["s"]
    assert hi2 == "m"  # short strings are exact
    st3 = _Stats(STATS_SCHEMA)
    st3.update(batch_.slice(4, 2))  # the largest string is 37 characters: a 32-character prefix, incremented
    hi3 = json.loads(st3.to_json())["maxValues"]["s"]
    assert len(hi3) == 32 and hi3 == "zz" + "\uffff" * 29 + "\U00010000"
    assert ("zz" + "\uffff" * 35).encode() < hi3.encode()

    def parse(v: str) -> dt.datetime:
        return dt.datetime.strptime(v.rstrip("Z"), "%Y-%m-%dT%H:%M:%S.%f")
    ts = [v.replace(tzinfo=None) for v in batch_.column("ts").to_pylist() if v is not None]
    assert lo["ts"] == "2023-12-31T23:59:59.000Z" and hi["ts"] == "2024-05-06T07:08:10.000Z"
    assert parse(lo["ts"]) <= min(ts) and parse(hi["ts"]) >= max(ts)
    assert lo["ntz"] == "2024-01-01T12:00:00.123" and hi["ntz"] == "2024-01-01T12:00:00.124"
    assert {"d", "b"}.isdisjoint(lo) and stats["nullCount"]["s"] == 1 and stats["nullCount"]["b"] == 1


def test_delta_stats_let_readers_skip_files_and_never_lose_a_matching_row(tmp_path) -> None:
    """A real table: deltalake's DataFusion prunes files on these statistics (a max set too low loses the row:
    seen failing with the string max truncated to its prefix), and queries for the longest strings and the
    largest timestamp still find their rows. (delta-rs widens a timestamp max by 1 ms when it reads it, as
    Delta Spark does, so rounding the max up is checked by the unit test above, for other readers.)"""
    import datetime as dt
    sink = DeltaSink.from_options({"path": str(tmp_path / "t")}, STATS_SCHEMA)
    sink.validate_destination()
    sink.transaction_log().claim("test")
    acks = [run_task(sink, TransactionContext(sink.sink_id, 0, "0"), [_stats_batch().slice(0, 3)]),
            run_task(sink, TransactionContext(sink.sink_id, 0, "1"), [_stats_batch().slice(3, 3)])]
    assert CheckpointCoordinator(sink).complete_batch(0, acks, ["0", "1"]) == "COMMITTED"
    table = DeltaTable(sink.uri)
    actions = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    assert all(a["min.s"] is not None and a["min.ts"] is not None for a in actions)  # stats for both types
    from deltalake import QueryBuilder  # DataFusion, which prunes files on the statistics

    def count(where: str) -> int:
        rows = QueryBuilder().register("t", table).execute(f"SELECT count(*) AS n FROM t WHERE {where}").read_all()
        return rows.column("n")[0].as_py()
    assert count("ts = TIMESTAMP '2024-05-06T07:08:09.999999Z'") == 1
    assert count("ts > TIMESTAMP '2024-05-06T07:08:09.999500Z'") == 1
    assert count("s = '" + "a" * 40 + "b'") == 1
    assert count("s > 'zz'") == 2
    assert count("s = '" + "\U0010ffff" * 40 + "'") == 1  # above any 32-character prefix of itself
    assert count("s = 'zz" + "\uffff" * 35 + "'") == 1


def _sink_on(path: str, schema: pa.Schema, with_schema: bool = True) -> DeltaSink:
    s = DeltaSink.from_options({"path": path}, schema if with_schema else None)
    s.validate_destination()
    s.transaction_log().claim("test")
    return s


def _rows_of(sink: DeltaSink) -> list[dict]:
    return sorted(DeltaTable(sink.uri).to_pyarrow_table().to_pylist(), key=lambda r: r["id"])


@pytest.mark.parametrize("with_schema", [True, False])  # False: the runtime's sink, which reads the table itself
def test_delta_sink_inv6_rows_breaking_not_null_or_check_constraints_are_never_committed(tmp_path, with_schema):
    """Before the fix both batches below were committed, and the table held a null id and id -5 despite its
    NOT NULL column and CHECK (id > 0)."""
    from deltalake import write_deltalake
    from twophase.errors import ConstraintViolationError
    path = str(tmp_path / "t")
    table_schema = pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.string())])
    write_deltalake(path, pa.table({"id": [1], "v": ["seed"]}, schema=table_schema))
    DeltaTable(path).alter.add_constraint({"pos": "id > 0"})
    DeltaTable(path).alter.add_constraint({"v_ok": "v <> 'bad'"})
    stream = pa.schema([("id", pa.int64()), ("v", pa.string())])
    sink = _sink_on(path, stream, with_schema)
    version = DeltaTable(path).version()
    for bad, match in ((pa.record_batch({"id": [2, None], "v": ["ok", "x"]}, schema=stream), "'id' is NOT NULL"),
                       (pa.record_batch({"id": [3, -5], "v": ["ok", "x"]}, schema=stream), "CHECK constraint 'pos'"),
                       (pa.record_batch({"id": [4, 6], "v": ["ok", "bad"]}, schema=stream), "'v_ok'"),
                       (pa.record_batch({"id": [4, 6], "v": ["ok", None]}, schema=stream), "'v_ok'")):  # NULL fails
        with pytest.raises(ConstraintViolationError, match=match):
            run_task(sink, TransactionContext(sink.sink_id, 0, "0"), [bad])
    assert DeltaTable(path).version() == version and _rows_of(sink) == [{"id": 1, "v": "seed"}]
    assert not [f for f in os_files(path) if "part-" in f and sink_token(sink.sink_id) in f]  # nothing left behind
    good = run_task(sink, TransactionContext(sink.sink_id, 0, "0"), [pa.record_batch({"id": [7], "v": ["fine"]},
                                                                                      schema=stream)])
    assert CheckpointCoordinator(sink).complete_batch(0, [good], ["0"]) == "COMMITTED"
    assert _rows_of(sink) == [{"id": 1, "v": "seed"}, {"id": 7, "v": "fine"}]


def os_files(root: str) -> list[str]:
    import os
    return [os.path.join(d, n) for d, _, names in os.walk(root) for n in names]


def test_delta_sink_inv6_generated_columns_must_equal_their_expression_and_be_provided(tmp_path):
    from deltalake import Field, Schema
    from twophase.errors import ConstraintViolationError
    path = str(tmp_path / "g")
    DeltaTable.create(path, Schema([Field("id", "long"), Field("g", "long", metadata={
        "delta.generationExpression": "id * 2"})]))
    stream = pa.schema([("id", pa.int64()), ("g", pa.int64())])
    sink = _sink_on(path, stream)
    with pytest.raises(ConstraintViolationError, match="generated column 'g'"):
        run_task(sink, TransactionContext(sink.sink_id, 0, "0"), [pa.record_batch({"id": [1, 2], "g": [2, 5]},
                                                                                   schema=stream)])
    ok = run_task(sink, TransactionContext(sink.sink_id, 0, "0"), [pa.record_batch({"id": [1, 2], "g": [2, 4]},
                                                                                   schema=stream)])
    assert CheckpointCoordinator(sink).complete_batch(0, [ok], ["0"]) == "COMMITTED"
    with pytest.raises(ConfigurationError, match=r"generated columns the stream does not provide: \['g = id \* 2'\]"):
        _sink_on(path, pa.schema([("id", pa.int64())]))


def test_delta_sink_inv6_column_mapping_table_refused_before_any_write(tmp_path):
    """Data files of a column-mapped table name columns by physical name; files written with logical names
    read as nulls in Delta readers that follow the protocol. Refused on the driver."""
    path = str(tmp_path / "cm")
    DeltaTable.create(path, pa.schema([("id", pa.int64())]), configuration={"delta.columnMapping.mode": "name"})
    with pytest.raises(ConfigurationError, match="column mapping"):
        _sink_on(path, pa.schema([("id", pa.int64())]))
    assert not [f for f in os_files(path) if f.endswith(".parquet")]


def test_delta_stats_extreme_timestamps_never_fail_a_write_nor_bound_wrongly() -> None:
    """Spark's timestamp range ends at 9999-12-31 23:59:59.999999, where rounding the max up leaves the years
    datetime can show; year 1 with a zone likewise. The column then has no statistics (before: OverflowError
    failed every task writing such a row, seen in integration/test_types.py)."""
    import datetime as dt
    import json
    utc = dt.timezone.utc
    schema = pa.schema([("ts", pa.timestamp("us", tz="UTC")), ("ntz", pa.timestamp("us")), ("ns", pa.timestamp("ns"))])
    st = _Stats(schema)
    st.update(pa.record_batch({"ts": [dt.datetime(1, 1, 1, tzinfo=utc), dt.datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=utc)],
                               "ntz": [dt.datetime(2020, 1, 1), dt.datetime(9999, 12, 31, 23, 59, 59, 999_000)],
                               "ns": pa.array([1_000_000_001, 2_000_000_999], pa.timestamp("ns"))}, schema=schema))
    stats = json.loads(st.to_json())
    assert "ts" not in stats["maxValues"] and "ts" not in stats["minValues"]
    assert stats["maxValues"]["ntz"] == "9999-12-31T23:59:59.999"  # already a whole millisecond: exact
    assert stats["minValues"]["ns"] == "1970-01-01T00:00:01.000" and stats["maxValues"]["ns"] == "1970-01-01T00:00:02.001"


def test_delta_sink_inv5_merge_schema_adds_nested_struct_fields(tmp_path) -> None:
    from twophase.coordinator import CheckpointCoordinator as Coordinator
    point = pa.struct([("x", pa.int64())])
    old = pa.schema([("id", pa.int64()), ("s", point), ("l", pa.list_(point))])
    uri = str(tmp_path / "nested")
    first = DeltaSink.from_options({"path": uri}, old)
    first.validate_destination()
    first.transaction_log().claim("test")
    first_rows = pa.record_batch([pa.array([1]), pa.array([{"x": 1}], point), pa.array([[{"x": 1}]], pa.list_(point))],
                                 schema=old)
    Coordinator(first).complete_batch(0, [run_task(first, TransactionContext(first.sink_id, 0, "0"), [first_rows])])
    wider_point = pa.struct([("x", pa.int64()), ("y", pa.string())])
    new = pa.schema([("id", pa.int64()), ("s", wider_point), ("l", pa.list_(wider_point))])
    with pytest.raises(ConfigurationError, match=r"s\.y"):  # named, and refused without mergeSchema
        DeltaSink.from_options({"path": uri}, new).validate_destination()
    narrower = pa.schema([("id", pa.int64()), ("s", pa.struct([("y", pa.string())])), ("l", pa.list_(point))])
    with pytest.raises(ConfigurationError, match="column 's'"):  # a dropped field is never merged
        DeltaSink.from_options({"path": uri, "mergeSchema": "true"}, narrower).validate_destination()
    second = DeltaSink.from_options({"path": uri, "mergeSchema": "true", "sink.id": "second"}, new)
    second.validate_destination()
    second.transaction_log().claim("test2")
    Coordinator(second).complete_batch(0, [run_task(second, TransactionContext(second.sink_id, 0, "0"), [
        pa.record_batch([pa.array([2]), pa.array([{"x": 2, "y": "b"}], wider_point),
                         pa.array([[{"x": 2, "y": "b"}]], pa.list_(wider_point))], schema=new)])])
    rows = sorted(DeltaTable(uri).to_pyarrow_table().to_pylist(), key=lambda r: r["id"])
    assert rows == [{"id": 1, "s": {"x": 1, "y": None}, "l": [{"x": 1, "y": None}]},
                    {"id": 2, "s": {"x": 2, "y": "b"}, "l": [{"x": 2, "y": "b"}]}]


def test_delta_sink_inv6_a_constraint_added_while_a_checkpoint_is_in_flight_is_checked_at_commit(tmp_path):
    """The writers checked their rows against the table they saw; ALTER TABLE ADD CONSTRAINT came between
    their pre-commit and the driver's commit. Before the fix the commit added the rows and the table held
    id -5 under CHECK (id > 0)."""
    from deltalake import write_deltalake
    from twophase.errors import ConstraintViolationError
    from twophase.states import CheckpointState
    path = str(tmp_path / "t")
    stream = pa.schema([("id", pa.int64()), ("p", pa.string())])
    write_deltalake(path, pa.table({"id": [1], "p": ["a"]}, schema=stream), partition_by=["p"])
    sink = _sink_on(path, stream)
    acks = [run_task(sink, TransactionContext(sink.sink_id, 0, "0"), [pa.record_batch(
        {"id": [2, -5], "p": ["a", None]}, schema=stream)])]
    DeltaTable(path).alter.add_constraint({"pos": "id > 0", "p_known": "p IS NOT NULL"})
    co = CheckpointCoordinator(sink)
    with pytest.raises(ConstraintViolationError, match=r"(pos|p_known).*checkpoint 0.*twophase log resolve"):
        co.complete_batch(0, acks, ["0"])
    assert _rows_of(sink) == [{"id": 1, "p": "a"}]  # nothing committed
    assert sink.transaction_log().get(0).state is CheckpointState.COMPLETED  # decided, never dropped silently
    # rows that satisfy the requirement the table gained meanwhile are read back, checked, and committed
    path2 = str(tmp_path / "t2")
    write_deltalake(path2, pa.table({"id": [1], "p": ["a"]}, schema=stream), partition_by=["p"])
    sink2 = _sink_on(path2, stream)
    good = [run_task(sink2, TransactionContext(sink2.sink_id, 0, "0"), [pa.record_batch({"id": [3], "p": ["b"]},
                                                                                       schema=stream)])]
    assert good[0].handle["checks"] == {"not_null": [], "checks": []}  # what the writer enforced, in the handle
    DeltaTable(path2).alter.add_constraint({"pos": "id > 0", "p_known": "p IS NOT NULL"})
    assert CheckpointCoordinator(sink2).complete_batch(0, good, ["0"]) == "COMMITTED"
    assert _rows_of(sink2) == [{"id": 1, "p": "a"}, {"id": 3, "p": "b"}]


# ---- review items 14, 15, 18: partition values in UTC, durable Delta commits, 4-digit years


def test_delta_partition_values_inv_timestamps_stored_as_utc_instants() -> None:
    """A UTC-adjusted timestamp partition value is the ISO-8601 instant in UTC, as Delta's own writer stores it
    (readers take a value without an offset as UTC); a timestamp_ntz keeps its wall-clock text. Before the
    fix the folder text was copied: ``2024-01-01 05:00:00-05:00`` (Python path), or Spark's session-local
    ``2024-01-01 05:00:00`` with no offset (native path), read back five hours off."""
    schema = pa.schema([("ts", pa.timestamp("us", tz="UTC")), ("ntz", pa.timestamp("us")), ("v", pa.int64())])
    assert _partition_values("ts=2024-01-01T05%3A00%3A00-05%3A00/ntz=2024-01-01 05%3A00%3A00", schema) == {
        "ts": "2024-01-01T10:00:00.000000Z", "ntz": "2024-01-01 05:00:00.000000"}
    assert _partition_values("ts=2024-01-01 10%3A00%3A00.123", schema) == {"ts": "2024-01-01T10:00:00.123000Z"}
    assert _partition_values("ts=0999-01-01 00%3A00%3A00/ntz=__HIVE_DEFAULT_PARTITION__", schema) == {
        "ts": "0999-01-01T00:00:00.000000Z", "ntz": None}


def test_delta_sink_partition_values_timestamps_read_back_as_the_instants_written(tmp_path) -> None:
    """twophase-delta partitioned by a timestamp column: deltalake and pyarrow read back the exact instants of
    the rows, microseconds and years before 1000 included."""
    import datetime as dt
    ny = pa.timestamp("us", tz="UTC")
    schema = pa.schema([("id", pa.int64()), ("ts", ny)])
    utc = dt.timezone.utc
    instants = [dt.datetime(2024, 1, 1, 10, tzinfo=utc), dt.datetime(2024, 7, 1, 3, 30, 0, 250, tzinfo=utc),
                dt.datetime(999, 12, 31, 23, tzinfo=utc)]
    s = DeltaSink.from_options({"path": str(tmp_path / "t"), "partitionBy": "ts"}, schema)
    s.validate_destination()
    s.transaction_log().claim("test")
    b = pa.record_batch({"id": pa.array([0, 1, 2], pa.int64()), "ts": pa.array(instants, pa.timestamp("us", tz="UTC")).cast(ny)},
                        schema=schema)
    CheckpointCoordinator(s).complete_batch(0, [run_task(s, TransactionContext(s.sink_id, 0, "0"), [b])])
    dt_ = DeltaTable(s.uri)
    values = sorted(pa.table(dt_.get_add_actions(flatten=True)).column("partition.ts").to_pylist(), key=str)
    got = {r["id"]: r["ts"] for r in dt_.to_pyarrow_table().to_pylist()}
    assert {i: got[i].astimezone(utc) for i in got} == dict(enumerate(instants)), (got, values)
    via_arrow = {r["id"]: r["ts"] for r in dt_.to_pyarrow_dataset().to_table().to_pylist()}
    assert {i: via_arrow[i].astimezone(utc) for i in via_arrow} == dict(enumerate(instants)), (via_arrow, values)


def test_delta_sink_inv1_delta_commit_fsynced_before_committed_is_reported(sink, monkeypatch) -> None:
    """The Delta commit file of the checkpoint and the _delta_log directory are fsynced before commit_checkpoint
    returns COMMITTED, and again before ALREADY_COMMITTED (a crashed predecessor may have left the commit
    unsynced): delta-rs does not fsync, and the coordinator records COMMITTED in its fsynced log right after,
    so a power loss could keep the record and lose the Delta version. Fails on 8fc79bb (no fsync)."""
    acks = run_checkpoint(sink, 0)
    c = sink.create_committer()
    handles = [c.decode(a.handle) for a in acks]
    seen = record_fsyncs(monkeypatch)
    assert {r.status for r in c.commit_checkpoint(0, handles)} == {CommitStatus.COMMITTED}
    version = DeltaTable(sink.uri).version()
    log_dir = os.path.join(sink.uri, "_delta_log")
    commit_file = os.path.join(log_dir, f"{version:020d}.json")
    assert commit_file in seen and log_dir in seen, seen
    assert seen.index(log_dir) > seen.index(commit_file)
    seen.clear()
    assert {r.status for r in c.commit_checkpoint(0, handles, recovering=True)} == {CommitStatus.ALREADY_COMMITTED}
    assert commit_file in seen and log_dir in seen, seen


def test_delta_stats_inv_timestamps_before_year_1000_have_four_digit_years() -> None:
    """Timestamp statistics are ISO with 4-digit years, as Delta writes them (strftime's %Y wrote ``999-...``,
    which readers cannot parse)."""
    import datetime as dt
    import json
    from twophase.sinks.delta import _timestamp_json
    schema = pa.schema([("ts", pa.timestamp("us", tz="UTC")), ("ntz", pa.timestamp("us"))])
    st = _Stats(schema)
    st.update(pa.record_batch({"ts": [dt.datetime(999, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)],
                               "ntz": [dt.datetime(12, 1, 1)]}, schema=schema))
    stats = json.loads(st.to_json())
    assert stats["minValues"] == {"ts": "0999-01-02T03:04:05.000Z", "ntz": "0012-01-01T00:00:00.000"}
    assert _timestamp_json(0, upper=True, utc=True) == "1970-01-01T00:00:00.000Z"
