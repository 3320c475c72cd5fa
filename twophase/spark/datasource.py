"""The Spark adapter: PySpark's Python Data Source API driving the same sink hooks as the runtime.

A micro-batch is a checkpoint. Where each piece runs:

- ``streamWriter()`` runs on the driver (in a planner worker) before EVERY micro-batch and again in
  the commit worker right before ``commit``: it validates options, claims the sink's log for this
  query (its ``checkpointLocation``, and the query's persistent id from ``<checkpointLocation>/metadata``
  when that is a local path: a deleted and recreated checkpoint is refused before any data moves),
  and runs recovery, which is cheap when there is nothing to do.
- ``write()`` runs on executors, once per partition attempt: the one task driver (:class:`~twophase.sink.TaskDriver`)
  creates the writer, writes, prepare_commit; the returned
  commit message is the task's ack and carries the JSON handle. The batch id comes from Spark's
  ``streaming.sql.batchId`` local property.
- ``commit(messages, batchId)`` runs on the driver in a separate, long-lived Python worker and may be
  called more than once for a batch id; Spark also re-runs a batch whose own commit log entry is
  missing. Nothing is kept in driver globals: every call builds its coordinator from the sink's
  durable log, which alone decides (see :meth:`CheckpointCoordinator.complete_batch`). The acks carry
  the query id the tasks saw (Spark's ``sql.streaming.queryId``), checked against the log's binding
  wherever the checkpoint lives.
- ``abort(messages, batchId)`` runs on the driver when a task failed: every prepared handle is aborted.

A batch write (``df.write.format(...).mode("append")``, ``INSERT INTO`` a temporary view) goes through
``writer()`` instead, once per job on the driver: it plans one run of the write
(:func:`twophase.write_job.plan_write_job`), whose writer executors run as above; the driver's
``commit(messages)`` / ``abort(messages)`` runs once (:class:`TwoPhaseBatchWriter`).
"""

from __future__ import annotations

import abc
import json
import os
from dataclasses import dataclass, field
from typing import Any, Iterator, List, Optional

from twophase._versions import require

require("pyspark", what="twophase's Spark formats (DataSourceStreamArrowWriter)")

from pyspark.sql.datasource import (DataSource, DataSourceArrowWriter, DataSourceStreamArrowWriter,  # noqa: E402
                                    WriterCommitMessage)
from pyspark.sql.types import StructType

from twophase._logging import get_logger
from twophase.coordinator import CheckpointCoordinator
from twophase.errors import ConfigurationError
from twophase.options import parse_options
from twophase.sink import Ack, Guarantee, TransactionContext, SinkSpec, run_task
from twophase.write_job import (WRITE_JOB_OPTIONS, WriteJob, abort_write_job, beating, commit_write_job,
                                plan_write_job)

_WRITE_JOB_KEYS = frozenset(o.lookup_key for o in WRITE_JOB_OPTIONS)

_log = get_logger(__name__)

BATCH_ID_PROPERTY = "streaming.sql.batchId"
#: set by Spark on every task of a streaming query: the id persisted in <checkpointLocation>/metadata
QUERY_ID_PROPERTY = "sql.streaming.queryId"


def task_context(sink: SinkSpec[Any], batch_id: Optional[int] = None) -> TransactionContext:
    """The :class:`TransactionContext` of the running Spark task (executor side).

    ``batch_id`` defaults to Spark's ``streaming.sql.batchId`` local property. The attempt identity is
    Spark's ``taskAttemptId()`` (unique per application), not ``attemptNumber()`` (restarts at 0 in
    every stage attempt).
    """
    from pyspark import TaskContext
    tc = TaskContext.get()
    if tc is None:
        raise RuntimeError("twophase sink task called outside a Spark task")
    if batch_id is None:
        raw = tc.getLocalProperty(BATCH_ID_PROPERTY)
        if raw is None:
            raise RuntimeError(f"Spark did not set {BATCH_ID_PROPERTY}; twophase sinks need a micro-batch query")
        batch_id = int(raw)
    return TransactionContext(sink.sink_id, int(batch_id), str(tc.partitionId()), tc.attemptNumber(),
                              task_attempt_id=tc.taskAttemptId(), query_id=tc.getLocalProperty(QUERY_ID_PROPERTY))


@dataclass
class TwoPhaseCommitMessage(WriterCommitMessage):
    """A task's ack: the checkpoint id, task id, attempt and the sink's JSON handle."""

    ack: dict = field(default_factory=dict)

    def to_ack(self) -> Ack:
        return Ack.from_json(self.ack)


def _acks(messages: List[Optional[WriterCommitMessage]]) -> list[Optional[Ack]]:
    return [m.to_ack() if isinstance(m, TwoPhaseCommitMessage) and m.ack else None for m in messages]


def prepare_sink(sink: SinkSpec[Any], owner: Optional[str], *, what: str) -> None:
    """Driver-side start of a query (or batch): validate, claim the log for ``owner``, recover.

    Exactly-once needs the query's checkpoint location as the log's owner; it is what lets a
    restarted query take its sink back while a second query is refused.
    """
    sink.validate_destination()
    if sink.guarantee is Guarantee.AT_LEAST_ONCE:
        return
    if not owner:
        raise ConfigurationError(
            f"{what}: exactly-once needs the query's checkpoint location: add "
            ".option('checkpointLocation', '/path/to/checkpoint') to writeStream (a session-wide "
            "spark.sql.streaming.checkpointLocation is not visible to Python sinks)")
    log = sink.transaction_log()
    log.claim(owner, query_id=checkpoint_query_id(owner))
    CheckpointCoordinator(sink, log).recover()


def checkpoint_query_id(checkpoint_location: Optional[str]) -> Optional[str]:
    """The streaming query's persistent id from ``<checkpointLocation>/metadata`` (Spark writes it when
    the query starts, before the first batch), when the location is a local path; else None, and the
    query id the tasks report in their acks binds the log at the first commit instead."""
    if not checkpoint_location:
        return None
    path = checkpoint_location[len("file:"):] if checkpoint_location.startswith("file:") else checkpoint_location
    if "://" in path:
        return None
    if path.startswith("//"):
        path = path[2:]
    try:
        with open(os.path.join(os.path.expanduser(path), "metadata"), encoding="utf-8") as f:
            return str(json.loads(f.readline())["id"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


class TwoPhaseStreamWriter(DataSourceStreamArrowWriter):
    """Drives a :class:`SinkSpec` from Spark (see module docstring for where each runs)."""

    def __init__(self, sink: SinkSpec[Any]) -> None:
        self.sink = sink

    def write(self, iterator: Iterator[Any]) -> TwoPhaseCommitMessage:
        ack = run_task(self.sink, task_context(self.sink), iterator)
        return TwoPhaseCommitMessage(ack.to_json())

    def commit(self, messages: List[Optional[WriterCommitMessage]], batchId: int) -> None:
        if self.sink.guarantee is Guarantee.AT_LEAST_ONCE:
            return
        acks = _acks(messages)
        # prepare_sink() recovers, and sweeps, before every micro-batch; sweep here too only where
        # leftovers hurt readers until aborted (sink.sweep_after_commit)
        CheckpointCoordinator(self.sink, sweep_after_commit=self.sink.sweep_after_commit).complete_batch(
            batchId, acks, expected_tasks=[str(i) for i in range(len(messages))])

    def abort(self, messages: List[Optional[WriterCommitMessage]], batchId: int) -> None:
        if self.sink.guarantee is Guarantee.AT_LEAST_ONCE:
            return
        CheckpointCoordinator(self.sink).abort_batch(batchId, _acks(messages), "a Spark task failed")


class TwoPhaseBatchWriter(DataSourceArrowWriter):
    """Drives one run of a batch write (``df.write``, ``INSERT INTO``; see :mod:`twophase.write_job`):
    ``writer()`` planned it on the driver; executors run ``write`` (each task beats the run's heartbeat while
    it runs); the driver runs ``commit`` or ``abort`` once. Spark calls ``abort`` also when ``commit`` threw:
    a run that was decided (COMPLETED) before the error is committed there, never aborted."""

    def __init__(self, job: WriteJob) -> None:
        self.job = job

    def write(self, iterator: Iterator[Any]) -> TwoPhaseCommitMessage:
        if self.job.skip:  # the write committed before: read nothing into it, commit nothing
            for _ in iterator:
                pass
            return TwoPhaseCommitMessage({})
        with beating(self.job):  # the run is alive while its tasks run (write_job invariant 6)
            ack = run_task(self.job.spec, task_context(self.job.spec, self.job.checkpoint_id), iterator)
        return TwoPhaseCommitMessage(ack.to_json())

    def commit(self, messages: List[Optional[WriterCommitMessage]]) -> None:
        commit_write_job(self.job, _acks(messages))

    def abort(self, messages: List[Optional[WriterCommitMessage]]) -> None:
        abort_write_job(self.job, _acks(messages), "the Spark job failed")


class TwoPhaseSinkDataSource(DataSource, abc.ABC):
    """Base of every twophase Spark format that writes: subclasses set ``short_name``, ``spec_class`` and
    ``build_sink``, and refuse columns the sink cannot write in ``check_sink_columns``."""

    short_name: str = ""
    #: the :class:`~twophase.sink.SinkSpec` class this format builds (``foreach_batch`` finds the format by it)
    spec_class: Optional[type] = None
    #: other spec classes ``build_sink`` may return for some options (twophase-file: the Azure file sink)
    also_builds: tuple[type, ...] = ()

    @classmethod
    def check_sink_columns(cls, what: str, sink: SinkSpec[Any], schema: StructType) -> None:
        """Refuse, on the driver, every column of ``schema`` that ``sink`` cannot write exactly. Default: none."""

    @classmethod
    def name(cls) -> str:
        return cls.short_name

    @abc.abstractmethod
    def build_sink(self, schema: StructType) -> SinkSpec[Any]:
        """Validate ``self.options`` and build the sink (driver side; raises ConfigurationError)."""

    def schema(self) -> StructType:
        """Asked by ``CREATE TEMPORARY VIEW v USING <format>`` without a column list: a sink has no schema
        of its own to offer (subclasses whose destination has one override this)."""
        raise ConfigurationError(
            f"{self.short_name} is a sink and has no schema of its own: name the view's columns, "
            f"CREATE TEMPORARY VIEW v (id BIGINT, ...) USING {self.short_name} OPTIONS (...), then INSERT INTO v")

    def writer(self, schema: StructType, overwrite: bool) -> TwoPhaseBatchWriter:
        """A batch write (``df.write.format(...).mode("append")``, SQL ``INSERT INTO``): planned here, on the
        driver, before any data moves (see :mod:`twophase.write_job`)."""
        if not self.options:
            raise ConfigurationError(
                f"{self.short_name}: the batch write got no options. Spark does not hand a SQL table's OPTIONS to a "
                f"Python data source's writer (CREATE TABLE ... USING {self.short_name} then INSERT INTO); use a "
                f"temporary view: CREATE TEMPORARY VIEW v (<columns>) USING {self.short_name} OPTIONS (path '...'), "
                "then INSERT INTO v SELECT ..., or df.write.format(...).option('path', ...).mode('append').save()")
        if overwrite:
            raise ConfigurationError(
                f"{self.short_name}: mode('overwrite') / INSERT OVERWRITE is not supported (it would have to remove what "
                "is there); use mode('append'), or write to a new path")
        job_raw = {k: v for k, v in self.options.items() if k.lower() in _WRITE_JOB_KEYS}
        job_opts = parse_options(job_raw, WRITE_JOB_OPTIONS, sink=self.short_name)
        sink_options = self.options
        self.options = type(sink_options)({k: v for k, v in sink_options.items() if k.lower() not in _WRITE_JOB_KEYS})
        try:
            sink = self.build_sink(schema)
        finally:
            self.options = sink_options
        if not sink.supports_write_jobs:
            sink.write_job_spec("-")  # raises: names the streaming way
        return TwoPhaseBatchWriter(plan_write_job(sink, write_id=job_opts["writeId"],
                                                  abandon_after_ms=job_opts["batch.abandonAfter"]))

    def streamWriter(self, schema: StructType, overwrite: bool) -> TwoPhaseStreamWriter:
        keys = {k.lower() for k in self.options}
        given = [o.key for o in WRITE_JOB_OPTIONS if o.lookup_key in keys]
        if given:
            raise ConfigurationError(
                f"{self.short_name}: option(s) {', '.join(given)} are for batch writes (df.write); a streaming query is "
                "idempotent through its checkpointLocation: remove them")
        if overwrite:  # Spark asks a sink to truncate for outputMode("complete")
            raise ConfigurationError(
                f"{self.short_name}: outputMode('complete') is not supported (each micro-batch would be appended, "
                "not replace the previous result); use outputMode('append'), or write the aggregate with "
                "foreachBatch")
        sink = self.build_sink(schema)
        prepare_sink(sink, self.options.get("checkpointlocation"), what=self.short_name)
        return TwoPhaseStreamWriter(sink)
