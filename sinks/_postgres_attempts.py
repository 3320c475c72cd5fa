"""twophase-postgres: rolling back the prepared transactions of dead task attempts, and the fence that keeps it from
ever taking one a live driver may still commit.

A task attempt that dies after ``PREPARE TRANSACTION`` (and before a COMPLETED record names its gid) leaves a
prepared transaction that holds its row locks. The sweep takes it only once a checkpoint ``>=`` it commits, but
with a unique index (``upsertKeys``, or a primary key in append mode) the re-run of its batch inserts the same keys
and waits on those locks: every task of the batch failed on ``lockTimeout`` and the batch could never pass.

Which prepared transactions may be rolled back before their checkpoint is decided (all three must hold):

1. **Its own.** The gid carries this sink's token and table digest (:meth:`PostgresSink.own_checkpoint`).
2. **Not of this run.** The gid's attempt segment carries the run token of the sink object that planned the batch
   (``R<8 hex>A<attempt>``): a new one per ``foreach_batch`` batch call, per Spark format planning
   (``streamWriter``: every batch), per process of the embedded runtime. Attempts of the batch that are still
   running or whose ack is on its way to this run's commit (a slow, retried or speculative attempt of the SAME
   batch) carry this run's token and are never taken.
3. **No driver can commit it any more** (the fence). Every completer holds ``pg_advisory_lock(hashtextextended(gid,
   0))`` of each gid it is about to record COMPLETED, checks under it that the gid is still prepared, and keeps
   the lock until the commit is done (:func:`completion_guard`: ``foreach_batch`` and the Spark format's
   ``commit``). The roller takes a gid only under ``pg_try_advisory_lock`` of it (a completer holding it: skipped),
   and only when the transaction log names it in no COMPLETED / COMMITTED / LOST record (a driver that wrote COMPLETED
   and died before COMMIT PREPARED: recovery commits it). So of a roller and a completer of another live driver
   (two drivers on one checkpoint), one finds the lock taken: the completer's batch fails (the gid is gone before
   its COMPLETED record) and is re-run, or the roller skips it; a recorded gid is never rolled back.

The embedded runtime (``sink_to``) never reopens an ABORTED checkpoint (its next id is above every id in its log),
so after its recovery every own prepared transaction of an ABORTED checkpoint is dead by the log's decision alone
(:func:`rollback_aborted`).

Where it runs: ``foreach_batch`` on the driver before the batch's tasks (``before_batch_tasks``); a Spark format in
each task before its transaction begins (the driver's ``streamWriter`` also runs in the commit worker right before
``commit``, where the batch's own prepared transactions are waiting: it cannot tell the two calls apart, a task
can); the runtime after recovery, before its tasks start.
"""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Sequence

from twophase._logging import get_logger
from twophase.errors import TransientSinkError

if TYPE_CHECKING:  # pragma: no cover
    from twophase.sinks.postgres import PostgresSink

_log = get_logger(__name__)

#: the attempt segment of a gid made by a run: R<run token>A<attempt>
_RUN = re.compile(r"^R([0-9a-f]{8})A")
#: the log states in which a checkpoint's recorded handles are (or were) committed: never rolled back
_DECIDED_COMMIT = ("COMPLETED", "COMMITTED", "LOST")
_KEY = "hashtextextended(%s, 0)"


def new_run_token() -> str:
    return uuid.uuid4().hex[:8]


def run_of(gid: str) -> Optional[str]:
    """The run token in ``gid`` (None for a gid made before run tokens: of no live run)."""
    m = _RUN.match(gid.rsplit("_", 1)[-1])
    return m.group(1) if m else None


def attempt_segment(run_token: str, attempt: str) -> str:
    return f"R{run_token}A{attempt}"


def _gids_of_acks(acks: Sequence[Any]) -> list[str]:
    """The gids in ``acks`` (Ack objects or their JSON), sorted (locks are always taken in one order)."""
    out = set()
    for a in acks:
        if a is None:
            continue
        handle = a.handle if hasattr(a, "handle") else a.get("handle", {})
        txn = (handle or {}).get("txn")
        if isinstance(txn, dict) and isinstance(txn.get("gid"), str):
            out.add(txn["gid"])
    return sorted(out)


def recorded_for_commit(sink: "PostgresSink", gid: str, checkpoint_id: int, log: Any = None) -> bool:
    """Whether the transaction log names ``gid`` in a record that is (or was) to be committed."""
    log = log if log is not None else sink.transaction_log()
    record = log.get(checkpoint_id)
    if record is None or record.state.value not in _DECIDED_COMMIT:
        return False
    return gid in json.dumps(dict(record.handles))


def rollback_dead(sink: "PostgresSink", conn: Any, take: Callable[[int], bool], *, log: Any = None) -> list[str]:
    """Roll back each prepared transaction of ``sink`` whose checkpoint ``take`` accepts, that is not of this run
    (``sink.run_token``), that no completer holds, and that the log names in no record to commit (module doc).
    Returns the gids rolled back."""
    from twophase.sinks.postgres import _gid_literal, _psycopg
    psycopg = _psycopg()
    rolled = []
    for gid in sink.prepared(conn):
        cid = sink.own_checkpoint(gid)
        if cid is None or not take(cid) or run_of(gid) == sink.run_token:
            continue
        if not conn.execute(f"SELECT pg_try_advisory_lock({_KEY})", (gid,)).fetchone()[0]:
            _log.info("postgres_attempt_kept_being_committed", sink_id=sink.sink_id, gid=gid)
            continue
        try:
            if recorded_for_commit(sink, gid, cid, log):
                continue  # recovery commits it
            try:
                conn.execute(f"ROLLBACK PREPARED {_gid_literal(gid)}")
                rolled.append(gid)
            except psycopg.errors.UndefinedObject:
                pass  # committed or rolled back meanwhile
        finally:
            conn.execute(f"SELECT pg_advisory_unlock({_KEY})", (gid,))
    if rolled:
        _log.info("postgres_dead_attempts_rolled_back", sink_id=sink.sink_id, run=sink.run_token, gids=rolled)
    return rolled


def rollback_aborted(sink: "PostgresSink", conn: Any, log: Any) -> list[str]:
    """The embedded runtime, after its recovery: roll back the sink's prepared transactions of checkpoints the job's
    log recorded ABORTED (the runtime never reopens one)."""
    from twophase.sinks.postgres import _gid_literal, _psycopg
    psycopg = _psycopg()
    rolled = []
    for gid in sink.prepared(conn):
        cid = sink.own_checkpoint(gid)
        if cid is None:
            continue
        record = log.get(cid)
        if record is None or record.state.value != "ABORTED":
            continue
        try:
            conn.execute(f"ROLLBACK PREPARED {_gid_literal(gid)}")
            rolled.append(gid)
        except psycopg.errors.UndefinedObject:
            pass
    if rolled:
        _log.info("postgres_aborted_attempts_rolled_back", sink_id=sink.sink_id, gids=rolled)
    return rolled


def _decided(sink: "PostgresSink", checkpoint_id: int) -> bool:
    record = sink.transaction_log().get(checkpoint_id)
    return record is not None and record.state.value in _DECIDED_COMMIT


@contextlib.contextmanager
def completion_guard(sink: "PostgresSink", checkpoint_id: int, acks: Sequence[Any]) -> Iterator[None]:
    """Hold the fence lock of every gid in ``acks`` while the batch is completed and committed; refuse (a
    TransientSinkError: the batch fails and is re-run) when one of them was rolled back meanwhile (by a roller that
    took it as a dead attempt before this driver locked it) and not committed before, unless the log has decided the
    batch already (COMPLETED / COMMITTED / LOST: complete_batch aborts such unrecorded acks; recovery's sweep of a
    re-run of a committed batch rolls them back first)."""
    from twophase.sinks.postgres import _psycopg
    psycopg = _psycopg()
    gids = [g for g in _gids_of_acks(acks) if sink.own_checkpoint(g) is not None]
    if not gids:
        yield
        return
    conn = sink.connect(autocommit=True)  # its own session: the locks live exactly as long as this block
    try:
        try:
            for gid in gids:
                with sink.waiting(f"the fence lock of '{gid}' (held by another run's dead-attempt rollback or "
                                  "completer; a paused one holds it until it is resumed or killed)", conn):
                    conn.execute(f"SELECT pg_advisory_lock({_KEY})", (gid,))
            with sink.waiting(f"checking batch {checkpoint_id}'s prepared transactions before its commit", conn):
                prepared = {r[0] for r in conn.execute("SELECT gid FROM pg_prepared_xacts WHERE gid = ANY(%s)",
                                                       (gids,)).fetchall()}
                missing = [g for g in gids if g not in prepared]
                committed = {r[0] for r in conn.execute(f"SELECT gid FROM {sink.marker} WHERE gid = ANY(%s)",
                                                        (missing,)).fetchall()} if missing else set()
        except psycopg.Error as e:
            raise sink._error(e, "locking the batch's prepared transactions for its commit") from None
        gone = [g for g in missing if g not in committed]
        if gone and _decided(sink, checkpoint_id):
            # the log decided the batch before: these acks are unrecorded and aborted by complete_batch (a re-run of a
            # committed batch whose new attempts recovery's sweep rolled back); a recorded one missing is its LOST
            gone = []
        if gone:
            raise TransientSinkError(
                f"twophase-postgres (sink {sink.sink_id!r}): batch {checkpoint_id}: prepared transaction(s) {gone} of "
                "this batch were rolled back before its commit (taken as dead attempts by another run of the query: "
                "two drivers on one checkpoint?); nothing of the batch was committed and it is re-run")
        yield
    finally:
        conn.close()  # releases the locks


__all__ = ["attempt_segment", "completion_guard", "new_run_token", "recorded_for_commit", "rollback_aborted",
           "rollback_dead", "run_of"]
