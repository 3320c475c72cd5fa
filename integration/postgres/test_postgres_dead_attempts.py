"""twophase-postgres: a task attempt that died after PREPARE TRANSACTION holds its row locks; the re-run of its batch
must not wait on them forever (sinks/_postgres_attempts.py), through every engine: the embedded runtime (SIGKILL at
after_pre_commit, restart), a registered Spark format (writeStream.format(name) via twophase.spark.data_source).
Every table has a primary key, so a re-run attempt writing a dead attempt's keys waits on its locks; lockTimeout
is short, so without the rollback the run fails instead of hanging.

And what the rollback must never take: an attempt of this run (a slow live attempt of the same batch), a gid whose
completer holds its fence lock (another live driver about to commit it), a gid the log records COMPLETED (recovery
commits it); a completer whose gid was taken before it locked refuses the batch (re-run), never a LOST."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pyarrow as pa
import pytest

from integration.fileio import INPUT_SCHEMA, check_exactly_once, make_input
from integration.postgres.server import PgServer
from twophase.errors import TransientSinkError
from twophase.sink import Ack, TransactionContext, run_task
from twophase.sinks.postgres import PostgresSink

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _rows(ids: list[int], v: str = "dead") -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"id": ids, "v": [v] * len(ids)})


def _dead_prepared(pg: PgServer, table: str, sink_id: str, tmp_path, cid: int, ids: list[int]) -> str:
    """A prepared transaction of ``sink_id`` on ``table`` (columns id, grp, payload) left by a dead run: its sink
    object (and run token) is gone, no log record names it."""
    dead = PostgresSink(url=pg.url, table=table, sink_id=sink_id, log_location=str(tmp_path / f"dead-{cid}"))
    txn = dead.begin_transaction(TransactionContext(sink_id, cid, "0"))
    dead.write(txn, pa.RecordBatch.from_pydict({"id": ids, "grp": ["x"] * len(ids), "payload": ["dead"] * len(ids)}))
    dead.pre_commit(txn)
    dead.close()
    return txn["gid"]


# --------------------------------------------------------------------------- the embedded runtime, SIGKILLed

RT_JOB = '''
import sys, time
sys.path[:0] = [{root!r}]
from twophase.sinks.postgres import PostgresSink
from twophase.runtime import CheckpointConfig, CollectionSource, JobGraph, JobRunner

def pause(_split, _pos):
    time.sleep(0.05)
    return False

g = JobGraph("pg-dead-attempt")
sink = PostgresSink(url={url!r}, table={table!r}, sink_id="pg-rt-dead", log_location={log!r}, lockTimeout=3)
g.source(CollectionSource({{"s0": [{{"id": i, "v": "row"}} for i in range({n})]}}, pause=pause), uid="src").sink_to(
    sink, uid="sink", parallelism=2)
JobRunner(g, checkpointing=CheckpointConfig(0.05), owner={ck!r}).run()
print("FINISHED")
'''


def test_pg_runtime_a_sigkilled_attempt_after_prepare_does_not_block_the_restarted_job(pg, tmp_path):
    """sink_to: the job process SIGKILLed right after a task's PREPARE (checkpoint undecided: ABORTED at restart);
    its prepared transaction holds primary keys the restarted job writes again. Before the fix the restart waited
    lockTimeout on them in every attempt and failed; now its recovery rolls them back and every row is once."""
    n = 1500
    table = pg.new_table("id bigint PRIMARY KEY, v text", prefix="rtdead")
    script = tmp_path / "job.py"
    script.write_text(RT_JOB.format(root=ROOT, url=pg.url, table=table, log=str(tmp_path / "log"),
                                    ck=str(tmp_path / "ck"), n=n))
    marker = str(tmp_path / "marker")
    env = dict(os.environ, TWOPHASE_FAULT="after_pre_commit@2", TWOPHASE_FAULT_MARKER=marker)
    p = subprocess.run([sys.executable, str(script)], env=env, start_new_session=True, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == -signal.SIGKILL, p.stdout + p.stderr[-3000:]
    sink = PostgresSink(url=pg.url, table=table, sink_id="pg-rt-dead", log_location=str(tmp_path / "log"))
    left = pg.prepared(sink.gid_prefix)
    assert left, "the killed attempt left its prepared transaction (the case under test)"
    env.pop("TWOPHASE_FAULT")
    p = subprocess.run([sys.executable, str(script)], env=env, start_new_session=True, capture_output=True,
                       text=True, timeout=150)
    assert p.returncode == 0 and "FINISHED" in p.stdout, p.stderr[-3000:]
    report = check_exactly_once(list(range(n)), pg.ids(table))
    assert report.ok, report.line()
    assert pg.prepared(sink.gid_prefix) == []
    sink.close()


# --------------------------------------------------------------------------- a registered Spark format


@pytest.fixture(scope="module")
def pg_format():
    """twophase-postgres registered as a user registers a TwoPhaseCommitSink (on the shared context's own session,
    made the JVM's active and default one: integration/test_user_sink_spark.py says why)."""
    import twophase.spark
    from integration.spark_session import make_spark
    spark = make_spark("twophase-pg-dead-attempts", new_session=False)
    spark.dataSource.register(twophase.spark.data_source(PostgresSink, name="pg-dead-test"))
    jvm_session = spark._jvm.org.apache.spark.sql.classic.SparkSession
    jvm_session.setActiveSession(spark._jsparkSession)
    jvm_session.setDefaultSession(spark._jsparkSession)
    return spark, "pg-dead-test"


def test_pg_format_a_dead_attempt_of_an_earlier_run_does_not_block_the_rerun_batch(pg, pg_format, tmp_path):
    """writeStream.format(name): an earlier run of the query died after a task's PREPARE in batches 0 and 1 (their
    prepared transactions hold primary keys the re-run writes). Before the fix the tasks waited lockTimeout (2 s)
    and the query failed; now each task rolls back its batch's dead attempts of earlier runs before it begins."""
    spark, name = pg_format
    table = pg.new_table("id bigint PRIMARY KEY, grp text, payload text", prefix="fmtdead")
    inp, ck = str(tmp_path / "in"), str(tmp_path / "ck")
    ids = make_input(inp, 2, 5)
    dead = [_dead_prepared(pg, table, "pg-fmt-dead", tmp_path, cid, [lo, lo + 1]) for cid, lo in ((0, 0), (1, 5))]
    assert set(dead) <= set(pg.prepared("tp_"))  # was sorted(...) >= sorted(...): a list order, not a subset
    df = spark.readStream.schema(INPUT_SCHEMA).option("maxFilesPerTrigger", 1).json(inp).repartition(3)
    q = (df.writeStream.format(name).option("url", pg.url).option("table", table).option("sinkId", "pg-fmt-dead")
         .option("lockTimeout", "2").option("checkpointLocation", ck).trigger(availableNow=True).start())
    try:
        assert q.awaitTermination(180), "the query did not finish"
    finally:
        q.stop()
    assert q.exception() is None, q.exception()
    report = check_exactly_once(ids, pg.ids(table))
    assert report.ok, report.line()
    assert not set(dead) & set(pg.prepared("tp_"))
    assert pg.sql(f"SELECT count(*) FROM {table} WHERE payload <> 'row-' || id") == [(0,)]


# --------------------------------------------------------------------------- what the rollback never takes


def _sink(pg: PgServer, tmp_path, table: str, **kw) -> PostgresSink:
    s = PostgresSink(url=pg.url, table=table, sink_id="pg-fence", log_location=str(tmp_path / "log"), **kw)
    s.validate_destination()
    return s


def _prepare(sink: PostgresSink, cid: int, ids: list[int], task: str = "0") -> Ack:
    return run_task(sink, TransactionContext(sink.sink_id, cid, task), [_rows(ids)])


def test_pg_rollback_keeps_this_runs_attempts_a_held_gid_and_a_recorded_one(pg, tmp_path):
    """Of three prepared transactions of batch 3 the roller of a new run takes none: one of its own run (a slow live
    attempt of the same batch), one whose completer holds its fence lock (another driver committing it), one the log
    records COMPLETED (its driver died before COMMIT PREPARED: recovery commits it); a dead one beside them goes."""
    from twophase.sinks._postgres_attempts import rollback_dead
    from twophase.states import CheckpointState
    table = pg.new_table("id bigint PRIMARY KEY, v text", prefix="fence")
    roller = _sink(pg, tmp_path, table)
    own = _prepare(roller, 3, [1])                        # this run's attempt, its ack on the way
    other = _sink(pg, tmp_path, table)                    # another live driver's run
    held = _prepare(other, 3, [2])
    recorded_run = _sink(pg, tmp_path, table)
    recorded = _prepare(recorded_run, 2, [3])
    log = recorded_run.transaction_log()
    log.transition(2, CheckpointState.PENDING)
    log.transition(2, CheckpointState.COMPLETED, handles={"0": dict(recorded.handle)})  # then the driver died
    dead = _prepare(_sink(pg, tmp_path, table), 3, [4])  # a dead run's attempt
    gid = lambda a: a.handle["txn"]["gid"]  # noqa: E731
    with other.completion_guard(3, [held]):
        rolled = rollback_dead(roller, roller._driver_conn(), lambda cid: cid >= 2)
    assert rolled == [gid(dead)]
    left = set(pg.prepared(roller.gid_prefix))
    assert {gid(own), gid(held), gid(recorded)} <= left and gid(dead) not in left
    for s in (roller, other, recorded_run):
        s.close()


def test_pg_a_completer_whose_gid_was_rolled_back_refuses_the_batch_never_lost(pg, tmp_path):
    """A roller of another run took the gid before this driver locked it: the completion guard refuses the batch (a
    TransientSinkError: nothing recorded COMPLETED, the batch is re-run), where recording it would have made it
    LOST."""
    from twophase.sinks._postgres_attempts import rollback_dead
    table = pg.new_table("id bigint PRIMARY KEY, v text", prefix="fence2")
    driver = _sink(pg, tmp_path, table)
    ack = _prepare(driver, 5, [7])
    roller = _sink(pg, tmp_path, table)
    assert rollback_dead(roller, roller._driver_conn(), lambda cid: cid >= 5) == [ack.handle["txn"]["gid"]]
    with pytest.raises(TransientSinkError, match="rolled back before its commit"):
        with driver.completion_guard(5, [ack]):
            pytest.fail("the batch must not be completed")
    assert driver.transaction_log().get(5) is None
    driver.close()
    roller.close()


def test_pg_a_rerun_of_a_decided_batch_whose_new_attempts_were_swept_completes_as_already_committed(pg, tmp_path):
    """Found by the nemesis (postgres/protocol seed 2811.5, postgres/recovery seed 2811.6: after_complete@0, then
    every restart failed): the driver died after batch 0's COMPLETED record; the restart's recovery committed it, Spark
    re-ran batch 0, and the commit worker's recovery swept the re-run's prepared transactions (checkpoint 0 <= the
    highest committed: they can only be aborted). The completion guard refused the batch for them (rolled back
    before its commit), so every restart failed the same way. A batch the log has decided is not refused: its new
    acks are unrecorded and aborted, the outcome is ALREADY_COMMITTED."""
    from twophase.coordinator import CheckpointCoordinator
    from twophase.states import CheckpointState
    table = pg.new_table("id bigint NOT NULL, v text", prefix="decided")
    first = _sink(pg, tmp_path, table)
    ack1 = _prepare(first, 0, [1, 2])
    log = first.transaction_log()
    log.transition(0, CheckpointState.PENDING)
    log.transition(0, CheckpointState.COMPLETED, handles={"0": dict(ack1.handle)})  # then the driver died
    first.close()
    rerun = _sink(pg, tmp_path, table)  # the restart (a new run)
    CheckpointCoordinator(rerun).recover()  # commits batch 0
    ack2 = _prepare(rerun, 0, [1, 2])  # Spark re-runs batch 0
    CheckpointCoordinator(rerun).recover()  # the commit worker's recovery sweeps checkpoints <= 0
    assert pg.prepared(rerun.gid_prefix) == []
    with rerun.completion_guard(0, [ack2]):
        outcome = CheckpointCoordinator(rerun, sweep_after_commit=True).complete_batch(0, [ack2],
                                                                                       expected_tasks=["0"])
    assert "ALREADY_COMMITTED" in str(outcome)
    assert pg.ids(table) == [1, 2]
    rerun.close()
