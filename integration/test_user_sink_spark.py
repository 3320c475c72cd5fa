"""A user's own TwoPhaseCommitSink through ``twophase.spark.foreach_batch`` on a real Spark: every row once, also
when Spark re-runs the last batch (its commit log entry removed)."""

from __future__ import annotations

import glob
import json
import os
from typing import Any

import pytest

import twophase
from integration.fileio import check_exactly_once, make_input, run_foreach_batch


@pytest.fixture(scope="module")
def spark():
    from integration.spark_session import make_spark
    s = make_spark("twophase-user-sink-tests")
    yield s  # on the shared context: not stopped (integration/spark_session.py)


class JsonLinesSink(twophase.TwoPhaseCommitSink):
    """Stage one JSON-lines file per task at pre_commit; rename it into place at commit."""

    def __init__(self, root: str, **kw: Any) -> None:
        super().__init__(**kw)
        self.root = root

    def begin_transaction(self, context: Any) -> dict:
        name = f"{context.checkpoint_id}-{context.task_id}-{context.attempt_uid}.jsonl"
        self._rows: list = []
        return {"staged": os.path.join(self.root, "_staging", name), "final": os.path.join(self.root, f"part-{name}")}

    def write(self, txn: dict, batch: Any) -> None:
        self._rows.extend(batch.to_pylist())

    def pre_commit(self, txn: dict) -> None:
        os.makedirs(os.path.dirname(txn["staged"]), exist_ok=True)
        with open(txn["staged"], "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in self._rows)
            f.flush()
            os.fsync(f.fileno())

    def commit(self, txn: dict) -> None:
        if not os.path.exists(txn["final"]):
            try:
                os.rename(txn["staged"], txn["final"])
            except FileNotFoundError:
                raise twophase.errors.DataLossError(f"{txn['staged']} is gone") from None

    def abort(self, txn: dict) -> None:
        if os.path.exists(txn["staged"]):
            os.unlink(txn["staged"])


def _ids(out: str) -> list[int]:
    ids = []
    for p in glob.glob(os.path.join(out, "part-*.jsonl")):
        with open(p) as f:
            ids += [json.loads(line)["id"] for line in f]
    return ids


def test_user_sink_foreach_batch_every_row_once(spark, tmp_path):
    from twophase.spark import foreach_batch
    inp, out, ck = str(tmp_path / "in"), str(tmp_path / "out"), str(tmp_path / "ck")
    ids = make_input(inp, 3, 40)
    sink = JsonLinesSink(out, sink_id="user-jsonl", log_location=str(tmp_path / "log"))
    run_foreach_batch(spark, inp, foreach_batch(sink, owner=ck), ck)
    report = check_exactly_once(ids, _ids(out))
    assert report.ok, report.line()
    commits = sorted(glob.glob(os.path.join(ck, "commits", "[0-9]*")), key=lambda p: int(os.path.basename(p)))
    last = commits[-1]  # Spark re-runs the last batch: the log says it is committed, nothing is written twice
    for p in (last, os.path.join(os.path.dirname(last), f".{os.path.basename(last)}.crc")):
        if os.path.exists(p):
            os.unlink(p)
    run_foreach_batch(spark, inp, foreach_batch(sink, owner=ck), ck)
    report = check_exactly_once(ids, _ids(out))
    assert report.ok, report.line()
    assert os.listdir(os.path.join(out, "_staging")) == []
