"""twophase-postgres, the leftovers of issue 23 (session 15), against a real PostgreSQL server: a zombie driver that
wakes after the restarted query committed its batch and the log's retention removed the batch's record; a driver
statement on a SIGSTOPped server abandoned after option serverWaitTimeout, and the batch committed exactly once after
SIGCONT."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from integration.postgres.test_postgres_adversarial import _rows, _server_pids, _signal, _sink
from twophase import testing
from twophase.coordinator import CheckpointCoordinator
from twophase.errors import DataLossError, TransientSinkError
from twophase.log import TransactionLog
from twophase.sink import CommitStatus, TransactionContext, run_task
from twophase.sinks.postgres import CommitOutcomeUnknownError, PostgresSink
from twophase.states import CheckpointState

RETAIN = 2  # the log's retention (log.retain) of the restarted driver: small, so it is passed in a few batches


def _zombie_then_restarted_driver(pg, tmp_path, sink_id: str, batches: int = 6, lose: bool = False,
                                  table: str = "", **kw):
    """Driver A records batch 0 COMPLETED and pauses (a zombie) before COMMIT PREPARED; driver B (restarted, log
    retention RETAIN) recovers batch 0 and commits batches 1..batches. ``lose``: an operator rolls A's gid back
    first; B's recovery finds it LOST, the operator records the loss (twophase log resolve --accept-loss)."""
    table = table or pg.new_table("id bigint NOT NULL, v text", prefix="zret")

    def _sink(pg, tmp_path, table, sink_id):
        s = PostgresSink(url=kw.get("url", pg.url), table=table, sink_id=sink_id,
                         log_location=str(tmp_path / f"log-{sink_id}"), **{k: v for k, v in kw.items() if k != "url"})
        s.validate_destination()
        return s

    a = _sink(pg, tmp_path, table, sink_id=sink_id)
    ack = run_task(a, TransactionContext(a.sink_id, 0, "0"), [_rows([1])])
    log = a.transaction_log()
    log.transition(0, CheckpointState.PENDING)
    log.transition(0, CheckpointState.COMPLETED, handles={"0": dict(ack.handle)})  # A pauses here
    b = _sink(pg, tmp_path, table, sink_id=sink_id)
    b_log = TransactionLog.open(b.resolved_log_location(), b.sink_id, retain=RETAIN)
    if lose:
        pg.sql(f"ROLLBACK PREPARED '{ack.handle['txn']['gid']}'")
        with pytest.raises(Exception):
            CheckpointCoordinator(b, log=b_log).recover()
        b_log.transition(0, CheckpointState.LOST, reason="test: the operator accepts the loss")
    else:
        assert CheckpointCoordinator(b, log=b_log).recover().committed == [0]
    for cid in range(1, batches + 1):
        b_ack = run_task(b, TransactionContext(b.sink_id, cid, "0"), [_rows([cid + 1])])
        CheckpointCoordinator(b, log=b_log).complete_batch(cid, [b_ack], expected_tasks=["0"])
    assert b_log.get(0) is None, "the log's retention removed batch 0's record"
    gid = ack.handle["txn"]["gid"]
    assert not pg.sql(f"SELECT 1 FROM {a.marker} WHERE gid = %s", (gid,)), "the sweep pruned its marker"
    return table, a, b, ack


def test_pg_a_zombie_woken_after_the_logs_retention_removed_its_batch_is_already_committed_not_lost(pg, tmp_path):
    """Issue 23, leftover 1: the zombie's COMMIT PREPARED found no gid, no marker (pruned by the sweep) and no log
    record (removed by retention) and declared the committed batch LOST (DataLossError, 'twophase log resolve
    --accept-loss'). The sweep now keeps, with the markers it prunes, what it read in the log while the record was
    there (sinks/_postgres_proof.py): the batch was COMMITTED, so the zombie's commit is ALREADY_COMMITTED."""
    table, a, b, ack = _zombie_then_restarted_driver(pg, tmp_path, "lo-zombie")
    assert pg.ids(table) == [1, 2, 3, 4, 5, 6, 7]
    assert testing.commit(a, ack.handle) is CommitStatus.ALREADY_COMMITTED  # A wakes up
    assert pg.ids(table) == [1, 2, 3, 4, 5, 6, 7]
    a.close()
    b.close()


def test_pg_the_proof_rows_need_only_the_marker_tables_documented_grants(pg, tmp_path):
    """The sweep writes its proof rows with the grants docs/postgres.md gives the writer role on the marker table
    (SELECT, INSERT, DELETE: an upsert would need UPDATE too, and the recovery's sweep would fail on it)."""
    table = pg.new_table("id bigint NOT NULL, v text", prefix="zgrant")
    marker = f"public.m_{table.split('_', 1)[1]}"
    pg.sql(f"CREATE TABLE {marker} (gid text PRIMARY KEY, gid_prefix text NOT NULL, checkpoint_id bigint NOT NULL, "
           "prepared_at timestamptz NOT NULL DEFAULT now())")
    url = pg.role("tp_lo_writer", "lo-writer-pw", f"GRANT INSERT ON {table} TO tp_lo_writer; "
                  f"GRANT SELECT, INSERT, DELETE ON {marker} TO tp_lo_writer")
    try:
        _, a, b, ack = _zombie_then_restarted_driver(pg, tmp_path, "lo-zgrant", table=table, url=url,
                                                     markerTable=marker)
        assert testing.commit(a, ack.handle) is CommitStatus.ALREADY_COMMITTED
        assert pg.ids(table) == [1, 2, 3, 4, 5, 6, 7]
        a.close()
        b.close()
    finally:
        pg.sql(f"DROP TABLE {marker}")


def test_pg_a_zombie_whose_batch_was_lost_and_removed_by_retention_is_never_already_committed(pg, tmp_path):
    """The other side: batch 0's gid was rolled back by an operator, B's recovery found it LOST and the operator
    recorded the loss; the record is gone by retention when the zombie wakes. Its commit must not say
    ALREADY_COMMITTED (that would hide the loss): the sweep read the record LOST, so neither outcome of the gid is
    proven (another gid of a LOST batch may have committed) and the error says so, distinct from DataLossError."""
    table, a, b, ack = _zombie_then_restarted_driver(pg, tmp_path, "lo-zlost", lose=True)
    assert pg.ids(table) == [2, 3, 4, 5, 6, 7]
    with pytest.raises(CommitOutcomeUnknownError, match="ABORTED or LOST"):
        a.commit(ack.handle["txn"])
    a.close()
    b.close()


def test_pg_a_gone_gid_that_nothing_proves_either_way_is_outcome_unknown_not_lost(pg, tmp_path):
    """A sink whose sweep kept no proof rows (an older version's marker table: the rows deleted here) cannot prove
    the zombie's batch committed nor lost: CommitOutcomeUnknownError (not retried), never DataLossError."""
    table, a, b, ack = _zombie_then_restarted_driver(pg, tmp_path, "lo-zunknown")
    pg.sql(f"DELETE FROM {a.marker} WHERE gid LIKE 'checked%%' AND gid LIKE %s", ("%" + a.gid_prefix,))
    with pytest.raises(CommitOutcomeUnknownError) as e:
        a.commit(ack.handle["txn"])
    assert not isinstance(e.value, DataLossError) and not e.value.retriable
    assert "twophase-pg-pw" not in str(e.value)
    a.close()
    b.close()


def test_pg_a_gid_gone_above_the_pruned_markers_is_still_lost(pg, tmp_path):
    """The loss stays proven where the marker was never pruned: batch 7 (above every pruned marker) COMPLETED, its
    gid rolled back by an operator: DataLossError."""
    table, a, b, _ = _zombie_then_restarted_driver(pg, tmp_path, "lo-zabove", batches=3)
    ack = run_task(b, TransactionContext(b.sink_id, 7, "0"), [_rows([70])])
    pg.sql(f"ROLLBACK PREPARED '{ack.handle['txn']['gid']}'")
    with pytest.raises(DataLossError, match="rolled back"):
        b.commit(ack.handle["txn"])
    a.close()
    b.close()


# --------------------------------------------------------------------------- a deadline on a paused server


def _retry_busy(call):
    """``call()``, again while it fails with PostgreSQL's retriable "prepared transaction ... is busy": the abandoned
    statement reached the server before the pause, and its backend, resumed, runs it; a COMMIT / ROLLBACK PREPARED
    of the same gid meanwhile gets "is busy" (the coordinator retries it at recovery). Up to 10 s."""
    for _ in range(50):
        try:
            return call()
        except TransientSinkError as e:
            assert e.retriable and "busy" in str(e), str(e)
            time.sleep(0.2)
    return call()


def test_pg_a_commit_on_a_paused_server_is_abandoned_after_serverWaitTimeout_then_committed_once(pg, tmp_path):
    """Issue 23, leftover 2: with the server SIGSTOPped, the driver's COMMIT PREPARED waited forever (a stopped
    server's kernel answers keepalives). Now it is abandoned after option serverWaitTimeout (its socket shut down):
    a retriable error naming the option, without the password. Its outcome is unknown; after SIGCONT the next
    commit of the batch (recovery) looks the gid up first, and the batch ends committed exactly once."""
    table = pg.new_table("id bigint NOT NULL, v text", prefix="deadline")
    sink = PostgresSink(url=pg.url + "?connect_timeout=2", table=table, sink_id="lo-deadline",
                        log_location=str(tmp_path / "log"), serverWaitTimeout="1.5")
    sink.validate_destination()
    ack = run_task(sink, TransactionContext(sink.sink_id, 0, "0"), [_rows([1, 2])])
    log = sink.transaction_log()
    log.transition(0, CheckpointState.PENDING)
    log.transition(0, CheckpointState.COMPLETED, handles={"0": dict(ack.handle)})
    sink._driver_conn()
    pids = _server_pids(pg)
    result: dict = {}

    def commit() -> None:
        try:
            result["status"] = sink.commit(ack.handle["txn"])
        except Exception as e:  # noqa: BLE001 - checked below
            result["error"] = e

    _signal(pids, signal.SIGSTOP)
    try:
        start = time.monotonic()
        t = threading.Thread(target=commit)
        t.start()
        t.join(20)
        took = time.monotonic() - start
        assert not t.is_alive(), "the commit still waits on the paused server"
    finally:
        _signal(pids, signal.SIGCONT)
    err = result.get("error")
    assert isinstance(err, TransientSinkError) and err.retriable, result
    assert "serverWaitTimeout" in str(err) and "twophase-pg-pw" not in str(err), str(err)
    assert took < 10, took
    # the next attempt, in this process (the gid is looked up first) and at recovery. The abandoned COMMIT PREPARED
    # reached the server before the pause: its backend runs it once resumed, and a COMMIT PREPARED meeting it still
    # running gets "is busy", retriable (the coordinator retries at recovery): retried here for a few seconds
    status = _retry_busy(lambda: sink.commit(ack.handle["txn"]))
    assert status in (None, CommitStatus.ALREADY_COMMITTED), status
    assert CheckpointCoordinator(sink).recover().committed == [0]
    assert log.get(0).state is CheckpointState.COMMITTED
    assert pg.ids(table) == [1, 2] and pg.prepared(sink.gid_prefix) == []
    sink.close()


def test_pg_the_sweep_and_the_checks_on_a_paused_server_are_abandoned_after_serverWaitTimeout(pg, tmp_path):
    """The other driver statements (the destination check, the sweep, ROLLBACK PREPARED) end too: each raises the
    retriable error naming the option, and each works again after SIGCONT (the abandoned connection replaced)."""
    table = pg.new_table("id bigint NOT NULL, v text", prefix="deadline2")
    sink = _sink(pg, tmp_path, table, sink_id="lo-deadline2", serverWaitTimeout=1)
    ack = run_task(sink, TransactionContext(sink.sink_id, 3, "0"), [_rows([5])])
    calls = {"validate_destination": sink.validate_destination,
             "sweep": lambda: sink.create_committer().abort_lingering(1, 0),
             "abort": lambda: sink.abort(ack.handle["txn"])}
    for name, call in calls.items():
        sink._driver_conn()
        pids = _server_pids(pg)
        result: dict = {}

        def run(call=call) -> None:
            try:
                call()
                result["done"] = True
            except Exception as e:  # noqa: BLE001 - checked below
                result["error"] = e

        t = threading.Thread(target=run)
        _signal(pids, signal.SIGSTOP)
        try:
            t.start()
            t.join(20)
            assert not t.is_alive(), name
        finally:
            _signal(pids, signal.SIGCONT)
        err = result.get("error")
        assert isinstance(err, TransientSinkError) and err.retriable and "serverWaitTimeout" in str(err), (name, result)
        _retry_busy(call)  # after the pause: a new connection
    assert pg.prepared(sink.gid_prefix) == []
    sink.close()
