"""The job's view of its sinks for the checkpoint coordinator: one handle per task, many transactions.

The core :class:`~twophase.coordinator.CheckpointCoordinator` expects one handle per acking task. In
the runtime every task acks (sources with positions, operators with state), and a sink task's
handle carries every transaction it pre-committed that is not committed yet (tasks invariant 2).
:class:`JobCommitter` is the ``TwoPhaseCommitSink`` the coordinator drives; it unwraps those handles
and calls the real sinks.

Invariants (``test_committer_invN_*``):

1. ``commit_checkpoint`` hands every wrapped transaction of the checkpoint to its sink's own
   ``commit_checkpoint`` (so a sink that commits a checkpoint atomically still can); non-sink task
   handles carry no transactions.
2. ``abort`` of a task handle (its checkpoint was declined, expired or subsumed) does NOT abort the
   wrapped transactions: the sink task still holds them and acks them again with the next
   checkpoint (Flink's two-phase-commit sink keeps them pending the same way). The runner aborts
   them itself when no checkpoint can own them any more (failover, cancel): see
   :meth:`abort_transactions`.
3. Recovery, lingering cleanup and the log are delegated to the sinks / the job's log unchanged.
"""

from __future__ import annotations

from typing import Any, Collection, Mapping, Optional, Sequence

from twophase._logging import get_logger
from twophase.log import TransactionLog
from twophase.sink import TransactionContext, TwoPhaseCommitSink

_log = get_logger(__name__)


class JobCommitter(TwoPhaseCommitSink[dict, None]):
    """Routes task handles ``{"task", "sink", "txns": [...]}`` to the job's sinks (see invariants)."""

    def __init__(self, sinks: Mapping[str, TwoPhaseCommitSink], log: TransactionLog) -> None:
        self.sinks = dict(sinks)
        self.log = log
        self.sink_id = log.sink_id

    # executor hooks are the sink tasks' business, never the coordinator's
    def begin_transaction(self, context: TransactionContext) -> None:
        raise NotImplementedError("JobCommitter is driver-side only")

    def write(self, txn: None, batch: Any) -> int:
        raise NotImplementedError("JobCommitter is driver-side only")

    def pre_commit(self, txn: None) -> dict:
        raise NotImplementedError("JobCommitter is driver-side only")

    def abort_open(self, txn: None) -> None:
        raise NotImplementedError("JobCommitter is driver-side only")

    def _by_sink(self, handles: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
        out: dict[str, list[Mapping[str, Any]]] = {}
        for h in handles:
            if h.get("txns"):
                out.setdefault(h["sink"], []).extend(h["txns"])
        return out

    def commit(self, handle: Mapping[str, Any]) -> None:
        for inner in handle.get("txns") or ():
            self.sinks[handle["sink"]].commit(inner)

    def commit_checkpoint(self, checkpoint_id: int, handles: Sequence[Mapping[str, Any]], *,
                          recovering: bool = False) -> None:
        for uid, inner in self._by_sink(handles).items():  # invariant 1
            self.sinks[uid].commit_checkpoint(checkpoint_id, inner, recovering=recovering)

    def abort(self, handle: Mapping[str, Any]) -> None:
        if handle.get("txns"):  # invariant 2: carried forward by the sink task
            _log.info("transactions_carried_forward", task=handle.get("task"), transactions=len(handle["txns"]))

    def recover_and_commit(self, handle: Mapping[str, Any]) -> None:
        for inner in handle.get("txns") or ():  # invariant 3: the sink's own recovery hook
            self.sinks[handle["sink"]].recover_and_commit(inner)

    def recover_and_abort(self, handle: Mapping[str, Any]) -> None:
        if handle.get("sink") is None:
            return
        for inner in handle.get("txns") or ():  # invariant 3: the sink's own recovery hook
            self.sinks[handle["sink"]].recover_and_abort(inner)

    def abort_transactions(self, sink_uid: Optional[str], txns: Collection[Mapping[str, Any]]) -> None:
        """Abort wrapped transactions no checkpoint can own any more (failover, cancel)."""
        if sink_uid is None:
            return
        for inner in txns:
            self.sinks[sink_uid].abort(inner)

    def abort_lingering(self, up_to_checkpoint: int, keep: Collection[Mapping[str, Any]] = ()) -> int:
        inner_keep = [t for h in keep for t in (h.get("txns") or ())]
        return sum(s.abort_lingering(up_to_checkpoint, inner_keep) for s in self.sinks.values())

    def transaction_log(self) -> TransactionLog:
        return self.log

    def close(self) -> None:
        for s in self.sinks.values():
            s.close()
