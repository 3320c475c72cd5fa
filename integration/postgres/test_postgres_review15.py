"""Adversarial review (session 15) of twophase-postgres' proof rows (sinks/_postgres_proof.py) and driver deadlines
(sinks/_postgres_waits.py), commits f3d8e6c, 9c50fa0, e882eca, against a real PostgreSQL server.

- A zombie driver paused inside its sweep's transaction (it holds the sweep's advisory lock) must not stall the
  restarted driver: its recovery's sweep waited on the lock until serverWaitTimeout, failed, and failed again on
  every retry while the zombie stayed paused.
- The proof rows are not tied to the log that wrote them: a new log with the same gid prefix (the claim released and
  taken by another checkpoint location, or the checkpoint deleted and recreated) inherits another log's reading of
  its checkpoint ids (strict xfails, reported)."""

from __future__ import annotations

import threading
import time

import pytest

from integration.postgres.test_postgres_adversarial import _rows, _sink
from integration.postgres.test_postgres_leftovers import RETAIN, _zombie_then_restarted_driver
from twophase import testing
from twophase.coordinator import CheckpointCoordinator
from twophase.errors import DataLossError
from twophase.log import TransactionLog
from twophase.sink import CommitStatus, TransactionContext, run_task
from twophase.sinks.postgres import CommitOutcomeUnknownError, PostgresSink
from twophase.states import CheckpointState


class _PausedLog:
    """A driver's log whose record reads pause (a GC pause or SIGSTOP of a zombie driver while its sweep reads the
    log inside the sweep's transaction): ``entered`` set on the first read, which waits for ``release``."""

    def __init__(self, log: TransactionLog) -> None:
        self.log, self.entered, self.release = log, threading.Event(), threading.Event()
        self.store = log.store

    def checkpoint_ids(self) -> list[int]:
        return self.log.checkpoint_ids()

    def get(self, cid: int):
        self.entered.set()
        self.release.wait(60)
        return self.log.get(cid)


def test_pg_r15_a_zombie_paused_inside_its_sweep_does_not_stall_the_restarted_drivers_recovery(pg, tmp_path):
    """Driver A (a zombie, same sink id and log) pauses inside its sweep's transaction, holding the sweep's advisory
    lock (here: reading the log's records, as the first sweep after an upgrade does for a whole range). The restarted
    driver B's recovery sweeps too: it waited on A's lock until serverWaitTimeout, then failed with 'the server did
    not answer' (retriable, and failing again on every retry for as long as A stays paused: the query cannot
    restart). Not pruning markers is always safe, so B's sweep skips the pruning while another sweep holds it."""
    table = pg.new_table("id bigint NOT NULL, v text", prefix="r15lock")
    b = _sink(pg, tmp_path, table, sink_id="r15-lock", serverWaitTimeout=2)
    for cid in range(4):
        ack = run_task(b, TransactionContext(b.sink_id, cid, "0"), [_rows([cid])])
        CheckpointCoordinator(b).complete_batch(cid, [ack], expected_tasks=["0"])
    # the zombie's sweep restarts its range (no checked rows yet: a marker table of the previous version)
    pg.sql(f"DELETE FROM {b.marker} WHERE gid IN (%s, %s)", ("checked:" + b.gid_prefix, "checked-from:" + b.gid_prefix))
    a = _sink(pg, tmp_path, table, sink_id="r15-lock")
    paused = _PausedLog(a.transaction_log())
    a.transaction_log = lambda: paused  # type: ignore[method-assign]
    result: dict = {}

    def zombie_sweep() -> None:
        try:
            result["zombie"] = a.create_committer().abort_lingering(3, 3)
        except Exception as e:  # noqa: BLE001 - checked below
            result["zombie_error"] = e

    t = threading.Thread(target=zombie_sweep)
    t.start()
    try:
        assert paused.entered.wait(20), "the zombie's sweep never read the log"
        start = time.monotonic()
        report = CheckpointCoordinator(b).recover()  # B restarts while A is paused inside its sweep
        assert time.monotonic() - start < 10
        assert report.committed == []
    finally:
        paused.release.set()
        t.join(30)
    assert "zombie_error" not in result, result
    # once A's transaction ended, B's next sweep prunes again
    ack = run_task(b, TransactionContext(b.sink_id, 4, "0"), [_rows([4])])
    CheckpointCoordinator(b).complete_batch(4, [ack], expected_tasks=["0"])
    left = pg.sql(f"SELECT checkpoint_id FROM {b.marker} WHERE gid_prefix = %s", (b.gid_prefix,))
    assert sorted(r[0] for r in left) == [4]
    assert pg.ids(table) == [0, 1, 2, 3, 4]
    a.close()
    b.close()


def _old_log_then_release(pg, tmp_path, table: str, sink_id: str, batches: int = 6, how: str = "release") -> None:
    """A first query (its own log location) commits batches 0..batches on ``table`` with ``sink_id`` (its sweeps keep
    proof rows for checkpoints 0..batches); then it is gone for good and its claim of the gid prefix is released, as
    docs/postgres.md's refusal message says (DELETE FROM <marker> WHERE gid = 'owner:<prefix>'). ``how`` "recreate":
    its log is at the location the next query uses, and is deleted instead (a checkpoint deleted and recreated: the
    claim names the same location, nothing is released)."""
    import shutil
    where = tmp_path / (f"log-{sink_id}" if how == "recreate" else "old-query-log")
    old = PostgresSink(url=pg.url, table=table, sink_id=sink_id, log_location=str(where))
    old.validate_destination()
    old_log = TransactionLog.open(old.resolved_log_location(), old.sink_id, retain=RETAIN)
    for cid in range(batches + 1):
        ack = run_task(old, TransactionContext(old.sink_id, cid, "0"), [_rows([1000 + cid])])
        CheckpointCoordinator(old, log=old_log).complete_batch(cid, [ack], expected_tasks=["0"])
    assert pg.sql(f"SELECT checkpoint_id FROM {old.marker} WHERE gid = %s", ("checked:" + old.gid_prefix,))
    if how == "recreate":
        shutil.rmtree(where)
    else:
        pg.sql(f"DELETE FROM {old.marker} WHERE gid = %s", ("owner:" + old.gid_prefix,))
    old.close()


@pytest.mark.xfail(strict=True, reason="review 15: proof rows are not tied to the log that wrote them; a new log with "
                   "the same gid prefix inherits the old log's 'pruned:' and 'checked:' rows, so a proven loss at a "
                   "low checkpoint id of the new log is CommitOutcomeUnknownError (with a false 'the log holds a "
                   "COMPLETED record ... re-created after retention' reason) instead of DataLossError")
@pytest.mark.parametrize("how", ["release", "recreate"])
def test_pg_r15_a_new_log_on_a_released_prefix_still_proves_a_loss(pg, tmp_path, how):
    """The first query is gone, its claim released; a new query (new log, checkpoint ids from 0) takes the prefix.
    An operator rolls back a gid of its COMPLETED checkpoint 1: the marker of checkpoint 1 was never pruned by THIS
    log (nothing committed yet), so the loss is proven: DataLossError (before f3d8e6c: DataLossError). The old log's
    'pruned:' row (7) made it look possibly pruned, and its reading of ITS checkpoint 1 made it 'covered'."""
    table = pg.new_table("id bigint NOT NULL, v text", prefix="r15claim")
    _old_log_then_release(pg, tmp_path, table, "r15-claim", how=how)
    new = _sink(pg, tmp_path, table, sink_id="r15-claim")
    assert new.transaction_log().get(3) is None, "a new log"
    ack = run_task(new, TransactionContext(new.sink_id, 1, "0"), [_rows([1])])
    log = new.transaction_log()
    log.transition(1, CheckpointState.PENDING)
    log.transition(1, CheckpointState.COMPLETED, handles={"0": dict(ack.handle)})
    pg.sql(f"ROLLBACK PREPARED '{ack.handle['txn']['gid']}'")
    with pytest.raises(DataLossError):
        new.commit(ack.handle["txn"])
    new.close()


@pytest.mark.xfail(strict=True, reason="review 15: proof rows are not tied to the log that wrote them; a zombie of a "
                   "new log on a released prefix reads the old log's 'checked:' range (the new sweeps never read "
                   "their own records below it) and its LOST batch is reported ALREADY_COMMITTED")
def test_pg_r15_a_zombie_of_a_new_log_whose_batch_was_lost_is_never_already_committed(pg, tmp_path):
    """As test_pg_a_zombie_whose_batch_was_lost_and_removed_by_retention_is_never_already_committed, on a table whose
    gid prefix an earlier query (another log, gone, its claim released) used: the new log's batch 0 was rolled back,
    recorded LOST, removed by retention; the zombie's commit must not be ALREADY_COMMITTED."""
    table = pg.new_table("id bigint NOT NULL, v text", prefix="r15zlost")
    _old_log_then_release(pg, tmp_path, table, "r15-zlost")
    _, a, b, ack = _zombie_then_restarted_driver(pg, tmp_path, "r15-zlost", lose=True, table=table)
    assert 1 not in pg.ids(table), "batch 0 of the new query is not in the table"
    status = None
    try:
        status = testing.commit(a, ack.handle)
    except (CommitOutcomeUnknownError, DataLossError):
        pass
    assert status is not CommitStatus.ALREADY_COMMITTED, "a LOST batch reported committed"
    a.close()
    b.close()


def test_pg_r15_an_at_least_once_sinks_lost_gid_on_a_prefix_an_exactly_once_query_swept_is_not_already_committed(
        pg, tmp_path):
    """An at-least-once sink has no log (its commit reads no record: ``record`` is always None) and keeps no proof
    rows. With the same sink id on the same table as an earlier exactly-once query (a new checkpoint: batch ids from
    0), that query's proof rows 'cover' its checkpoint ids: a gid of batch 1 rolled back before the driver's first
    COMMIT PREPARED (an operator, a restored data directory) was reported ALREADY_COMMITTED, silently (before
    f3d8e6c: DataLossError). The loss must stay loud."""
    table = pg.new_table("id bigint NOT NULL, v text", prefix="r15alo")
    _old_log_then_release(pg, tmp_path, table, "r15-alo")
    alo = PostgresSink(url=pg.url, table=table, sink_id="r15-alo", guarantee="at-least-once")
    alo.validate_destination()
    # the task's hooks (run_task commits at once in at-least-once): another actor rolls the gid back between its
    # PREPARE and its COMMIT PREPARED (an operator, a second driver's sweep, a restored data directory)
    txn = alo.begin_transaction(TransactionContext(alo.sink_id, 1, "0"))
    alo.write(txn, _rows([1]))
    alo.pre_commit(txn)
    pg.sql(f"ROLLBACK PREPARED '{txn['gid']}'")
    status = None
    with pytest.raises((DataLossError, CommitOutcomeUnknownError)):
        status = alo.commit(txn)
    assert status is not CommitStatus.ALREADY_COMMITTED
    assert 1 not in pg.ids(table)
    alo.close()
