"""twophase-delta checks every row against the table's CHECK constraints, invariants and generation expressions with
DataFusion; a function whose meaning there is not Spark's (delta-spark's writers judge the same table) is refused on
the driver, by name, before anything is written (review 15 of the Delta allow-list: CHECK (length(concat(grp,
payload)) > 0) let a row with a NULL payload through, because DataFusion's concat skips NULL arguments where Spark's
returns NULL). delta-spark's side: integration/delta_spark/test_delta_features_review.py."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from twophase.coordinator import CheckpointCoordinator
from twophase.errors import ConfigurationError
from twophase.sink import TransactionContext, run_task
from twophase.sinks._delta_checks import VETTED_FUNCTIONS, unvetted_calls
from twophase.sinks.delta import DeltaSink

from tests.test_delta_features import hand_made_table  # noqa: E402

STREAM = pa.schema([("id", pa.int64()), ("grp", pa.string()), ("payload", pa.string())])


def _table(tmp_path, constraint: str) -> str:
    """An empty table as delta-spark leaves one after ``ADD CONSTRAINT c CHECK (<constraint>)`` (writer version 3); delta-rs itself cannot add (or parse) a constraint that calls these functions, so the log is written here."""
    path = str(tmp_path / "t")
    field = lambda name, t: {"name": name, "type": t, "nullable": True, "metadata": {}}  # noqa: E731
    schema = {"type": "struct", "fields": [field("id", "long"), field("grp", "string"), field("payload", "string")]}
    hand_made_table(path, 1, 3, config={"delta.constraints.c": constraint}, schema=schema)
    return path


@pytest.mark.parametrize("constraint, function", [
    ("length(concat(grp, payload)) > 0", "concat"),        # silent before: NULL payload committed
    ("substring(payload, 0, 3) = 'row'", "substring"),     # loud before: rows delta-spark accepts refused
    ("CAST(id AS STRING) <> '7'", "cast"),
])
def test_delta_inv6_a_check_calling_a_function_datafusion_may_read_otherwise_is_refused_by_name(tmp_path, constraint,
                                                                                               function):
    path = _table(tmp_path, constraint)
    version = DeltaTable(path).version()
    with pytest.raises(ConfigurationError, match=rf"CHECK constraint 'c'.*calls {function}.*DROP CONSTRAINT") as e:
        sink = DeltaSink.from_options({"path": path}, STREAM)
        sink.validate_destination()
        run_task(sink, TransactionContext(sink.sink_id, 0, "0"),
                 [pa.record_batch({"id": [2], "grp": ["g"], "payload": [None]}, schema=STREAM)])
    assert "twophase-delta" in str(e.value)
    assert DeltaTable(path).version() == version and DeltaTable(path).to_pyarrow_table().num_rows == 0


def test_delta_inv6_a_check_calling_only_vetted_functions_is_enforced(tmp_path):
    path = _table(tmp_path, "coalesce(length(lower(payload)), 0) > 0 AND abs(id) < 100 AND upper(grp) = 'G'")
    sink = DeltaSink.from_options({"path": path}, STREAM)
    sink.validate_destination()
    from twophase.errors import ConstraintViolationError
    with pytest.raises(ConstraintViolationError, match="'c'"):
        run_task(sink, TransactionContext(sink.sink_id, 0, "0"),
                 [pa.record_batch({"id": [2, 200], "grp": ["g", "g"], "payload": ["a", "b"]}, schema=STREAM)])
    good = run_task(sink, TransactionContext(sink.sink_id, 0, "0"),
                    [pa.record_batch({"id": [3], "grp": ["g"], "payload": ["ok"]}, schema=STREAM)])
    assert CheckpointCoordinator(sink).complete_batch(0, [good], ["0"]) == "COMMITTED"
    assert sorted(DeltaTable(path).to_pyarrow_table().column("id").to_pylist()) == [3]


@pytest.mark.parametrize("expr, calls", [
    ("id >= 0 AND payload LIKE 'row-%'", []),
    ("id IN (1, 2) AND NOT (id > 3) OR (grp IS NULL)", []),
    ("CASE WHEN id > 1 THEN (id) ELSE (0) END > 0", []),
    ("payload <> \"concat(x)\" AND payload <> 'substring(y)'", []),   # names inside strings are not calls
    ("`concat` > 0", []),                                              # a backquoted column name
    ("coalesce(payload, grp) <> 'x' AND length(payload) > abs(id)", []),
    ("year(ts) > 2000 AND trim (payload) <> ''", ["trim", "year"]),
])
def test_delta_unvetted_calls_finds_function_calls_only(expr, calls):
    assert unvetted_calls(expr) == calls
    assert VETTED_FUNCTIONS == {"coalesce", "abs", "lower", "upper", "length"}
