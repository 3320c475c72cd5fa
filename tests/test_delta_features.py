"""Delta table features: twophase-delta writes a table only if every feature of its protocol is on its allow-list
(:data:`twophase.sinks._delta_checks.WRITABLE_FEATURES`), and refuses any other on the driver, naming it, before the
query writes anything (fast tests, no Spark: protocols built as objects, or tiny tables whose first log entry is
written by hand; delta-spark's own tables: integration/delta_spark/test_delta_features.py).

Before the check (issue 24), delta-rs refused type widening, row tracking, clustering, in-commit timestamps,
deletion vectors, v2 checkpoints and unknown writer features only at the Delta commit: the executors had written
the batch's data files by then.
"""

from __future__ import annotations

import json
import os
import time
import uuid

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from deltalake.table import ProtocolVersions

from twophase.coordinator import CheckpointCoordinator
from twophase.errors import ConfigurationError, UnsupportedTableFeatureError
from twophase.sink import TransactionContext, run_task
from twophase.sinks._delta_checks import WRITABLE_FEATURES, check_protocol, unsupported_features
from twophase.sinks.delta import DeltaSink

SCHEMA = pa.schema([("id", pa.int64())])
DELTA_SCHEMA = {"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}}]}


def rw(feature: str) -> ProtocolVersions:
    """A table-features protocol with ``feature`` as a reader-writer feature."""
    return ProtocolVersions(3, 7, [feature], [feature])


def w(feature: str) -> ProtocolVersions:
    """A table-features protocol with ``feature`` as a writer feature."""
    return ProtocolVersions(1, 7, [feature], None)


def refused(protocol: ProtocolVersions, config: dict | None = None) -> UnsupportedTableFeatureError:
    with pytest.raises(UnsupportedTableFeatureError) as e:
        check_protocol(protocol, config, "/t")
    return e.value


@pytest.mark.parametrize("feature", sorted(WRITABLE_FEATURES))
def test_writable_features_pass(feature):
    reader = feature in ("timestampNtz", "deletionVectors")  # reader-writer features
    check_protocol(ProtocolVersions(3 if reader else 1, 7, [feature] if reader else None, [feature]), {}, "/t")


@pytest.mark.parametrize("protocol,feature,fix", [
    (rw("columnMapping"), "columnMapping", "'delta.columnMapping.mode'='none'"),
    (rw("v2Checkpoint"), "v2Checkpoint", "'delta.checkpointPolicy'='classic'"),
    (rw("typeWidening"), "typeWidening", "'delta.enableTypeWidening'='false'"),
    (rw("vacuumProtocolCheck"), "vacuumProtocolCheck", "DROP FEATURE vacuumProtocolCheck"),
    (w("rowTracking"), "rowTracking", "'delta.enableRowTracking'"),
    (w("domainMetadata"), "domainMetadata", "CLUSTER BY"),
    (w("clustering"), "clustering", "without CLUSTER BY"),
    (w("inCommitTimestamp"), "inCommitTimestamp", "'delta.enableInCommitTimestamps'='false'"),
    (w("identityColumns"), "identityColumns", "AS IDENTITY"),
    (w("icebergCompatV2"), "icebergCompatV2", "'delta.enableIcebergCompatV2'='false'"),
    (rw("variantType"), "variantType", "VARIANT"),  # delta-rs commits it; twophase never tested it: refused
    (rw("someFutureFeature"), "someFutureFeature", "'delta.feature.someFutureFeature'"),
    (w("someFutureWriterFeature"), "someFutureWriterFeature", "DROP FEATURE someFutureWriterFeature"),
])
def test_every_other_feature_is_refused_by_name_with_its_fix(protocol, feature, fix):
    e = refused(protocol)
    assert e.features == (feature,)
    assert f"features twophase-delta does not write correctly: {feature}" in str(e) and fix in str(e), str(e)
    assert isinstance(e, ConfigurationError)


def test_all_unwritable_features_are_named_at_once():
    e = refused(ProtocolVersions(3, 7, ["deletionVectors", "typeWidening", "timestampNtz"],
                                 ["appendOnly", "deletionVectors", "typeWidening", "clustering", "domainMetadata"]))
    assert e.features == ("typeWidening", "clustering", "domainMetadata")


@pytest.mark.parametrize("reader,writer,config,expected", [
    (1, 2, {}, []), (1, 3, {}, []), (1, 4, {}, []),
    (2, 5, {}, []),  # column mapping is in force only with a mode
    (2, 5, {"delta.columnMapping.mode": "name"}, ["columnMapping"]),
    (2, 5, {"delta.columnMapping.mode": "id"}, ["columnMapping"]),
    (1, 6, {}, ["identityColumns (implied by minWriterVersion 6)"]),
    (4, 7, {}, ["minReaderVersion 4"]), (1, 8, {}, ["minWriterVersion 8"]),
])
def test_legacy_protocol_versions_imply_their_features(reader, writer, config, expected):
    assert unsupported_features(reader, writer, None, None, config) == expected


# --------------------------------------------------------------------------- tiny tables (delta-rs)


def hand_made_table(path: str, reader: int, writer: int, reader_features=None, writer_features=None,
                    config: dict | None = None, schema: dict | None = None) -> None:
    """A table whose first log entry carries the given protocol (delta-rs creates no table with most features)."""
    os.makedirs(os.path.join(path, "_delta_log"))
    protocol = {"minReaderVersion": reader, "minWriterVersion": writer}
    if reader_features is not None:
        protocol["readerFeatures"] = reader_features
    if writer_features is not None:
        protocol["writerFeatures"] = writer_features
    meta = {"id": str(uuid.uuid4()), "format": {"provider": "parquet", "options": {}},
            "schemaString": json.dumps(schema or DELTA_SCHEMA), "partitionColumns": [], "configuration": config or {},
            "createdTime": int(time.time() * 1000)}
    with open(os.path.join(path, "_delta_log", f"{0:020d}.json"), "w") as f:
        for action in ({"commitInfo": {"timestamp": meta["createdTime"], "operation": "CREATE TABLE"}},
                       {"protocol": protocol}, {"metaData": meta}):
            f.write(json.dumps(action) + "\n")


def table_files(path: str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, n), path) for d, _, names in os.walk(path) for n in names
                  if not os.path.relpath(d, path).startswith("_twophase"))


def write_one_batch(sink: DeltaSink) -> str:
    sink.validate_destination()
    sink.transaction_log().claim("test")
    ack = run_task(sink, TransactionContext(sink.sink_id, 0, "0"), [pa.record_batch({"id": [1, 2]}, schema=SCHEMA)])
    return CheckpointCoordinator(sink).complete_batch(0, [ack], ["0"])


@pytest.mark.parametrize("reader,writer,rf,wf,feature", [
    (3, 7, ["typeWidening"], ["typeWidening"], "typeWidening"),
    (1, 7, None, ["rowTracking"], "rowTracking"),
    (1, 7, None, ["clustering", "domainMetadata"], "clustering"),
    (1, 7, None, ["inCommitTimestamp"], "inCommitTimestamp"),
    (1, 7, None, ["fooBar"], "fooBar"),  # a writer feature nobody knows
    (3, 7, ["fooBar"], ["fooBar"], "fooBar"),  # a reader feature nobody knows: delta-rs cannot even load the table
])
@pytest.mark.parametrize("with_schema", [True, False])
def test_delta_sink_inv6_unwritable_table_feature_refused_on_the_driver_before_any_data_file(
        tmp_path, reader, writer, rf, wf, feature, with_schema):
    """Before the check, the writer features of this list failed only at the Delta commit (delta-rs's
    CommitFailedError 'Unsupported table features required'), after the task had written its data file."""
    path = str(tmp_path / "t")
    hand_made_table(path, reader, writer, rf, wf)
    before = table_files(path)
    sink = DeltaSink.from_options({"path": path}, SCHEMA if with_schema else None)
    with pytest.raises(UnsupportedTableFeatureError, match=feature) as e:
        write_one_batch(sink)
    assert feature in e.value.features
    assert table_files(path) == before, "a data file or log entry was written before the refusal"


@pytest.mark.parametrize("reader,writer,rf,wf,feature", [
    (3, 7, ["catalogManaged"], ["catalogManaged"], "catalogManaged"),  # delta-rs: 'Max catalog version ...'
    (1, 7, None, None, "protocol"),  # delta-rs: 'Invalid protocol action' (writer 7 without writer features)
])
def test_a_table_delta_rs_cannot_load_is_refused_by_name(tmp_path, reader, writer, rf, wf, feature):
    path = str(tmp_path / "t")
    hand_made_table(path, reader, writer, rf, wf)
    with pytest.raises(UnsupportedTableFeatureError, match="cannot even load") as e:
        DeltaSink.from_options({"path": path}, SCHEMA).validate_destination()
    assert e.value.features == (feature,)


@pytest.mark.parametrize("writer_features", [["appendOnly", "invariants", "checkConstraints", "changeDataFeed",
                                              "generatedColumns", "timestampNtz", "deletionVectors"]])
def test_the_allow_list_is_what_delta_rs_commits(tmp_path, writer_features):
    """Every allowed feature on one table: twophase-delta writes and commits it, the protocol unchanged."""
    path = str(tmp_path / "t")
    hand_made_table(path, 3, 7, ["timestampNtz", "deletionVectors"], writer_features)
    before = DeltaTable(path).protocol()
    assert write_one_batch(DeltaSink.from_options({"path": path}, SCHEMA)) == "COMMITTED"
    dt = DeltaTable(path)  # (deltalake's own reader refuses deletion vectors: the Add actions instead)
    assert dt.version() == 1 and pa.table(dt.get_add_actions(flatten=True)).column("num_records").to_pylist() == [2]
    assert dt.protocol() == before


def test_a_feature_added_after_the_driver_checked_is_refused_at_commit(tmp_path):
    """A feature the table gained while a batch was in flight (ALTER TABLE between write and commit): the commit
    refuses it by name, nothing is committed."""
    path = str(tmp_path / "t")
    hand_made_table(path, 1, 2)
    sink = DeltaSink.from_options({"path": path}, SCHEMA)
    sink.validate_destination()
    sink.transaction_log().claim("test")
    ack = run_task(sink, TransactionContext(sink.sink_id, 0, "0"), [pa.record_batch({"id": [1]}, schema=SCHEMA)])
    with open(os.path.join(path, "_delta_log", f"{1:020d}.json"), "w") as f:
        f.write(json.dumps({"commitInfo": {"timestamp": 1, "operation": "SET TBLPROPERTIES"}}) + "\n")
        f.write(json.dumps({"protocol": {"minReaderVersion": 1, "minWriterVersion": 7,
                                         "writerFeatures": ["appendOnly", "invariants", "rowTracking"]}}) + "\n")
    with pytest.raises(UnsupportedTableFeatureError, match="rowTracking"):
        CheckpointCoordinator(sink).complete_batch(0, [ack], ["0"])
    assert DeltaTable(path).version() == 1


@pytest.mark.parametrize("reader,writer,rf,wf", [(1, 2, None, None), (1, 7, None, ["appendOnly", "invariants"])])
def test_legacy_column_invariants_are_written_and_enforced(tmp_path, reader, writer, rf, wf):
    """``invariants`` (delta-spark no longer creates them; older tables have them): allowed, and a row that breaks
    the column's invariant fails the batch with nothing of it committed."""
    from twophase.errors import ConstraintViolationError
    path = str(tmp_path / "t")
    invariant = json.dumps({"expression": {"expression": "id > 0"}})
    hand_made_table(path, reader, writer, rf, wf, schema={"type": "struct", "fields": [
        {"name": "id", "type": "long", "nullable": True, "metadata": {"delta.invariants": invariant}}]})
    sink = DeltaSink.from_options({"path": path}, SCHEMA)
    assert write_one_batch(sink) == "COMMITTED"  # ids 1, 2
    with pytest.raises(ConstraintViolationError, match=r"1 row\(s\) of the batch break the table's invariant on 'id'"):
        run_task(sink, TransactionContext(sink.sink_id, 1, "0"), [pa.record_batch({"id": [3, 0]}, schema=SCHEMA)])
    assert DeltaTable(path).to_pyarrow_table().column("id").to_pylist() == [1, 2]


# --------------------------------------------------------------------------- a sink without a schema


def test_a_sink_without_schema_on_a_missing_table_is_refused_at_validate_naming_the_schema(tmp_path):
    """Before: validate_destination passed, the task wrote its data files, and the commit failed with
    'the table ... is gone'."""
    path = str(tmp_path / "missing")
    sink = DeltaSink.from_options({"path": path})
    with pytest.raises(ConfigurationError, match=r"does not exist and the sink has no schema.*"
                                                 r"DeltaSink.from_options\(options, schema\)"):
        write_one_batch(sink)
    assert not [f for f in table_files(path) if f.endswith(".parquet")]


def test_a_sink_without_schema_adopts_the_streams_and_creates_the_table(tmp_path):
    path = str(tmp_path / "new")
    sink = DeltaSink.from_options({"path": path})
    sink.adopt_schema(SCHEMA)
    assert write_one_batch(sink) == "COMMITTED"
    assert DeltaTable(path).to_pyarrow_table().column("id").to_pylist() == [1, 2]
    other = pa.schema([("id", pa.string())])
    sink.adopt_schema(other)  # a sink keeps the schema it has
    assert sink.options.schema == SCHEMA
