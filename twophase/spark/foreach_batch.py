"""``foreach_batch(sink)``: the same exactly-once guarantee for pipelines built on ``foreachBatch``.

The returned function runs on the driver for each micro-batch: it recovers the sink, runs every
partition's side of the protocol on the executors through ``mapInArrow`` (each task yields its ack
as one JSON row), then completes checkpoint ``batch_id`` with the coordinator, keyed by batch id
exactly like the streaming writer, so a re-run batch is never committed twice.

The batch is planned and run once (no ``df.rdd``, which would run it a second time and which Spark
Connect does not have): ``collect()`` returns one ack per partition or fails, so the acks say which
tasks took part. A batch with no partitions completes with no handles (and its replay is a no-op).
"""

from __future__ import annotations

import contextlib
import copy
import json
from typing import Any, Callable, Iterator

from twophase.coordinator import CheckpointCoordinator
from twophase.sink import Ack, Guarantee, SinkSpec, run_task


def foreach_batch(sink: SinkSpec[Any], *, owner: str | None = None) -> Callable[[Any, int], None]:
    """Return a ``foreachBatch`` function writing each batch to ``sink`` exactly once.

    ``owner`` identifies the query for the sink's log (use the query's checkpoint location);
    it defaults to the sink id.
    """
    if owner and hasattr(sink, "bind_owner"):  # a TwoPhaseCommitSink keeps its log under the checkpoint location;
        sink = copy.copy(sink).bind_owner(owner)  # a copy: the same sink object in two queries keeps two logs
    owner = owner or f"foreachBatch:{sink.sink_id}"

    def write_batch(df: Any, batch_id: int) -> None:
        from twophase.spark.datasource import prepare_sink
        from twophase.spark import data_source_for
        fmt = data_source_for(sink)  # the sink's registered format refuses columns it cannot write
        if fmt is not None:
            fmt.check_sink_columns("foreach_batch", sink, df.schema)
        elif hasattr(sink, "check_spark_schema"):  # a sink with no format of its own (twophase-postgres)
            sink.check_spark_schema(df.schema)
        prepare_sink(sink, owner, what="foreach_batch")
        if hasattr(sink, "before_batch_tasks"):  # recovered, no task of this batch started yet (twophase-postgres)
            sink.before_batch_tasks(batch_id)

        def task(batches: Iterator[Any]) -> Iterator[Any]:
            import pyarrow as pa
            from twophase.spark.datasource import task_context
            ack = run_task(sink, task_context(sink, batch_id), batches)
            yield pa.RecordBatch.from_pylist([{"ack": json.dumps(ack.to_json())}])

        rows = df.mapInArrow(task, "ack string").collect()
        if sink.guarantee is Guarantee.AT_LEAST_ONCE:
            return
        acks = [Ack.from_json(json.loads(r["ack"])) for r in rows]
        tasks = sorted(a.task_id for a in acks)
        if tasks != [str(i) for i in range(len(acks))]:  # one ack per partition 0..n-1, or something is off
            raise RuntimeError(f"foreach_batch: batch {batch_id} returned acks for partitions {tasks}; expected 0..n-1")
        guard = getattr(sink, "completion_guard", None)  # twophase-postgres: the fence of its dead-attempt rollback
        with guard(batch_id, acks) if guard is not None else contextlib.nullcontext():
            CheckpointCoordinator(sink, sweep_after_commit=sink.sweep_after_commit).complete_batch(
                batch_id, acks, expected_tasks=tasks)

    return write_batch
