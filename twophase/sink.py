"""The ``TwoPhaseCommitSink`` base: the hooks every exactly-once sink implements once.

Where each hook runs (Spark adapter / embedded runtime) and how often:

=========================  ==========  ===========================================================
hook                       where       called
=========================  ==========  ===========================================================
``begin_transaction``      executor    once per task attempt and checkpoint
``write``                  executor    once per Arrow record batch of the task's input
``pre_commit``             executor    once, after the last write; returns the JSON handle (the ack)
``abort_open``             executor    instead of pre_commit when the task fails
``commit``                 driver      for each handle of a CompletedCheckpoint; MAY BE CALLED AGAIN
``abort``                  driver      for each handle of a declined checkpoint, or a duplicate ack
``recover_and_commit``     driver      at recovery, for handles of a COMPLETED, uncommitted checkpoint
``recover_and_abort``      driver      at recovery, for handles of a PENDING checkpoint
``commit_checkpoint``      driver      once per completed checkpoint (default: ``commit`` each handle)
``abort_lingering``        driver      at recovery and after each commit: abort what no log owns
=========================  ==========  ===========================================================

Invariants every sink must keep (named in tests as ``test_sink_invN_*``):

1. Nothing written in a transaction is visible to readers before ``commit`` of its handle.
2. ``commit`` and ``recover_and_commit`` are idempotent: committing a committed handle is a no-op,
   never a second copy. If the data of a handle can no longer be committed, raise DataLossError.
3. ``abort`` and ``recover_and_abort`` are idempotent and never touch committed data.
4. A handle is JSON-serializable and self-sufficient: the driver commits it in another process
   than the one that wrote it, possibly after the writer died.
5. ``abort_lingering(up_to, keep)`` aborts only transactions of checkpoints ``<= up_to`` that are not
   in ``keep``; it never aborts a transaction that a newer checkpoint may still ack, and it removes
   only what it can prove is its own: every name a sink creates carries :func:`sink_token` of its
   sink id, and a sweep matches that token, never a bare name pattern (another sink, another query
   may write into the same folder, bucket or table).
"""

from __future__ import annotations

import abc
import enum
import hashlib
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Collection, Generic, Iterable, Mapping, Optional, Sequence, TypeVar

from twophase import faults
from twophase._logging import get_logger
from twophase.errors import ConfigurationError
from twophase.states import TransactionState, check_transition

_log = get_logger(__name__)

H = TypeVar("H", bound=Mapping[str, Any])
T = TypeVar("T")


def sink_token(sink_id: str) -> str:
    """A short, stable digest of ``sink_id`` (12 hex digits) that every name a sink creates carries
    (invariant 5: a sink sweeps only names with its own token)."""
    return hashlib.sha256(sink_id.encode()).hexdigest()[:12]


class Guarantee(str, enum.Enum):
    """Delivery guarantee a sink runs with (option ``guarantee``)."""

    EXACTLY_ONCE = "exactly-once"
    AT_LEAST_ONCE = "at-least-once"

    @classmethod
    def parse(cls, value: str) -> "Guarantee":
        try:
            return cls(value.strip().lower())
        except ValueError:
            raise ConfigurationError(
                f"option 'guarantee' must be 'exactly-once' or 'at-least-once', got {value!r}") from None


@dataclass(frozen=True)
class TransactionContext:
    """Identity of one transaction: which sink, checkpoint, task and attempt.

    ``attempt`` is the attempt number within the task's stage attempt (Spark's ``attemptNumber()``,
    which restarts at 0 in every stage attempt: NOT unique). ``task_attempt_id`` is unique per
    application (Spark's ``taskAttemptId()``; PySpark exposes no stage attempt number); sinks that
    name external transactions per attempt must derive the name from it. ``query_id`` is the streaming query's persistent id
    (``<checkpointLocation>/metadata``), when the engine tells it.
    """

    sink_id: str
    checkpoint_id: int
    task_id: str
    attempt: int = 0
    attempt_uid: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    task_attempt_id: Optional[int] = None
    query_id: Optional[str] = None


class Transaction(Generic[T]):
    """Executor-side bookkeeping of one transaction; every state move is checked (see :mod:`twophase.states`)."""

    def __init__(self, context: TransactionContext, payload: T) -> None:
        self.context = context
        self.payload = payload
        self.state = TransactionState.OPEN
        self.records = 0

    def transition_to(self, target: TransactionState) -> None:
        check_transition(self.state, target, what=f"transaction {self.context}")
        self.state = target


@dataclass(frozen=True)
class Ack:
    """A task's acknowledgement of a checkpoint: its pre-committed handle (Spark's commit message)."""

    checkpoint_id: int
    task_id: str
    attempt_uid: str
    handle: Mapping[str, Any]
    records: int = 0
    #: the streaming query the task ran for (Spark's persistent query id), checked against the log's binding
    query_id: Optional[str] = None

    def to_json(self) -> dict[str, Any]:
        return {"checkpoint_id": self.checkpoint_id, "task_id": self.task_id, "attempt_uid": self.attempt_uid,
                "handle": dict(self.handle), "records": self.records, "query_id": self.query_id}

    @classmethod
    def from_json(cls, a: Mapping[str, Any]) -> "Ack":
        """The inverse of :meth:`to_json` (an ack travels as JSON from executors to the driver)."""
        return cls(int(a["checkpoint_id"]), str(a["task_id"]), str(a["attempt_uid"]), a["handle"],
                   int(a.get("records", 0)), a.get("query_id"))


class TwoPhaseCommitSink(abc.ABC, Generic[H, T]):
    """Base of every sink: executor hooks write and pre-commit, driver hooks commit and abort.

    ``H`` is the handle type (a JSON mapping), ``T`` the sink's in-task transaction payload.
    A sink object must be picklable: Spark ships it to executors and to the commit worker.
    """

    #: Stable id of this sink; the transaction log is keyed by it.
    sink_id: str
    #: commit handles of one checkpoint with this many threads (I/O bound sinks set > 1)
    commit_parallelism: int = 1
    #: True if lingering transactions hurt readers until they are aborted (Kafka: an open transaction
    #: holds back read_committed consumers), so the Spark adapter aborts them right after each commit
    #: too, not only at the recovery before the next micro-batch (which may never come).
    sweep_after_commit: bool = False
    #: what the sink promises; AT_LEAST_ONCE sinks commit at task end and the Spark adapter keeps no log
    guarantee: Guarantee = Guarantee.EXACTLY_ONCE

    def validate_destination(self) -> None:
        """Fail early, on the driver before any data moves, if the destination cannot work (unreachable,
        missing, refused settings), with an error that names the option and the fix. Default: nothing."""

    # ---- executor side

    @abc.abstractmethod
    def begin_transaction(self, context: TransactionContext) -> T:
        """Open a transaction for ``context``; nothing of it is visible to readers."""

    @abc.abstractmethod
    def write(self, txn: T, batch: Any) -> int:
        """Write one ``pyarrow.RecordBatch`` into ``txn``; returns the number of records written."""

    @abc.abstractmethod
    def pre_commit(self, txn: T) -> H:
        """Make ``txn`` durable but invisible and return its handle (invariant 4)."""

    @abc.abstractmethod
    def abort_open(self, txn: T) -> None:
        """Drop an open transaction after a task failure (best effort; recovery cleans up the rest)."""

    # ---- driver side

    @abc.abstractmethod
    def commit(self, handle: H) -> None:
        """Make ``handle``'s data visible; idempotent (invariant 2)."""

    @abc.abstractmethod
    def abort(self, handle: H) -> None:
        """Discard ``handle``'s data; idempotent (invariant 3)."""

    def recover_and_commit(self, handle: H) -> None:
        """Commit a handle of a COMPLETED checkpoint found at recovery; the writer may be long gone."""
        self.commit(handle)

    def recover_and_abort(self, handle: H) -> None:
        """Abort a handle found at recovery that no completed checkpoint owns."""
        self.abort(handle)

    def commit_checkpoint(self, checkpoint_id: int, handles: Sequence[H], *, recovering: bool = False) -> None:
        """Commit every handle of a completed checkpoint. Override to commit a checkpoint atomically.

        The default commits handle by handle (``commit_parallelism`` threads) and is therefore only
        atomic per handle; a crash in between is repaired by recovery committing the rest.
        """
        fn = self.recover_and_commit if recovering else self.commit
        if not handles:
            return
        fn(handles[0])
        faults.maybe_crash("mid_commit", checkpoint_id)
        rest = list(handles[1:])
        if self.commit_parallelism > 1 and len(rest) > 1:
            with ThreadPoolExecutor(min(self.commit_parallelism, len(rest))) as pool:
                list(pool.map(fn, rest))
        else:
            for h in rest:
                fn(h)

    def abort_lingering(self, up_to_checkpoint: int, keep: Collection[H] = ()) -> int:
        """Abort transactions of checkpoints ``<= up_to_checkpoint`` not in ``keep`` (invariant 5).

        Returns how many were aborted. The default knows of none.
        """
        return 0

    def transaction_log(self):  # -> TransactionLog (import cycle avoided)
        """The durable log of this sink (its location is the sink's to choose)."""
        raise NotImplementedError

    def log_owner_hint(self) -> Optional[str]:
        return None

    def close(self) -> None:
        """Release driver-side resources (clients, pools)."""


def run_task(sink: TwoPhaseCommitSink[Any, Any], context: TransactionContext, batches: Iterable[Any]) -> Ack:
    """Run one task's side of the protocol: begin, write every batch, pre_commit, return the ack.

    On any failure the open transaction is aborted and the error re-raised (the task fails and the
    checkpoint cannot complete). Fault points ``write`` and ``after_pre_commit`` are here.
    """
    txn = Transaction(context, sink.begin_transaction(context))
    try:
        first = True
        for batch in batches:
            txn.records += sink.write(txn.payload, batch)
            if first:
                faults.maybe_crash("write", context.checkpoint_id)
                first = False
        handle = sink.pre_commit(txn.payload)
        txn.transition_to(TransactionState.PRE_COMMITTED)
    except BaseException:
        if txn.state is TransactionState.OPEN:
            try:
                sink.abort_open(txn.payload)
            except Exception as e:  # the original error matters more
                _log.warning("abort_open_failed", checkpoint_id=context.checkpoint_id, task=context.task_id, error=str(e))
            txn.transition_to(TransactionState.ABORTED)
        raise
    faults.maybe_crash("after_pre_commit", context.checkpoint_id)
    _log.debug("pre_committed", sink_id=context.sink_id, checkpoint_id=context.checkpoint_id,
               task=context.task_id, records=txn.records)
    return Ack(context.checkpoint_id, context.task_id, context.attempt_uid, dict(handle), txn.records,
               context.query_id)
