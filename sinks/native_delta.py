"""The Delta sink's part of the native path (:mod:`twophase.spark.native`): Spark writes Parquet, twophase-delta commits.

Spark's own Parquet writer writes a micro-batch, partitioned by the table's partition columns, into
``<table>/_twophase/<token>/staging/<batch:020d>/native-<attempt>/`` (the sink's private folder: no Delta
version references anything there). The driver then, per data file: reads the Parquet footer for the
Delta statistics (:func:`footer_stats`), fsyncs it, and renames it into the table under the partition
folder Spark chose, with the sink's own name ``part-<token>-<batch>-<task>-<attempt>-<seq>.<ext>``
(no Delta version references it yet). The committables are :class:`~twophase.sinks.delta.DeltaCommittable`
exactly as the Python writers make them, so from there it is twophase-delta's protocol, unchanged: ONE
Delta commit per batch with the app transaction ``(sink id, batch id)``, skipped when the table has it;
aborts delete only files no Delta commit added; the sweep deletes this sink's files that its log proves
were never committed. :class:`NativeDeltaCommitter` also sweeps the staging folders of decided batches
(what Spark left there: ``_temporary``, ``.crc``, a crashed attempt's files).

Limits (refused on the driver before any data moves, naming the way out): a table with NOT NULL
columns, CHECK constraints, invariants or generated columns (the native path never sees the rows, so
it cannot enforce them: use ``format("twophase-delta")``, which does), nested columns, and tables on
S3 (Spark's writer would need the hadoop-aws jars; ``format("twophase-delta")`` writes S3 without them).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections import defaultdict
from typing import Any, Optional, Sequence

import pyarrow as pa

from twophase._logging import get_logger
from twophase.errors import ConfigurationError
from twophase.log_store import fsync_dir, makedirs_durable
from twophase.naming import internal_rel, part_file_name
from twophase.sinks.delta import (DeltaCommittable, DeltaCommitter, DeltaSink, DeltaSinkOptions, _max_string,
                                  _min_string, _partition_values, _timestamp_json)
from twophase.spark.native import NativeOptions, NativeTarget, keep_written, list_spark_output, make_durable

_log = get_logger(__name__)


def footer_stats(path: str) -> tuple[int, str]:
    """``(records, Delta stats JSON)`` of a Parquet file from its footer: numRecords, nullCount of every
    column, and min/max where a bound can be shown safely (integers, dates, strings as bounded prefixes,
    INT64 timestamps in ms rounded outward). A column whose statistics are missing in any row group gets
    no bounds, nor does a string column whose statistics are not valid UTF-8 (Spark's strings may hold any
    bytes, e.g. ``CAST(value AS STRING)`` of Kafka's binary values); floats (NaN), decimals, booleans,
    binary and INT96 timestamps never do (a bound is never tighter than the data: readers skip files on it)."""
    import datetime as dt
    import pyarrow.parquet as pq
    md = pq.read_metadata(path)
    schema = md.schema.to_arrow_schema()
    nulls = {f.name: 0 for f in schema}
    lo: dict[str, Any] = {}
    hi: dict[str, Any] = {}
    no_bounds: set[str] = set()
    for rg in range(md.num_row_groups):
        g = md.row_group(rg)
        for c in range(g.num_columns):
            col = g.column(c)
            name = col.path_in_schema
            if name not in nulls:
                continue
            st = col.statistics
            if st is None or not st.has_null_count:
                no_bounds.add(name)
                nulls.pop(name, None)
                continue
            nulls[name] += st.null_count
            if not st.has_min_max or g.num_rows == st.null_count:
                if g.num_rows != st.null_count:
                    no_bounds.add(name)
                continue
            try:
                a, b = st.min, st.max
            except (UnicodeDecodeError, ValueError):  # e.g. CAST(binary AS STRING): bytes that are not UTF-8
                no_bounds.add(name)
                continue
            lo[name] = a if name not in lo else min(lo[name], a)
            hi[name] = b if name not in hi else max(hi[name], b)
    lows: dict[str, Any] = {}
    highs: dict[str, Any] = {}
    for f in schema:
        name, t = f.name, f.type
        if name in no_bounds or name not in lo:
            continue
        a, b = lo[name], hi[name]
        if pa.types.is_integer(t):
            lows[name], highs[name] = int(a), int(b)
        elif pa.types.is_date(t):
            lows[name], highs[name] = a.isoformat(), b.isoformat()
        elif pa.types.is_string(t) or pa.types.is_large_string(t):
            lows[name] = _min_string(a)
            upper = _max_string(b)
            if upper is not None:
                highs[name] = upper
        elif pa.types.is_timestamp(t) and isinstance(a, dt.datetime):
            def us(v: dt.datetime) -> int:
                base = dt.datetime(1970, 1, 1, tzinfo=v.tzinfo) if v.tzinfo else dt.datetime(1970, 1, 1)
                return (v - base) // dt.timedelta(microseconds=1)
            low = _timestamp_json(us(a), upper=False, utc=t.tz is not None)
            high = _timestamp_json(us(b), upper=True, utc=t.tz is not None)
            if low is not None and high is not None:
                lows[name], highs[name] = low, high
    stats = {"numRecords": md.num_rows, "minValues": lows, "maxValues": highs, "nullCount": nulls}
    return md.num_rows, json.dumps(stats, separators=(",", ":"), default=str)


class NativeDeltaCommitter(DeltaCommitter):
    """twophase-delta's committer, whose sweep also removes the staging folders of decided batches."""

    def abort_lingering(self, up_to_checkpoint: int, highest_committed: Optional[int] = None) -> int:
        removed = super().abort_lingering(up_to_checkpoint, highest_committed)
        staging = os.path.join(self.uri, internal_rel(self.sink_id), "staging")
        try:
            ckpt_dirs = os.listdir(staging)
        except FileNotFoundError:
            return removed
        for d in ckpt_dirs:
            if d.isdigit() and int(d) <= up_to_checkpoint:
                shutil.rmtree(os.path.join(staging, d), ignore_errors=True)
                removed += 1
        return removed


class NativeDeltaSink(DeltaSink):
    """twophase-delta with :class:`NativeDeltaCommitter`; the log, names and Delta commit are the same."""

    table_from_batch = True  # DeltaNativeTarget.check_schema creates the table from the batch's columns

    def create_committer(self) -> NativeDeltaCommitter:
        return NativeDeltaCommitter(self)


class DeltaNativeTarget(NativeTarget):
    """``native_sink("delta", path="/data/table")``: Spark's Parquet writer, one Delta commit per batch."""

    spark_format = "parquet"

    def __init__(self, sink: NativeDeltaSink) -> None:
        self.spec = sink
        self.sink = sink
        self._checked: Optional[str] = None
        self._schema: Optional[pa.Schema] = None

    @classmethod
    def create(cls, options: NativeOptions) -> "DeltaNativeTarget":
        raw: dict[str, Any] = {"path": options.path, "partitionBy": ",".join(options.partition_by),
                               "mergeSchema": str(options.merge_schema).lower(),
                               "log.retain": str(options.log_retain), "checkpointLocation": options.owner}
        if options.writer_options.get("compression") in ("snappy", "zstd", "gzip", "none"):
            raw["compression"] = options.writer_options["compression"]
        if options.sink_id:
            raw["sink.id"] = options.sink_id
        if options.log_location:
            raw["log.location"] = options.log_location
        o = DeltaSinkOptions.from_options(raw)
        if o.on_s3:  # pragma: no cover - native_options refuses URLs already
            raise ConfigurationError("native_sink('delta'): tables on S3 are not supported by the native path")
        return cls(NativeDeltaSink(o))

    def partition_columns(self, options: NativeOptions) -> tuple[str, ...]:
        return self.sink.partition_by  # the table's, once check_schema read it

    def writer_settings(self) -> dict[str, str]:
        """Spark writes timestamp partition folders in this zone (else the session's, with no offset in the
        text); the committables turn them into Delta's UTC partition values."""
        return {"timeZone": "UTC"}

    def check_schema(self, schema: Any) -> None:
        """Create the table, or check the batch's columns against it (mergeSchema adds new ones); refuse
        nested columns and tables with row rules the native path cannot enforce."""
        key = schema.json()
        if key == self._checked:
            return
        from twophase.sinks._spark_types import arrow_schema
        nested = [f.name for f in schema.fields if f.dataType.typeName() in ("struct", "array", "map")]
        if nested:
            raise ConfigurationError(f"native_sink('delta'): columns {nested} are nested; the native path writes "
                                     "flat tables only: use format('twophase-delta') for nested columns")
        arrow = arrow_schema(schema)  # timestamps in UTC, as the Python path's (PySpark asserts a zone)
        self.sink.ensure_schema(arrow)
        self._schema = arrow  # the partition columns' types: timestamp partition values
        if self.sink.checks:
            raise ConfigurationError(
                f"native_sink('delta'): the table {self.sink.uri} has row rules (NOT NULL columns, CHECK constraints, "
                f"invariants or generated columns: {self.sink.checks}); the native path never sees the rows and "
                "cannot enforce them: use format('twophase-delta'), which checks every batch before writing it")
        self._checked = key

    def attempt_dir(self, batch_id: int, attempt_uid: str) -> str:
        return os.path.join(self.sink.uri, internal_rel(self.sink.sink_id), "staging", f"{batch_id:020d}",
                            f"native-{attempt_uid}")

    def _table_schema(self) -> Optional[pa.Schema]:
        """The Arrow schema whose timestamp columns decide the partition values' form (the stream's, else the table's)."""
        if self._schema is None:
            dt = self.sink._table()
            if dt is not None:
                self._schema = pa.schema(dt.schema().to_arrow())
        return self._schema

    def committables(self, batch_id: int, attempt_uid: str, attempt_dir: str, *,
                     partition_by: Optional[Sequence[str]] = None,
                     expected_records: Optional[int] = None) -> list[DeltaCommittable]:
        files = list_spark_output(attempt_dir, self.sink.partition_by if partition_by is None else partition_by)
        stats: dict[str, tuple[int, str]] = {}

        def measure(path: str) -> int:
            stats[path] = footer_stats(path)
            return stats[path][0]

        measured = make_durable(attempt_dir, files, measure=measure)
        kept = keep_written("native_sink('delta')", batch_id, files, measured, exact=True, expected=expected_records)
        schema = self._table_schema()
        root = self.sink.uri
        by_task: dict[str, list[dict[str, Any]]] = defaultdict(list)
        dirs: set[str] = set()
        now = int(time.time() * 1000)
        for f, size, records in kept:
            seq = len(by_task[f.task])
            name = part_file_name(self.sink.sink_id, batch_id, f.task, attempt_uid, seq, f.ext)
            rel = f"{f.dir_rel}/{name}" if f.dir_rel else name
            staged = os.path.join(attempt_dir, f.rel)
            values = _partition_values(f.dir_rel, schema)
            target = os.path.join(root, rel)
            makedirs_durable(os.path.dirname(target))
            self.sink.files.note(rel)  # the sweep of a committed batch reads these records (delta invariant 7)
            os.rename(staged, target)  # into the table under a name no Delta version references yet
            dirs.add(os.path.dirname(target))
            by_task[f.task].append({"path": rel, "rel": rel, "size": size, "partition_values": values,
                                    "modification_time": now, "stats": stats[staged][1], "records": records})
        for d in dirs:
            fsync_dir(d)
        with contextlib.suppress(OSError):
            fsync_dir(attempt_dir)
        return [DeltaCommittable(checkpoint_id=batch_id, task_id=task, attempt_uid=attempt_uid,
                                 records=sum(e["records"] for e in entries), files=entries)  # type: ignore[arg-type]
                for task, entries in sorted(by_task.items(), key=lambda kv: int(kv[0]))]
