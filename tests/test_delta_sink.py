"""Fast tests of the Delta sink on a local table (no server, no Spark): the driver and executor hooks."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from sinks.delta import DeltaSink, _partition_values, _Stats
from twophase.coordinator import CheckpointCoordinator
from twophase.errors import ConfigurationError
from twophase.sink import TransactionContext, run_task

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
    sink.commit_checkpoint(3, [a.handle for a in acks])
    sink.commit_checkpoint(3, [a.handle for a in acks])  # e.g. recovery after a crash before COMMITTED
    sink.commit_checkpoint(2, [a.handle for a in acks])  # an older checkpoint is also already in
    dt = DeltaTable(sink.uri)
    assert dt.version() == 1 and dt.to_pyarrow_table().num_rows == 20


def test_delta_sink_inv3_abort_deletes_only_the_handles_files(sink) -> None:
    co = CheckpointCoordinator(sink)
    co.complete_batch(0, run_checkpoint(sink, 0))
    before = set(sink.files.list_data())
    acks = run_checkpoint(sink, 1)
    for a in acks:
        sink.abort(a.handle)
    assert set(sink.files.list_data()) == before
    assert DeltaTable(sink.uri).to_pyarrow_table().num_rows == 20


def test_delta_sink_inv4_abort_lingering_deletes_unreferenced_files_once(sink) -> None:
    co = CheckpointCoordinator(sink, sweep_after_commit=False)
    co.complete_batch(0, run_checkpoint(sink, 0))
    run_checkpoint(sink, 1)  # a crashed attempt: files without a commit
    assert sink.abort_lingering(0) == 0  # checkpoint 1 is not <= 0
    assert sink.abort_lingering(1) == 0  # no final record of checkpoint 1 proves its files orphaned: kept
    run_checkpoint(sink, 2)  # another crashed attempt, then the re-run of checkpoint 2 commits
    co.complete_batch(2, run_checkpoint(sink, 2))
    committed = {f["rel"] for cid in (0, 2) for h in sink.transaction_log().get(cid).handles.values()
                 for f in h["files"]}
    assert sink.abort_lingering(2) == 4  # the crashed attempt of 2; checkpoint 1 has still no record
    assert {r for r in sink.files.list_data() if "-00000001-" not in r} == committed
    assert DeltaTable(sink.uri).to_pyarrow_table().num_rows == 40
    run_checkpoint(sink, 2)
    assert sink.abort_lingering(2) == 0  # checkpoint 2 was scanned already (watermark)


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
