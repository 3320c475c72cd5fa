"""What the Spark benchmarks share: a no-op Python sink (the ceiling of Spark -> Python) and timing a
streaming query over its micro-batches from its progress events (batch 0 is the warm-up)."""

from __future__ import annotations

import statistics
import time
from typing import Any


def register_noop(spark: Any) -> None:
    """Register ``bench-noop``: a Python data source whose writer only iterates the Arrow batches Spark hands it."""
    from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage

    class NoopWriter(DataSourceStreamArrowWriter):
        def write(self, iterator):
            for _ in iterator:
                pass
            return WriterCommitMessage()

        def commit(self, messages, batchId):
            pass

        def abort(self, messages, batchId):
            pass

    class NoopSink(DataSource):
        @classmethod
        def name(cls):
            return "bench-noop"

        def streamWriter(self, schema, overwrite):
            return NoopWriter()

    spark.dataSource.register(NoopSink)


def time_batches(query: Any, batches: int, timeout: float) -> dict[str, Any]:
    """Let ``query`` run batches ``0..batches`` (0 is the warm-up), stop it, and sum batches 1..N from its
    progress: ``{"rows", "seconds", "batch_ms" (median), "batches"}``."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        p = query.lastProgress
        if p is not None and p["batchId"] >= batches:
            break
        if query.exception() is not None:
            raise query.exception()
        query.awaitTermination(0.2)
    progress = [p for p in query.recentProgress if 1 <= p["batchId"] <= batches]
    query.stop()
    ms = [p["durationMs"]["triggerExecution"] for p in progress]
    return {"rows": sum(p["numInputRows"] for p in progress), "seconds": sum(ms) / 1e3,
            "batch_ms": statistics.median(ms) if ms else float("nan"), "batches": len(progress)}
