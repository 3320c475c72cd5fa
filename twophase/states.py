"""Protocol states and the only place their transitions are checked.

Checkpoint states (one record per checkpoint id in the transaction log)::

        trigger            all tasks acked,              every handle
    ∅ ──────────► PENDING ──record durable──► COMPLETED ──committed──► COMMITTED
    │                │                                                  (final)
    │                │ decline / timeout / subsumed / task failure
    │                ▼
    └─Spark abort─► ABORTED ──► PENDING   (only a re-run of the same checkpoint id,
      of a batch   (final for            which Spark does when a batch failed)
      with no       its attempt)
      record)

A COMPLETED checkpoint is never aborted: once the decision is durable it is
committed, on recovery if need be (invariant 1 of :mod:`twophase.coordinator`).
The one exception is an operator's: a COMPLETED checkpoint whose transactions can
no longer be committed (DataLossError: expired, deleted) stops every recovery until
``twophase log resolve LOCATION --checkpoint N --accept-loss`` moves it to LOST,
a final state that records the loss (never taken for COMMITTED, never silent)::

    COMPLETED ──operator accepts the loss──► LOST (final)

Transaction states (one per sink transaction, i.e. per task and checkpoint)::

    OPEN ──prepare_commit──► PRE_COMMITTED ──commit──► COMMITTED
      │                        │
      └────────abort───────────┴──abort──► ABORTED

In-memory state of a :class:`~twophase.checkpoint.PendingCheckpoint` (the coordinator's collector of
acks for one attempt; "disposed" is COMPLETED or ABORTED, after which every ack is DISCARDED)::

                 every expected task acked
    COLLECTING ────────finalize()────────► COMPLETED (disposed)
         │
         └──────────abort()──────────────► ABORTED   (disposed)

What the coordinator does on each event, given a checkpoint's state, is one pure function beside
these tables: :func:`twophase.decisions.decide` (its module docstring has the decision table).

Every move goes through :func:`check_transition`, which raises
:class:`~twophase.errors.InvalidTransitionError` for anything not in the tables.
"""

from __future__ import annotations

import enum
from typing import Optional, Union

from twophase.errors import InvalidTransitionError


class CheckpointState(str, enum.Enum):
    """State of one checkpoint id in a sink's transaction log."""

    PENDING = "PENDING"
    COMPLETED = "COMPLETED"
    COMMITTED = "COMMITTED"
    ABORTED = "ABORTED"
    #: a COMPLETED checkpoint that could not be committed and whose loss an operator accepted
    LOST = "LOST"

    @property
    def is_decided(self) -> bool:
        """True once the outcome is fixed: COMPLETED (will commit), COMMITTED, ABORTED or LOST."""
        return self is not CheckpointState.PENDING

    @property
    def is_final(self) -> bool:
        """True when nothing more happens to this attempt: COMMITTED, ABORTED or LOST."""
        return self in (CheckpointState.COMMITTED, CheckpointState.ABORTED, CheckpointState.LOST)


class TransactionState(str, enum.Enum):
    """State of one sink transaction (one task's writes for one checkpoint)."""

    OPEN = "OPEN"
    PRE_COMMITTED = "PRE_COMMITTED"
    COMMITTED = "COMMITTED"
    ABORTED = "ABORTED"


class PendingState(str, enum.Enum):
    """In-memory state of a :class:`~twophase.checkpoint.PendingCheckpoint` (never written to the log)."""

    #: taking acks from the expected tasks
    COLLECTING = "COLLECTING"
    #: finalized into a CompletedCheckpoint (disposed)
    COMPLETED = "COMPLETED"
    #: aborted: declined, expired, subsumed, or a task missing (disposed)
    ABORTED = "ABORTED"

    @property
    def is_disposed(self) -> bool:
        """True once the checkpoint takes no more acks: COMPLETED or ABORTED."""
        return self is not PendingState.COLLECTING


State = Union[CheckpointState, TransactionState, PendingState]

#: Allowed checkpoint moves; ``None`` is "no record yet".
CHECKPOINT_TRANSITIONS: dict[Optional[CheckpointState], frozenset[CheckpointState]] = {
    # ABORTED directly: Spark aborts a batch this sink has no record of (its tasks failed before any
    # commit call). The old way hopped through PENDING to get there; the record is the same, and the
    # write is still a compare-and-swap against "absent" (log invariant 7). See twophase.decisions.
    None: frozenset({CheckpointState.PENDING, CheckpointState.ABORTED}),
    CheckpointState.PENDING: frozenset({CheckpointState.COMPLETED, CheckpointState.ABORTED}),
    CheckpointState.COMPLETED: frozenset({CheckpointState.COMMITTED, CheckpointState.LOST}),
    CheckpointState.COMMITTED: frozenset(),
    CheckpointState.LOST: frozenset(),
    # A checkpoint id can be attempted again after an abort (Spark re-runs a failed batch id).
    CheckpointState.ABORTED: frozenset({CheckpointState.PENDING}),
}

#: Allowed transaction moves; ``None`` is "not begun".
TRANSACTION_TRANSITIONS: dict[Optional[TransactionState], frozenset[TransactionState]] = {
    None: frozenset({TransactionState.OPEN}),
    TransactionState.OPEN: frozenset({TransactionState.PRE_COMMITTED, TransactionState.ABORTED}),
    TransactionState.PRE_COMMITTED: frozenset({TransactionState.COMMITTED, TransactionState.ABORTED}),
    TransactionState.COMMITTED: frozenset(),
    TransactionState.ABORTED: frozenset(),
}


#: Allowed moves of a PendingCheckpoint; ``None`` is "not created yet". Both ends are disposed.
PENDING_CHECKPOINT_TRANSITIONS: dict[Optional[PendingState], frozenset[PendingState]] = {
    None: frozenset({PendingState.COLLECTING}),
    PendingState.COLLECTING: frozenset({PendingState.COMPLETED, PendingState.ABORTED}),
    PendingState.COMPLETED: frozenset(),
    PendingState.ABORTED: frozenset(),
}

#: The table of each kind of state.
TABLES: dict[type, dict] = {
    CheckpointState: CHECKPOINT_TRANSITIONS,
    TransactionState: TRANSACTION_TRANSITIONS,
    PendingState: PENDING_CHECKPOINT_TRANSITIONS,
}


def is_transition_valid(source: Optional[State], target: State) -> bool:
    """Whether the protocol allows moving from ``source`` (None: nothing yet) to ``target``."""
    table: dict = TABLES[type(target)]
    if source is not None and type(source) is not type(target):
        return False
    return target in table.get(source, frozenset())


def check_transition(source: Optional[State], target: State, *, what: str = "") -> None:
    """Raise :class:`InvalidTransitionError` unless ``source -> target`` is allowed."""
    if not is_transition_valid(source, target):
        src = source.value if source is not None else "<none>"
        label = f" for {what}" if what else ""
        raise InvalidTransitionError(f"invalid transition {src} -> {target.value}{label}")
