"""Sweeps that find names by :mod:`twophase.naming` never take a nested destination's files: two destinations,
one inside the other, given the same explicit ``sink.id`` have the same token (and two logs), so a name's
token alone does not prove it is the outer sink's. The outer sink's sweep takes only names where it puts its
files (directly under its path, or under the folders of its own partition columns in order,
:func:`twophase.naming.own_part_rel`: a Hive-looking ``region=eu`` folder of another column is not its layout).
The S3 and Azure file sinks' cases run against their servers (``integration/s3``, ``integration/azure``);
the Delta sink's whole-table listing runs here, on a local table."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from twophase.coordinator import CheckpointCoordinator
from twophase.sink import TransactionContext, run_task
from twophase.sinks.delta import DeltaSink

SCHEMA = pa.schema([("id", pa.int64()), ("p", pa.string())])


def _batch(start: int) -> pa.RecordBatch:
    return pa.record_batch({"id": pa.array(range(start, start + 10), pa.int64()), "p": ["a"] * 10}, schema=SCHEMA)


def _sink(path: str, **extra: str) -> DeltaSink:
    s = DeltaSink.from_options({"path": path, "sink.id": "same", **extra}, SCHEMA)
    s.validate_destination()
    s.transaction_log().claim(f"query of {path}")
    return s


@pytest.mark.parametrize("nested", ["eu", "region=eu"])
def test_naming_delta_whole_table_sweep_never_deletes_a_nested_tables_committed_files(tmp_path, nested) -> None:
    """Delta tables t (partitioned by p) and t/<nested> with the same sink.id: t's whole-table listing sweep sees
    the nested table's committed data files (its token, checkpoint ids t's log has COMMITTED with other files)
    and must leave them: the nested table still reads every row it committed, and t's own loser is swept.
    ``region=eu`` is the one-job-per-partition layout: it looks like a Hive partition folder, but ``region`` is
    not t's partition column, so its files are not t's."""
    outer = _sink(str(tmp_path / "t"), partitionBy="p", **{"log.retain": "2"})  # every sweep lists the whole table
    inner = _sink(str(tmp_path / "t" / nested))
    loser = run_task(outer, TransactionContext(outer.sink_id, 1, "out-0"), [_batch(5000)])  # a runtime task's loser
    for cid in (0, 1):
        CheckpointCoordinator(inner).complete_batch(cid, [run_task(inner, TransactionContext(inner.sink_id, cid, "0"),
                                                                    [_batch(cid * 100)])])
        CheckpointCoordinator(outer, sweep_after_commit=True).complete_batch(cid, [run_task(outer, TransactionContext(outer.sink_id, cid, "0"),
                                                                    [_batch(1000 + cid * 100)])])
    assert sorted(DeltaTable(inner.uri).to_pyarrow_table().column("id").to_pylist()) == list(range(0, 10)) + \
        list(range(100, 110))
    assert sorted(DeltaTable(outer.uri).to_pyarrow_table().column("id").to_pylist()) == \
        list(range(1000, 1010)) + list(range(1100, 1110))
    assert not any((tmp_path / "t" / f["rel"]).exists() for f in loser.handle["files"]), "the loser was not swept"


def test_naming_delta_whole_table_sweep_of_an_unpartitioned_table_keeps_a_nested_tables_files(tmp_path) -> None:
    """An unpartitioned Delta table t's sweep takes only names directly under t: t/region=eu (same sink.id)
    keeps its committed files, and t's own loser at its root is swept."""
    outer = _sink(str(tmp_path / "t"), **{"log.retain": "2"})
    inner = _sink(str(tmp_path / "t" / "region=eu"), partitionBy="p")
    loser = run_task(outer, TransactionContext(outer.sink_id, 1, "out-0"), [_batch(5000)])
    for cid in (0, 1):
        CheckpointCoordinator(inner).complete_batch(cid, [run_task(inner, TransactionContext(inner.sink_id, cid, "0"),
                                                                    [_batch(cid * 100)])])
        CheckpointCoordinator(outer, sweep_after_commit=True).complete_batch(cid, [run_task(outer, TransactionContext(outer.sink_id, cid, "0"),
                                                                    [_batch(1000 + cid * 100)])])
    assert sorted(DeltaTable(inner.uri).to_pyarrow_table().column("id").to_pylist()) == list(range(0, 10)) + \
        list(range(100, 110))
    assert not any((tmp_path / "t" / f["rel"]).exists() for f in loser.handle["files"]), "the loser was not swept"
