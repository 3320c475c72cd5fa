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
2. commit (also at recovery) is idempotent per checkpoint id: a COMMITTED checkpoint is never
   committed again, and handles arriving for it (a re-run or retried commit) are aborted.
3. A notification for checkpoint n commits every completed, uncommitted checkpoint <= n, in order.
4. Handles of a declined, expired or subsumed checkpoint are aborted, never committed. A checkpoint one of
   whose prepared transactions the sink already lost before the decision (``SinkCommitter.check_prepared``:
   Kafka's broker expired it) is declined the same way: aborted, retriable, never decided. The check is asked on
   every path that decides (a Spark batch, a batch write's run, the embedded runtime's last ack) and never
   for a decided checkpoint; a check that fails (TransientSinkError) decides nothing either.
5. Recovery commits every COMPLETED checkpoint and aborts every PENDING one and every lingering
   transaction of checkpoints up to the highest committed id, before any new data is written.
   Lingering transactions of higher (aborted) ids are left alone, since such an id may be attempted
   again at this very moment; they are aborted once a later checkpoint commits (step 5).
   A sink that sweeps with the commit (``SinkCommitter.sweep_with_commit``: S3) has done that sweep when
   the highest COMMITTED record says ``swept``, and recovery then lists nothing; whatever an attempt
   still running creates afterwards is aborted by the next commit's sweep (:mod:`twophase.decisions`).
6. Acks of another streaming query than the one the log is bound to (a deleted and recreated
   checkpoint: batch ids restart at 0) are aborted and refused with QueryMismatchError; they are
   never taken for re-runs of the old query's committed batches.
7. A COMPLETED checkpoint that cannot be committed (DataLossError) stops recovery, with the operator
   command in the error; only ``twophase log resolve --accept-loss`` moves it to LOST, which is
   recorded, final, and never counted as committed.

What the coordinator does on each event is one pure function, :func:`twophase.decisions.decide`
(event, record state, facts) -> actions, whose module docstring has the whole decision table. Every
entry point below reads what it needs, asks it, and hands the actions to the executor
(:meth:`CheckpointCoordinator._execute`), the only place that writes a checkpoint record; the sink is
reached only through ``_abort_handles``, ``_commit_handles``, ``_check_handles`` and ``_sweep``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Sequence

from twophase import faults
from twophase._logging import get_logger
from twophase.checkpoint import (CheckpointProperties, CompletedCheckpoint, Handle, PendingCheckpoint,
                                 TaskAcknowledgeResult, _task_sort_key)
from twophase.decisions import (AbortHandles, Action, CheckSuperseded, CommitHandles, CommitOutcome, CommitUpTo,
                                DeclineWriteJob, Event,
                                Facts, Handles, Outcome, Prune, Refuse, RefuseResolve, Sweep, TakeAcks, WriteAborted,
                                WriteCommitted, WriteCompleted, WriteLost, WritePending, decide)
from twophase.errors import (CheckpointDeclinedError, ConcurrentWriterError, ConfigurationError, DataLossError,
                             QueryMismatchError, RecordExistsError, TransientSinkError)
from twophase.log import CheckpointRecord, TransactionLog
from twophase.sink import Ack, CommitStatus, SinkCommitter, SinkSpec
from twophase.states import CheckpointState, check_transition

__all__ = ["CheckpointCoordinator", "CommitOutcome", "RecoveryReport", "TriggerPolicy"]

_log = get_logger(__name__)

#: what a checkpoint declined by ``check_prepared`` leads to: its error message (``{reason}``: the sink's
#: words) and whether it is retriable (a Spark micro-batch runs again; a batch
#: write's commit does not, a new run of the write does; the embedded runtime fails over)
_THEN_BATCH = ("checkpoint {cid} of sink {sink!r} was not decided: {reason}. Every transaction of it was aborted "
               "and nothing of it committed; the batch runs again", True)
_THEN_WRITE_JOB = ("run {cid} of batch write {sink!r} was not committed: {reason}. Every transaction of it was "
                   "aborted: nothing of this write was committed. A batch write is not re-run by anyone: the job must "
                   "be re-run (with the same option writeId, its new run replaces this one)", False)
_THEN_RUNTIME = ("checkpoint {cid} of sink {sink!r} was not decided: {reason}. Nothing of it was committed; the job "
                 "fails over: its sinks abort the transactions of every undecided checkpoint, it restarts from its "
                 "last completed checkpoint and writes the records again into new transactions", True)


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


@dataclass
class _Call:
    """One entry point's call, as its executor sees it: the checkpoint, its record as read, and what it brings."""

    checkpoint_id: int
    #: the record as last read or written by this call (None: no record)
    record: Optional[CheckpointRecord] = None
    #: the (record, version) the decision was based on: the first write compare-and-swaps against it
    #: (log invariant 7); None: the log's own read (inside ``locked()`` that is the cached one)
    expected: Optional[tuple[Optional[CheckpointRecord], Optional[str]]] = None
    #: the handles the event brings (ACKED)
    handles: Sequence[Handle] = ()
    #: BATCH_COMMIT: the acks and the tasks that must ack
    acks: Sequence[Ack] = ()
    expected_tasks: frozenset[str] = frozenset()
    #: TRIGGER: the properties to record
    properties: Optional[CheckpointProperties] = None
    #: ACKS_COMPLETE: the finalized checkpoint to record
    completed: Optional[CompletedCheckpoint] = None
    #: what the executor saw: handles aborted, lingering transactions swept, when the commit started
    aborted: int = 0
    swept: int = 0
    #: a Sweep of this call went through (WriteCommitted records it: decisions, "sweeping with the commit")
    sweep_done: bool = False
    commit_started: float = 0.0
    recovering: bool = False

    @property
    def state(self) -> Optional[CheckpointState]:
        return self.record.state if self.record is not None else None


class CheckpointCoordinator:
    """Drives the two-phase commit of one sink against its durable log (see module invariants).

    Thread-safe. Holds pending checkpoints in memory only; everything that matters after a crash is
    in the log, so a coordinator can be created afresh for every Spark commit call.

    Every public entry point reads what it needs, asks :func:`twophase.decisions.decide` and hands the
    actions to :meth:`_execute`, the only place that writes a checkpoint record; the sink is reached only
    through :meth:`_abort_handles`, :meth:`_commit_handles`, :meth:`_check_handles` and :meth:`_sweep`.
    """

    def __init__(self, sink: "SinkSpec[Any] | SinkCommitter[Any]", log: Optional[TransactionLog] = None, *,
                 policy: Optional[TriggerPolicy] = None, clock: Callable[[], float] = time.time,
                 sweep_after_commit: bool = True) -> None:
        """``sweep_after_commit``: abort lingering transactions ``<= n`` right after committing ``n``
        (step 5). The Spark adapter turns it off because it recovers, and so sweeps, before every
        micro-batch anyway; a sweep can be a slow listing (S3 multipart uploads).

        ``sink`` is a sink's spec (its committer and, unless ``log`` is given, its log are taken from it)
        or a committer (then ``log`` is required: the runtime's job committer)."""
        committer: SinkCommitter[Any] = sink.create_committer() if isinstance(sink, SinkSpec) else sink
        if isinstance(sink, SinkSpec):
            log = log if log is not None else sink.transaction_log()
        elif log is None:
            raise ConfigurationError("a CheckpointCoordinator over a committer needs the log")
        self.committer = committer
        self.sweep_after_commit = sweep_after_commit
        #: the committer lets the sweep after a commit run before COMMITTED is recorded (decisions module)
        self.sweep_with_commit = bool(getattr(committer, "sweep_with_commit", False))
        self.log = log
        self.policy = policy or TriggerPolicy()
        self.clock = clock
        self._pending: dict[int, PendingCheckpoint] = {}
        self._lock = threading.RLock()
        self.last_trigger: Optional[float] = None
        self.last_completion: Optional[float] = None
        self.consecutive_failures = 0
        self.listeners: list[Callable[[CompletedCheckpoint], None]] = []

    # ---- the sink's committer, reached only here

    def _abort_handles(self, handles: Iterable[Handle], *, recovering: bool = False) -> None:
        """Abort JSON handles through the committer (typed by its ``decode``)."""
        for h in handles:
            self.committer.abort(self.committer.decode(h), recovering=recovering)

    def _commit_handles(self, checkpoint_id: int, handles: Sequence[Handle], *, recovering: bool) -> None:
        """Commit a checkpoint's JSON handles through the committer; a LOST outcome is a DataLossError."""
        results = self.committer.commit_checkpoint(checkpoint_id, [self.committer.decode(h) for h in handles],
                                                   recovering=recovering)
        lost = [r for r in results if r.status is CommitStatus.LOST]
        if lost:
            raise DataLossError("; ".join(r.detail or f"task {r.committable.task_id}: data gone" for r in lost))

    def _check_handles(self, checkpoint_id: int, handles: Sequence[Handle]) -> list[str]:
        """The committer's ``check_prepared`` of JSON handles, before the decision: what it found gone."""
        return list(self.committer.check_prepared(checkpoint_id, [self.committer.decode(h) for h in handles]))

    def _sweep(self, up_to: int) -> int:
        """Abort this sink's lingering transactions ``<= up_to`` (committed or recovered up to there: nothing
        of them can be committed any more); returns how many. Raises what the sink raises (the executor
        makes a sweep after a commit best effort)."""
        return self.committer.abort_lingering(up_to, self.log.highest_committed())

    # ---- recovery (invariant 5)

    def recover(self) -> RecoveryReport:
        """Commit COMPLETED checkpoints, abort PENDING ones and lingering transactions."""
        report = RecoveryReport()
        with self._lock, self.log.locked():
            view = self.log.view()
            for rec in view.unfinished:
                actions = decide(Event.RECOVER, rec.state)
                self._execute(Event.RECOVER, actions, _Call(rec.checkpoint_id, rec))
                if any(isinstance(a, WriteCommitted) for a in actions):
                    report.committed.append(rec.checkpoint_id)
                elif any(isinstance(a, WriteAborted) for a in actions):
                    report.aborted.append(rec.checkpoint_id)
                faults.maybe_crash("in_recovery", rec.checkpoint_id)
            # Only up to the highest COMMITTED id: an ABORTED id may be attempted again right now (Spark
            # re-runs the batch; this recovery also runs in the commit worker just before that batch's
            # commit), so its staged data is cleaned only once a later checkpoint commits (step 5).
            # (an id of 0 is a committed id: `or -1` here once skipped the sweep whenever only batch 0 was committed)
            highest = max([-1 if view.highest_committed is None else view.highest_committed, *report.committed])
            # swept with its commit (recorded in its COMMITTED record): no sweep needed up to it
            swept = not report.committed and view.committed is not None and view.committed.swept
            call = _Call(highest)
            self._run(Event.RECOVERY_SWEEP, None,
                      Facts(highest_committed=highest if highest >= 0 else None, swept=swept), call)
            report.lingering_aborted = call.swept
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
            call = self._read(checkpoint_id, properties=pending.properties)
            # step 1: record PENDING (WritePending), or refuse an id that has a live or decided record
            self._run(Event.TRIGGER, call.state, Facts(), call)
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
                self._reject_ack(ack, pending, result)
                return result
            if pending.is_fully_acknowledged and self._check_prepared(pending, then=_THEN_RUNTIME,
                                                                      decline_transient=True):
                self._complete_and_commit(pending)
            return result

    def _reject_ack(self, ack: Ack, pending: Optional[PendingCheckpoint], result: TaskAcknowledgeResult) -> None:
        """A duplicate, unknown or late ack: aborted (invariant 4), unless it carries a handle its checkpoint
        already took (a redelivered ack), which will be (or was) committed."""
        _log.warning("ack_rejected", checkpoint_id=ack.checkpoint_id, task=ack.task_id, result=result.value)
        redelivered = pending is not None and ack.handle in pending.acked_handles.values()
        # a redelivery is decided whatever the record says: the log is read only when it matters
        call = (_Call(ack.checkpoint_id, handles=[ack.handle]) if redelivered
                else self._read(ack.checkpoint_id, handles=[ack.handle]))
        self._run(Event.ACK_REJECTED, call.state, Facts(redelivered=redelivered), call)

    def decline(self, checkpoint_id: int, task_id: str, reason: str) -> None:
        """A task cannot take part in ``checkpoint_id``: abort it (invariant 4)."""
        self.abort_checkpoint(checkpoint_id, f"declined by task {task_id}: {reason}")

    def abort_checkpoint(self, checkpoint_id: int, reason: str, extra_handles: Sequence[Handle] = (),
                         *, expired: bool = False) -> None:
        """Abort a pending checkpoint and every handle acked to it."""
        with self._lock:
            pending = self._pending.pop(checkpoint_id, None)
            handles = list(pending.abort(reason).values()) if pending else []
            call = self._read(checkpoint_id, handles=[*handles, *extra_handles])
            self._run(Event.ABORT, call.state, Facts(reason=reason), call)
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
        call = self._read(cid, completed=completed)
        # step 3 (WriteCompleted: durable decision before any commit, invariant 1), then step 4 (CommitUpTo)
        self._run(Event.ACKS_COMPLETE, call.state, Facts(), call)
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
            # step 4: commit everything completed up to checkpoint_id, in order (invariant 3); a PENDING
            # record below it that no live PendingCheckpoint owns (its coordinator died) is subsumed
            for rec in self.log.unfinished():
                if rec.checkpoint_id > checkpoint_id:
                    break
                facts = Facts(older=rec.checkpoint_id < checkpoint_id, notified=checkpoint_id,
                              sweep_after_commit=self.sweep_after_commit, sweep_with_commit=self.sweep_with_commit)
                self._run(Event.NOTIFY_COMPLETE, rec.state, facts, _Call(rec.checkpoint_id, rec))
            # step 5b: clean up
            self.consecutive_failures = 0
            self._run(Event.CLEAN_UP, None, Facts(sweep_after_commit=self.sweep_after_commit,
                                                  sweep_with_commit=self.sweep_with_commit), _Call(checkpoint_id))
        faults.maybe_crash("after_commit", checkpoint_id)

    # ---- the Spark path: one call per batch, all acks at once

    def complete_batch(self, checkpoint_id: int, acks: Sequence[Optional[Ack]],
                       expected_tasks: Optional[Iterable[str]] = None) -> CommitOutcome:
        """Complete checkpoint ``checkpoint_id`` from every task's ack in one call (Spark's driver commit).

        Idempotent (invariant 2): if the log already has the checkpoint COMMITTED (or pruned below the
        highest committed id), every ack's handle is aborted and nothing is committed again; if it is
        COMPLETED, the recorded handles are committed and the new ones aborted. Returns the outcome.
        Raises :class:`CheckpointDeclinedError` (after aborting everything) if a task did not ack.

        The record is created before it is read (a batch id is new in the common case): the decision is
        asked on "no record", whose first action creates PENDING with a compare-and-swap against absent;
        if a record is there (:class:`RecordExistsError` from that first write, before anything else was
        done), it is read and the decision asked again on its state (see :mod:`twophase.decisions`).
        """
        present = [a for a in acks if a is not None]
        expected = ({str(t) for t in expected_tasks} if expected_tasks is not None
                    else {a.task_id for a in present} | ({"<missing>"} if len(present) < len(acks) else set()))
        with self._lock, self.log.locked():
            self._bind_query(checkpoint_id, present)
            facts = Facts(sweep_after_commit=self.sweep_after_commit)
            kw: dict[str, Any] = dict(handles=[a.handle for a in present], acks=present,
                                      expected_tasks=frozenset(expected))
            # create first, read only if a record is there (no GET of an absent record, no listing)
            call = _Call(checkpoint_id, None, (None, None), **kw)
            try:
                outcome = self._run(Event.BATCH_COMMIT, None, facts, call)
            except RecordExistsError:
                if call.record is not None:  # a later write of this call: not the create
                    raise
                call = self._read(checkpoint_id, **kw)
                outcome = self._run(Event.BATCH_COMMIT, call.state, facts, call)
            assert outcome is not None, "every BATCH_COMMIT decision ends with an outcome"
            return outcome

    def _take_acks(self, call: _Call, *, write_job: bool = False) -> CommitOutcome:
        """Steps 1-2 of the Spark path (trigger and acks coincide), then 3-4 if every task acked.
        ``write_job``: a batch write's run (WRITE_JOB_COMMIT), which nobody re-runs on its own."""
        checkpoint_id = call.checkpoint_id
        # step 1 (trigger and acks coincide in Spark; BATCH_COMMIT wrote PENDING unless it was there)
        pending = PendingCheckpoint(checkpoint_id, call.expected_tasks, triggered_at=self.clock())
        self._pending[checkpoint_id] = pending
        for a in call.acks:  # step 2
            result = pending.acknowledge(a.task_id, a.handle)
            if result is not TaskAcknowledgeResult.SUCCESS:
                self._reject_ack(a, pending, result)  # a redelivered copy of an accepted ack is not aborted
        if not pending.is_fully_acknowledged:
            missing = sorted(pending.not_yet_acknowledged)
            self.abort_checkpoint(checkpoint_id, f"tasks {missing} did not acknowledge")
            raise CheckpointDeclinedError(
                f"checkpoint {checkpoint_id} of sink {self.log.sink_id!r} aborted: tasks {missing} did not ack")
        self._check_prepared(pending, then=_THEN_WRITE_JOB if write_job else _THEN_BATCH)
        self._complete_and_commit(pending)
        return CommitOutcome.COMMITTED

    def _check_prepared(self, pending: PendingCheckpoint, *, then: tuple[str, bool],
                        decline_transient: bool = False) -> bool:
        """Invariant 4, before step 3: a handle whose prepared data the sink already lost (the committer's
        ``check_prepared``: Kafka's broker expired the transaction) declines the checkpoint like a missing
        ack: every handle aborted, nothing decided, and CheckpointDeclinedError says what happens next
        (``then``: its message and whether it is retriable; a Spark batch runs again, a batch write must be run
        again by its user, the embedded runtime fails over). Deciding it would make a checkpoint that can only
        become LOST, an operator's case, while nothing was decided.

        ``decline_transient`` (the acknowledge path): a check that raises TransientSinkError declines the
        checkpoint (aborted, counted as a failed checkpoint; the runtime carries its transactions into the
        next checkpoint, which asks the check again) and returns False. Otherwise the error propagates and
        nothing is decided either (Spark retries the commit or aborts the batch). Returns True: decide."""
        cid = pending.checkpoint_id
        acked = pending.acked_handles
        try:
            gone = self._check_handles(cid, [acked[t] for t in sorted(acked, key=_task_sort_key)])
        except TransientSinkError as e:
            if not decline_transient:
                raise
            _log.warning("prepared_check_failed", sink_id=self.log.sink_id, checkpoint_id=cid, error=str(e),
                         consequence="the checkpoint is declined, not decided; its transactions are checked again "
                                     "with the next checkpoint")
            self.abort_checkpoint(cid, f"the check of its prepared transactions failed: {e}")
            return False
        if not gone:
            return True
        reason = "; ".join(gone)
        self.abort_checkpoint(cid, f"prepared data gone before the decision: {reason}")
        text, retriable = then
        raise CheckpointDeclinedError(text.format(cid=cid, sink=self.log.sink_id, reason=reason), retriable=retriable)

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
            self._run(Event.QUERY_MISMATCH, None, Facts(), _Call(checkpoint_id, handles=[a.handle for a in acks]))
            raise

    def resolve_lost(self, checkpoint_id: int, reason: str) -> CheckpointRecord:
        """The operator's way out of invariant 7: record a COMPLETED checkpoint that can never be
        committed as LOST (final, with the reason), so that recovery goes on. Refuses any other state."""
        with self._lock, self.log.locked():
            call = self._read(checkpoint_id)
            rec = call.record
            self._run(Event.RESOLVE_LOST, call.state, Facts(reason=reason), call)
        assert rec is not None and call.record is not None
        records = sum(int(h.get("records", 0) or 0) for h in rec.handles.values())
        _log.error("checkpoint_loss_accepted", sink_id=self.log.sink_id, checkpoint_id=checkpoint_id,
                   handles=len(rec.handles), records=records, reason=reason)
        return call.record

    def abort_batch(self, checkpoint_id: int, acks: Sequence[Optional[Ack]], reason: str) -> None:
        """Spark's driver abort: abort every prepared handle, record ABORTED unless already decided."""
        with self._lock, self.log.locked():
            call = self._read(checkpoint_id, handles=[a.handle for a in acks if a is not None])
            highest = self.log.highest_committed() if call.record is None else None
            # committed and pruned (as in complete_batch): a new record would reopen it
            facts = Facts(below_highest=highest is not None and checkpoint_id < highest, reason=reason)
            self._run(Event.SPARK_ABORT_BATCH, call.state, facts, call)

    # ---- batch writes (df.write): a log per write, one id per run (twophase.write_job)

    def complete_write_job(self, checkpoint_id: int, acks: Sequence[Optional[Ack]],
                           expected_tasks: Iterable[str]) -> CommitOutcome:
        """Spark's driver commit of a batch write's run ``checkpoint_id`` (its PENDING record was written
        when the job was planned). Like :meth:`complete_batch`, but a record that a newer run took over
        (ABORTED) or that is gone is never reopened: the acks are aborted and CheckpointDeclinedError raised."""
        present = [a for a in acks if a is not None]
        with self._lock, self.log.locked():
            call = self._read(checkpoint_id, handles=[a.handle for a in present], acks=present,
                              expected_tasks=frozenset(str(t) for t in expected_tasks))
            return self._commit_write_job_call(call)

    def _commit_write_job_call(self, call: _Call) -> CommitOutcome:
        """WRITE_JOB_COMMIT on ``call``'s record; a compare-and-swap to COMMITTED lost to another driver is
        reported as the run committed (write_job invariant 6)."""
        try:
            outcome = self._run(Event.WRITE_JOB_COMMIT, call.state, Facts(), call)
        except ConcurrentWriterError:
            if self._fresh_state(call.checkpoint_id) is not CheckpointState.COMMITTED:
                raise
            # another driver (another host finishing this decided run; object-store logs lock only
            # locally) committed the same recorded handles and won the compare-and-swap to COMMITTED:
            # every handle of the run is committed
            _log.info("write_job_committed_by_another_driver", sink_id=self.log.sink_id,
                      checkpoint_id=call.checkpoint_id)
            return CommitOutcome.ALREADY_COMMITTED
        assert outcome is not None, "every WRITE_JOB_COMMIT decision ends with an outcome or raises"
        return outcome

    def _fresh_state(self, checkpoint_id: int) -> Optional[CheckpointState]:
        """The record's state as the store has it now (a new listing and read, even inside a lock span)."""
        self.log.highest_committed(fresh=True)
        self.log._cache.pop(checkpoint_id, None)
        rec = self.log.get(checkpoint_id)
        return rec.state if rec is not None else None

    def sweep_write_job(self, up_to: int) -> int:
        """Sweep a finished batch write's lingering transactions ``<= up_to`` once more (stragglers that
        attempts opened after its last sweep; write_job invariant 8). Best effort: returns how many."""
        with self._lock, self.log.locked():
            call = _Call(up_to)
            self._do(Event.RECOVERY_SWEEP, Sweep(up_to=up_to, best_effort=True), call)
            return call.swept

    def finish_write_job_runs(self) -> tuple[Optional[int], list[int]]:
        """Commit the decided (COMPLETED) runs of a batch write (:meth:`recover`); a compare-and-swap lost to
        another driver that committed them meanwhile is not an error. Returns the highest committed run as
        the log has it afterwards (None: none) and the runs this call recorded COMMITTED."""
        committed: list[int] = []
        with self._lock, self.log.locked():
            try:
                committed = self.recover().committed
            except ConcurrentWriterError:
                pass  # re-read below: committed by the other driver, or still COMPLETED (then raise)
            self.log.highest_committed(fresh=True)
            self.log._cache.clear()
            view = self.log.view()
            left = [r.checkpoint_id for r in view.unfinished if r.state is CheckpointState.COMPLETED]
            if left:
                raise ConcurrentWriterError(
                    f"runs {left} of batch write {self.log.sink_id!r} stay COMPLETED: another driver is writing "
                    "this log at the same moment; re-run the write with the same option writeId to finish them")
            return view.highest_committed, committed

    def abort_write_job(self, checkpoint_id: int, acks: Sequence[Optional[Ack]], reason: str) -> Optional[CommitOutcome]:
        """Spark's driver abort of a batch write's run: abort every prepared handle, record ABORTED and
        sweep what failed attempts left (ids <= this run's: no later run exists while this one is PENDING).

        A run that is COMPLETED is decided and only ever goes forward (write_job invariant 5): Spark calls
        abort when its commit threw after the decision (a transient error while committing), so the run is
        committed here, exactly as a commit would (WRITE_JOB_COMMIT on COMPLETED), and the outcome returned
        (None: nothing was committed). A run found COMMITTED (Spark's commit threw after the commit, in its
        bookkeeping) returns ALREADY_COMMITTED: its rows are committed, nothing is aborted."""
        present = [a for a in acks if a is not None]
        with self._lock, self.log.locked():
            call = self._read(checkpoint_id, handles=[a.handle for a in present])
            if call.state is CheckpointState.COMPLETED:
                call = self._read(checkpoint_id, handles=[a.handle for a in present], acks=present)
                return self._commit_write_job_call(call)
            self._run(Event.WRITE_JOB_ABORT, call.state, Facts(reason=reason), call)
            if call.state is CheckpointState.COMMITTED:  # the record read at the start of this lock span
                # committed (by this job's commit before an error in what followed it, or by another driver):
                # the acked handles are the recorded ones, nothing was aborted; never reported as an abort
                return CommitOutcome.ALREADY_COMMITTED
            return None

    def take_over_write_job(self, checkpoint_id: int, reason: str) -> Optional[CheckpointState]:
        """Abort the unfinished (PENDING) run ``checkpoint_id`` of a batch write that a new run replaces,
        and sweep its staged data. The old run, if it is still alive, is declined at its commit (its
        compare-and-swap from PENDING fails, or it reads ABORTED): it can never commit afterwards.

        Returns the state the run was found in: PENDING (this call took it over), or whatever another
        driver made of it meanwhile (COMPLETED, COMMITTED: the caller recovers or skips, never plans a run
        after it; ABORTED, LOST, None: nothing to take over)."""
        with self._lock, self.log.locked():
            call = self._read(checkpoint_id)
            found = call.state
            try:
                self._run(Event.WRITE_JOB_TAKE_OVER, found, Facts(reason=reason), call)
            except ConcurrentWriterError:  # the compare-and-swap from PENDING lost: read what it is now
                return self._fresh_state(checkpoint_id)
            return found

    # ---- the executor: the only place that writes a checkpoint record or reaches the sink

    def _read(self, checkpoint_id: int, **kw: Any) -> _Call:
        """A call on ``checkpoint_id`` with its record as the log has it now (the decision's read)."""
        rec, version = self.log.get_versioned(checkpoint_id)
        return _Call(checkpoint_id, rec, (rec, version), **kw)

    def _run(self, event: Event, state: Optional[CheckpointState], facts: Facts,
             call: _Call) -> Optional[CommitOutcome]:
        return self._execute(event, decide(event, state, facts), call)

    def _execute(self, event: Event, actions: Sequence[Action], call: _Call) -> Optional[CommitOutcome]:
        """Do ``actions`` in order; an outcome (Outcome, TakeAcks, a CheckSuperseded that found one) ends them."""
        for action in actions:
            outcome = self._do(event, action, call)
            if outcome is not None:
                return outcome
        return None

    def _write(self, call: _Call, target: CheckpointState, **changes: Any) -> CheckpointRecord:
        expected, call.expected = call.expected, None
        call.record = self.log.transition(call.checkpoint_id, target, expected=expected, **changes)
        return call.record

    def _handles(self, which: Handles, call: _Call) -> list[Handle]:
        recorded = list(call.record.handles.values()) if call.record is not None else []
        if which is Handles.RECORDED:
            return recorded
        if which is Handles.UNRECORDED:
            return [h for h in call.handles if h not in recorded]
        return list(call.handles)

    def _do(self, event: Event, action: Action, call: _Call) -> Optional[CommitOutcome]:
        cid = call.checkpoint_id
        if isinstance(action, AbortHandles):
            handles = self._handles(action.which, call)
            self._abort_handles(handles, recovering=action.recovering)
            call.aborted += len(handles)
        elif isinstance(action, CommitHandles):
            assert call.record is not None
            call.commit_started, call.recovering = time.perf_counter(), action.recovering
            self._commit_checkpoint(call.record, recovering=action.recovering)
        elif isinstance(action, WritePending):
            self._write(call, CheckpointState.PENDING,
                        **({"properties": call.properties} if call.properties is not None else {}))
        elif isinstance(action, WriteCompleted):
            assert call.completed is not None
            faults.maybe_crash("before_complete", cid)
            # step 3: durable decision before any commit (invariant 1)
            self._write(call, CheckpointState.COMPLETED, handles=dict(call.completed.handles),
                        task_state=call.completed.task_state)
            faults.maybe_crash("after_complete", cid)
            self.last_completion = self.clock()
            self.consecutive_failures = 0
        elif isinstance(action, WriteCommitted):
            rec = self._write(call, CheckpointState.COMMITTED, **({"swept": True} if call.sweep_done else {}))
            _log.info("checkpoint_committed", sink_id=self.log.sink_id, checkpoint_id=cid, handles=len(rec.handles),
                      recovering=call.recovering,
                      commit_ms=round((time.perf_counter() - call.commit_started) * 1e3, 3))
        elif isinstance(action, WriteAborted):
            self._write(call, CheckpointState.ABORTED, reason=action.reason)
        elif isinstance(action, WriteLost):
            self._write(call, CheckpointState.LOST, reason=action.reason)
        elif isinstance(action, Sweep):
            up_to = cid if action.up_to is None else action.up_to
            if not action.best_effort:
                call.swept = self._sweep(up_to)
                call.sweep_done = True
            else:
                # cleanup only: a failure is logged and the next sweep (the next commit, the next recovery)
                # retries it; it never fails a batch whose data is already committed
                try:
                    call.swept = self._sweep(up_to)
                    call.sweep_done = True
                except Exception as e:  # noqa: BLE001 - see above
                    _log.warning("sweep_failed", sink_id=self.log.sink_id, checkpoint_id=up_to, error=str(e),
                                 consequence="leftovers stay until the next sweep")
        elif isinstance(action, Prune):
            self.log.prune()
        elif isinstance(action, CommitUpTo):
            # step 4: commit everything completed up to cid, in order (invariant 3)
            self.notify_checkpoint_complete(cid, current=call.record)
        elif isinstance(action, CheckSuperseded):
            # this call holds a PENDING record it created, re-opened or found: is the id below the highest
            # committed one (committed before and pruned, or by another driver meanwhile)? A listing made
            # after the create, so it cannot miss such a commit (log invariant 7)
            highest = self.log.highest_committed(fresh=True)
            facts = Facts(below_highest=highest is not None and cid < highest, highest_committed=highest)
            outcome = self._run(Event.SUPERSEDED_CHECK, call.state, facts, call)
            if outcome is not None:
                _log.warning("checkpoint_superseded", sink_id=self.log.sink_id, checkpoint_id=cid, highest=highest)
            return outcome
        elif isinstance(action, TakeAcks):
            return self._take_acks(call, write_job=event is Event.WRITE_JOB_COMMIT)
        elif isinstance(action, Outcome):
            if event is Event.BATCH_COMMIT and action.outcome is CommitOutcome.ALREADY_COMMITTED:
                _log.info("batch_already_committed", sink_id=self.log.sink_id, checkpoint_id=cid,
                          aborted_new_handles=call.aborted)
            return action.outcome
        elif isinstance(action, Refuse):
            check_transition(call.state, action.target, what=f"checkpoint {cid} of sink {self.log.sink_id!r}")
            raise AssertionError(f"{action} for an allowed move")  # pragma: no cover - the table refuses it
        elif isinstance(action, DeclineWriteJob):
            why = (call.record.reason if call.record is not None and call.record.reason else "its record is gone")
            raise CheckpointDeclinedError(
                f"run {cid} of batch write {self.log.sink_id!r} was not committed: {why}. A newer run of the same "
                "write took it over (it aborted this one, which never commits); its acks were aborted", retriable=False)
        elif isinstance(action, RefuseResolve):
            raise ConfigurationError(
                f"checkpoint {cid} of sink {self.log.sink_id!r} is "
                f"{call.state.value if call.state else 'not in the log'}; only a COMPLETED checkpoint can be "
                "resolved as lost")
        else:  # pragma: no cover - every action of decisions.Action is handled above
            raise AssertionError(f"no executor for {action!r}")
        return None

    def _commit_checkpoint(self, rec: CheckpointRecord, *, recovering: bool) -> None:
        """Commit ``rec``'s handles; a DataLossError stops with the operator's one way on (invariant 7)."""
        try:
            self._commit_handles(rec.checkpoint_id, rec.to_completed().ordered_handles(), recovering=recovering)
        except DataLossError as e:
            _log.error("checkpoint_data_loss", sink_id=self.log.sink_id, checkpoint_id=rec.checkpoint_id, error=str(e))
            if "twophase log resolve" in str(e):  # the sink named the command already
                raise
            raise DataLossError(
                f"{e}. Checkpoint {rec.checkpoint_id} of sink {self.log.sink_id!r} stays COMPLETED and every restart "
                f"stops here until an operator records the loss: twophase log resolve {self.log.location} "
                f"--sink-id {self.log.sink_id} --checkpoint {rec.checkpoint_id} --accept-loss") from e
