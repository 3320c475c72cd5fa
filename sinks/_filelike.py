"""The writer skeleton files, S3 and Delta share: rolling data files per Hive partition, then a committable.

A file-like writer (task side) routes each Arrow batch to one open file per partition directory,
rolls a file past the size limit, and at ``prepare_commit`` finishes every open file and returns a
committable listing them. What differs per sink is only where a file goes and how it is finished:

=====================  =====================================================================
hook                   what the sink does
=====================  =====================================================================
``open_file``          open a stream for the next part file of ``part_rel`` (staging, upload)
``finish_file``        close it durably (fsync, complete the parts) and return its entry
``discard_open``       drop a file that was never finished (task failure)
``discard_finished``   drop a finished file's data (task failure after a roll)
``committable``        build the typed committable from the finished entries
=====================  =====================================================================

Invariant (``test_filelike_inv1_*``): a writer makes nothing visible; ``abort`` drops every file it
opened or finished, best effort (the committer's sweep removes what a crashed task leaves).
"""

from __future__ import annotations

import abc
import contextlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, TypeVar

import pyarrow as pa

from twophase.errors import ConfigurationError
from twophase.sink import Committable, Guarantee, SinkWriter, TransactionContext
from twophase.sinks._formats import FormatOptions, write_rolling
from twophase.naming import part_file_name

C = TypeVar("C", bound=Committable)


@dataclass(frozen=True, kw_only=True)
class FileLikeOptions:
    """The options every sink that writes files shares (the file, S3 and Azure file sinks subclass it, adding
    where files go): format and rolling, identity, log. Built by :meth:`common`."""

    format: str = "parquet"
    partition_by: tuple[str, ...] = ()
    max_file_size: int = 128 << 20
    compression: str = "snappy"
    #: format, codec, maxRecordsPerFile and the CSV options, validated (:func:`~twophase.sinks._formats.format_options`)
    format_options: FormatOptions = field(default_factory=FormatOptions)
    sink_id: Optional[str] = None
    guarantee: Guarantee = Guarantee.EXACTLY_ONCE
    log_location: Optional[str] = None
    log_retain: int = 100
    owner: Optional[str] = None

    @staticmethod
    def common(o: Mapping[str, Any], fo: FormatOptions) -> dict[str, Any]:
        """These fields from parsed options ``o`` (``partitionBy``, ``maxFileSize`` and the common ones) and ``fo``."""
        return dict(format=fo.format, partition_by=o["partitionBy"], max_file_size=o["maxFileSize"],
                    compression=fo.compression, format_options=fo, sink_id=o["sink.id"],
                    guarantee=Guarantee.parse(o["guarantee"]), log_location=o["log.location"],
                    log_retain=o["log.retain"], owner=o["checkpointlocation"])


def check_partition_columns(sink: str, columns: tuple[str, ...], schema: Any) -> None:
    """Partition columns must be columns of the stream, and not all of them."""
    if schema is None or not columns:
        return
    missing = [c for c in columns if c not in schema.names]
    if missing:
        raise ConfigurationError(f"{sink}: option 'partitionBy' names {missing}, which are not columns of the "
                                 f"stream ({', '.join(schema.names)})")
    if len(columns) == len(schema.names):
        raise ConfigurationError(f"{sink}: option 'partitionBy' names every column; keep at least one data column")


class FileLikeWriter(SinkWriter[C]):
    """One task's transaction of a file-like sink (see the module docstring's hook table).

    ``open_files`` maps a partition directory (``""`` unpartitioned) to an open file object with a
    ``writer`` (:class:`~twophase.sinks._formats.FormatWriter`); ``finished`` lists the JSON entries of
    finished files; ``pool`` (``upload_threads`` > 0) uploads parts in the background.
    """

    def __init__(self, context: TransactionContext, *, partition_by: tuple[str, ...], max_file_size: int,
                 upload_threads: int = 0, max_records: Optional[int] = None) -> None:
        super().__init__(context)
        self.partition_by = partition_by
        self.max_file_size = max_file_size
        self.max_records = max_records
        self.open_files: dict[str, Any] = {}
        self.finished: list[dict[str, Any]] = []
        self.records = 0
        self._seq = 0
        self.pool: Optional[ThreadPoolExecutor] = (
            ThreadPoolExecutor(upload_threads, thread_name_prefix="twophase-part") if upload_threads else None)

    def next_name(self, ext: str) -> str:
        """The next :func:`~twophase.naming.part_file_name` of this transaction (it carries the sink's token)."""
        c = self.context
        name = part_file_name(c.sink_id, c.checkpoint_id, c.task_id, c.attempt_uid, self._seq, ext)
        self._seq += 1
        return name

    # ---- the hooks

    @abc.abstractmethod
    def open_file(self, part_rel: str, schema: pa.Schema) -> Any:
        """Open the next part file of partition directory ``part_rel``; returns an object with ``writer``."""

    @abc.abstractmethod
    def finish_file(self, f: Any) -> dict[str, Any]:
        """Close ``f`` durably and return its JSON entry for the committable."""

    @abc.abstractmethod
    def discard_open(self, f: Any) -> None:
        """Drop a file that was never finished."""

    @abc.abstractmethod
    def discard_finished(self, entry: dict[str, Any]) -> None:
        """Drop the data of a finished file (its entry)."""

    @abc.abstractmethod
    def committable(self) -> C:
        """The committable of this transaction, from ``self.finished`` and ``self.records``."""

    def observe(self, f: Any, piece: pa.RecordBatch) -> None:
        """Sees every piece written into ``f`` (Delta: column statistics). Default: nothing."""

    def after_finish(self) -> None:
        """Runs once every file is finished, before the committable is built (at-least-once: publish now)."""

    def after_abort(self) -> None:
        """Runs at the end of :meth:`abort` (remove the attempt's folder)."""

    # ---- the sequence

    def write(self, batch: pa.RecordBatch) -> int:
        if batch.num_rows == 0:
            return 0
        write_rolling(self.open_files, batch, self.partition_by, self.max_file_size, self.open_file,
                      self._finish, observe=self.observe, max_records=self.max_records)
        self.records += batch.num_rows
        return batch.num_rows

    def _finish(self, f: Any) -> None:
        self.finished.append(self.finish_file(f))

    def prepare_commit(self) -> C:
        try:
            for key in list(self.open_files):
                self._finish(self.open_files.pop(key))
        finally:
            if self.pool is not None:
                self.pool.shutdown(wait=True)
        self.after_finish()
        return self.committable()

    def abort(self) -> None:
        for f in self.open_files.values():
            with contextlib.suppress(Exception):
                self.discard_open(f)
        for entry in self.finished:
            with contextlib.suppress(Exception):
                self.discard_finished(entry)
        if self.pool is not None:
            self.pool.shutdown(wait=False)
        self.after_abort()
