"""The checkpoint coordinator: collects acks, makes the decision durable, then commits.

The protocol, step by step (marked ``# step N`` in the code):

1. trigger: a PendingCheckpoint is created for the tasks that must ack; its PENDING record is written.
2. ack: each task acks with its pre-committed handle; duplicates, unknown tasks and acks to disposed
   checkpoints are aborted at once, never committed (except a redelivered ack carrying the very handle
   the checkpoint already accepted or recorded: that one is left to be committed).
3. complete: once every task acked, the CompletedCheckpoint (with every handle) is made durable in the
   log, BEFORE anything is committed.
4. commit: the sink commits the checkpoint's handles, then COMMITTED is recorded.
5. subsume and clean: older pending checkpoints are aborted, lingering transactions of checkpoints
   ``<= n`` are aborted, and the log is pruned.

Invariants (named in tests as ``test_coordinator_invN_*``):

1. The completed checkpoint is durable before any transaction of it is committed.
2. commit and recover_and_commit are idempotent per checkpoint id: a COMMITTED checkpoint is never
   committed again, and handles arriving for it (a re-run or retried commit) are aborted.
3. A notification for checkpoint n commits every completed, uncommitted checkpoint <= n, in order.
4. Handles of a declined, expired or subsumed checkpoint are aborted, never committed.
5. Recovery commits every COMPLETED checkpoint and aborts every PENDING one and every lingering
   transaction of checkpoints up to the highest committed id, before any new data is written.
   Lingering transactions of higher (aborted) ids are left alone, since such an id may be attempted
   again at this very moment; they are aborted once a later checkpoint commits (step 5).
6. Acks of another streaming query than the one the log is bound to (a deleted and recreated
   checkpoint: batch ids restart at 0) are aborted and refused with QueryMismatchError; they are
   never taken for re-runs of the old query's committed batches.
7. A COMPLETED checkpoint that cannot be committed (DataLossError) stops recovery, with the operator
   command in the error; only ``twophase log resolve --accept-loss`` moves it to LOST, which is
   recorded, final, and never counted as committed.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from twophase import faults
from twophase._logging import get_logger
from twophase.checkpoint import (CheckpointProperties, CompletedCheckpoint, Handle, PendingCheckpoint,
                                 TaskAcknowledgeResult)
from twophase.decisions import CommitOutcome
from twophase.errors import CheckpointDeclinedError, ConfigurationError, DataLossError, QueryMismatchError
from twophase.log import CheckpointRecord, TransactionLog
from twophase.sink import Ack, TwoPhaseCommitSink
from twophase.states import CheckpointState

__all__ = ["CheckpointCoordinator", "CommitOutcome", "RecoveryReport", "TriggerPolicy"]

_log = get_logger(__name__)


@dataclass(frozen=True)
class TriggerPolicy:
    """When checkpoints may be triggered (used by the embedded runtime; Spark triggers per batch).

    ``interval_s`` between triggers, at least ``min_pause_s`` between the end of one checkpoint and
    the next trigger, at most ``max_concurrent`` pending at once, each aborted after ``timeout_s``;
    more than ``tolerable_failures`` consecutive failed checkpoints fail the job.
    """

    interval_s: float = 1.0
    min_pause_s: float = 0.0
    max_concurrent: int = 1
    timeout_s: float = 60.0
    tolerable_failures: int = 0

    def __post_init__(self) -> None:
        if self.interval_s <= 0:
            raise ConfigurationError(f"checkpoint interval must be > 0, got {self.interval_s}")
        if self.min_pause_s < 0:
            raise ConfigurationError(f"checkpoint min pause must be >= 0, got {self.min_pause_s}")
        if self.max_concurrent < 1:
            raise ConfigurationError(f"max concurrent checkpoints must be >= 1, got {self.max_concurrent}")
        if self.timeout_s <= 0:
            raise ConfigurationError(f"checkpoint timeout must be > 0, got {self.timeout_s}")
        if self.tolerable_failures < 0:
            raise ConfigurationError(f"tolerable checkpoint failures must be >= 0, got {self.tolerable_failures}")

    def may_trigger(self, now: float, *, last_trigger: Optional[float], last_completion: Optional[float],
                    pending: int, forced: bool = False) -> bool:
        """Whether a checkpoint may be triggered at ``now``."""
        if forced:
            return True
        if pending >= self.max_concurrent:
            return False
        if last_trigger is not None and now - last_trigger < self.interval_s:
            return False
        if last_completion is not None and now - last_completion < self.min_pause_s:
            return False
        return True


@dataclass
class RecoveryReport:
    """What :meth:`CheckpointCoordinator.recover` did."""

    committed: list[int] = field(default_factory=list)
    aborted: list[int] = field(default_factory=list)
    lingering_aborted: int = 0


class CheckpointCoordinator:
    """Drives the two-phase commit of one sink against its durable log (see module invariants).

    Thread-safe. Holds pending checkpoints in memory only; everything that matters after a crash is
    in the log, so a coordinator can be created afresh for every Spark commit call.
    """

    def __init__(self, sink: TwoPhaseCommitSink[Any, Any], log: Optional[TransactionLog] = None, *,
                 policy: Optional[TriggerPolicy] = None, clock: Callable[[], float] = time.time,
                 sweep_after_commit: bool = True) -> None:
        """``sweep_after_commit``: abort lingering transactions ``<= n`` right after committing ``n``
        (step 5). The Spark adapter turns it off because it recovers, and so sweeps, before every
        micro-batch anyway; a sweep can be a slow listing (S3 multipart uploads)."""
        self.sink = sink
        self.sweep_after_commit = sweep_after_commit
        self.log = log if log is not None else sink.transaction_log()
        self.policy = policy or TriggerPolicy()
        self.clock = clock
        self._pending: dict[int, PendingCheckpoint] = {}
        self._lock = threading.RLock()
        self.last_trigger: Optional[float] = None
        self.last_completion: Optional[float] = None
        self.consecutive_failures = 0
        self.listeners: list[Callable[[CompletedCheckpoint], None]] = []

    # ---- recovery (invariant 5)

    def recover(self) -> RecoveryReport:
        """Commit COMPLETED checkpoints, abort PENDING ones and lingering transactions."""
        report = RecoveryReport()
        with self._lock, self.log.locked():
            view = self.log.view()
            for rec in view.unfinished:
                if rec.state is CheckpointState.COMPLETED:
                    self._commit_record(rec, recovering=True)
                    report.committed.append(rec.checkpoint_id)
                elif rec.state is CheckpointState.PENDING:
                    for h in rec.handles.values():
                        self.sink.recover_and_abort(h)
                    self.log.transition(rec.checkpoint_id, CheckpointState.ABORTED, reason="aborted at recovery")
                    report.aborted.append(rec.checkpoint_id)
                faults.maybe_crash("in_recovery", rec.checkpoint_id)
            # Only up to the highest COMMITTED id: an ABORTED id may be attempted again right now (Spark
            # re-runs the batch; this recovery also runs in the commit worker just before that batch's
            # commit), so its staged data is cleaned only once a later checkpoint commits (step 5).
            highest = max([view.highest_committed or -1, *report.committed])
            if highest >= 0:
                report.lingering_aborted = self.sink.abort_lingering(highest, ())
        if report.committed or report.aborted or report.lingering_aborted:
            _log.info("recovered", sink_id=self.log.sink_id, committed=report.committed, aborted=report.aborted,
                      lingering_aborted=report.lingering_aborted)
        return report

    def latest_completed(self) -> Optional[CheckpointRecord]:
        """The newest COMMITTED or COMPLETED record (what a restart restores from)."""
        return self.log.latest_completed()

    # ---- step 1: trigger

    def trigger(self, checkpoint_id: int, tasks: Iterable[str],
                properties: Optional[CheckpointProperties] = None) -> PendingCheckpoint:
        """Create and record a PendingCheckpoint for ``tasks`` (step 1)."""
        with self._lock:
            pending = PendingCheckpoint(checkpoint_id, tasks, properties, triggered_at=self.clock())
            self.log.transition(checkpoint_id, CheckpointState.PENDING, properties=pending.properties)
            self._pending[checkpoint_id] = pending
            self.last_trigger = self.clock()
            return pending

    @property
    def pending_count(self) -> int:
        with self._lock:
            return len(self._pending)

    def pending_ids(self) -> list[int]:
        with self._lock:
            return sorted(self._pending)

    # ---- step 2: ack / decline

    def acknowledge(self, ack: Ack, task_state: Any = None) -> TaskAcknowledgeResult:
        """Take a task's ack (step 2); completes and commits the checkpoint when it is the last one."""
        with self._lock:
            pending = self._pending.get(ack.checkpoint_id)
            result = (pending.acknowledge(ack.task_id, ack.handle, task_state) if pending is not None
                      else TaskAcknowledgeResult.DISCARDED)
            if result is not TaskAcknowledgeResult.SUCCESS:
                _log.warning("ack_rejected", checkpoint_id=ack.checkpoint_id, task=ack.task_id, result=result.value)
                if not self._is_accepted(ack, pending):
                    self.sink.abort(ack.handle)  # invariant 4: never committed
                return result
            if pending.is_fully_acknowledged:
                self._complete_and_commit(pending)
            return result

    def _is_accepted(self, ack: Ack, pending: Optional[PendingCheckpoint]) -> bool:
        """Whether a rejected ack carries a handle its checkpoint already took (a redelivered ack).

        Such a handle will be (or was) committed; aborting it would lose a decided checkpoint's data.
        """
        if pending is not None and ack.handle in pending.acked_handles.values():
            return True
        rec = self.log.get(ack.checkpoint_id)
        return (rec is not None and rec.state in (CheckpointState.COMPLETED, CheckpointState.COMMITTED)
                and ack.handle in rec.handles.values())

    def decline(self, checkpoint_id: int, task_id: str, reason: str) -> None:
        """A task cannot take part in ``checkpoint_id``: abort it (invariant 4)."""
        self.abort_checkpoint(checkpoint_id, f"declined by task {task_id}: {reason}")

    def abort_checkpoint(self, checkpoint_id: int, reason: str, extra_handles: Sequence[Handle] = (),
                         *, expired: bool = False) -> None:
        """Abort a pending checkpoint and every handle acked to it."""
        with self._lock:
            pending = self._pending.pop(checkpoint_id, None)
            handles = list(pending.abort(reason).values()) if pending else []
            for h in [*handles, *extra_handles]:
                self.sink.abort(h)
            rec = self.log.get(checkpoint_id)
            if rec is not None and rec.state is CheckpointState.PENDING:
                self.log.transition(checkpoint_id, CheckpointState.ABORTED, reason=reason)
            self.consecutive_failures += 1
            _log.warning("checkpoint_aborted", sink_id=self.log.sink_id, checkpoint_id=checkpoint_id,
                         reason=reason, expired=expired)

    def check_timeouts(self) -> list[int]:
        """Abort pending checkpoints older than the policy's timeout; returns their ids."""
        now = self.clock()
        with self._lock:
            late = [cid for cid, p in self._pending.items() if now - p.triggered_at > self.policy.timeout_s]
        for cid in late:
            self.abort_checkpoint(cid, f"expired after {self.policy.timeout_s}s", expired=True)
        return late

    def failure_budget_exceeded(self) -> bool:
        return self.consecutive_failures > self.policy.tolerable_failures

    # ---- steps 3-5

    def _complete_and_commit(self, pending: PendingCheckpoint) -> CompletedCheckpoint:
        cid = pending.checkpoint_id
        completed = pending.finalize()
        del self._pending[cid]
        faults.maybe_crash("before_complete", cid)
        # step 3: durable decision before any commit (invariant 1)
        rec = self.log.transition(cid, CheckpointState.COMPLETED, handles=dict(completed.handles),
                                  task_state=completed.task_state)
        faults.maybe_crash("after_complete", cid)
        self.last_completion = self.clock()
        self.consecutive_failures = 0
        # step 4: commit everything completed up to cid, in order (invariant 3)
        self.notify_checkpoint_complete(cid, current=rec)
        for listener in self.listeners:
            listener(completed)
        return completed

    def notify_checkpoint_complete(self, checkpoint_id: int, *, current: Optional[CheckpointRecord] = None) -> None:
        """Commit every COMPLETED checkpoint <= ``checkpoint_id`` in order, then subsume and clean (steps 4-5)."""
        with self._lock, self.log.locked():
            # step 5a: subsume older pending checkpoints (invariant 4) BEFORE committing, so that no
            # record below a COMMITTED one is left unfinished (log invariant 6)
            for cid in [c for c in self._pending if c < checkpoint_id]:
                self.abort_checkpoint(cid, f"subsumed by checkpoint {checkpoint_id}")
            for rec in self.log.unfinished():
                if rec.checkpoint_id > checkpoint_id:
                    break
                if rec.state is CheckpointState.COMPLETED:
                    self._commit_record(rec, recovering=rec.checkpoint_id != checkpoint_id)
                elif rec.state is CheckpointState.PENDING and rec.checkpoint_id < checkpoint_id:
                    # a PENDING record no live PendingCheckpoint owns (its coordinator died): subsumed
                    self.log.transition(rec.checkpoint_id, CheckpointState.ABORTED,
                                        reason=f"subsumed by checkpoint {checkpoint_id}")
            # step 5b: clean up
            self.consecutive_failures = 0
            if self.sweep_after_commit:
                self._sweep(checkpoint_id)
            self.log.prune()
        faults.maybe_crash("after_commit", checkpoint_id)

    def _sweep(self, checkpoint_id: int) -> None:
        """Abort this sink's lingering transactions ``<= checkpoint_id`` (committed: nothing there can be
        committed any more). Cleanup only: a failure is logged and the next sweep (the next commit, the
        next recovery) retries it; it never fails a batch whose data is already committed."""
        try:
            self.sink.abort_lingering(checkpoint_id, ())
        except Exception as e:  # noqa: BLE001 - see docstring
            _log.warning("sweep_failed", sink_id=self.log.sink_id, checkpoint_id=checkpoint_id, error=str(e),
                         consequence="leftovers stay until the next sweep")

    def _commit_record(self, rec: CheckpointRecord, *, recovering: bool) -> None:
        started = time.perf_counter()
        handles = rec.to_completed().ordered_handles()
        try:
            self.sink.commit_checkpoint(rec.checkpoint_id, handles, recovering=recovering)
        except DataLossError as e:  # invariant 7: stop, and tell the operator the one way on
            _log.error("checkpoint_data_loss", sink_id=self.log.sink_id, checkpoint_id=rec.checkpoint_id, error=str(e))
            if "twophase log resolve" in str(e):  # the sink named the command already
                raise
            raise DataLossError(
                f"{e}. Checkpoint {rec.checkpoint_id} of sink {self.log.sink_id!r} stays COMPLETED and every restart "
                f"stops here until an operator records the loss: twophase log resolve {self.log.location} "
                f"--sink-id {self.log.sink_id} --checkpoint {rec.checkpoint_id} --accept-loss") from e
        self.log.transition(rec.checkpoint_id, CheckpointState.COMMITTED)
        _log.info("checkpoint_committed", sink_id=self.log.sink_id, checkpoint_id=rec.checkpoint_id,
                  handles=len(handles), recovering=recovering, commit_ms=round((time.perf_counter() - started) * 1e3, 3))

    # ---- the Spark path: one call per batch, all acks at once

    def complete_batch(self, checkpoint_id: int, acks: Sequence[Optional[Ack]],
                       expected_tasks: Optional[Iterable[str]] = None) -> CommitOutcome:
        """Complete checkpoint ``checkpoint_id`` from every task's ack in one call (Spark's driver commit).

        Idempotent (invariant 2): if the log already has the checkpoint COMMITTED (or pruned below the
        highest committed id), every ack's handle is aborted and nothing is committed again; if it is
        COMPLETED, the recorded handles are committed and the new ones aborted. Returns the outcome.
        Raises :class:`CheckpointDeclinedError` (after aborting everything) if a task did not ack.
        """
        present = [a for a in acks if a is not None]
        expected = ({str(t) for t in expected_tasks} if expected_tasks is not None
                    else {a.task_id for a in present} | ({"<missing>"} if len(present) < len(acks) else set()))
        with self._lock, self.log.locked():
            self._bind_query(checkpoint_id, present)
            rec = self.log.get(checkpoint_id)
            highest = self.log.highest_committed()
            already = (rec is not None and rec.state in (CheckpointState.COMMITTED, CheckpointState.LOST)) or (
                rec is None and highest is not None and checkpoint_id < highest)
            if already or (rec is not None and rec.state is CheckpointState.COMPLETED):
                recorded = list(rec.handles.values()) if rec is not None else []
                stale = [a.handle for a in present if a.handle not in recorded]
                for h in stale:
                    self.sink.abort(h)
                if already:
                    _log.info("batch_already_committed", sink_id=self.log.sink_id, checkpoint_id=checkpoint_id,
                              aborted_new_handles=len(stale))
                    if self.sweep_after_commit and rec is not None and rec.state is CheckpointState.COMMITTED:
                        # a re-run of a committed batch (Spark had not logged it): its own retried or
                        # crashed attempts are leftovers too, and this may be the run's last batch
                        self._sweep(checkpoint_id)
                    return CommitOutcome.ALREADY_COMMITTED
                self.notify_checkpoint_complete(checkpoint_id)
                return CommitOutcome.RECOVERED
            # step 1 (trigger and acks coincide in Spark)
            if rec is None or rec.state is CheckpointState.ABORTED:
                self.log.transition(checkpoint_id, CheckpointState.PENDING)
                if rec is None and self._superseded(checkpoint_id):
                    for a in present:
                        self.sink.abort(a.handle)
                    return CommitOutcome.ALREADY_COMMITTED
            pending = PendingCheckpoint(checkpoint_id, expected, triggered_at=self.clock())
            self._pending[checkpoint_id] = pending
            for a in present:  # step 2
                result = pending.acknowledge(a.task_id, a.handle)
                if result is not TaskAcknowledgeResult.SUCCESS:
                    _log.warning("ack_rejected", checkpoint_id=checkpoint_id, task=a.task_id, result=result.value)
                    if not self._is_accepted(a, pending):  # a redelivered copy of an accepted ack is not aborted
                        self.sink.abort(a.handle)
            if not pending.is_fully_acknowledged:
                missing = sorted(pending.not_yet_acknowledged)
                self.abort_checkpoint(checkpoint_id, f"tasks {missing} did not acknowledge")
                raise CheckpointDeclinedError(
                    f"checkpoint {checkpoint_id} of sink {self.log.sink_id!r} aborted: tasks {missing} did not ack")
            self._complete_and_commit(pending)
            return CommitOutcome.COMMITTED

    def _bind_query(self, checkpoint_id: int, acks: Sequence[Ack]) -> None:
        """Invariant 6: the acks' query must be the log's; otherwise abort them and refuse."""
        query_ids = sorted({a.query_id for a in acks if a.query_id})
        try:
            if len(query_ids) > 1:
                raise QueryMismatchError(f"checkpoint {checkpoint_id} of sink {self.log.sink_id!r} got acks from "
                                         f"several streaming queries {query_ids}; one sink id serves one query")
            if query_ids:
                self.log.bind_query(query_ids[0])
        except QueryMismatchError:
            for a in acks:
                self.sink.abort(a.handle)
            raise

    def _superseded(self, checkpoint_id: int) -> bool:
        """After creating a record: did another driver commit a higher id meanwhile (then this id's old
        record was pruned and this writer is a zombie)? If so, abort the new record (log invariant 7)."""
        highest = self.log.highest_committed(fresh=True)
        if highest is None or highest <= checkpoint_id:
            return False
        _log.warning("checkpoint_superseded", sink_id=self.log.sink_id, checkpoint_id=checkpoint_id, highest=highest)
        self.log.transition(checkpoint_id, CheckpointState.ABORTED,
                            reason=f"checkpoint {highest} was committed meanwhile by another driver")
        return True

    def resolve_lost(self, checkpoint_id: int, reason: str) -> CheckpointRecord:
        """The operator's way out of invariant 7: record a COMPLETED checkpoint that can never be
        committed as LOST (final, with the reason), so that recovery goes on. Refuses any other state."""
        with self._lock, self.log.locked():
            rec = self.log.get(checkpoint_id)
            if rec is None or rec.state is not CheckpointState.COMPLETED:
                raise ConfigurationError(
                    f"checkpoint {checkpoint_id} of sink {self.log.sink_id!r} is "
                    f"{rec.state.value if rec else 'not in the log'}; only a COMPLETED checkpoint can be resolved as lost")
            records = sum(int(h.get("records", 0) or 0) for h in rec.handles.values())
            out = self.log.transition(checkpoint_id, CheckpointState.LOST, reason=f"data loss accepted: {reason}")
        _log.error("checkpoint_loss_accepted", sink_id=self.log.sink_id, checkpoint_id=checkpoint_id,
                   handles=len(rec.handles), records=records, reason=reason)
        return out

    def abort_batch(self, checkpoint_id: int, acks: Sequence[Optional[Ack]], reason: str) -> None:
        """Spark's driver abort: abort every prepared handle, record ABORTED unless already decided."""
        with self._lock, self.log.locked():
            rec = self.log.get(checkpoint_id)
            recorded = list(rec.handles.values()) if rec is not None and rec.state.is_decided else []
            for a in acks:
                if a is not None and a.handle not in recorded:
                    self.sink.abort(a.handle)
            highest = self.log.highest_committed() if rec is None else None
            if highest is not None and checkpoint_id < highest:
                return  # committed and pruned (as in complete_batch): a new record would reopen it
            if rec is None or rec.state is CheckpointState.ABORTED:
                self.log.transition(checkpoint_id, CheckpointState.PENDING)
                rec = self.log.get(checkpoint_id)
            if rec is not None and rec.state is CheckpointState.PENDING:
                self.log.transition(checkpoint_id, CheckpointState.ABORTED, reason=reason)
