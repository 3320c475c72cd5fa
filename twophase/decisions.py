"""What the checkpoint coordinator does, as one pure function: ``decide(event, state, facts) -> actions``.

Beside the state tables (:mod:`twophase.states`): the tables say which moves of a record are allowed,
this module says which moves (and sink calls) the coordinator makes. :func:`decide` does no I/O and
reads no clock: ``state`` is the checkpoint's record state in the log (None: no record) and
:class:`Facts` are plain values the caller read before asking. Every entry point of
:class:`~twophase.coordinator.CheckpointCoordinator` asks :func:`decide` and hands the actions to its
executor, the only place that calls the sink or writes the log. So the whole protocol is the table
below, and the table is tested pair by pair without a sink or a log (``tests/test_decisions.py``).

Handles an action acts on: ACKED are the handles the event brings (a call's acks, or a pending
checkpoint's acked handles); UNRECORDED are those of them that are not among the record's handles
(a decided checkpoint's own handles are committed, never aborted: coordinator invariant 1); RECORDED
are the record's own handles (a PENDING record found at recovery).

Decision table (``∅``: no record; ``—``: nothing to do; actions run in order; an Outcome or a Refuse
ends the list; a ``[fact]`` splits a cell)::

    event               state                          actions
    ------------------  -----------------------------  -----------------------------------------------------
    TRIGGER             ∅, ABORTED                     WritePending
    (runtime, step 1)   PENDING, COMPLETED,            Refuse(-> PENDING)
                        COMMITTED, LOST
    ACK_REJECTED        any [redelivered]              —   (the very handle the checkpoint took)
    (step 2)            COMPLETED, COMMITTED           AbortHandles(UNRECORDED)
                        ∅, PENDING, ABORTED, LOST      AbortHandles(ACKED)          (invariant 4)
    ACKS_COMPLETE       PENDING                        WriteCompleted, CommitUpTo   (steps 3-4, invariant 1)
    (step 3)            ∅, COMPLETED, COMMITTED,       Refuse(-> COMPLETED)
                        ABORTED, LOST
    NOTIFY_COMPLETE     COMPLETED [older]              CommitHandles(recovering), WriteCommitted
                        COMPLETED [not older,          CommitHandles, Sweep(best effort), WriteCommitted
                        sweep_after_commit and         (the record says whether the sweep went through)
                        sweep_with_commit]
                        COMPLETED [not older, else]    CommitHandles, WriteCommitted
    (step 4, each       PENDING [older]                WriteAborted("subsumed by checkpoint n"): an orphan
    unfinished record   PENDING [not older]            —
    <= n)               ∅, COMMITTED, ABORTED, LOST    —
    CLEAN_UP            any [sweep_after_commit and    Sweep(best effort), Prune
    (step 5b)           not sweep_with_commit]
                        any [else]                     Prune
    ABORT               PENDING                        AbortHandles(ACKED), WriteAborted(reason)
    (decline, timeout,  ∅, ABORTED                     AbortHandles(ACKED)
    subsumed, task      COMPLETED, COMMITTED, LOST     AbortHandles(UNRECORDED)     (never the decided ones)
    missing, job end)
    RECOVER             COMPLETED                      CommitHandles(recovering), WriteCommitted
    (invariant 5, each  PENDING                        AbortHandles(RECORDED, recovering),
    unfinished record)                                 WriteAborted("aborted at recovery")
                        ∅, COMMITTED, ABORTED, LOST    —
    RECOVERY_SWEEP      any [a highest committed id,   Sweep(up to it)  (errors propagate; ids above it
                        not swept]                                        may be re-attempted right now)
                        any [its record says swept]    —   (swept with its commit: see below)
                        any [none committed]           —
    BATCH_COMMIT        ∅                              WritePending, CheckSuperseded, TakeAcks
    (Spark: trigger,                                   (committed, then pruned: found by CheckSuperseded)
    acks and            ABORTED                        WritePending, CheckSuperseded, TakeAcks   (a re-run)
    complete at once)   PENDING                        CheckSuperseded, TakeAcks
                        COMPLETED                      AbortHandles(UNRECORDED), CommitUpTo, Outcome(RECOVERED)
                        COMMITTED                      AbortHandles(UNRECORDED), [sweep_after_commit]
                                                       Sweep(best effort), Outcome(ALREADY_COMMITTED)
                        LOST                           AbortHandles(UNRECORDED), Outcome(ALREADY_COMMITTED)
    SUPERSEDED_CHECK    PENDING [below highest]        WriteAborted("below the highest committed
    (after BATCH_COMMIT                                checkpoint h..."), AbortHandles(ACKED),
    created, re-opened                                 Outcome(ALREADY_COMMITTED)   (invariant 2, log inv. 7)
    or found PENDING;   PENDING [not below highest]    —   (go on: TakeAcks)
    fresh highest)      ∅, COMPLETED, COMMITTED,       —   (not asked: the call holds a PENDING record)
                        ABORTED, LOST
    SPARK_ABORT_BATCH   ∅ [below highest]              AbortHandles(ACKED)   (no record: one would reopen it)
                        ∅ [not below highest]          AbortHandles(ACKED), WriteAborted(reason)
                        PENDING                        AbortHandles(ACKED), WriteAborted(reason)
                        ABORTED, COMPLETED,            AbortHandles(UNRECORDED)
                        COMMITTED, LOST
    QUERY_MISMATCH      any                            AbortHandles(ACKED)   (then QueryMismatchError:
                                                                              invariant 6)
    RESOLVE_LOST        COMPLETED                      WriteLost(reason)     (invariant 7, by an operator)
    (operator)          ∅, PENDING, COMMITTED,         RefuseResolve
                        ABORTED, LOST
    WRITE_JOB_COMMIT    PENDING                        TakeAcks     (the record the job's planning wrote)
    (a batch write,     COMPLETED                      AbortHandles(UNRECORDED), CommitUpTo, Outcome(RECOVERED)
    df.write: its       COMMITTED                      AbortHandles(UNRECORDED), Sweep(best effort),
    PENDING record was                                 Outcome(ALREADY_COMMITTED)
    written when the    LOST                           AbortHandles(UNRECORDED), Outcome(ALREADY_COMMITTED)
    job was planned)    ∅, ABORTED                     AbortHandles(ACKED), DeclineWriteJob   (taken over by a
                                                       newer run: never reopened, unlike BATCH_COMMIT)
    WRITE_JOB_ABORT     PENDING                        AbortHandles(ACKED), WriteAborted(reason), Sweep(best effort)
    (Spark's abort of   ABORTED                        AbortHandles(ACKED), Sweep(best effort)
    a batch write)      ∅                              AbortHandles(ACKED)
                        COMPLETED, COMMITTED, LOST     AbortHandles(UNRECORDED)   (COMPLETED is not asked:
                                                       the coordinator asks WRITE_JOB_COMMIT, a decided run
                                                       goes forward: write_job invariant 5)
    WRITE_JOB_TAKE_OVER PENDING                        AbortHandles(RECORDED, recovering), WriteAborted(reason),
    (an unfinished run                                 Sweep(best effort)
    of a batch write    ABORTED                        Sweep(best effort)
    that a new run      ∅, COMPLETED, COMMITTED, LOST  —   (COMPLETED is committed by RECOVER, never taken over)
    replaces)

``TakeAcks`` hands the acks to a fresh PendingCheckpoint (in memory); each rejected ack is an
ACK_REJECTED event, a missing one an ABORT event (then CheckpointDeclinedError), and a full set the
ACKS_COMPLETE event (Outcome COMMITTED). ``CommitUpTo`` is ``notify_checkpoint_complete(id)``: a
NOTIFY_COMPLETE event per unfinished record <= id, then CLEAN_UP. ``CheckSuperseded`` reads the highest
committed id afresh and asks SUPERSEDED_CHECK.

BATCH_COMMIT decides on "no record" before reading (the executor creates the record, a compare-and-swap
against absent; if one is there it reads it and asks again with its state): in the common case, a new
batch id, that costs one conditional PutObject where a read of the record and a listing for the highest
committed id cost two requests of S3's slowest kind. An id that was committed and then pruned (a re-run
of an old batch, which Spark never does for a batch it has logged, or a zombie driver) is then found by
CheckSuperseded, whose listing comes after the create and so cannot miss a commit made meanwhile; that
rare path leaves an ABORTED record at the old id, naming why. Every BATCH_COMMIT that would take acks
into a PENDING record (created, re-opened from ABORTED, or found) asks CheckSuperseded first: a record
below the highest COMMITTED id is never legitimately unfinished (log invariant 6), so whatever left it
there (such an ABORTED record re-run, a crash between its PENDING and ABORTED writes, a zombie) its id
was committed before and is never committed again. Only failed or repeated batches reach those states,
so the listing costs nothing in the common case.

Sweeping with the commit (``sweep_with_commit``, a committer's declaration that a handle committed again
after a sweep is still ALREADY_COMMITTED, as S3's are): the sweep up to ``n`` runs after ``n``'s handles
are committed and before COMMITTED is recorded, and the record says whether it went through. Everything
at or below ``n`` is then final or ``n``'s own committed handles, so nothing the sweep aborts can ever
be committed (sink invariant 5). The recovery before the next batch skips its sweep when the highest
COMMITTED record says swept: nothing lingering up to that id existed when it was recorded, except what
an attempt still running created afterwards (a speculative or zombie task), which the next commit's
sweep aborts (it covers every id up to its own). A record committed at recovery, by an older version, or
whose sweep failed says not swept, and recovery sweeps. The log's attempt number is no evidence here:
a retried, speculative or zombie TASK leaves uploads behind while its checkpoint commits at attempt 1.

Spark's abort of a batch with no record writes ABORTED directly (``∅ -> ABORTED`` in
:data:`~twophase.states.CHECKPOINT_TRANSITIONS`): the record that results is the one the old
``∅ -> PENDING -> ABORTED`` hop left, and log invariant 7 holds the same way (the write is a
compare-and-swap against "absent", so a record another driver created meanwhile is never replaced),
while log invariant 6 is untouched (ABORTED is finished). Recording nothing was the other choice; it
would lose the abort's reason from ``twophase log inspect``.

A batch write (:mod:`twophase.write_job`) is a log of its own whose ids are its runs, one after the
other: a run is planned only once every earlier id is final, so its Sweep (ids <= its own) never reaches
a later run's data, and a run whose record was taken over is declined at commit instead of reopened,
which is what makes a second run of one write id safe while the first one may still be alive.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional, Union

from twophase.states import CheckpointState

S = CheckpointState


class CommitOutcome(str, enum.Enum):
    """What :meth:`~twophase.coordinator.CheckpointCoordinator.complete_batch` did. A str, so
    ``outcome == "COMMITTED"`` holds and ``str()`` / f-strings give the bare value."""

    #: this call completed and committed the checkpoint
    COMMITTED = "COMMITTED"
    #: the log had it COMMITTED (or pruned below the highest committed id) or LOST: nothing committed again
    ALREADY_COMMITTED = "ALREADY_COMMITTED"
    #: the log had it COMPLETED (decided by an earlier call): its recorded handles were committed
    RECOVERED = "RECOVERED"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class Event(str, enum.Enum):
    """What happened to one checkpoint id (see the table in the module docstring)."""

    TRIGGER = "TRIGGER"
    ACK_REJECTED = "ACK_REJECTED"
    ACKS_COMPLETE = "ACKS_COMPLETE"
    NOTIFY_COMPLETE = "NOTIFY_COMPLETE"
    CLEAN_UP = "CLEAN_UP"
    ABORT = "ABORT"
    RECOVER = "RECOVER"
    RECOVERY_SWEEP = "RECOVERY_SWEEP"
    BATCH_COMMIT = "BATCH_COMMIT"
    SUPERSEDED_CHECK = "SUPERSEDED_CHECK"
    SPARK_ABORT_BATCH = "SPARK_ABORT_BATCH"
    QUERY_MISMATCH = "QUERY_MISMATCH"
    RESOLVE_LOST = "RESOLVE_LOST"
    WRITE_JOB_COMMIT = "WRITE_JOB_COMMIT"
    WRITE_JOB_ABORT = "WRITE_JOB_ABORT"
    WRITE_JOB_TAKE_OVER = "WRITE_JOB_TAKE_OVER"


@dataclass(frozen=True)
class Facts:
    """Plain values the caller read before asking; each event reads only the ones it names."""

    #: SUPERSEDED_CHECK, SPARK_ABORT_BATCH: the id is below the highest COMMITTED id
    #: (with no record: it was committed, then pruned)
    below_highest: bool = False
    #: RECOVERY_SWEEP: the highest committed id (None: none); SUPERSEDED_CHECK: for the reason
    highest_committed: Optional[int] = None
    #: NOTIFY_COMPLETE: the record's id is below the notified one (so it is committed as a recovery)
    older: bool = False
    #: NOTIFY_COMPLETE: the notified id (for the reason of an orphan PENDING record)
    notified: Optional[int] = None
    #: ACK_REJECTED: the handle is the very one the pending checkpoint already accepted (a redelivery)
    redelivered: bool = False
    #: CLEAN_UP, BATCH_COMMIT, NOTIFY_COMPLETE: the coordinator sweeps lingering transactions right after a commit
    sweep_after_commit: bool = True
    #: NOTIFY_COMPLETE, CLEAN_UP: the committer lets that sweep run before COMMITTED is recorded (see above)
    sweep_with_commit: bool = False
    #: RECOVERY_SWEEP: the highest COMMITTED record says it was swept with its commit
    swept: bool = False
    #: ABORT, SPARK_ABORT_BATCH, RESOLVE_LOST: the caller's reason
    reason: Optional[str] = None


class Handles(str, enum.Enum):
    """Which handles an :class:`AbortHandles` acts on (see the module docstring)."""

    ACKED = "ACKED"
    UNRECORDED = "UNRECORDED"
    RECORDED = "RECORDED"


# ---- actions (what the executor does, in order)


@dataclass(frozen=True)
class WritePending:
    """Record PENDING (a first attempt, or a re-attempt of an ABORTED id)."""


@dataclass(frozen=True)
class WriteCompleted:
    """Record COMPLETED with every handle: the durable decision (fault points before/after_complete)."""


@dataclass(frozen=True)
class WriteCommitted:
    """Record COMMITTED (after the sink committed every handle)."""


@dataclass(frozen=True)
class WriteAborted:
    reason: str


@dataclass(frozen=True)
class WriteLost:
    reason: str


@dataclass(frozen=True)
class CommitHandles:
    """Commit the record's handles through the sink (a DataLossError stops, with the operator's command)."""

    recovering: bool


@dataclass(frozen=True)
class AbortHandles:
    which: Handles
    recovering: bool = False


@dataclass(frozen=True)
class Sweep:
    """Abort the sink's lingering transactions up to ``up_to`` (None: this checkpoint's id).
    ``best_effort``: a failure is logged, never raised (the data is committed already)."""

    up_to: Optional[int] = None
    best_effort: bool = False


@dataclass(frozen=True)
class Prune:
    """Apply the log's retention."""


@dataclass(frozen=True)
class CommitUpTo:
    """``notify_checkpoint_complete(id)``: commit every COMPLETED checkpoint up to this one, in order."""


@dataclass(frozen=True)
class CheckSuperseded:
    """Read the highest committed id afresh and ask SUPERSEDED_CHECK."""


@dataclass(frozen=True)
class TakeAcks:
    """Hand the acks to a PendingCheckpoint; ends the list with its outcome."""


@dataclass(frozen=True)
class Outcome:
    outcome: CommitOutcome


@dataclass(frozen=True)
class Refuse:
    """The move to ``target`` is not in the table: raise InvalidTransitionError."""

    target: CheckpointState


@dataclass(frozen=True)
class RefuseResolve:
    """Only a COMPLETED checkpoint can be resolved as lost: raise ConfigurationError."""


@dataclass(frozen=True)
class DeclineWriteJob:
    """A batch write's run whose PENDING record a newer run took over (or that is gone): raise
    CheckpointDeclinedError; nothing of this run is committed."""


Action = Union[WritePending, WriteCompleted, WriteCommitted, WriteAborted, WriteLost, CommitHandles, AbortHandles,
               Sweep, Prune, CommitUpTo, CheckSuperseded, TakeAcks, Outcome, Refuse, RefuseResolve, DeclineWriteJob]

#: Every record state, with None for "no record".
STATES: tuple[Optional[CheckpointState], ...] = (None, *CheckpointState)

_DECIDED = (S.COMPLETED, S.COMMITTED, S.LOST)


def decide(event: Event, state: Optional[CheckpointState], facts: Facts = Facts()) -> list[Action]:
    """The actions for ``event`` on a checkpoint whose record is in ``state`` (None: no record).

    Pure: no I/O, no clock; the same arguments always give the same list.
    """
    if state is not None and not isinstance(state, CheckpointState):
        raise TypeError(f"state must be a CheckpointState or None, got {state!r}")
    event = Event(event)
    if event is Event.TRIGGER:
        return [WritePending()] if state in (None, S.ABORTED) else [Refuse(S.PENDING)]
    if event is Event.ACK_REJECTED:
        if facts.redelivered:
            return []
        return [AbortHandles(Handles.UNRECORDED if state in (S.COMPLETED, S.COMMITTED) else Handles.ACKED)]
    if event is Event.ACKS_COMPLETE:
        return [WriteCompleted(), CommitUpTo()] if state is S.PENDING else [Refuse(S.COMPLETED)]
    if event is Event.NOTIFY_COMPLETE:
        if state is S.COMPLETED:
            sweep = not facts.older and facts.sweep_after_commit and facts.sweep_with_commit
            return [CommitHandles(recovering=facts.older), *([Sweep(best_effort=True)] if sweep else []),
                    WriteCommitted()]
        if state is S.PENDING and facts.older:
            return [WriteAborted(f"subsumed by checkpoint {facts.notified}")]
        return []
    if event is Event.CLEAN_UP:
        sweep = facts.sweep_after_commit and not facts.sweep_with_commit
        return [Sweep(best_effort=True), Prune()] if sweep else [Prune()]
    if event is Event.ABORT:
        if state is S.PENDING:
            return [AbortHandles(Handles.ACKED), WriteAborted(_reason(facts))]
        return [AbortHandles(Handles.UNRECORDED if state in _DECIDED else Handles.ACKED)]
    if event is Event.RECOVER:
        if state is S.COMPLETED:
            return [CommitHandles(recovering=True), WriteCommitted()]
        if state is S.PENDING:
            return [AbortHandles(Handles.RECORDED, recovering=True), WriteAborted("aborted at recovery")]
        return []
    if event is Event.RECOVERY_SWEEP:
        return [] if facts.highest_committed is None or facts.swept else [Sweep(up_to=facts.highest_committed)]
    if event is Event.BATCH_COMMIT:
        return _batch_commit(state, facts)
    if event is Event.SUPERSEDED_CHECK:
        if state is S.PENDING and facts.below_highest:
            return [WriteAborted(f"below the highest committed checkpoint {facts.highest_committed}: committed "
                                 "before (its record pruned) or by another driver meanwhile; nothing of this "
                                 "attempt is committed"),
                    AbortHandles(Handles.ACKED), Outcome(CommitOutcome.ALREADY_COMMITTED)]
        return []
    if event is Event.SPARK_ABORT_BATCH:
        if state is None:
            return [AbortHandles(Handles.ACKED)] + ([] if facts.below_highest else [WriteAborted(_reason(facts))])
        if state is S.PENDING:
            return [AbortHandles(Handles.ACKED), WriteAborted(_reason(facts))]
        return [AbortHandles(Handles.UNRECORDED)]
    if event is Event.QUERY_MISMATCH:
        return [AbortHandles(Handles.ACKED)]
    if event is Event.RESOLVE_LOST:
        return [WriteLost(f"data loss accepted: {facts.reason}")] if state is S.COMPLETED else [RefuseResolve()]
    if event is Event.WRITE_JOB_COMMIT:
        if state is S.PENDING:
            return [TakeAcks()]
        if state is S.COMPLETED:
            return [AbortHandles(Handles.UNRECORDED), CommitUpTo(), Outcome(CommitOutcome.RECOVERED)]
        if state is S.COMMITTED:
            return [AbortHandles(Handles.UNRECORDED), Sweep(best_effort=True), Outcome(CommitOutcome.ALREADY_COMMITTED)]
        if state is S.LOST:
            return [AbortHandles(Handles.UNRECORDED), Outcome(CommitOutcome.ALREADY_COMMITTED)]
        return [AbortHandles(Handles.ACKED), DeclineWriteJob()]
    if event is Event.WRITE_JOB_ABORT:
        if state is S.PENDING:
            return [AbortHandles(Handles.ACKED), WriteAborted(_reason(facts)), Sweep(best_effort=True)]
        if state is S.ABORTED:
            return [AbortHandles(Handles.ACKED), Sweep(best_effort=True)]
        return [AbortHandles(Handles.ACKED if state is None else Handles.UNRECORDED)]
    if event is Event.WRITE_JOB_TAKE_OVER:
        if state is S.PENDING:
            return [AbortHandles(Handles.RECORDED, recovering=True), WriteAborted(_reason(facts)),
                    Sweep(best_effort=True)]
        return [Sweep(best_effort=True)] if state is S.ABORTED else []
    raise AssertionError(f"no decision for {event}")  # pragma: no cover - every Event is handled above


def _batch_commit(state: Optional[CheckpointState], facts: Facts) -> list[Action]:
    if state is None:
        return [WritePending(), CheckSuperseded(), TakeAcks()]
    if state is S.ABORTED:
        return [WritePending(), CheckSuperseded(), TakeAcks()]
    if state is S.PENDING:
        return [CheckSuperseded(), TakeAcks()]
    if state is S.COMPLETED:
        return [AbortHandles(Handles.UNRECORDED), CommitUpTo(), Outcome(CommitOutcome.RECOVERED)]
    # a re-run of a committed batch (Spark had not logged it): its own retried or crashed attempts are
    # leftovers too, and this may be the run's last batch, so sweep now
    sweep: list[Action] = [Sweep(best_effort=True)] if state is S.COMMITTED and facts.sweep_after_commit else []
    return [AbortHandles(Handles.UNRECORDED), *sweep, Outcome(CommitOutcome.ALREADY_COMMITTED)]


def _reason(facts: Facts) -> str:
    if facts.reason is None:
        raise ValueError("this event needs Facts.reason")
    return facts.reason
