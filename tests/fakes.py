"""An in-memory two-phase-commit sink for protocol tests (no servers, no Spark).

:class:`FakeSink` behaves like a strict real sink: committing an aborted or unknown transaction raises
:class:`~twophase.errors.DataLossError` (its data is gone), committing a committed one is a no-op
(sink invariant 2), aborting a committed one never touches its data (sink invariant 3). It records
every driver call so tests can assert what was committed, aborted and in which order, and it can be
told to fail (``fail_next``) or to run a hook inside a call (``on``), e.g. to read the log mid-commit.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Optional

from twophase.checkpoint import Handle
from twophase.errors import DataLossError
from twophase.log import TransactionLog
from twophase.sink import Ack, TransactionContext, TwoPhaseCommitSink, run_task
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

    @property
    def handle(self) -> dict[str, Any]:
        return {"txn": self.txn_id, "checkpoint_id": self.checkpoint_id, "task_id": self.task_id}


class FakeSink(TwoPhaseCommitSink[Handle, FakeTxn]):
    """In-memory sink that records commits and aborts and can be told to fail."""

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
        #: ``(up_to_checkpoint, keep)`` for each abort_lingering call
        self.lingering_calls: list[tuple[int, list[Handle]]] = []
        self._failures: dict[str, list[BaseException]] = {}
        self._hooks: dict[str, Callable[[Any], None]] = {}

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

    def state_of(self, handle: Handle) -> TransactionState:
        return self.txns[handle["txn"]].state

    def commit_count(self, handle: Handle) -> int:
        """How many times ``handle``'s data became visible (exactly-once means at most 1)."""
        return self.committed.count(handle["txn"])

    # ---- executor side

    def begin_transaction(self, context: TransactionContext) -> FakeTxn:
        self._enter("begin_transaction", context)
        with self._lock:
            txn = FakeTxn(f"t{next(self._ids)}", context.checkpoint_id, context.task_id)
            self.txns[txn.txn_id] = txn
            return txn

    def write(self, txn: FakeTxn, batch: Any) -> int:
        self._enter("write", batch)
        txn.rows.extend(batch)
        return len(batch)

    def pre_commit(self, txn: FakeTxn) -> Handle:
        self._enter("pre_commit", txn)
        txn.state = TransactionState.PRE_COMMITTED
        return txn.handle

    def abort_open(self, txn: FakeTxn) -> None:
        txn.state = TransactionState.ABORTED

    # ---- driver side

    def _commit(self, op: str, handle: Handle) -> None:
        self._enter(op, handle)
        with self._lock:
            self.calls.append((op, handle["txn"]))
            txn = self.txns.get(handle["txn"])
            if txn is None or txn.state in (TransactionState.ABORTED, TransactionState.OPEN):
                raise DataLossError(f"transaction {handle} cannot be committed: "
                                    f"{'unknown' if txn is None else txn.state.value}")
            if txn.state is TransactionState.COMMITTED:
                return  # idempotent: no second copy
            txn.state = TransactionState.COMMITTED
            self.visible.extend(txn.rows)
            self.committed.append(txn.txn_id)

    def _abort(self, op: str, handle: Handle) -> None:
        self._enter(op, handle)
        with self._lock:
            self.calls.append((op, handle["txn"]))
            txn = self.txns.get(handle["txn"])
            if txn is None or txn.state is TransactionState.ABORTED:
                return
            if txn.state is TransactionState.COMMITTED:
                self.aborts_of_committed.append(txn.txn_id)
                return  # never touches committed data
            txn.state = TransactionState.ABORTED
            self.aborted.append(txn.txn_id)

    def commit(self, handle: Handle) -> None:
        self._commit("commit", handle)

    def recover_and_commit(self, handle: Handle) -> None:
        self._commit("recover_and_commit", handle)

    def abort(self, handle: Handle) -> None:
        self._abort("abort", handle)

    def recover_and_abort(self, handle: Handle) -> None:
        self._abort("recover_and_abort", handle)

    def abort_lingering(self, up_to_checkpoint: int, keep: Collection[Handle] = ()) -> int:
        self._enter("abort_lingering", up_to_checkpoint)
        keep_ids = {h["txn"] for h in keep}
        with self._lock:
            self.lingering_calls.append((up_to_checkpoint, list(keep)))
            victims = [t for t in self.txns.values()
                       if t.checkpoint_id <= up_to_checkpoint and t.txn_id not in keep_ids
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
