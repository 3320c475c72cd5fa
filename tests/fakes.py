"""An in-memory two-phase-commit sink for protocol tests (no servers, no Spark).

:class:`FakeSink` behaves like a strict real sink: committing an aborted or unknown transaction is
reported LOST (its data is gone; the coordinator raises :class:`~twophase.errors.DataLossError`), committing a committed one is a no-op
(sink invariant 2), aborting a committed one never touches its data (sink invariant 3). It records
every driver call so tests can assert what was committed, aborted and in which order, and it can be
told to fail (``fail_next``) or to run a hook inside a call (``on``), e.g. to read the log mid-commit.
"""

from __future__ import annotations

import itertools
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Collection, Mapping, Optional, Union

from twophase.errors import DataLossError
from twophase.log import TransactionLog
from twophase.sink import (Ack, Committable, CommitResult, CommitStatus, SinkCommitter, SinkSpec, SinkWriter,
                           TransactionContext, run_task)
from twophase.states import TransactionState

HOOKS = ("begin_transaction", "write", "pre_commit", "commit", "abort", "recover_and_commit",
         "recover_and_abort", "abort_lingering")


@dataclass
class FakeTxn:
    """One transaction of the fake sink: its identity, its rows, and where it is in the protocol."""

    txn_id: str
    checkpoint_id: int
    task_id: str
    rows: list[Any] = field(default_factory=list)
    state: TransactionState = TransactionState.OPEN


@dataclass(frozen=True, kw_only=True)
class FakeCommittable(Committable):
    """The fake sink's committable: the in-memory transaction's id."""

    kind: ClassVar[str] = "fake"
    txn: str = ""


def _txn_id(handle: Union[Mapping[str, Any], FakeCommittable]) -> str:
    return handle.txn if isinstance(handle, FakeCommittable) else handle["txn"]


class FakeWriter(SinkWriter[FakeCommittable]):
    def __init__(self, sink: "FakeSink", context: TransactionContext) -> None:
        super().__init__(context)
        self.sink = sink
        sink._enter("begin_transaction", context)
        with sink._lock:
            self.txn = FakeTxn(f"t{next(sink._ids)}", context.checkpoint_id, context.task_id)
            sink.txns[self.txn.txn_id] = self.txn

    def write(self, batch: Any) -> int:
        self.sink._enter("write", batch)
        self.txn.rows.extend(batch)
        return len(batch)

    def prepare_commit(self) -> FakeCommittable:
        self.sink._enter("pre_commit", self.txn)
        self.txn.state = TransactionState.PRE_COMMITTED
        t, c = self.txn, self.context
        return FakeCommittable(checkpoint_id=t.checkpoint_id, task_id=t.task_id, attempt_uid=c.attempt_uid,
                               records=len(t.rows), txn=t.txn_id)

    def abort(self) -> None:
        self.txn.state = TransactionState.ABORTED


class FakeSink(SinkSpec[FakeCommittable], SinkCommitter[FakeCommittable]):
    """In-memory sink (spec and committer in one object) that records commits and aborts and can fail."""

    committable_type = FakeCommittable

    def __init__(self, log: Optional[TransactionLog] = None, sink_id: str = "fake") -> None:
        self.sink_id = sink_id
        self._log = log
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self.txns: dict[str, FakeTxn] = {}
        #: rows readers can see, in commit order; a row appears once per committed transaction
        self.visible: list[Any] = []
        #: every driver call as ``(op, txn_id)`` in call order (op: commit, abort, recover_and_commit, ...)
        self.calls: list[tuple[str, str]] = []
        #: txn ids in the order their data became visible
        self.committed: list[str] = []
        #: txn ids in the order they were aborted (first abort only)
        self.aborted: list[str] = []
        #: aborts asked for a transaction that was already committed (must stay 0 in a correct protocol)
        self.aborts_of_committed: list[str] = []
        #: ``(up_to_checkpoint, highest_committed)`` for each abort_lingering call
        self.lingering_calls: list[tuple[int, Optional[int]]] = []
        self._failures: dict[str, list[BaseException]] = {}
        self._hooks: dict[str, Callable[[Any], None]] = {}

    def create_writer(self, context: TransactionContext) -> FakeWriter:
        return FakeWriter(self, context)

    def create_committer(self) -> "FakeSink":
        return self

    # ---- test controls

    def fail_next(self, op: str, error: BaseException, times: int = 1) -> None:
        """Make the next ``times`` calls of ``op`` raise ``error`` (before doing anything)."""
        if op not in HOOKS:
            raise ValueError(f"unknown op {op!r}")
        self._failures.setdefault(op, []).extend([error] * times)

    def on(self, op: str, fn: Callable[[Any], None]) -> None:
        """Run ``fn(handle_or_arg)`` at the start of every ``op`` call (after injected failures)."""
        if op not in HOOKS:
            raise ValueError(f"unknown op {op!r}")
        self._hooks[op] = fn

    def _enter(self, op: str, arg: Any) -> None:
        queue = self._failures.get(op)
        if queue:
            raise queue.pop(0)
        hook = self._hooks.get(op)
        if hook is not None:
            hook(arg)

    # ---- helpers for tests

    def prepare(self, checkpoint_id: int, task_id: str, rows: Collection[Any] = ("row",)) -> Ack:
        """Run one task through the real :func:`run_task` and return its ack (a pre-committed handle)."""
        ctx = TransactionContext(self.sink_id, checkpoint_id, str(task_id))
        return run_task(self, ctx, [list(rows)])

    def state_of(self, handle: Union[Mapping[str, Any], FakeCommittable]) -> TransactionState:
        return self.txns[_txn_id(handle)].state

    def commit_count(self, handle: Union[Mapping[str, Any], FakeCommittable]) -> int:
        """How many times ``handle``'s data became visible (exactly-once means at most 1)."""
        return self.committed.count(_txn_id(handle))

    # ---- driver side

    def _commit(self, op: str, handle: Union[Mapping[str, Any], FakeCommittable]) -> CommitResult[FakeCommittable]:
        committable = handle if isinstance(handle, FakeCommittable) else FakeCommittable.from_json(handle)
        self._enter(op, committable.to_json())
        with self._lock:
            self.calls.append((op, committable.txn))
            txn = self.txns.get(committable.txn)
            if txn is None or txn.state in (TransactionState.ABORTED, TransactionState.OPEN):
                return CommitResult(committable, CommitStatus.LOST, f"transaction {committable.txn} cannot be committed: "
                                    f"{'unknown' if txn is None else txn.state.value}")
            if txn.state is TransactionState.COMMITTED:
                return CommitResult(committable, CommitStatus.ALREADY_COMMITTED)  # idempotent: no second copy
            txn.state = TransactionState.COMMITTED
            self.visible.extend(txn.rows)
            self.committed.append(txn.txn_id)
            return CommitResult(committable, CommitStatus.COMMITTED)

    def _abort(self, op: str, handle: Union[Mapping[str, Any], FakeCommittable]) -> None:
        self._enter(op, handle.to_json() if isinstance(handle, FakeCommittable) else handle)
        with self._lock:
            self.calls.append((op, _txn_id(handle)))
            txn = self.txns.get(_txn_id(handle))
            if txn is None or txn.state is TransactionState.ABORTED:
                return
            if txn.state is TransactionState.COMMITTED:
                self.aborts_of_committed.append(txn.txn_id)
                return  # never touches committed data
            txn.state = TransactionState.ABORTED
            self.aborted.append(txn.txn_id)

    def commit(self, committable: Union[Mapping[str, Any], FakeCommittable], *,
               recovering: bool = False) -> CommitResult[FakeCommittable]:
        """Commit (op ``commit``, or ``recover_and_commit`` when ``recovering``); a direct call with a
        handle that cannot be committed raises DataLossError, like the coordinator does for LOST."""
        result = self._commit("recover_and_commit" if recovering else "commit", committable)
        return result

    def commit_strict(self, committable: Union[Mapping[str, Any], FakeCommittable], *, recovering: bool = False) -> None:
        """:meth:`commit`, raising DataLossError for a LOST outcome (tests of the sink itself)."""
        r = self.commit(committable, recovering=recovering)
        if r.status is CommitStatus.LOST:
            raise DataLossError(r.detail)

    def abort(self, committable: Union[Mapping[str, Any], FakeCommittable], *, recovering: bool = False) -> None:
        self._abort("recover_and_abort" if recovering else "abort", committable)

    def abort_lingering(self, up_to_checkpoint: int, highest_committed: Optional[int] = None) -> int:
        self._enter("abort_lingering", up_to_checkpoint)
        with self._lock:
            self.lingering_calls.append((up_to_checkpoint, highest_committed))
            victims = [t for t in self.txns.values()
                       if t.checkpoint_id <= up_to_checkpoint
                       and t.state in (TransactionState.OPEN, TransactionState.PRE_COMMITTED)]
            for t in victims:
                t.state = TransactionState.ABORTED
                self.aborted.append(t.txn_id)
                self.calls.append(("abort_lingering", t.txn_id))
            return len(victims)

    def transaction_log(self) -> TransactionLog:
        if self._log is None:
            raise NotImplementedError("FakeSink was built without a log")
        return self._log


def record_fsyncs(monkeypatch: Any) -> list[str]:
    """Patch os.fsync to record the path of every descriptor it syncs (then sync it); returns the list."""
    seen: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        seen.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)
    monkeypatch.setattr(os, "fsync", fsync)
    return seen
