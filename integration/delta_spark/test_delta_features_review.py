"""Adversarial review (session 15) of twophase-delta's table-feature allow-list (sinks/_delta_checks.py, commits
8a41e4b 491c83f 22e585b d762dd4), delta-spark 4.4.0 as the judge (``.venv-delta``, see conftest.py).

twophase's side runs through its Python API (DeltaSink, run_task, CheckpointCoordinator: the code a Spark query
runs), so that another writer's step can be put at an exact point: between a batch's write and its commit, and
between the committer's read of the table (its protocol and constraint checks) and the Delta commit itself
(``deltalake.DeltaTable.create_write_transaction``). delta-spark is the other writer and reads the result.
"""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

pytestmark = [pytest.mark.spark]

#: the races, protocol versions, deletion-vector/CDF and native-path cases (~40 s; they found nothing broken)
#: run with TWOPHASE_DELTA_REVIEW=1; the expression-semantics cases (the defects this review fixed) always run
full_review = pytest.mark.skipif(os.environ.get("TWOPHASE_DELTA_REVIEW") != "1",
                                 reason="TWOPHASE_DELTA_REVIEW=1 runs it (docs/development.md)")

SCHEMA = pa.schema([("id", pa.int64()), ("grp", pa.string()), ("payload", pa.string())])


def rows(ids) -> pa.RecordBatch:
    ids = list(ids)
    return pa.record_batch({"id": ids, "grp": [f"g{i % 3}" for i in ids], "payload": [f"row-{i}" for i in ids]},
                           schema=SCHEMA)


def create(spark, path: str, columns: str = "id BIGINT, grp STRING, payload STRING", props: str = "",
           after: tuple[str, ...] = ()) -> None:
    spark.sql(f"CREATE TABLE delta.`{path}` ({columns}) USING delta {props}")
    for stmt in after:
        spark.sql(stmt.format(t=f"delta.`{path}`"))


def sink_for(path: str, schema: pa.Schema = SCHEMA):
    from twophase.sinks.delta import DeltaSink
    sink = DeltaSink.from_options({"path": path}, schema)
    sink.validate_destination()
    sink.transaction_log().claim("review")
    return sink


def write(sink, cid: int, batch: pa.RecordBatch):
    from twophase.sink import TransactionContext, run_task
    return run_task(sink, TransactionContext(sink.sink_id, cid, "0"), [batch])


def complete(sink, cid: int, ack) -> str:
    from twophase.coordinator import CheckpointCoordinator
    return CheckpointCoordinator(sink).complete_batch(cid, [ack], ["0"])


def spark_ids(spark, path: str) -> list[int]:
    return sorted(r[0] for r in spark.read.format("delta").load(path).select("id").collect())


@pytest.fixture
def before_delta_commit(monkeypatch):
    """``before_delta_commit(fn)``: run ``fn`` once, right before twophase's committer hands its Add actions to
    delta-rs (after it read the table, its protocol and its constraints for this commit)."""
    import deltalake
    orig = deltalake.DeltaTable.create_write_transaction
    pending: list = []

    def hooked(self, *a, **kw):
        while pending:
            pending.pop(0)()
        return orig(self, *a, **kw)

    monkeypatch.setattr(deltalake.DeltaTable, "create_write_transaction", hooked)
    return pending.append


# --------------------------------------------------------------------------- another writer, mid-commit

RACED = [
    # (what delta-spark runs, the error recovery must raise, the feature / requirement it names)
    ("ALTER TABLE {t} SET TBLPROPERTIES ('delta.enableRowTracking' = 'true')", "UnsupportedTableFeatureError",
     "rowTracking"),
    ("ALTER TABLE {t} SET TBLPROPERTIES ('delta.enableTypeWidening' = 'true')", "UnsupportedTableFeatureError",
     "typeWidening"),
    ("ALTER TABLE {t} SET TBLPROPERTIES ('delta.columnMapping.mode' = 'name')", "UnsupportedTableFeatureError",
     "columnMapping"),
    ("ALTER TABLE {t} ADD CONSTRAINT small CHECK (id < 5)", "ConstraintViolationError", "small"),
]


@full_review
@pytest.mark.parametrize("stmt,error,named", RACED, ids=[r[2] for r in RACED])
def test_table_changed_between_the_commit_checks_and_the_delta_commit_commits_nothing(
        spark, tmp_path, before_delta_commit, stmt, error, named):
    """delta-spark commits a feature (or a CHECK constraint the batch breaks) AFTER twophase's committer read the
    table and checked it, BEFORE its Delta commit: the commit's base version is stale. delta-rs's conflict check
    must fail the commit (the other writer's metaData action), nothing of the batch may be in the table, and the
    restart's recovery (which reads the table again) must refuse by name."""
    from twophase.coordinator import CheckpointCoordinator
    path = str(tmp_path / "t")
    create(spark, path)
    sink = sink_for(path)
    assert complete(sink, 0, write(sink, 0, rows(range(0, 3)))) == "COMMITTED"
    ack = write(sink, 1, rows(range(10, 13)))
    before_delta_commit(lambda: spark.sql(stmt.format(t=f"delta.`{path}`")))
    with pytest.raises(Exception) as first:
        complete(sink, 1, ack)
    assert spark_ids(spark, path) == [0, 1, 2], f"the raced commit went in ({first.value!r})"
    with pytest.raises(Exception) as again:  # the restart: recovery commits the COMPLETED checkpoint again
        CheckpointCoordinator(sink_for(path)).recover()
    assert type(again.value).__name__ == error and named in str(again.value), again.value
    assert spark_ids(spark, path) == [0, 1, 2]


@full_review
def test_feature_enabled_between_write_and_commit_refused_by_delta_spark_alter(spark, tmp_path):
    """delta-spark enables a refused feature after the batch's tasks wrote it, before the commit: refused by
    name at commit, nothing committed (the fast test of this writes the protocol by hand; here delta-spark's
    ALTER TABLE writes it)."""
    from twophase.errors import UnsupportedTableFeatureError
    path = str(tmp_path / "t")
    create(spark, path)
    sink = sink_for(path)
    ack = write(sink, 0, rows(range(3)))
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.checkpointPolicy' = 'v2')")
    with pytest.raises(UnsupportedTableFeatureError, match="v2Checkpoint"):
        complete(sink, 0, ack)
    assert spark_ids(spark, path) == []


# --------------------------------------------------------------------------- allowed features, their semantics

def test_not_null_column_of_a_delta_spark_table_refuses_null_rows(spark, tmp_path):
    from twophase.errors import ConstraintViolationError
    path = str(tmp_path / "t")
    create(spark, path, "id BIGINT, grp STRING NOT NULL, payload STRING")
    with pytest.raises(Exception, match="(?i)NOT NULL|null"):
        spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, NULL, 'x')")
    sink = sink_for(path)
    bad = pa.record_batch({"id": [1, 2], "grp": ["g1", None], "payload": ["a", "b"]}, schema=SCHEMA)
    with pytest.raises(ConstraintViolationError, match="grp"):
        write(sink, 0, bad)
    assert spark_ids(spark, path) == []


#: CHECK constraints Spark evaluates one way; twophase evaluates them with DataFusion. Each row: the constraint,
#: ids delta-spark's INSERT accepts, ids it refuses.
SPARK_SEMANTICS = [
    # Spark's `/` of two integers is a DOUBLE division (55 / 10 = 5.5); DataFusion's is an integer one (5)
    ("int_division", "id / 10 <= 5", [50, 41], [55, 59]),
    # a double-quoted string is a string literal in Spark SQL, an identifier in DataFusion
    ("double_quoted_literal", "payload <> \"row-7\"", [1, 2], [7]),
]


#: divergences of DataFusion's functions from Spark's, found by this review (silent: concat skips NULL arguments, so a
#: row delta-spark refuses was committed; loud: substring(s, 0, n) returns n - 1 characters): since then a constraint
#: calling a function outside twophase.sinks._delta_checks.VETTED_FUNCTIONS is refused by name before anything is
#: written (tests/test_delta_check_functions.py without Spark)
SPARK_FUNCTIONS = [
    ("concat_null", "length(concat(grp, payload)) > 0", "concat", "1000, 'g', NULL"),
    ("substring_zero", "substring(payload, 0, 3) = 'row'", "substring", "1, 'g', 'x-1'"),
]


@pytest.mark.parametrize("name,expr,function,refused", SPARK_FUNCTIONS, ids=[f[0] for f in SPARK_FUNCTIONS])
def test_check_constraint_calling_a_function_datafusion_reads_otherwise_is_refused_by_name(spark, tmp_path, name, expr,
                                                                                           function, refused):
    """delta-spark refuses the row; twophase, which cannot evaluate the function as Spark does, refuses the table on
    the driver naming the constraint and the function: nothing written, nothing committed."""
    from twophase.errors import ConfigurationError
    path = str(tmp_path / "t")
    create(spark, path, after=(f"ALTER TABLE {{t}} ADD CONSTRAINT c_{name} CHECK ({expr})",))
    with pytest.raises(Exception, match="(?i)CHECK constraint|violat"):
        spark.sql(f"INSERT INTO delta.`{path}` VALUES ({refused})")
    files = sorted(os.listdir(path))  # delta-spark's refused INSERT may leave its own orphan data file
    with pytest.raises(ConfigurationError, match=rf"c_{name}.*calls {function}"):
        sink_for(path)
    assert spark_ids(spark, path) == []
    assert sorted(os.listdir(path)) == files  # twophase wrote nothing


@pytest.mark.parametrize("name,expr,ok,bad", SPARK_SEMANTICS, ids=[s[0] for s in SPARK_SEMANTICS])
def test_check_constraint_evaluated_as_delta_spark_does(spark, tmp_path, name, expr, ok, bad):
    """A CHECK constraint delta-spark added: every row delta-spark's INSERT refuses, twophase refuses (its batch
    fails, nothing of it committed), and every row delta-spark accepts, twophase writes."""
    from twophase.errors import ConstraintViolationError
    path = str(tmp_path / "t")
    create(spark, path, after=(f"ALTER TABLE {{t}} ADD CONSTRAINT c_{name} CHECK ({expr})",))
    def one(i):  # id i (None: id 1000 with a null payload)
        if i is None:
            return pa.record_batch({"id": [1000], "grp": ["g"], "payload": [None]}, schema=SCHEMA)
        return rows([i])

    for i in bad:  # the judge: delta-spark refuses each of them
        values = "1000, 'g', NULL" if i is None else f"{i}, 'g', 'row-{i}'"
        with pytest.raises(Exception, match="(?i)CHECK constraint|violat"):
            spark.sql(f"INSERT INTO delta.`{path}` VALUES ({values})")
    sink = sink_for(path)
    for cid, i in enumerate(bad):
        with pytest.raises(ConstraintViolationError, match=f"c_{name}"):
            complete(sink, cid, write(sink, cid, one(i)))
    assert spark_ids(spark, path) == [], "twophase committed rows that break the table's CHECK constraint"
    assert complete(sink, 100, write(sink, 100, rows(ok))) == "COMMITTED"
    assert spark_ids(spark, path) == sorted(ok)


def test_check_constraint_on_a_mixed_case_column(spark, tmp_path):
    """Column ``userId`` and ``CHECK (userId >= 0)``: Spark resolves it (case-insensitively); DataFusion
    lower-cases the unquoted identifier and finds no column ``userid``."""
    from twophase.errors import ConstraintViolationError
    path = str(tmp_path / "t")
    create(spark, path, "userId BIGINT, grp STRING", after=("ALTER TABLE {t} ADD CONSTRAINT pos CHECK (userId >= 0)",))
    schema = pa.schema([("userId", pa.int64()), ("grp", pa.string())])
    sink = sink_for(path, schema)
    with pytest.raises(ConstraintViolationError, match="pos"):
        complete(sink, 0, write(sink, 0, pa.record_batch({"userId": [-1], "grp": ["g"]}, schema=schema)))
    assert complete(sink, 1, write(sink, 1, pa.record_batch({"userId": [1], "grp": ["g"]}, schema=schema))) \
        == "COMMITTED"
    assert [r[0] for r in spark.read.format("delta").load(path).select("userId").collect()] == [1]


def test_check_constraint_on_a_column_the_stream_does_not_have(spark, tmp_path):
    """CHECK (extra IS NULL OR extra > 0) on a nullable column the stream leaves out: delta-spark's INSERT of the
    other columns writes NULL there and passes; twophase must write the stream (the column is NULL) too."""
    path = str(tmp_path / "t")
    create(spark, path, "id BIGINT, grp STRING, payload STRING, extra BIGINT",
           after=("ALTER TABLE {t} ADD CONSTRAINT ex CHECK (extra IS NULL OR extra > 0)",))
    spark.sql(f"INSERT INTO delta.`{path}` (id, grp, payload) VALUES (1000, 'g', 'row-1000')")
    sink = sink_for(path)
    assert complete(sink, 0, write(sink, 0, rows([1, 2]))) == "COMMITTED"
    assert spark_ids(spark, path) == [1, 2, 1000]


def test_generated_column_with_spark_division_written(spark, tmp_path):
    """``half DOUBLE GENERATED ALWAYS AS (id / 2)``: delta-spark computes 0.5 for id 1; the stream computes the same
    value with Spark; twophase must accept it (it checks each value equals the expression)."""
    path = str(tmp_path / "t")
    create(spark, path, "id BIGINT, grp STRING, payload STRING, half DOUBLE GENERATED ALWAYS AS (id / 2)")
    spark.sql(f"INSERT INTO delta.`{path}` (id, grp, payload) VALUES (1001, 'g', 'row-1001')")
    assert spark.read.format("delta").load(path).select("half").collect()[0][0] == 500.5
    schema = SCHEMA.append(pa.field("half", pa.float64()))
    b = rows([1, 2, 3])
    batch = pa.record_batch(list(b.columns) + [pa.array([0.5, 1.0, 1.5])], schema=schema)
    sink = sink_for(path, schema)
    assert complete(sink, 0, write(sink, 0, batch)) == "COMMITTED"
    assert spark_ids(spark, path) == [1, 2, 3, 1001]


# --------------------------------------------------------------------------- protocols: legacy, dropped

LEGACY = [
    # (reader, writer, extra properties, written?)
    (1, 3, {}, True),
    (1, 4, {}, True),
    (2, 5, {}, True),  # column mapping supported, mode none
    (1, 6, {}, False),  # identity columns implied: refused although the table has none (conservative)
]


@full_review
@pytest.mark.parametrize("reader,writer,props,written", LEGACY, ids=[f"r{r}w{w}" for r, w, _, _ in LEGACY])
def test_legacy_protocol_versions(spark, tmp_path, reader, writer, props, written):
    from twophase.errors import UnsupportedTableFeatureError
    path = str(tmp_path / "t")
    all_props = {"delta.minReaderVersion": str(reader), "delta.minWriterVersion": str(writer), **props}
    create(spark, path, props="TBLPROPERTIES (" + ", ".join(f"'{k}' = '{v}'" for k, v in all_props.items()) + ")")
    d = spark.sql(f"DESCRIBE DETAIL delta.`{path}`").collect()[0]
    assert (d["minReaderVersion"], d["minWriterVersion"]) == (reader, writer), d
    if not written:
        with pytest.raises(UnsupportedTableFeatureError):
            sink_for(path)
        return
    sink = sink_for(path)
    assert complete(sink, 0, write(sink, 0, rows(range(4)))) == "COMMITTED"
    assert spark_ids(spark, path) == [0, 1, 2, 3]
    d2 = spark.sql(f"DESCRIBE DETAIL delta.`{path}`").collect()[0]
    assert (d2["minReaderVersion"], d2["minWriterVersion"]) == (reader, writer)


def test_table_after_drop_feature(spark, tmp_path):
    """A refused feature dropped with ALTER TABLE ... DROP FEATURE (delta-spark 4.4 without TRUNCATE HISTORY
    leaves checkpointProtection): twophase either writes the table or refuses by a name whose fix works."""
    from twophase.errors import UnsupportedTableFeatureError
    path = str(tmp_path / "t")
    create(spark, path, props="TBLPROPERTIES ('delta.enableTypeWidening' = 'true')")
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.enableTypeWidening' = 'false')")
    spark.sql(f"ALTER TABLE delta.`{path}` DROP FEATURE typeWidening")
    features = sorted(spark.sql(f"DESCRIBE DETAIL delta.`{path}`").collect()[0]["tableFeatures"])
    try:
        sink = sink_for(path)
    except UnsupportedTableFeatureError as e:
        assert set(e.features) <= {"checkpointProtection"}, (features, e)
        assert "DROP FEATURE checkpointProtection TRUNCATE HISTORY" in str(e), f"the fix named does not remove it: {e}"
        # the command is delta-spark's: it refuses only because the history since the drop is younger than the
        # log retention (not a syntax or unknown-feature error)
        with pytest.raises(Exception, match="(?i)retention|TRUNCATE|wait|history") as refused:
            spark.sql(f"ALTER TABLE delta.`{path}` DROP FEATURE checkpointProtection TRUNCATE HISTORY")
        assert "PARSE_SYNTAX_ERROR" not in str(refused.value), refused.value
        return
    assert complete(sink, 0, write(sink, 0, rows(range(3)))) == "COMMITTED"
    assert spark_ids(spark, path) == [0, 1, 2]


# --------------------------------------------------------------------------- deletion vectors, change data feed

@full_review
def test_delete_racing_twophase_commit_on_a_deletion_vector_and_cdf_table(spark, tmp_path, before_delta_commit):
    """deletionVectors + changeDataFeed: delta-spark DELETEs rows of twophase's own file (a deletion vector on it)
    and OPTIMIZEs, each between twophase's commit checks and its Delta commit; delta-rs writes checkpoints
    (interval 2) after twophase's commits. delta-spark then reads: deleted rows stay deleted, every other row
    once, and the change feed has an insert per twophase row and a delete per deleted row."""
    path = str(tmp_path / "t")
    create(spark, path, props="TBLPROPERTIES ('delta.enableDeletionVectors' = 'true', "
                              "'delta.enableChangeDataFeed' = 'true', 'delta.checkpointInterval' = '2')")
    sink = sink_for(path)
    t = f"delta.`{path}`"
    assert complete(sink, 0, write(sink, 0, rows(range(0, 10)))) == "COMMITTED"
    before_delta_commit(lambda: spark.sql(f"DELETE FROM {t} WHERE id IN (3, 4)"))
    assert complete(sink, 1, write(sink, 1, rows(range(10, 20)))) == "COMMITTED"
    ops = {r["operation"]: r for r in spark.sql(f"DESCRIBE HISTORY {t}").collect()}
    assert int(ops["DELETE"]["operationMetrics"]["numDeletionVectorsAdded"]) == 1, ops["DELETE"]
    before_delta_commit(lambda: spark.sql(f"DELETE FROM {t} WHERE id = 15"))
    assert complete(sink, 2, write(sink, 2, rows(range(20, 30)))) == "COMMITTED"
    before_delta_commit(lambda: spark.sql(f"OPTIMIZE {t}"))
    assert complete(sink, 3, write(sink, 3, rows(range(30, 40)))) == "COMMITTED"
    assert complete(sink, 4, write(sink, 4, rows(range(40, 50)))) == "COMMITTED"
    expected = [i for i in range(50) if i not in (3, 4, 15)]
    assert spark_ids(spark, path) == expected
    assert any(n.endswith(".checkpoint.parquet") for n in __import__("os").listdir(path + "/_delta_log"))
    changes = (spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", 1).load(path)
               .select("id", "_change_type").collect())
    got = sorted((r["id"], r["_change_type"]) for r in changes)
    assert got == sorted([(i, "insert") for i in range(50)] + [(i, "delete") for i in (3, 4, 15)]), got


# --------------------------------------------------------------------------- timestamp_ntz

NTZ = ["0001-01-01 00:00:00", "1899-12-31 23:59:59.999999", "2024-03-10 02:30:00.654321", "9999-12-31 23:59:59.999999"]


def test_timestamp_ntz_extremes_round_trip_and_filter_through_stats(spark, tmp_path):
    """timestamp_ntz values at the ends of Delta's range and with microseconds: delta-spark reads each exactly, and
    a filter on each one (data skipping on the min/max statistics twophase writes) finds its row."""
    import datetime as dt
    path = str(tmp_path / "t")
    create(spark, path, "id BIGINT, ntz TIMESTAMP_NTZ")
    schema = pa.schema([("id", pa.int64()), ("ntz", pa.timestamp("us"))])
    values = [dt.datetime.fromisoformat(v) for v in NTZ]
    sink = sink_for(path, schema)
    batch = pa.record_batch({"id": list(range(len(values))), "ntz": pa.array(values, pa.timestamp("us"))},
                            schema=schema)
    assert complete(sink, 0, write(sink, 0, batch)) == "COMMITTED"
    t = f"delta.`{path}`"
    got = sorted(tuple(r) for r in spark.sql(f"SELECT id, CAST(ntz AS STRING) FROM {t}").collect())
    assert got == [(i, v.rstrip("0").rstrip(".") if "." in v else v) for i, v in enumerate(NTZ)], got
    for i, v in enumerate(NTZ):
        for op in ("=", ">=", "<="):
            found = [r[0] for r in spark.sql(f"SELECT id FROM {t} WHERE ntz {op} TIMESTAMP_NTZ'{v}'").collect()]
            assert i in found, (op, v, found)


# --------------------------------------------------------------------------- the native path

@full_review
def test_native_path_refuses_a_feature_enabled_between_its_batches(spark, tmp_path):
    """native_sink('delta'): a feature delta-spark enables after the query's first batch is refused by name at the
    next commit; nothing of that batch is in the table."""
    from integration.delta_spark.test_delta_features import stream
    from integration.fileio import make_input
    table, inp, ck = str(tmp_path / "t"), str(tmp_path / "in"), str(tmp_path / "ck")
    create(spark, table)
    ids = make_input(inp, 1, 10)
    stream(spark, inp, table, ck, "native")
    assert spark_ids(spark, table) == ids
    spark.sql(f"ALTER TABLE delta.`{table}` SET TBLPROPERTIES ('delta.enableTypeWidening' = 'true')")
    make_input(inp, 1, 10, start=10)
    with pytest.raises(Exception, match=r"UnsupportedTableFeatureError[\s\S]*typeWidening"):
        stream(spark, inp, table, ck, "native")
    assert spark_ids(spark, table) == ids
