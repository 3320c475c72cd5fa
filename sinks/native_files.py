"""The file sink's part of the native path (:mod:`twophase.spark.native`): Spark writes, twophase-file commits.

Spark's own writer (``parquet``, ``orc``, ``json``, ``csv``) writes a micro-batch into
``<path>/_twophase/<token>/staging/<batch:020d>/native-<attempt>/`` (Hive partition folders inside, as
Spark lays them out). The driver lists the data files, fsyncs them, and makes one
:class:`~twophase.sinks.files.FileCommittable` per Spark task: each file keeps its partition folder and
gets the sink's own final name ``part-<token>-<batch>-<task>-<attempt>-<seq>.<Spark's extension>``
(:func:`twophase.naming.part_file_name`). From there it is the file sink's protocol, unchanged: the
:class:`~twophase.sinks.files.FileCommitter` hard-links each file into place and unlinks the staged
copy; its ``abort_lingering`` sweeps the whole staging folder of a decided checkpoint, including what
Spark left there (``_temporary``, ``.crc`` files, a crashed attempt's folder).

The committables carry no ``attempt_dir``: the committer would remove the folder after committing the
first task's files, while the other tasks' files are still in it. The folder is swept right after the
batch commits (``FileSink.sweep_after_commit``), and by the recovery of a later batch.
"""

from __future__ import annotations

import os
from collections import defaultdict
from typing import Any

from twophase.naming import part_file_name
from twophase.sinks.files import FileCommittable, FileSink
from twophase.spark.native import NativeOptions, NativeTarget, list_spark_output, make_durable


def _parquet_rows(path: str) -> int:
    import pyarrow.parquet as pq
    return int(pq.read_metadata(path).num_rows)


def _orc_rows(path: str) -> int:
    import pyarrow.orc as orc
    return int(orc.ORCFile(path).nrows)


#: records per file from its footer (Parquet, ORC); JSON and CSV files are not read (records 0)
_ROWS = {"parquet": _parquet_rows, "orc": _orc_rows}


class FileNativeTarget(NativeTarget):
    """``native_sink("parquet" | "orc" | "json" | "csv", path=...)``: the twophase-file sink's staging and commit."""

    def __init__(self, sink: FileSink, fmt: str) -> None:
        self.spec = sink
        self.sink = sink
        self.spark_format = fmt

    @classmethod
    def create(cls, options: NativeOptions) -> "FileNativeTarget":
        raw: dict[str, Any] = {"path": options.path, "format": options.format, "log.retain": str(options.log_retain),
                               "checkpointLocation": options.owner}
        if options.sink_id:
            raw["sink.id"] = options.sink_id
        if options.log_location:
            raw["log.location"] = options.log_location
        return cls(FileSink.from_options(raw), options.format)

    def attempt_dir(self, batch_id: int, attempt_uid: str) -> str:
        return os.path.join(self.sink.staging, f"{batch_id:020d}", f"native-{attempt_uid}")

    def committables(self, batch_id: int, attempt_uid: str, attempt_dir: str) -> list[FileCommittable]:
        files = list_spark_output(attempt_dir)
        measured = make_durable(attempt_dir, files, measure=_ROWS.get(self.spark_format))
        by_task: dict[str, list[dict[str, Any]]] = defaultdict(list)
        root = self.sink.root
        for f, (size, records) in zip(files, measured):
            seq = len(by_task[f.task])
            name = part_file_name(self.sink.sink_id, batch_id, f.task, attempt_uid, seq, f.ext)
            by_task[f.task].append({"staged": os.path.relpath(os.path.join(attempt_dir, f.rel), root),
                                    "final": f"{f.dir_rel}/{name}" if f.dir_rel else name,
                                    "bytes": size, "records": records})
        return [FileCommittable(checkpoint_id=batch_id, task_id=task, attempt_uid=attempt_uid,
                                records=sum(e["records"] for e in entries), attempt_dir="",
                                files=entries)  # type: ignore[arg-type]
                for task, entries in sorted(by_task.items(), key=lambda kv: int(kv[0]))]


