"""The job's view of its sinks for the checkpoint coordinator: one handle per task, many transactions.

The core :class:`~twophase.coordinator.CheckpointCoordinator` expects one handle per acking task. In
the runtime every task acks (sources with positions, operators with state), and a sink task's
handle carries every transaction it pre-committed that is not committed yet (tasks invariant 2).
:class:`JobCommitter` is the :class:`~twophase.sink.SinkCommitter` the coordinator drives; it unwraps
those handles and calls each sink's own committer. It implements only the committer side: the sink
tasks drive the writers (:class:`twophase.sink.TaskDriver`).

Invariants (``test_committer_invN_*``):

1. ``commit_checkpoint`` hands every wrapped transaction of the checkpoint to its sink's own
   ``commit_checkpoint`` (so a sink that commits a checkpoint atomically still can), and reports a
   wrapped transaction's LOST outcome as its task handle's; non-sink task handles carry no transactions.
2. ``abort`` of a task handle (its checkpoint was declined, expired or subsumed) does NOT abort the
   wrapped transactions: the sink task still holds them and acks them again with the next
   checkpoint (Flink's two-phase-commit sink keeps them pending the same way). The runner aborts
   them itself when no checkpoint can own them any more (failover, cancel): see
   :meth:`abort_transactions`.
3. Recovery (``recovering=True``) and lingering cleanup reach every sink's own committer unchanged.
4. ``check_prepared`` (before a decision) asks each sink's own ``check_prepared`` about the wrapped
   transactions of the checkpoint that no decided checkpoint owns: a task handle lists the checkpoint each
   transaction was pre-committed at (``at``), and a transaction pre-committed at or before a checkpoint
   this committer was asked to commit belongs to that decided checkpoint (every task acks every completed
   checkpoint with every transaction it holds), so it is never checked (it is committed: Kafka's broker
   describes it CompleteCommit, which the check would name gone) even when a sink task carried it into a
   later ack before the notification reached it.
"""

from __future__ import annotations

from typing import Any, Collection, Mapping, Optional, Sequence

from twophase._logging import get_logger
from twophase.sink import CommitResult, CommitStatus, SinkCommitter, SinkSpec

_log = get_logger(__name__)


class JobCommitter(SinkCommitter[Mapping[str, Any]]):
    """Routes task handles ``{"task", "sink", "txns": [...]}`` to the job's sinks (see invariants)."""

    def __init__(self, sinks: Mapping[str, SinkSpec[Any]]) -> None:
        self.sinks = dict(sinks)
        self.committers: dict[str, SinkCommitter[Any]] = {uid: s.create_committer() for uid, s in self.sinks.items()}
        #: the highest checkpoint handed to :meth:`commit_checkpoint` (decided: the coordinator commits in order)
        self.decided_up_to: Optional[int] = None

    def decode(self, handle: Mapping[str, Any]) -> Mapping[str, Any]:  # type: ignore[override]
        """A task handle is a routing envelope; its ``txns`` are decoded by each sink's committer."""
        return handle

    def _by_sink(self, handles: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
        out: dict[str, list[Mapping[str, Any]]] = {}
        for h in handles:
            if h.get("txns"):
                out.setdefault(h["sink"], []).extend(h["txns"])
        return out

    def commit(self, committable: Mapping[str, Any], *, recovering: bool = False) -> CommitResult[Any]:
        """Commit one task handle: each wrapped transaction through its sink's committer, as the only one
        of its own checkpoint (the coordinator commits whole checkpoints through :meth:`commit_checkpoint`)."""
        results = []
        if committable.get("txns"):
            c = self.committers[committable["sink"]]
            results = [c.commit(c.decode(t), recovering=recovering) for t in committable["txns"]]
        lost = [r for r in results if r.status is CommitStatus.LOST]
        if lost:
            return CommitResult(committable, CommitStatus.LOST, "; ".join(r.detail for r in lost))  # type: ignore[arg-type]
        already = bool(results) and all(r.status is CommitStatus.ALREADY_COMMITTED for r in results)
        return CommitResult(committable, CommitStatus.ALREADY_COMMITTED if already  # type: ignore[arg-type]
                            else CommitStatus.COMMITTED)

    def check_prepared(self, checkpoint_id: int, committables: Sequence[Mapping[str, Any]]) -> list[str]:
        """Each sink's own check of the undecided wrapped transactions of the checkpoint (invariant 4)."""
        decided = self.decided_up_to
        by_sink: dict[str, list[Mapping[str, Any]]] = {}
        for h in committables:
            txns = list(h.get("txns") or ())
            at = list(h.get("at") or ())
            if decided is not None and len(at) == len(txns):
                txns = [t for t, c in zip(txns, at) if c > decided]
            if txns:
                by_sink.setdefault(h["sink"], []).extend(txns)
        out: list[str] = []
        for uid, inner in by_sink.items():
            c = self.committers[uid]
            out.extend(c.check_prepared(checkpoint_id, [c.decode(t) for t in inner]))
        return out

    def commit_checkpoint(self, checkpoint_id: int, committables: Sequence[Mapping[str, Any]], *,
                          recovering: bool = False) -> list[CommitResult[Any]]:
        if self.decided_up_to is None or checkpoint_id > self.decided_up_to:  # invariant 4: decided
            self.decided_up_to = checkpoint_id
        out: list[CommitResult[Any]] = []
        for uid, inner in self._by_sink(committables).items():  # invariant 1
            c = self.committers[uid]
            out.extend(c.commit_checkpoint(checkpoint_id, [c.decode(t) for t in inner], recovering=recovering))
        return out

    def abort(self, committable: Mapping[str, Any], *, recovering: bool = False) -> None:
        if recovering:  # invariant 3: a task handle found PENDING at recovery; no sink task holds it any more
            self.abort_transactions(committable.get("sink"), committable.get("txns") or (), recovering=True)
        elif committable.get("txns"):  # invariant 2: carried forward by the sink task
            _log.info("transactions_carried_forward", task=committable.get("task"), transactions=len(committable["txns"]))

    def abort_transactions(self, sink_uid: Optional[str], txns: Collection[Mapping[str, Any]], *,
                           recovering: bool = False) -> None:
        """Abort wrapped transactions no checkpoint can own any more (failover, cancel, recovery)."""
        if sink_uid is None:
            return
        c = self.committers[sink_uid]
        for inner in txns:
            c.abort(c.decode(inner), recovering=recovering)

    def abort_lingering(self, up_to_checkpoint: int, highest_committed: Optional[int]) -> int:
        return sum(c.abort_lingering(up_to_checkpoint, highest_committed) for c in self.committers.values())

    def close(self) -> None:
        for c in self.committers.values():
            c.close()
        for s in self.sinks.values():
            s.close()
