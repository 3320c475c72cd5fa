"""twophase-postgres: what proves a gid's batch committed once both its marker and its log record are gone.

A gid missing from ``pg_prepared_xacts`` was committed (its marker row, written inside its transaction, is in the
marker table) or rolled back (it is not). Two things remove that evidence over time:

- the sweep prunes the marker rows of checkpoints below the highest committed one (the table stays small), and
- the log's retention (``log.retain``) removes the records of old final checkpoints.

A zombie driver (paused after its COMPLETED record, past both) wakes and commits its gid: no gid, no marker, no
record. That is not a loss; nor is it proof of a commit. So the sweep keeps, in the marker table, beside the markers
it prunes, what it read in the log while the records were there (rows whose ``gid`` is no gid: never pruned as
markers, never taken for one):

``pruned:<gid prefix>``
    ``checkpoint_id`` = P: marker rows of checkpoints ``< P`` may have been pruned. A gid of a checkpoint ``>= P``
    without its marker was never committed: its loss is proven.
``checked:<gid prefix>`` / ``checked-from:<gid prefix>``
    ``checkpoint_id`` = C / V0: the sweep read the log's record of every checkpoint in ``[V0, C]`` (each one present
    and final: it walks only ids the log lists without a gap, newest first from the highest committed one), and
``unsettled:<gid prefix><checkpoint:020d>``
    one row per checkpoint of ``[V0, C]`` whose record was not COMMITTED (ABORTED or LOST): rare.

A gid is committed only after its checkpoint's COMPLETED record is durable (the commit hook's contract), a COMPLETED
record becomes COMMITTED or LOST and nothing else, and one checkpoint id has one COMPLETED record (the log's
compare-and-swap). So for a gid of checkpoint ``c`` with ``c < P`` and ``V0 <= c <= C``, no ``unsettled`` row for
``c`` and no log record for ``c`` any more: its batch was COMMITTED, and the gid with it (ALREADY_COMMITTED). A gid
that neither proof covers (a gap in what the sweep could read, a sink upgraded from a version without these rows)
is :class:`CommitOutcomeUnknownError`: never LOST, never ALREADY_COMMITTED by a guess.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from twophase.states import CheckpointState

if TYPE_CHECKING:  # pragma: no cover
    from twophase.sinks.postgres import PostgresSink

PRUNED, CHECKED, CHECKED_FROM, UNSETTLED = "pruned:", "checked:", "checked-from:", "unsettled:"


def _row(conn: Any, sink: "PostgresSink", gid: str) -> Optional[int]:
    r = conn.execute(f"SELECT checkpoint_id FROM {sink.marker} WHERE gid = %s", (gid,)).fetchone()
    return None if r is None else int(r[0])


def _put(conn: Any, sink: "PostgresSink", gid: str, checkpoint_id: int) -> None:
    """Set a proof row (inside the sweep's transaction): DELETE and INSERT, the grants the marker table has
    (SELECT, INSERT, DELETE; no UPDATE)."""
    conn.execute(f"DELETE FROM {sink.marker} WHERE gid = %s", (gid,))
    conn.execute(f"INSERT INTO {sink.marker} (gid, gid_prefix, checkpoint_id) VALUES (%s, %s, %s)",
                 (gid, gid, checkpoint_id))


def prune_markers(sink: "PostgresSink", conn: Any, highest_committed: int, log: Any) -> None:
    """The sweep's marker pruning (checkpoints below ``highest_committed``), in one transaction with what the log
    says about the checkpoints being pruned (module doc). ``log`` None (at-least-once: no log): the markers only."""
    p = sink.gid_prefix
    if log is None:
        conn.execute(f"DELETE FROM {sink.marker} WHERE gid_prefix = %s AND checkpoint_id < %s", (p, highest_committed))
        return
    ids = set(log.checkpoint_ids())
    with conn.transaction():
        # one sweep at a time per prefix updates the proof rows. Another driver's sweep holding the lock (a zombie
        # paused inside its transaction holds it for as long as it stays paused): this one prunes nothing (never
        # unsafe: the markers stay, the next sweep prunes them) instead of waiting on it until serverWaitTimeout
        # and failing the restarted driver's recovery on every retry
        if not conn.execute("SELECT pg_try_advisory_xact_lock(hashtextextended(%s, 0))", (PRUNED + p,)).fetchone()[0]:
            return
        checked, start = _row(conn, sink, CHECKED + p), _row(conn, sink, CHECKED_FROM + p)
        if checked is not None and start is not None and checked >= highest_committed:
            pass  # a later sweep already checked further
        else:
            if checked is not None and start is not None and all(i in ids for i in range(checked + 1, highest_committed)):
                todo, start = range(checked + 1, highest_committed), start
            else:  # no rows yet, or a gap (records pruned before a sweep read them): a new range, newest first
                low = highest_committed
                while low - 1 in ids:
                    low -= 1
                todo, start = range(low, highest_committed), low
            for cid in todo:
                record = log.get(cid)
                if record is None or not record.state.is_final:
                    start = cid + 1  # cannot vouch for it: the range starts after it
                    continue
                if record.state is not CheckpointState.COMMITTED:
                    _put(conn, sink, f"{UNSETTLED}{p}{cid:020d}", cid)
            _put(conn, sink, CHECKED + p, highest_committed)
            _put(conn, sink, CHECKED_FROM + p, start)
            conn.execute(f"DELETE FROM {sink.marker} WHERE starts_with(gid, %s) AND checkpoint_id < %s",
                         (UNSETTLED + p, start))
        conn.execute(f"DELETE FROM {sink.marker} WHERE gid_prefix = %s AND checkpoint_id < %s", (p, highest_committed))
        pruned = _row(conn, sink, PRUNED + p)
        if pruned is None or pruned < highest_committed:
            _put(conn, sink, PRUNED + p, highest_committed)


def settle_gone(sink: "PostgresSink", conn: Any, gid: str, checkpoint_id: int,
                record: Any, *, has_log: bool = True) -> tuple[str, str]:
    """A gid gone from ``pg_prepared_xacts``, ``record`` its checkpoint's log record now (or None): ``("committed",
    why)``, ``("lost", why)`` or ``("unknown", why)`` (module doc). One statement reads the marker and the proof rows:
    one snapshot of them (the sweep changes them in one transaction). ``has_log`` False (at-least-once: no log, no
    proof rows of its own; those on the prefix are another query's, about its checkpoints): the marker alone."""
    p = sink.gid_prefix
    if not has_log:
        if conn.execute(f"SELECT 1 FROM {sink.marker} WHERE gid = %s", (gid,)).fetchone() is not None:
            return "committed", "its marker is in the marker table"
        return "lost", "its marker is not in the marker table (at-least-once: the batch is committed at once)"
    marker, pruned, checked, start, unsettled = conn.execute(
        f"SELECT EXISTS (SELECT 1 FROM {sink.marker} WHERE gid = %s), "
        f"(SELECT checkpoint_id FROM {sink.marker} WHERE gid = %s), "
        f"(SELECT checkpoint_id FROM {sink.marker} WHERE gid = %s), "
        f"(SELECT checkpoint_id FROM {sink.marker} WHERE gid = %s), "
        f"EXISTS (SELECT 1 FROM {sink.marker} WHERE gid = %s)",
        (gid, PRUNED + p, CHECKED + p, CHECKED_FROM + p, f"{UNSETTLED}{p}{checkpoint_id:020d}")).fetchone()
    names_gid = record is not None and any(isinstance(h, dict) and (h.get("txn") or {}).get("gid") == gid
                                           for h in dict(record.handles).values())
    if marker:
        return "committed", "its marker is in the marker table"
    if names_gid and record.state is CheckpointState.COMMITTED:
        return "committed", f"the log records checkpoint {checkpoint_id} COMMITTED with it"
    if names_gid and record.state is CheckpointState.LOST:
        return "lost", f"the log records checkpoint {checkpoint_id} LOST"
    if pruned is None or checkpoint_id >= pruned:
        return "lost", "its marker was never pruned (it would be there had it committed)"
    covered = checked is not None and start is not None and start <= checkpoint_id <= checked
    if record is None and covered and not unsettled:
        return "committed", (f"its marker was pruned, and the sweep read checkpoint {checkpoint_id}'s record COMMITTED "
                             "before the log's retention removed it")
    if covered and unsettled:
        why = f"the sweep read checkpoint {checkpoint_id}'s record ABORTED or LOST, not COMMITTED"
    elif covered:
        why = (f"the log holds a {record.state.value} record of checkpoint {checkpoint_id} that does not name it "
               "(re-created after the original was removed by retention)")
    elif checked is not None and start is not None:
        why = (f"the sweep never read the log's record of checkpoint {checkpoint_id} (it read {start}..{checked}: "
               "the record was removed by the log's retention before a sweep read it)")
    else:
        why = f"no sweep has kept what the log said about checkpoints below {pruned} (a sink of an older version)"
    return "unknown", f"its marker may have been pruned (checkpoints below {pruned}) and {why}"
