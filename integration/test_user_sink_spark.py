"""A user's own TwoPhaseCommitSink on a real Spark: through ``twophase.spark.foreach_batch`` and as a registered
format (``twophase.spark.data_source``: streaming and batch writes), every row once, also when Spark re-runs the
last batch (its commit log entry removed); a wrong option fails before any data moves, naming it; a query killed
(SIGKILL) between pre_commit and commit and restarted leaves every row once (``user_sink_job.py``)."""

from __future__ import annotations

import glob
import json
from collections import Counter
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


def _staged(out: str) -> list[str]:
    return sorted(p for p in os.listdir(out) if p.startswith(".")) if os.path.isdir(out) else []


class DotStagedSink(twophase.TwoPhaseCommitSink):
    """The README's sink: each task appends to a hidden ``.<name>.staged`` file, the commit renames it."""

    def __init__(self, directory: str, **kw: Any) -> None:
        super().__init__(**kw)
        self.directory = directory

    def begin_transaction(self, context: Any) -> dict:
        name = f"{context.checkpoint_id}-{context.task_id}-{context.attempt_uid}.jsonl"
        return {"staged": os.path.join(self.directory, f".{name}.staged"),
                "final": os.path.join(self.directory, f"part-{name}")}

    def write(self, txn: dict, batch: Any) -> None:
        os.makedirs(self.directory, exist_ok=True)
        with open(txn["staged"], "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in batch.to_pylist())

    def pre_commit(self, txn: dict) -> None:
        os.makedirs(self.directory, exist_ok=True)
        with open(txn["staged"], "a") as f:
            os.fsync(f.fileno())

    def commit(self, txn: dict) -> None:
        if os.path.exists(txn["staged"]):
            os.replace(txn["staged"], txn["final"])
        elif not os.path.exists(txn["final"]):
            raise twophase.errors.DataLossError(f"{txn['staged']} is gone")

    def abort(self, txn: dict) -> None:
        if os.path.exists(txn["staged"]):
            os.remove(txn["staged"])


@pytest.fixture(scope="module")
def base_spark():
    """The shared context's own session: a data source registered on a newSession() is not found by a streaming
    query in PySpark 4.x (integration/spark_session.py)."""
    from integration.spark_session import make_spark
    return make_spark("twophase-user-sink-tests", new_session=False)


@pytest.fixture(scope="module")
def user_format(base_spark):
    import twophase.spark
    base_spark.dataSource.register(twophase.spark.data_source(DotStagedSink, name="user-jsonl"))
    # Spark looks a Python data source up in the JVM's active (else default) session, not in the DataFrame's: after
    # other modules' sessions on the shared context, that is another session (DATA_SOURCE_NOT_FOUND in the suite,
    # found when the module ran alone). Make the session the format is registered on the active and default one.
    jvm_session = base_spark._jvm.org.apache.spark.sql.classic.SparkSession
    jvm_session.setActiveSession(base_spark._jsparkSession)
    jvm_session.setDefaultSession(base_spark._jsparkSession)
    return "user-jsonl"


def test_user_sink_data_source_streaming_every_row_once(base_spark, user_format, tmp_path):
    """writeStream.format(name).option(...): the options are the constructor's keyword arguments; every row once,
    also when Spark re-runs the last batch; nothing staged is left."""
    from integration.fileio import INPUT_SCHEMA
    inp, out, ck = str(tmp_path / "in"), str(tmp_path / "out"), str(tmp_path / "ck")
    ids = make_input(inp, 3, 40)

    def run() -> None:
        df = base_spark.readStream.schema(INPUT_SCHEMA).option("maxFilesPerTrigger", 1).json(inp).repartition(3)
        q = (df.writeStream.format(user_format).option("directory", out).option("sinkId", "user-fmt")
             .option("checkpointLocation", ck).trigger(availableNow=True).start())
        try:
            assert q.awaitTermination(180), "the query did not finish"
        finally:
            q.stop()
        assert q.exception() is None, q.exception()
    run()
    report = check_exactly_once(ids, _ids(out))
    assert report.ok, report.line()
    assert os.path.isdir(os.path.join(ck, "twophase-sink"))  # the log lives under the checkpoint location
    last = max(glob.glob(os.path.join(ck, "commits", "[0-9]*")), key=lambda p: int(os.path.basename(p)))
    for p in (last, os.path.join(os.path.dirname(last), f".{os.path.basename(last)}.crc")):
        if os.path.exists(p):
            os.unlink(p)
    run()
    report = check_exactly_once(ids, _ids(out))
    assert report.ok, report.line()
    assert _staged(out) == []


def test_user_sink_data_source_batch_write_once_and_a_rerun_writes_nothing(base_spark, user_format, tmp_path):
    """df.write.format(name).mode("append").save(): the same hooks through twophase.write_job; a re-run with the
    same writeId writes nothing; without log_location the write is refused naming it."""
    out, log = str(tmp_path / "out"), str(tmp_path / "log")
    df = base_spark.range(0, 90, numPartitions=3)

    def write(**extra: str) -> None:
        w = df.write.format(user_format).option("directory", out).option("sink_id", "user-batch").mode("append")
        for k, v in extra.items():
            w = w.option(k, v)
        w.save()
    with pytest.raises(Exception, match="log_location"):
        write()
    assert _ids(out) == []
    write(log_location=log, writeId="backfill-1")
    assert sorted(_ids(out)) == list(range(90))
    write(log_location=log, writeId="backfill-1")
    assert sorted(_ids(out)) == list(range(90)) and _staged(out) == []


@pytest.mark.parametrize("options,named", [({"sink_id": "x", "directry": "/tmp/x"}, "unknown option 'directry'"),
                                           ({"sink_id": "x"}, "missing option\\(s\\) directory")])
def test_user_sink_data_source_a_wrong_option_fails_early_naming_it(base_spark, user_format, tmp_path, options, named):
    """An option the constructor does not take, or a required one missing, fails on the driver before any task."""
    w = base_spark.range(0, 3).write.format(user_format).option("log_location", str(tmp_path / "log")).mode("append")
    for k, v in options.items():
        w = w.option(k, v)
    with pytest.raises(Exception, match=named):
        w.save()
    assert not os.path.exists(str(tmp_path / "x"))


# --------------------------------------------------------------------------- SIGKILL between pre_commit and commit

USER_JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jobs", "user_sink_job.py")
ROWS = 20
CHAIN = ("after_pre_commit", "after_complete")


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    from integration.crash_chain import CrashChain
    from integration.jobrun import job_env, run_in_own_session
    import sys
    work = tmp_path_factory.mktemp("user-crash")
    inp, out, ck = str(work / "in"), str(work / "out"), str(work / "ck")
    ids = make_input(inp, 4, ROWS)

    def run(fault: Any, marker: Any, log_path: str) -> int:
        cmd = [sys.executable, USER_JOB, "--input", inp, "--out", out, "--checkpoint", ck]
        return run_in_own_session(cmd, env=job_env(fault, marker), timeout=300, log_path=log_path).returncode

    def check_crashed(point: str, cid: int) -> None:
        got = _ids(out)
        report = check_exactly_once(ids, got)
        per_file = Counter(i // ROWS for i in got)  # input file f holds ids f*ROWS..; a batch reads one file
        state = f"after the crash at {point}@{cid}: {report.line()}; rows per file {dict(per_file)}, staged {_staged(out)}"
        assert report.duplicated == 0 and report.unexpected == 0, state
        assert len(per_file) == cid and set(per_file.values()) <= {ROWS}, state  # the batches before it, whole
        assert all(s.startswith(f".{cid}-") for s in _staged(out)), state  # only the crashed checkpoint's

    def check_final() -> None:
        report = check_exactly_once(ids, _ids(out))
        assert report.ok, report.line()
        assert _staged(out) == []
        pending = glob.glob(os.path.join(ck, "twophase-sink", "*", "user-pending", "*"))
        assert pending == [], pending

    return CrashChain(CHAIN, run, check_crashed, check_final, str(work))


@pytest.mark.parametrize("point", CHAIN)
def test_user_sink_data_source_crash_chain(chain: Any, point: str) -> None:
    """SIGKILL of the whole query (driver, JVM, workers) after pre_commit on an executor (the checkpoint not
    decided: the restart aborts it and re-runs the batch), then after the checkpoint is decided and before any
    commit (the restart's recovery commits it): earlier batches whole, nothing twice."""
    chain.crash(point)


def test_user_sink_data_source_crash_chain_final_restart(chain: Any) -> None:
    chain.finish()
