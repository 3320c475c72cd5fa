"""Barrier handlers: what a task with several input channels does when checkpoint barriers arrive.

A handler sees every barrier, cancel marker and end of input of its task's :class:`InputGate` and
calls back into the task (:class:`CheckpointableTask`):

* ``on_checkpoint(barrier, priority)`` -- snapshot the operator (a sink pre-commits) and forward the
  barrier downstream (ahead of queued output when ``priority``);
* ``ack(checkpoint_id, channel_state)`` -- the task's part of the checkpoint is complete;
* ``forward_cancel(checkpoint_id)`` -- send a :class:`CancelCheckpointMarker` downstream.

Three strategies (names from Flink):

:class:`AligningBarrierHandler` (exactly-once). Invariants (``test_barriers_aligned_invN_*``):

1. A channel that delivered barrier n is blocked; its records stay queued until every live channel
   has delivered n. So no record after barrier n on any channel reaches the operator before snapshot n.
2. The snapshot is taken, then the barrier forwarded, then the channels unblocked, exactly once per n.
3. A cancel marker for n, or a barrier of a newer checkpoint, ends the alignment of n: channels are
   unblocked, n is cancelled downstream, nothing of n is acked.
4. A channel that reached end of input no longer counts: alignment waits only for live channels.

:class:`TrackingBarrierHandler` (at-least-once): never blocks. Snapshot n is taken when the last
live channel delivers n; records that came after barrier n on faster channels are already in the
state, so a restore from n replays them a second time (duplicates, never loss).

:class:`UnalignedBarrierHandler` (exactly-once, no blocking). The barrier is a priority event: it
overtakes queued data. Invariants (``test_barriers_unaligned_invN_*``):

5. Snapshot n is taken when the first barrier n arrives, and the barrier is forwarded at once,
   ahead of queued output.
6. The checkpoint's channel state holds exactly the records that are before barrier n in their
   channel but were not in the operator at snapshot time: those the barrier overtook, and those read
   from a channel after the snapshot and before that channel's barrier. A restore replays them first.
7. The task acks n only when every live channel delivered n (its channel state is complete).
"""

from __future__ import annotations

import time
from typing import Any, Optional, Protocol

from twophase.checkpoint import CancelCheckpointMarker, CheckpointBarrier
from twophase.runtime.channels import InputGate


class CheckpointableTask(Protocol):
    def on_checkpoint(self, barrier: CheckpointBarrier, priority: bool) -> None: ...

    def ack(self, checkpoint_id: int, channel_state: Optional[dict[int, list]]) -> None: ...

    def forward_cancel(self, checkpoint_id: int) -> None: ...


class BarrierHandler:
    """Common bookkeeping: live channels, the newest finished checkpoint id, alignment times."""

    #: whether sources and tasks send barriers as priority events to a task using this handler
    priority_barriers = False

    def __init__(self, gate: InputGate, task: CheckpointableTask) -> None:
        self.gate = gate
        self.task = task
        self.live: set[int] = set(range(gate.num_channels))
        self.last_done = -1  # newest checkpoint id completed or cancelled here
        self.alignment_times: list[float] = []
        self._cancelled_forwarded: set[int] = set()

    def on_barrier(self, channel: int, barrier: CheckpointBarrier, overtaken: int = 0) -> None:
        raise NotImplementedError

    def on_cancel(self, channel: int, marker: CancelCheckpointMarker) -> None:
        raise NotImplementedError

    def on_end_of_input(self, channel: int) -> None:
        raise NotImplementedError

    def on_data(self, channel: int, buffer: list) -> None:
        """Called for every data buffer before it is processed (only the unaligned handler records)."""

    def _cancel_downstream(self, checkpoint_id: int) -> None:
        if checkpoint_id not in self._cancelled_forwarded:
            self._cancelled_forwarded.add(checkpoint_id)
            self.task.forward_cancel(checkpoint_id)
        self.last_done = max(self.last_done, checkpoint_id)


class AligningBarrierHandler(BarrierHandler):
    """Exactly-once alignment (invariants 1-4)."""

    def __init__(self, gate: InputGate, task: CheckpointableTask) -> None:
        super().__init__(gate, task)
        self.current: Optional[CheckpointBarrier] = None
        self.seen: set[int] = set()
        self._started = 0.0

    def on_barrier(self, channel: int, barrier: CheckpointBarrier, overtaken: int = 0) -> None:
        cid = barrier.checkpoint_id
        if cid <= self.last_done:
            return  # a late barrier of a checkpoint already finished or cancelled here
        if self.current is not None and cid > self.current.checkpoint_id:
            self._abort_alignment()  # invariant 3: a newer barrier ends the older alignment
        if self.current is None:
            self.current, self.seen, self._started = barrier, set(), time.perf_counter()
        self.seen.add(channel)
        self.gate.block(channel)  # invariant 1
        self._maybe_complete()

    def _maybe_complete(self) -> None:
        if self.current is None or not self.live <= self.seen:
            return
        barrier = self.current
        self.alignment_times.append(time.perf_counter() - self._started)
        self.task.on_checkpoint(barrier, False)  # invariant 2: snapshot and forward, then unblock
        self.current, self.seen = None, set()
        self.last_done = barrier.checkpoint_id
        self.gate.unblock_all()
        self.task.ack(barrier.checkpoint_id, None)

    def _abort_alignment(self) -> None:
        assert self.current is not None
        cid = self.current.checkpoint_id
        self.current, self.seen = None, set()
        self.gate.unblock_all()
        self._cancel_downstream(cid)

    def on_cancel(self, channel: int, marker: CancelCheckpointMarker) -> None:
        cid = marker.checkpoint_id
        if self.current is not None and cid == self.current.checkpoint_id:
            self._abort_alignment()
        elif cid > self.last_done and (self.current is None or cid > self.current.checkpoint_id):
            if self.current is not None:
                self._abort_alignment()
            self._cancel_downstream(cid)

    def on_end_of_input(self, channel: int) -> None:
        self.live.discard(channel)  # invariant 4
        self._maybe_complete()


class TrackingBarrierHandler(BarrierHandler):
    """At-least-once: count barriers per checkpoint, never block."""

    def __init__(self, gate: InputGate, task: CheckpointableTask) -> None:
        super().__init__(gate, task)
        self.pending: dict[int, tuple[CheckpointBarrier, set[int], float]] = {}

    def on_barrier(self, channel: int, barrier: CheckpointBarrier, overtaken: int = 0) -> None:
        cid = barrier.checkpoint_id
        if cid <= self.last_done:
            return
        entry = self.pending.setdefault(cid, (barrier, set(), time.perf_counter()))
        entry[1].add(channel)
        self._maybe_complete(cid)

    def _maybe_complete(self, cid: int) -> None:
        barrier, seen, started = self.pending[cid]
        if not self.live <= seen:
            return
        self.alignment_times.append(time.perf_counter() - started)
        for older in [c for c in self.pending if c < cid]:  # subsumed
            del self.pending[older]
            self._cancel_downstream(older)
        del self.pending[cid]
        self.last_done = cid
        self.task.on_checkpoint(barrier, False)
        self.task.ack(cid, None)

    def on_cancel(self, channel: int, marker: CancelCheckpointMarker) -> None:
        cid = marker.checkpoint_id
        if cid <= self.last_done:
            return
        self.pending.pop(cid, None)
        self._cancel_downstream(cid)

    def on_end_of_input(self, channel: int) -> None:
        self.live.discard(channel)
        for cid in sorted(self.pending):
            if cid in self.pending:
                self._maybe_complete(cid)


class UnalignedBarrierHandler(BarrierHandler):
    """Exactly-once without blocking: the barrier overtakes data, which goes into the checkpoint (5-7)."""

    priority_barriers = True

    def __init__(self, gate: InputGate, task: CheckpointableTask) -> None:
        super().__init__(gate, task)
        self.current: Optional[int] = None
        self.waiting: set[int] = set()
        self.channel_state: dict[int, list] = {}
        self._started = 0.0

    def on_barrier(self, channel: int, barrier: CheckpointBarrier, overtaken: int = 0) -> None:
        cid = barrier.checkpoint_id
        if cid <= self.last_done:
            return
        if self.current is not None and cid > self.current:
            self._abort()
        if self.current is None:
            self._started = time.perf_counter()
            self.task.on_checkpoint(barrier, True)  # invariant 5
            self.current = cid
            self.waiting = set(self.live)
            self.channel_state = {}
        # invariant 6: the data this barrier overtook is before it in the channel
        for element in self.gate.peek_queued(channel, overtaken):
            if isinstance(element, list):
                self.channel_state.setdefault(channel, []).extend(element)
        self.waiting.discard(channel)
        self._maybe_complete()

    def on_data(self, channel: int, buffer: list) -> None:
        if self.current is not None and channel in self.waiting:
            self.channel_state.setdefault(channel, []).extend(buffer)

    def _maybe_complete(self) -> None:
        if self.current is None or self.waiting & self.live:
            return
        cid, state = self.current, self.channel_state
        self.alignment_times.append(time.perf_counter() - self._started)
        self.current, self.channel_state, self.waiting = None, {}, set()
        self.last_done = cid
        self.task.ack(cid, state)  # invariant 7

    def _abort(self) -> None:
        assert self.current is not None
        cid = self.current
        self.current, self.channel_state, self.waiting = None, {}, set()
        self._cancel_downstream(cid)

    def on_cancel(self, channel: int, marker: CancelCheckpointMarker) -> None:
        cid = marker.checkpoint_id
        if self.current is not None and cid == self.current:
            self._abort()
        elif cid > self.last_done and (self.current is None or cid > self.current):
            if self.current is not None:
                self._abort()
            self._cancel_downstream(cid)

    def on_end_of_input(self, channel: int) -> None:
        self.live.discard(channel)
        self.waiting.discard(channel)
        self._maybe_complete()


HANDLERS = {"aligned": AligningBarrierHandler, "tracking": TrackingBarrierHandler,
            "unaligned": UnalignedBarrierHandler}
