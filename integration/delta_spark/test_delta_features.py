"""Tables delta-spark creates with Delta table features, appended to by twophase-delta (issue 24; ``.venv-delta``:
PySpark 4.2 + delta-spark 4.4, see conftest.py).

For each feature delta-spark makes the table (TBLPROPERTIES, CLUSTER BY, GENERATED columns, ALTER TABLE ADD
CONSTRAINT) and twophase-delta appends to it. Then EITHER

- *written*: delta-spark reads back every row exactly (its own reader, through the checkpoints delta-rs writes
  after twophase's commits: ``delta.checkpointInterval`` 2), its constraints hold on every row, and the table's
  protocol, features and properties are unchanged; where Delta refuses a row (a CHECK constraint, a generated
  column's value) twophase refuses it too, and commits nothing of its batch;
- or *refused*: the query fails on the driver before it writes anything (no new Parquet file under the table,
  no new ``_delta_log`` entry) with ``UnsupportedTableFeatureError`` naming the feature and what removes it.

The refusals run through the three ways into twophase-delta: ``format("twophase-delta")``, ``foreach_batch(
DeltaSink.from_options(...))`` (no schema: the sink takes the batch's) and ``native_sink("delta")``; they share
the driver's check (twophase.sinks._delta_checks.check_protocol). The table in docs/delta.md lists the results.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Callable, Optional

import pytest

from integration.fileio import INPUT_SCHEMA, make_input

pytestmark = [pytest.mark.spark]

BASE_COLUMNS = "id BIGINT, grp STRING, payload STRING"


@dataclass
class Case:
    name: str
    #: extra column definitions after BASE_COLUMNS
    columns: str = ""
    properties: dict[str, str] = field(default_factory=dict)
    clause: str = ""  # e.g. CLUSTER BY (id)
    after: tuple[str, ...] = ()  # SQL run after CREATE ({t} is the table)
    #: the stream's extra columns, as SQL expressions on id (the table's extra columns)
    select: tuple[str, ...] = ()
    #: rows delta-spark leaves in the table before twophase appends (its ``after`` statements)
    seeded: tuple[tuple, ...] = ()


def create(spark, path: str, case: Case) -> None:
    cols = BASE_COLUMNS + (", " + case.columns if case.columns else "")
    props = ", ".join(f"'{k}' = '{v}'" for k, v in case.properties.items())
    spark.sql(f"CREATE TABLE delta.`{path}` ({cols}) USING delta {case.clause} "
              f"{'TBLPROPERTIES (' + props + ')' if props else ''}")
    for stmt in case.after:
        spark.sql(stmt.format(t=f"delta.`{path}`"))


def detail(spark, path: str) -> dict:
    """The table's protocol, features and properties as delta-spark reads them."""
    d = spark.sql(f"DESCRIBE DETAIL delta.`{path}`").collect()[0].asDict()
    return {"minReaderVersion": d["minReaderVersion"], "minWriterVersion": d["minWriterVersion"],
            "tableFeatures": sorted(d.get("tableFeatures") or []), "properties": dict(d["properties"]),
            "clusteringColumns": list(d.get("clusteringColumns") or [])}


def snapshot(path: str) -> tuple[list[str], list[str]]:
    """(data files, _delta_log entries) under the table."""
    data, log = [], []
    for d, _, names in os.walk(path):
        rel = os.path.relpath(d, path)
        for n in names:
            if rel.startswith("_delta_log"):
                log.append(n)
            elif n.endswith(".parquet"):
                data.append(os.path.join(rel, n))
    return sorted(data), sorted(log)


def stream(spark, inp: str, table: str, ck: str, how: str, select: tuple[str, ...] = ()) -> None:
    """Every file of ``inp`` into ``table``, one file per micro-batch (availableNow), by ``how``: ``format``
    (format("twophase-delta")), ``foreach`` (foreach_batch(DeltaSink.from_options) with no schema) or ``native``
    (native_sink("delta")); re-raise the query's failure."""
    import twophase.spark
    df = spark.readStream.schema(INPUT_SCHEMA).option("maxFilesPerTrigger", 1).json(inp)
    if select:
        df = df.selectExpr("*", *select)
    w = df.writeStream.option("checkpointLocation", ck)
    if how == "format":
        w = w.format("twophase-delta").option("path", table)
    elif how == "foreach":
        from twophase.sinks.delta import DeltaSink
        w = w.foreachBatch(twophase.spark.foreach_batch(DeltaSink.from_options({"path": table}), owner=ck))
    else:
        w = w.foreachBatch(twophase.spark.native_sink("delta", path=table, checkpointLocation=ck))
    q = w.trigger(availableNow=True).start()
    try:
        assert q.awaitTermination(240), "the query did not finish"
    finally:
        q.stop()
    if q.exception() is not None:
        raise q.exception()


def delta_rows(spark, path: str, columns: str = "*") -> list[tuple]:
    return sorted(tuple(r) for r in spark.read.format("delta").load(path).selectExpr(columns).collect())


def expected_rows(ids: list[int], select: tuple[str, ...], spark) -> list[tuple]:
    """The rows of ``ids`` as the stream makes them (the select's expressions evaluated by Spark)."""
    df = spark.createDataFrame([(i, f"g{i % 3}", f"row-{i}") for i in ids], BASE_COLUMNS)
    if select:
        df = df.selectExpr("*", *select)
    return sorted(tuple(r) for r in df.collect())


# --------------------------------------------------------------------------- written correctly

WRITTEN = [
    Case("appendOnly", properties={"delta.appendOnly": "true"}),
    Case("changeDataFeed", properties={"delta.enableChangeDataFeed": "true"}),
    Case("checkConstraints", after=("ALTER TABLE {t} ADD CONSTRAINT id_ok CHECK (id >= 0 AND payload LIKE 'row-%')",)),
    Case("generatedColumns", columns="twice BIGINT GENERATED ALWAYS AS (id * 2)", select=("id * 2 AS twice",)),
    Case("timestampNtz", columns="ntz TIMESTAMP_NTZ",
         select=("timestamp_ntz'2024-03-10 02:30:00.654321' + make_dt_interval(0, 0, 0, id) AS ntz",)),
    # delta-spark deletes a row of its own file with a deletion vector before twophase appends: it stays deleted
    Case("deletionVectors", properties={"delta.enableDeletionVectors": "true"},
         after=("INSERT INTO {t} VALUES (1000, 'g1', 'row-1000'), (1001, 'g2', 'row-1001'), (1002, 'g0', 'row-1002')",
                "DELETE FROM {t} WHERE id = 1001"),
         seeded=((1000, "g1", "row-1000"), (1002, "g0", "row-1002"))),
]


@pytest.mark.parametrize("case", WRITTEN, ids=[c.name for c in WRITTEN])
def test_feature_written_correctly(spark, tmp_path, case):
    table, inp, ck = str(tmp_path / "t"), str(tmp_path / "in"), str(tmp_path / "ck")
    # delta-rs writes a checkpoint after twophase's commits, which delta-spark then reads
    create(spark, table, replace(case, properties={**case.properties, "delta.checkpointInterval": "2"}))
    before = detail(spark, table)
    assert case.name in before["tableFeatures"] or before["minWriterVersion"] < 7, before
    history = sorted(spark.sql(f"DESCRIBE HISTORY delta.`{table}`").collect(), key=lambda r: r["version"])
    created = history[-1]["version"]
    if case.name == "deletionVectors":
        assert int(history[-1]["operationMetrics"]["numDeletionVectorsAdded"]) == 1, history[-1]
    ids = make_input(inp, 3, 20)
    stream(spark, inp, table, ck, "format", case.select)
    assert delta_rows(spark, table) == sorted(expected_rows(ids, case.select, spark) + list(case.seeded))
    assert detail(spark, table) == before, "twophase-delta changed the table's protocol, features or properties"
    history = sorted(spark.sql(f"DESCRIBE HISTORY delta.`{table}`").collect(), key=lambda r: r["version"])
    assert [r["operation"] for r in history if r["version"] > created] == ["WRITE"] * 3, "one commit per batch"
    assert any(n.endswith(".checkpoint.parquet") and int(n.split(".")[0]) > created for n in snapshot(table)[1]), \
        "delta-rs wrote no checkpoint after twophase's commits"
    if case.name == "changeDataFeed":  # every appended row is an insert in Delta's change feed
        changes = (spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", 0)
                   .load(table).select("id", "_change_type").collect())
        assert sorted((r["id"], r["_change_type"]) for r in changes) == [(i, "insert") for i in sorted(ids)]


def test_check_constraint_violation_refused_by_both(spark, tmp_path):
    """A row that breaks a CHECK constraint: delta-spark's INSERT refuses it, and twophase-delta fails the batch
    (ConstraintViolationError) with nothing of it committed; the rows before it are in the table."""
    table, inp, ck = str(tmp_path / "t"), str(tmp_path / "in"), str(tmp_path / "ck")
    create(spark, table, Case("check", after=("ALTER TABLE {t} ADD CONSTRAINT id_small CHECK (id < 10)",)))
    with pytest.raises(Exception, match="(?i)CHECK constraint"):
        spark.sql(f"INSERT INTO delta.`{table}` VALUES (10, 'g1', 'row-10')")
    ids = make_input(inp, 1, 10)  # 0..9: allowed
    stream(spark, inp, table, ck, "format")
    make_input(inp, 1, 10, start=5)  # 5..14: 10..14 break it
    with pytest.raises(Exception, match=r"ConstraintViolationError[\s\S]*id_small"):
        stream(spark, inp, table, ck, "format")
    assert delta_rows(spark, table, "id") == [(i,) for i in ids]


def test_generated_column_mismatch_refused_by_both(spark, tmp_path):
    table, inp, ck = str(tmp_path / "t"), str(tmp_path / "in"), str(tmp_path / "ck")
    create(spark, table, Case("gen", columns="twice BIGINT GENERATED ALWAYS AS (id * 2)"))
    with pytest.raises(Exception, match="(?i)generated column|CHECK constraint"):
        spark.sql(f"INSERT INTO delta.`{table}` VALUES (1, 'g1', 'row-1', 3)")
    make_input(inp, 1, 5)
    with pytest.raises(Exception, match=r"ConstraintViolationError[\s\S]*generated column 'twice'"):
        stream(spark, inp, table, ck, "format", ("id * 3 AS twice",))
    assert delta_rows(spark, table) == []


# --------------------------------------------------------------------------- refused before writing

@dataclass
class Refused:
    case: Case
    features: tuple[str, ...]  # named in the error (UnsupportedTableFeatureError.features)
    fix: str  # named in the error: the property or command that removes the feature
    how: str = "format"


REFUSED = [
    Refused(Case("columnMapping-name", properties={"delta.columnMapping.mode": "name"}),
            ("columnMapping",), "'delta.columnMapping.mode'='none'", "native"),
    Refused(Case("columnMapping-id", properties={"delta.columnMapping.mode": "id"}),
            ("columnMapping",), "'delta.columnMapping.mode'='none'"),
    Refused(Case("v2Checkpoint", properties={"delta.checkpointPolicy": "v2"}),
            ("v2Checkpoint",), "'delta.checkpointPolicy'='classic'", "foreach"),
    Refused(Case("typeWidening", properties={"delta.enableTypeWidening": "true"}),
            ("typeWidening",), "'delta.enableTypeWidening'='false'", "native"),
    Refused(Case("identityColumns", columns="rid BIGINT GENERATED ALWAYS AS IDENTITY"),
            ("identityColumns",), "AS IDENTITY"),
    Refused(Case("clustering", clause="CLUSTER BY (id)"), ("clustering",), "without CLUSTER BY", "foreach"),
    Refused(Case("rowTracking", properties={"delta.enableRowTracking": "true"}),
            ("rowTracking",), "'delta.enableRowTracking'"),
    Refused(Case("inCommitTimestamp", properties={"delta.enableInCommitTimestamps": "true"}),
            ("inCommitTimestamp",), "'delta.enableInCommitTimestamps'='false'", "native"),
    Refused(Case("domainMetadata", properties={"delta.feature.domainMetadata": "supported"}),
            ("domainMetadata",), "CLUSTER BY"),
    Refused(Case("vacuumProtocolCheck", properties={"delta.feature.vacuumProtocolCheck": "supported"}),
            ("vacuumProtocolCheck",), "DROP FEATURE vacuumProtocolCheck", "foreach"),
    # delta-rs commits to such a table; twophase-delta never tested it, so the allow-list refuses it by name
    Refused(Case("variantType", properties={"delta.feature.variantType": "supported"}),
            ("variantType",), "VARIANT"),
]


@pytest.mark.parametrize("r", REFUSED, ids=[f"{r.case.name}-{r.how}" for r in REFUSED])
def test_feature_refused_before_writing(spark, tmp_path, r):
    table, inp, ck = str(tmp_path / "t"), str(tmp_path / "in"), str(tmp_path / "ck")
    create(spark, table, r.case)
    before, files = detail(spark, table), snapshot(table)
    for f in r.features:
        assert f in before["tableFeatures"], (f, before)
    make_input(inp, 1, 10)
    with pytest.raises(Exception) as e:
        stream(spark, inp, table, ck, r.how)
    text = str(e.value)
    assert "UnsupportedTableFeatureError" in text, text[-3000:]
    for f in r.features:
        assert f"does not write correctly: " in text and f in text, text[-3000:]
    assert r.fix in text, text[-3000:]
    assert snapshot(table) == files, "a data file or _delta_log entry was written before the refusal"
    assert detail(spark, table) == before


# --------------------------------------------------------------------------- foreach_batch with no schema


def test_foreach_batch_without_schema_creates_the_table_from_the_first_batch(spark, tmp_path):
    """``foreach_batch(DeltaSink.from_options({"path": new}))``: the table is created from the first batch's
    columns, as format("twophase-delta") creates it (before: the tasks wrote their files and the commit failed
    with 'the table ... is gone')."""
    table, inp, ck = str(tmp_path / "new"), str(tmp_path / "in"), str(tmp_path / "ck")
    ids = make_input(inp, 2, 10)
    stream(spark, inp, table, ck, "foreach")
    assert delta_rows(spark, table) == expected_rows(ids, (), spark)
