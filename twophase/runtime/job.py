"""The job runner: builds the tasks of a :class:`JobGraph`, runs them as threads, drives checkpoints,
restarts after failures and takes savepoints.

One attempt, step by step (marked ``# step N``):

1. recover: a fresh :class:`CheckpointCoordinator` over the job's log commits every COMPLETED and
   aborts every PENDING checkpoint and lingering transactions (coordinator invariant 5); a
   TransientSinkError here fails the attempt (``recovery``), which the restart strategy may retry;
2. restore: state comes from the savepoint given (until this run completes a checkpoint of its own),
   else from the latest completed checkpoint in the log; it is matched to vertices by uid;
3. deploy: gates, writers and task threads are built and started; sources seek, keyed state is
   redistributed, in-flight data of an unaligned checkpoint is replayed;
4. run: the runner thread takes task messages (acks, failures, end of input), triggers checkpoints
   by the :class:`TriggerPolicy`, aborts expired ones (cancel markers flow from the sources), and
   fails the attempt when more than ``tolerable_failures`` checkpoints in a row failed;
5. tear down: on a failure every gate is closed and every thread joined; transactions that sink
   tasks pre-committed after the latest completed checkpoint are aborted (each best effort: an abort
   that fails is logged, ``teardown_abort_failed``, and left to the sweep after a later commit, so the
   attempt's own failure still reaches the restart strategy); the restart strategy decides whether
   step 1 runs again.

Invariants (``test_job_invN_*``):

1. Every task of the job acks every completed checkpoint (finished tasks through the runner, with
   their final state), so a completed checkpoint's ``task_state`` is the state of the whole job.
2. A job whose sources are all bounded ends only after a checkpoint taken after the end of input
   completed, so every record reached a committed transaction.
3. Checkpoint ids only grow, across attempts and processes (each run continues after the log's
   highest id).
4. Only the runner thread talks to the coordinator.
5. A checkpoint is decided only after every sink confirmed, once every ack is in, that its prepared
   transactions still exist (coordinator invariant 4, ``SinkCommitter.check_prepared``; a decided
   checkpoint is never asked). One named gone (Kafka's broker aborted it after
   ``transaction.timeout.ms``) is never decided: its record is ABORTED and the attempt fails over like a
   task failure (logged ``checkpoint_failover``, counted in ``JobMetrics.failovers``): the sinks abort the
   transactions of every undecided checkpoint, the sources rewind to the latest completed checkpoint's
   positions and the records are written again into new transactions, so none is lost or doubled.
   (Declining alone would carry the dead transaction into the next checkpoint.) A check that fails
   transiently declines the checkpoint: its transactions are carried into the next one and checked
   again; more failed checkpoints in a row than ``tolerable_failures`` fail over.
"""

from __future__ import annotations

import enum
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Optional

from twophase._logging import get_logger
from twophase.checkpoint import CheckpointBarrier, CheckpointProperties, CheckpointType, CompletedCheckpoint
from twophase.coordinator import CheckpointCoordinator, TriggerPolicy
from twophase.errors import CheckpointDeclinedError, ConfigurationError, JobFailedError, TransientSinkError
from twophase.log import TransactionLog
from twophase.runtime import tasks as T
from twophase.runtime.channels import InputGate, OutputEdge, RecordWriter, hash_partitioner
from twophase.runtime.committer import JobCommitter
from twophase.runtime.graph import JobGraph, Vertex, task_id
from twophase.runtime.restart import FixedDelayRestart, RestartStrategy
from twophase.runtime.savepoint import Savepoint, match_state
from twophase.sink import Ack

_log = get_logger(__name__)

MODES = ("aligned", "tracking", "unaligned")


@dataclass(frozen=True)
class CheckpointConfig:
    """Periodic checkpointing. ``mode``: ``aligned`` (exactly-once), ``unaligned`` (exactly-once, barriers
    overtake data) or ``tracking`` (at-least-once, never blocks)."""

    interval_s: float = 1.0
    mode: str = "aligned"
    min_pause_s: float = 0.0
    max_concurrent: int = 1
    timeout_s: float = 60.0
    tolerable_failures: int = 0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigurationError(f"checkpoint mode {self.mode!r} is not one of {', '.join(MODES)}")

    def policy(self) -> TriggerPolicy:
        return TriggerPolicy(self.interval_s, self.min_pause_s, self.max_concurrent, self.timeout_s,
                             self.tolerable_failures)


class JobStatus(str, enum.Enum):
    FINISHED = "FINISHED"
    STOPPED = "STOPPED"  # stop-with-savepoint
    CANCELLED = "CANCELLED"


@dataclass
class JobMetrics:
    checkpoints_completed: list[int] = field(default_factory=list)
    checkpoint_durations_s: list[float] = field(default_factory=list)
    alignment_times_s: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    recovery_times_s: list[float] = field(default_factory=list)  # failure -> first new completed checkpoint
    records_out: int = 0
    #: checkpoints not decided because a sink named a prepared transaction gone; each failed over (invariant 5)
    failovers: list[int] = field(default_factory=list)


@dataclass
class JobResult:
    status: JobStatus
    attempts: int
    metrics: JobMetrics
    last_checkpoint_id: Optional[int] = None
    savepoint_path: Optional[str] = None


class _AttemptFailed(Exception):
    def __init__(self, cause: BaseException, where: str) -> None:
        super().__init__(f"{where}: {cause!r}")
        self.cause = cause
        self.where = where


@dataclass
class _Request:
    kind: str  # savepoint | stop | cancel
    path: Optional[str] = None
    future: Future = field(default_factory=Future)


class JobRunner:
    """Runs a :class:`JobGraph` in this process (see module docstring)."""

    def __init__(self, graph: JobGraph, *, checkpointing: Optional[CheckpointConfig] = None,
                 restart: Optional[RestartStrategy] = None, state_location: Optional[str] = None,
                 restore_from: Optional[str] = None, allow_non_restored_state: bool = False,
                 channel_capacity: int = 8, buffer_size: int = 256, sink_batch_rows: int = 1024,
                 owner: Optional[str] = None) -> None:
        graph.validate()
        self.graph = graph
        self.config = checkpointing
        self.mode = checkpointing.mode if checkpointing else "aligned"
        self.policy = checkpointing.policy() if checkpointing else TriggerPolicy(interval_s=3600.0)
        self.restart = restart if restart is not None else FixedDelayRestart(attempts=0)
        self.allow_non_restored_state = allow_non_restored_state
        self.channel_capacity, self.buffer_size, self.sink_batch_rows = channel_capacity, buffer_size, sink_batch_rows
        self.sinks = {v.uid: v.sink for v in graph.transactional_sinks if v.sink is not None}
        if self.sinks:
            self.log: TransactionLog = next(iter(self.sinks.values())).transaction_log()
        elif state_location:
            self.log = TransactionLog.open(state_location, f"job:{graph.name}")
        else:
            raise ConfigurationError(f"job {graph.name!r} has no transactional sink; give state_location= for its "
                                     "checkpoint log")
        self.log.claim(owner or f"twophase-runtime:{graph.name}")
        self.committer = JobCommitter(self.sinks)
        self.savepoint = Savepoint.read(restore_from) if restore_from else None
        self.metrics = JobMetrics()
        self._requests: "queue.Queue[_Request]" = queue.Queue()
        self._completed_in_run = False
        self._thread: Optional[threading.Thread] = None
        self._result: Optional[JobResult] = None
        self._error: Optional[BaseException] = None
        self._failed_at: Optional[float] = None
        self.attempt = 0
        self.coordinator: Optional[CheckpointCoordinator] = None

    # ------------------------------------------------------------------ public API

    def run(self) -> JobResult:
        """Run to the end (bounded sources), a stop-with-savepoint or a cancel; restarts per strategy.
        Every sink's destination is checked first (``SinkSpec.validate_destination``): a bad destination is a
        ConfigurationError before any task starts, not a failed attempt the restart strategy retries."""
        for sink in self.sinks.values():
            sink.validate_destination()
        while True:
            self.attempt += 1
            try:
                return self._run_attempt()
            except _AttemptFailed as f:
                self._failed_at = time.monotonic()
                self.metrics.failures.append(f.where)
                delay = self.restart.on_failure(time.monotonic())
                _log.warning("job_attempt_failed", job=self.graph.name, attempt=self.attempt, where=f.where,
                             error=repr(f.cause), restarting=delay is not None)
                if delay is None:
                    raise JobFailedError(f"job {self.graph.name!r} failed in attempt {self.attempt} ({f.where}: "
                                         f"{f.cause!r}); restart strategy {self.restart!r} gives up") from f.cause
                if delay:
                    time.sleep(delay)

    def start(self) -> "JobRunner":
        """Run in a background thread; use :meth:`wait`, :meth:`stop_with_savepoint`, :meth:`cancel`."""
        def target() -> None:
            try:
                self._result = self.run()
            except BaseException as e:
                self._error = e
        self._thread = threading.Thread(target=target, name=f"twophase-job-{self.graph.name}", daemon=True)
        self._thread.start()
        return self

    def wait(self, timeout: float) -> JobResult:
        assert self._thread is not None, "start() first"
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"job {self.graph.name!r} still running after {timeout}s")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def trigger_savepoint(self, path: str, timeout: float = 30.0) -> str:
        """Take a savepoint and write it to ``path``; the job keeps running."""
        return self._request(_Request("savepoint", path), timeout)

    def stop_with_savepoint(self, path: str, timeout: float = 30.0) -> str:
        """Take a savepoint, write it to ``path``, then stop the job (status STOPPED)."""
        return self._request(_Request("stop", path), timeout)

    def cancel(self) -> None:
        self._requests.put(_Request("cancel"))

    def _request(self, req: _Request, timeout: float) -> str:
        self._requests.put(req)
        return req.future.result(timeout)

    # ------------------------------------------------------------------ one attempt

    def _run_attempt(self) -> JobResult:
        inbox: "queue.Queue[tuple]" = queue.Queue()
        cancelled = threading.Event()
        # step 1: recover
        coord = CheckpointCoordinator(self.committer, self.log, policy=self.policy)
        self.coordinator = coord
        try:
            coord.recover()
        except TransientSinkError as e:  # a destination away for a moment: a failed attempt the restart retries
            raise _AttemptFailed(e, "recovery") from e
        for sink in self.sinks.values():  # twophase-postgres: prepared transactions of ABORTED checkpoints hold locks
            hook = getattr(sink, "after_runtime_recovery", None)
            if hook is not None:
                hook(self.log)
        # step 2: restore
        if self.savepoint is not None and not self._completed_in_run:
            restored_state, restored_from = self.savepoint.task_state, f"savepoint {self.savepoint.checkpoint_id}"
        else:
            rec = coord.latest_completed()
            restored_state = rec.task_state if rec else None
            restored_from = f"checkpoint {rec.checkpoint_id}" if rec else "nothing"
        state = match_state(restored_state, self.graph, allow_non_restored_state=self.allow_non_restored_state)
        next_id = max(self.log.checkpoint_ids(), default=0) + 1  # invariant 3
        _log.info("job_attempt_started", job=self.graph.name, attempt=self.attempt, restored_from=restored_from,
                  next_checkpoint_id=next_id)
        # step 3: deploy
        tasks = self._build_tasks(inbox, cancelled, state, next_id)
        run = _Attempt(self, coord, tasks, inbox, cancelled, next_id)
        coord.listeners.append(run.on_completed)
        for t in tasks.values():
            t.start()
        try:
            return run.loop()  # step 4
        except _AttemptFailed:
            raise
        except BaseException as e:
            raise _AttemptFailed(e, "runner") from e
        finally:
            run.teardown()  # step 5

    def _build_tasks(self, inbox: "queue.Queue[tuple]", cancelled: threading.Event,
                     state: dict[str, dict[int, Any]], first_id: int) -> dict[str, T.Task]:
        gates: dict[tuple[str, int], InputGate] = {}
        # channel layout: per downstream subtask, one channel per (input edge, upstream subtask feeding it)
        channel_of: dict[tuple[str, int, int, str, int], int] = {}
        for v in self.graph.vertices:
            for sub in range(v.parallelism):
                n = 0
                for ei, e in enumerate(v.inputs):
                    ups = [sub] if e.kind == "forward" else range(e.upstream.parallelism)
                    for u in ups:
                        channel_of[(v.uid, sub, ei, e.upstream.uid, u)] = n
                        n += 1
                if v.inputs:
                    gates[(v.uid, sub)] = InputGate(n, self.channel_capacity, name=task_id(v.uid, sub))
        tasks: dict[str, T.Task] = {}
        for v in self.graph.vertices:
            for sub in range(v.parallelism):
                edges = []
                for dv, e in self.graph.downstream(v):
                    ei = dv.inputs.index(e)
                    if e.kind == "forward":
                        targets = [(gates[(dv.uid, sub)], channel_of[(dv.uid, sub, ei, v.uid, sub)])]
                    else:
                        targets = [(gates[(dv.uid, d)], channel_of[(dv.uid, d, ei, v.uid, sub)])
                                   for d in range(dv.parallelism)]
                    part = hash_partitioner(e.key_fn) if e.kind == "hash" and e.key_fn is not None else None
                    edges.append(OutputEdge(targets, part, self.buffer_size))
                writer = RecordWriter(edges, cancelled)
                restored = state.get(v.uid, {})
                args = (v, sub, self.attempt, inbox, cancelled, writer, self.mode, restored)
                t: T.Task
                if v.kind == "source":
                    t = T.SourceTask(*args)
                elif v.sink is not None:
                    t = T.SinkTask(*args, gate=gates[(v.uid, sub)], sink=v.sink, first_checkpoint_id=first_id,
                                   to_row=v.to_row)
                    t.batch_rows = self.sink_batch_rows
                else:
                    assert v.operator_factory is not None
                    t = T.OperatorTask(*args, gate=gates[(v.uid, sub)], operator=v.operator_factory())
                tasks[t.tid] = t
        return tasks


class _Attempt:
    """State of one running attempt, owned by the runner thread (invariant 4)."""

    def __init__(self, runner: JobRunner, coord: CheckpointCoordinator, tasks: dict[str, T.Task],
                 inbox: "queue.Queue[tuple]", cancelled: threading.Event, next_id: int) -> None:
        self.runner, self.coord, self.tasks, self.inbox, self.cancelled = runner, coord, tasks, inbox, cancelled
        self.next_id = next_id
        self.pending: dict[int, Any] = {}  # checkpoint id -> PendingCheckpoint
        self.finished: dict[str, Any] = {}  # task id -> final state
        self.inputs_ended: set[str] = set()
        self.savepoint_requests: dict[int, _Request] = {}
        self.stop_after: Optional[int] = None
        self.stopped_request: Optional[_Request] = None
        self.last_completed: Optional[int] = None
        self.periodic = runner.config is not None

    # -- messages
    def loop(self) -> JobResult:
        while True:
            try:
                msg = self.inbox.get(timeout=0.002)
            except queue.Empty:
                msg = None
            while msg is not None:
                self.handle(msg)
                try:
                    msg = self.inbox.get_nowait()
                except queue.Empty:
                    msg = None
            result = self.tick()
            if result is not None:
                return result

    def handle(self, msg: tuple) -> None:
        kind, tid = msg[0], msg[1]
        if kind == T.ACK:
            _, _, cid, attempt_uid, handle, state = msg
            self.acknowledge(Ack(cid, tid, attempt_uid, handle), state)
        elif kind == T.FAILED:
            raise _AttemptFailed(msg[2], f"task {tid}")
        elif kind == T.INPUTS_ENDED:
            self.inputs_ended.add(tid)
            for cid, p in sorted(self.pending.items()):
                if tid in p.not_yet_acknowledged and not p.is_disposed:
                    self.tasks[tid].control.append((T.TRIGGER, CheckpointBarrier(cid, time.time(), p.properties)))
        elif kind == T.FINISHED:
            self.finished[tid] = msg[2]
            for cid, p in sorted(self.pending.items()):
                if tid in p.not_yet_acknowledged and not p.is_disposed:
                    self._ack_for_finished(cid, tid)

    def _ack_for_finished(self, cid: int, tid: str) -> None:
        handle = {"task": tid, "txns": []}
        self.acknowledge(Ack(cid, tid, "finished", handle), self.finished[tid])

    def acknowledge(self, ack: Ack, state: Any) -> None:
        """Hand an ack to the coordinator; the last one of a checkpoint whose prepared data a sink named gone
        (the coordinator declined it: CheckpointDeclinedError, its record ABORTED) fails over (invariant 5)."""
        try:
            self.coord.acknowledge(ack, task_state=state)
        except CheckpointDeclinedError as e:
            cid = ack.checkpoint_id
            self.runner.metrics.failovers.append(cid)
            latest = self.coord.latest_completed()
            _log.warning("checkpoint_failover", job=self.runner.graph.name, attempt=self.runner.attempt,
                         checkpoint_id=cid, restore_from=latest.checkpoint_id if latest else None, reason=str(e),
                         consequence="not decided (ABORTED); the sinks abort the transactions of every undecided "
                                     "checkpoint and the job restarts from its latest completed checkpoint")
            raise _AttemptFailed(e, f"checkpoint {cid}: prepared data gone") from e

    # -- periodic work
    def tick(self) -> Optional[JobResult]:
        coord = self.coord
        for cid in coord.check_timeouts():
            self._cancelled_checkpoint(cid)
        for cid in [c for c, p in self.pending.items() if p.is_disposed]:
            self.pending.pop(cid, None)
        if coord.failure_budget_exceeded():
            raise _AttemptFailed(CheckpointDeclinedError(
                f"{coord.consecutive_failures} checkpoints failed in a row; tolerable: "
                f"{coord.policy.tolerable_failures}"), "checkpointing")
        while True:
            try:
                req = self.runner._requests.get_nowait()
            except queue.Empty:
                break
            if req.kind == "cancel":
                return JobResult(JobStatus.CANCELLED, self.runner.attempt, self.runner.metrics, self.last_completed)
            cid = self.trigger(CheckpointProperties.savepoint(terminate=req.kind == "stop"))
            self.savepoint_requests[cid] = req
        if self.stopped_request is not None:
            return JobResult(JobStatus.STOPPED, self.runner.attempt, self.runner.metrics, self.last_completed,
                             self.stopped_request.future.result())
        if len(self.finished) == len(self.tasks):
            return JobResult(JobStatus.FINISHED, self.runner.attempt, self.runner.metrics, self.last_completed)
        waiting_sinks = self.inputs_ended - set(self.finished)
        now = coord.clock()
        if waiting_sinks and not self.pending:  # invariant 2: the final checkpoint
            self.trigger(CheckpointProperties.checkpoint())
        elif self.periodic and self.policy_allows(now):
            self.trigger(CheckpointProperties.checkpoint())
        return None

    def policy_allows(self, now: float) -> bool:
        c = self.coord
        return c.policy.may_trigger(now, last_trigger=c.last_trigger, last_completion=c.last_completion,
                                    pending=len(self.pending))

    def trigger(self, props: CheckpointProperties) -> int:
        cid = self.next_id
        self.next_id += 1
        barrier = CheckpointBarrier(cid, time.time(), props)
        pending = self.coord.trigger(cid, list(self.tasks), props)
        self.pending[cid] = pending
        for tid, t in self.tasks.items():
            if tid in self.finished:
                continue
            if isinstance(t, T.SourceTask) or tid in self.inputs_ended:
                t.control.append((T.TRIGGER, barrier))
        for tid in list(self.finished):
            if not pending.is_disposed:
                self._ack_for_finished(cid, tid)
        return cid

    def _cancelled_checkpoint(self, cid: int) -> None:
        self.pending.pop(cid, None)
        for t in self.tasks.values():
            if isinstance(t, T.SourceTask):
                t.control.append((T.CANCEL, cid))
        req = self.savepoint_requests.pop(cid, None)
        if req is not None:
            req.future.set_exception(CheckpointDeclinedError(f"savepoint {cid} expired"))

    # -- completion (called by the coordinator, in this thread, after the commit)
    def on_completed(self, completed: CompletedCheckpoint) -> None:
        cid = completed.checkpoint_id
        m = self.runner.metrics
        m.checkpoints_completed.append(cid)
        m.checkpoint_durations_s.append(completed.completed_at - completed.triggered_at)
        if self.runner._failed_at is not None:
            m.recovery_times_s.append(time.monotonic() - self.runner._failed_at)
            self.runner._failed_at = None
        self.runner._completed_in_run = True
        self.last_completed = cid
        for c in [c for c in self.pending if c <= cid]:
            self.pending.pop(c, None)
        for t in self.tasks.values():
            if isinstance(t, T.SinkTask):
                t.control.append((T.NOTIFY, cid))
        req = self.savepoint_requests.pop(cid, None)
        if req is not None:
            path = Savepoint(self.runner.graph.name, cid, dict(completed.task_state or {})).write(req.path or "")
            _log.info("savepoint_written", job=self.runner.graph.name, checkpoint_id=cid, path=path)
            if completed.properties.type is CheckpointType.SAVEPOINT and completed.properties.terminate:
                self.stopped_request = req
            req.future.set_result(path)

    # -- step 5
    def teardown(self) -> None:
        self.cancelled.set()
        for t in self.tasks.values():
            gate = getattr(t, "gate", None)
            if gate is not None:
                gate.close()
        for t in self.tasks.values():
            t.join(timeout=5.0)
            if t.is_alive():
                _log.warning("task_did_not_stop", task=t.tid)
        for cid, p in list(self.pending.items()):
            if not p.is_disposed:
                self.coord.abort_checkpoint(cid, "job attempt ended")
        for req in self.savepoint_requests.values():
            if not req.future.done():
                req.future.set_exception(CheckpointDeclinedError("the job attempt ended before the savepoint completed"))
        latest = self.coord.latest_completed()
        upto = latest.checkpoint_id if latest else -1
        for t in self.tasks.values():
            if isinstance(t, T.SinkTask) and not t.is_alive():
                for c, h in t.uncommitted:
                    if c > upto:
                        self._abort_stale(t, c, h)
            if isinstance(t, T.InputTask):
                self.runner.metrics.alignment_times_s.extend(t.handler.alignment_times)
            self.runner.metrics.records_out += t.writer.records_out if isinstance(t, T.SourceTask) else 0

    def _abort_stale(self, task: "T.SinkTask", pre_committed_at: int, handle: dict) -> None:
        """Abort one transaction no checkpoint can own any more (step 5), best effort: raised from teardown's
        ``finally``, a sink's error would replace the attempt's failure and the restart strategy would never
        be asked; the transaction's checkpoint is undecided, so the sweep after a later commit removes it."""
        try:
            self.runner.committer.abort_transactions(task.uid, [handle])
        except Exception as e:  # noqa: BLE001 - see above
            _log.warning("teardown_abort_failed", job=self.runner.graph.name, task=task.tid,
                         checkpoint_id=pre_committed_at, error=repr(e),
                         consequence="left to the sweep after a later commit (abort_lingering)")
