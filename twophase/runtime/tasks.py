"""Task threads: source tasks, operator tasks and sink tasks, one thread per subtask.

Every task talks to the job runner through two queues: ``control`` (runner -> task: trigger a
checkpoint, cancel one, checkpoint completed) and the runner's inbox (task -> runner: ack, failed,
inputs ended, finished). Data moves through :mod:`twophase.runtime.channels`.

Invariants (``test_tasks_invN_*``):

1. A source records the position of each of its splits and injects barrier n between two reads, so
   the barrier separates exactly the records before the recorded positions from those after.
2. A sink task pre-commits its open transaction when it takes part in checkpoint n (barrier or,
   after its input ended, a direct trigger), opens the next one, and acks with *every* handle it
   pre-committed and that no completed checkpoint committed yet (listing the checkpoint each was
   pre-committed at, ``at``: committer invariant 4): a handle whose checkpoint was
   aborted is carried into the next ack, never lost. The notification that checkpoint m completed
   drops the handles pre-committed at or before m.
3. A task never acks a checkpoint it did not snapshot; a finished task's final state is acked by
   the runner on its behalf.
4. A task that fails reports the error once and stops; teardown (cancel) is not a failure.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
import traceback
import uuid
from typing import Any, Callable, Optional

import pyarrow as pa

from twophase._logging import get_logger
from twophase.checkpoint import CancelCheckpointMarker, CheckpointBarrier
from twophase.runtime.barriers import HANDLERS, BarrierHandler
from twophase.runtime.channels import (END_OF_INPUT, MAX_WATERMARK, InputGate, PriorityEvent, RecordWriter,
                                       StreamStatus, TaskCancelled, Watermark)
from twophase.runtime.graph import Vertex, task_id
from twophase.runtime.operators import Operator, TaskInfo
from twophase.runtime.watermarks import StatusWatermarkValve
from twophase.sink import SinkSpec, TaskDriver, TransactionContext

_log = get_logger(__name__)

ACK, FAILED, INPUTS_ENDED, FINISHED = "ack", "failed", "inputs_ended", "finished"
TRIGGER, CANCEL, NOTIFY = "trigger", "cancel", "notify"


class Task(threading.Thread):
    """One subtask's thread."""

    def __init__(self, vertex: Vertex, subtask: int, attempt: int, inbox: "queue.Queue[tuple]",
                 cancelled: threading.Event, writer: RecordWriter, mode: str, restored: dict[int, Any]) -> None:
        super().__init__(name=f"twophase-{task_id(vertex.uid, subtask)}", daemon=True)
        self.vertex = vertex
        self.uid = vertex.uid
        self.subtask = subtask
        self.tid = task_id(vertex.uid, subtask)
        self.info = TaskInfo(vertex.uid, subtask, vertex.parallelism, attempt)
        self.attempt_uid = uuid.uuid4().hex[:12]
        self.inbox = inbox
        self.cancelled = cancelled
        self.writer = writer
        self.mode = mode
        self.restored = restored  # every subtask's state of this uid (for redistribution)
        self.control: collections.deque = collections.deque()
        self.records_in = 0

    def run(self) -> None:
        try:
            self.invoke()
        except TaskCancelled:
            pass
        except BaseException as e:  # invariant 4
            if not self.cancelled.is_set():
                _log.warning("task_failed", task=self.tid, error=repr(e))
                self.inbox.put((FAILED, self.tid, e, traceback.format_exc()))
        finally:
            self.cleanup()

    def invoke(self) -> None:
        raise NotImplementedError

    def cleanup(self) -> None:
        pass

    def send_ack(self, checkpoint_id: int, handle: dict, state: Any) -> None:
        self.inbox.put((ACK, self.tid, checkpoint_id, self.attempt_uid, handle, state))

    def forward_barrier(self, barrier: CheckpointBarrier, priority: bool) -> None:
        if priority:
            self.writer.broadcast_priority(barrier)
        else:
            self.writer.broadcast(barrier)


# --------------------------------------------------------------------------- sources


class _SplitState:
    __slots__ = ("split_id", "reader", "finished", "max_ts", "last_active", "idle", "last_wm")

    def __init__(self, split_id: str, reader: Any) -> None:
        self.split_id, self.reader = split_id, reader
        self.finished = False
        self.max_ts: Optional[int] = None
        self.last_active = time.monotonic()
        self.idle = False
        self.last_wm: Optional[int] = None


class SourceTask(Task):
    """Reads its splits, generates watermarks, injects barriers (invariant 1)."""

    records_per_read = 256

    def invoke(self) -> None:
        src = self.vertex.source
        assert src is not None
        positions: dict[str, Any] = {}
        for st in self.restored.values():
            positions.update((st or {}).get("splits", {}))
        mine = [s for i, s in enumerate(src.splits()) if i % self.vertex.parallelism == self.subtask]
        self.splits = [_SplitState(s, src.open_reader(s, positions.get(s))) for s in mine]
        strategy = self.vertex.watermarks
        self.valve = (StatusWatermarkValve(len(self.splits), lambda wm: self.writer.broadcast(Watermark(wm)),
                                           lambda idle: self.writer.broadcast(StreamStatus(idle)))
                      if strategy is not None and self.splits else None)
        if not self.splits and not src.bounded:
            self.writer.broadcast(StreamStatus(True))
        while not self.cancelled.is_set():
            self._drain_control()
            if all(s.finished for s in self.splits) and src.bounded:
                self._finish()
                return
            got = self._read_round(strategy)
            if not got:
                time.sleep(0.001)

    def _read_round(self, strategy: Any) -> int:
        got = 0
        now = time.monotonic()
        for i, s in enumerate(self.splits):
            if s.finished:
                continue
            res = s.reader.read(self.records_per_read)
            if res.records:
                got += len(res.records)
                s.last_active = now
                if s.idle and self.valve is not None:
                    s.idle = False
                    self.valve.input_status(i, False)
                if strategy is None:
                    for v in res.records:
                        self.writer.emit(v, None)
                else:
                    ts_fn = strategy.timestamp_fn
                    mx = s.max_ts
                    for v in res.records:
                        ts = ts_fn(v)
                        self.writer.emit(v, ts)
                        if mx is None or ts > mx:
                            mx = ts
                    s.max_ts = mx
                    wm = strategy.watermark_for(mx)
                    if s.last_wm is None or wm > s.last_wm:
                        s.last_wm = wm
                        self.writer.flush()
                        self.valve.input_watermark(i, wm)  # type: ignore[union-attr]
            if res.finished:
                s.finished = True
                self.writer.flush()
                if self.valve is not None:
                    self.valve.end_of_input(i)
            elif (not res.records and strategy is not None and strategy.idle_timeout_s is not None and not s.idle
                  and now - s.last_active > strategy.idle_timeout_s):
                s.idle = True
                self.writer.flush()
                self.valve.input_status(i, True)  # type: ignore[union-attr]
        self.records_in += got
        self.writer.flush()
        return got

    def positions(self) -> dict[str, Any]:
        return {s.split_id: s.reader.position() for s in self.splits}

    def _drain_control(self) -> None:
        while self.control:
            kind, arg = self.control.popleft()
            if kind == TRIGGER:
                barrier: CheckpointBarrier = arg
                state = {"splits": self.positions()}  # invariant 1: between two reads
                self.forward_barrier(barrier, self.mode == "unaligned")
                self.send_ack(barrier.checkpoint_id, {}, state)
            elif kind == CANCEL:
                self.writer.broadcast(CancelCheckpointMarker(arg))

    def _finish(self) -> None:
        if self.valve is None:
            self.writer.broadcast(Watermark(MAX_WATERMARK))
        self.writer.broadcast(END_OF_INPUT)
        self.inbox.put((FINISHED, self.tid, {"splits": self.positions()}))

    def cleanup(self) -> None:
        for s in getattr(self, "splits", ()):
            try:
                s.reader.close()
            except Exception:  # a reader that fails to close must not hide the task's own error
                pass


# --------------------------------------------------------------------------- tasks with inputs


class InputTask(Task):
    """A task with an input gate: the barrier handler and watermark valve sit in front of the operator."""

    def __init__(self, *args: Any, gate: InputGate, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.gate = gate
        self.handler: BarrierHandler = HANDLERS[self.mode](gate, self)
        self.valve = StatusWatermarkValve(gate.num_channels, self._on_watermark, self._on_status)
        self.ended: set[int] = set()
        self.inputs_ended = False

    # -- hooks for subclasses
    def process(self, value: Any, timestamp: Optional[int]) -> None:
        raise NotImplementedError

    def _on_watermark(self, wm: int) -> None:
        pass

    def _on_status(self, idle: bool) -> None:
        pass

    def end_of_all_inputs(self) -> None:
        raise NotImplementedError

    def handle_control(self, kind: str, arg: Any) -> None:
        pass

    # -- the loop
    def replay_channel_state(self, own: Any) -> None:
        for _ch, records in ((own or {}).get("channels") or []):
            for v, ts in records:
                self.process(v, ts)

    def run_loop(self) -> None:
        gate, handler = self.gate, self.handler
        process = self.process
        while not self.cancelled.is_set():
            while self.control:
                kind, arg = self.control.popleft()
                self.handle_control(kind, arg)
            if self.inputs_ended:
                if self.after_end_tick():
                    return
                continue
            item = gate.poll(0.005)
            if item is None:
                self.writer.flush()
                continue
            ch, el = item
            if type(el) is list:
                handler.on_data(ch, el)
                self.records_in += len(el)
                for v, ts in el:
                    process(v, ts)
            elif type(el) is Watermark:
                self.valve.input_watermark(ch, el.timestamp)
            elif type(el) is PriorityEvent:
                handler.on_barrier(ch, el.element, el.overtaken)
            elif type(el) is CheckpointBarrier:
                handler.on_barrier(ch, el, 0)
            elif type(el) is StreamStatus:
                self.valve.input_status(ch, el.idle)
            elif type(el) is CancelCheckpointMarker:
                handler.on_cancel(ch, el)
            elif el is END_OF_INPUT:
                self.ended.add(ch)
                self.valve.end_of_input(ch)
                handler.on_end_of_input(ch)
                if len(self.ended) == gate.num_channels:
                    self.inputs_ended = True
                    self.end_of_all_inputs()

    def after_end_tick(self) -> bool:
        """Called in the loop after all inputs ended; True ends the task."""
        return True

    # -- CheckpointableTask
    def forward_cancel(self, checkpoint_id: int) -> None:
        self.writer.broadcast(CancelCheckpointMarker(checkpoint_id))


def _channel_state_json(channel_state: Optional[dict[int, list]]) -> Optional[list]:
    if not channel_state:
        return None
    return [[ch, [[v, ts] for v, ts in recs]] for ch, recs in sorted(channel_state.items())]


class OperatorTask(InputTask):
    """Runs one operator: records in, records out; snapshots the operator at each checkpoint."""

    def __init__(self, *args: Any, operator: Operator, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.operator = operator
        self.snapshots: dict[int, Any] = {}

    def invoke(self) -> None:
        op = self.operator
        op.open(self.info)
        if self.restored:
            op.restore([self.restored[k] and self.restored[k].get("op") for k in sorted(self.restored)])
        self.process = lambda v, ts, _p=op.process, _w=self.writer: _p(v, ts, _w)  # type: ignore[method-assign]
        self.replay_channel_state(self.restored.get(self.subtask))
        self.run_loop()

    def _on_watermark(self, wm: int) -> None:
        self.operator.on_watermark(wm, self.writer)
        self.writer.broadcast(Watermark(wm))

    def _on_status(self, idle: bool) -> None:
        self.writer.broadcast(StreamStatus(idle))

    def on_checkpoint(self, barrier: CheckpointBarrier, priority: bool) -> None:
        self.snapshots[barrier.checkpoint_id] = self.operator.snapshot()
        self.forward_barrier(barrier, priority)

    def ack(self, checkpoint_id: int, channel_state: Optional[dict[int, list]]) -> None:
        for c in [c for c in self.snapshots if c < checkpoint_id]:
            del self.snapshots[c]
        state = {"op": self.snapshots.pop(checkpoint_id, None), "channels": _channel_state_json(channel_state)}
        self.send_ack(checkpoint_id, {}, state)

    def end_of_all_inputs(self) -> None:
        self.operator.end_input(self.writer)
        self.writer.broadcast(END_OF_INPUT)
        self.inbox.put((FINISHED, self.tid, {"op": self.operator.snapshot(), "channels": None}))

    def cleanup(self) -> None:
        self.operator.close()


class SinkTask(InputTask):
    """Runs a sink's writer through the :class:`~twophase.sink.TaskDriver`: one transaction per checkpoint
    interval (invariant 2)."""

    batch_rows = 1024

    def __init__(self, *args: Any, sink: SinkSpec[Any], first_checkpoint_id: int,
                 to_row: Optional[Callable[[Any], dict]] = None, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.sink = sink
        self.to_row = to_row
        self.next_label = first_checkpoint_id
        self.txn: Optional[TaskDriver[Any]] = None
        self.rows: list[dict] = []
        self.schema: Optional[pa.Schema] = None
        self.uncommitted: list[tuple[int, dict]] = []  # (checkpoint id pre-committed at, handle)
        self.finished = False

    def invoke(self) -> None:
        self._begin()
        self.replay_channel_state(self.restored.get(self.subtask))
        self.run_loop()

    def _begin(self) -> None:
        # task_attempt_id: unique per task attempt (like Spark's taskAttemptId), from the random attempt uid;
        # sinks that name external transactions per attempt derive the name from it
        ctx = TransactionContext(self.sink.sink_id, self.next_label, f"{self.uid}-{self.subtask}",
                                 self.info.attempt, self.attempt_uid, task_attempt_id=int(self.attempt_uid, 16))
        self.txn = TaskDriver(self.sink, ctx)

    def process(self, value: Any, timestamp: Optional[int]) -> None:
        to_row = self.to_row
        self.rows.append(to_row(value) if to_row is not None else value if type(value) is dict else {"value": value})
        if len(self.rows) >= self.batch_rows:
            self._write_rows()

    def _write_rows(self) -> None:
        if not self.rows:
            return
        assert self.txn is not None
        if self.schema is None:
            batch = pa.RecordBatch.from_pylist(self.rows)
            self.schema = batch.schema
        else:
            batch = pa.RecordBatch.from_pylist(self.rows, schema=self.schema)
        self.rows = []
        self.txn.write(batch)

    def _pre_commit(self, checkpoint_id: int) -> None:
        self._write_rows()
        if self.txn is not None:
            ack = self.txn.prepare_commit()
            self.uncommitted.append((checkpoint_id, dict(ack.handle)))
            self.txn = None

    def on_checkpoint(self, barrier: CheckpointBarrier, priority: bool) -> None:
        cid = barrier.checkpoint_id
        self._pre_commit(cid)
        self.next_label = cid + 1
        if not self.inputs_ended:
            self._begin()

    def ack(self, checkpoint_id: int, channel_state: Optional[dict[int, list]]) -> None:
        # "at": the checkpoint each transaction was pre-committed at (committer invariant 4)
        handle = {"task": self.tid, "sink": self.uid, "txns": [h for _, h in self.uncommitted],
                  "at": [c for c, _ in self.uncommitted]}
        self.send_ack(checkpoint_id, handle, {"op": None, "channels": _channel_state_json(channel_state)})

    def handle_control(self, kind: str, arg: Any) -> None:
        if kind == NOTIFY:  # invariant 2: everything pre-committed at or before arg is committed
            self.uncommitted = [(c, h) for c, h in self.uncommitted if c > arg]
            if self.inputs_ended and self.txn is None and not self.uncommitted:
                self.finished = True
        elif kind == TRIGGER and self.inputs_ended:  # a direct trigger once the input ended
            self.on_checkpoint(arg, False)
            self.ack(arg.checkpoint_id, None)

    def forward_cancel(self, checkpoint_id: int) -> None:
        pass  # no outputs

    def end_of_all_inputs(self) -> None:
        self._write_rows()
        self.inbox.put((INPUTS_ENDED, self.tid))

    def after_end_tick(self) -> bool:
        if self.finished:
            self.inbox.put((FINISHED, self.tid, {"op": None, "channels": None}))
            return True
        time.sleep(0.002)
        return False

    def cleanup(self) -> None:
        if self.txn is not None:  # recovery's abort_lingering cleans what this leaves
            self.txn.abort()
