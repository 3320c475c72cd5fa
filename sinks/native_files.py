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

import io
import os
import zlib
from collections import defaultdict
from typing import Any, BinaryIO, Callable, Mapping, Optional, Sequence

from twophase.naming import part_file_name
from twophase.sinks.files import FileCommittable, FileSink
from twophase.spark.native import NativeOptions, NativeTarget, keep_written, list_spark_output, make_durable


def _parquet_rows(path: str) -> int:
    import pyarrow.parquet as pq
    return int(pq.read_metadata(path).num_rows)


def _orc_rows(path: str) -> int:
    import pyarrow.orc as orc
    return int(orc.ORCFile(path).nrows)


def _open_decompressed(path: str, ext: str) -> Optional[BinaryIO]:
    """``path`` decompressed by its extension (Hadoop's codecs whose output is a standard stream), or None."""
    last = ext.rsplit(".", 1)[-1]
    if last in ("json", "csv"):
        return open(path, "rb")
    if last == "gz":
        import gzip
        return gzip.open(path, "rb")
    if last == "bz2":
        import bz2
        return bz2.open(path, "rb")
    if last == "deflate":
        return _ZlibReader(path)
    if last == "zst":
        try:
            import zstandard
        except ImportError:
            return None
        return zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), closefd=True)  # type: ignore[return-value]
    return None  # lz4, snappy: Hadoop's block framing


class _ZlibReader(io.RawIOBase):
    """Hadoop's DefaultCodec (``.deflate``): one zlib stream."""

    def __init__(self, path: str) -> None:
        self._f = open(path, "rb")
        self._z = zlib.decompressobj()

    def read(self, n: int = -1) -> bytes:  # type: ignore[override]
        while True:
            chunk = self._f.read(1 << 20)
            if not chunk:
                return self._z.flush()
            out = self._z.decompress(chunk)
            if out:
                return out

    def close(self) -> None:
        self._f.close()
        super().close()


def _json_rows(path: str, ext: str) -> Optional[int]:
    """Records of a JSON-lines file Spark wrote: its line breaks (Spark's JSON writer ends every record with
    one and escapes them inside values). None where that does not hold or the codec cannot be read."""
    stream = _open_decompressed(path, ext)
    if stream is None:
        return None
    with stream:
        n = 0
        while True:
            chunk = stream.read(1 << 20)
            if not chunk:
                return n
            n += chunk.count(b"\n")


def _csv_rows(path: str, ext: str, options: Mapping[str, str]) -> Optional[int]:
    """Records of a CSV file Spark wrote, parsed with its quote and escape characters (approximate: Spark's
    CSV writer and Python's parser may disagree on exotic escapes), the header line not counted."""
    import csv
    stream = _open_decompressed(path, ext)
    if stream is None:
        return None
    sep = options.get("sep") or options.get("delimiter") or ","
    quote = options.get("quote", '"') or '"'
    escape = options.get("escape", "\\") or "\\"
    with stream, io.TextIOWrapper(stream, encoding=options.get("encoding") or "utf-8", errors="replace",
                                  newline="") as text:
        reader = csv.reader(text, delimiter=sep[:1] or ",", quotechar=quote[:1], escapechar=escape[:1],
                            doublequote=False, strict=False)
        n = sum(1 for _ in reader)
    header = str(options.get("header", "false")).lower() == "true"
    return max(0, n - 1) if header and n else n


class FileNativeTarget(NativeTarget):
    """``native_sink("parquet" | "orc" | "json" | "csv", path=...)``: the twophase-file sink's staging and commit."""

    def __init__(self, sink: FileSink, fmt: str, writer_options: Optional[Mapping[str, str]] = None) -> None:
        self.spec = sink
        self.sink = sink
        self.spark_format = fmt
        self.writer_options = dict(writer_options or {})
        self.partition_by: tuple[str, ...] = ()

    @classmethod
    def create(cls, options: NativeOptions) -> "FileNativeTarget":
        raw: dict[str, Any] = {"path": options.path, "format": options.format, "log.retain": str(options.log_retain),
                               "checkpointLocation": options.owner}
        if options.sink_id:
            raw["sink.id"] = options.sink_id
        if options.log_location:
            raw["log.location"] = options.log_location
        target = cls(FileSink.from_options(raw), options.format, options.writer_options)
        target.partition_by = tuple(options.partition_by)
        return target

    def attempt_dir(self, batch_id: int, attempt_uid: str) -> str:
        return os.path.join(self.sink.staging, f"{batch_id:020d}", f"native-{attempt_uid}")

    def _measure(self) -> tuple[Optional[Callable[[str], Optional[int]]], bool]:
        """``(records of a file, whether those counts are exact)`` for the format: Parquet and ORC from the
        footer; JSON lines when Spark ends records with ``\\n`` (no ``lineSep``/``encoding`` given); CSV parsed
        (approximate)."""
        fmt, o = self.spark_format, self.writer_options
        if fmt == "parquet":
            return _parquet_rows, True
        if fmt == "orc":
            return _orc_rows, True
        if fmt == "json":
            if o.get("lineSep") not in (None, "\n") or (o.get("encoding") or "utf-8").lower().replace("-", "") != "utf8":
                return None, False
            return (lambda path: _json_rows(path, path.rsplit("/", 1)[-1].split(".", 1)[-1].lower())), True
        if fmt == "csv":
            return (lambda path: _csv_rows(path, path.rsplit("/", 1)[-1].split(".", 1)[-1].lower(), o)), False
        return None, False

    def committables(self, batch_id: int, attempt_uid: str, attempt_dir: str, *,
                     partition_by: Optional[Sequence[str]] = None,
                     expected_records: Optional[int] = None) -> list[FileCommittable]:
        files = list_spark_output(attempt_dir, self.partition_by if partition_by is None else partition_by)
        measure, exact = self._measure()
        measured = make_durable(attempt_dir, files, measure=measure)
        kept = keep_written(f"native_sink({self.spark_format!r})", batch_id, files, measured, exact=exact,
                            expected=expected_records)
        by_task: dict[str, list[dict[str, Any]]] = defaultdict(list)
        root = self.sink.root
        for f, size, records in kept:
            seq = len(by_task[f.task])
            name = part_file_name(self.sink.sink_id, batch_id, f.task, attempt_uid, seq, f.ext)
            by_task[f.task].append({"staged": os.path.relpath(os.path.join(attempt_dir, f.rel), root),
                                    "final": f"{f.dir_rel}/{name}" if f.dir_rel else name,
                                    "bytes": size, "records": records})
        return [FileCommittable(checkpoint_id=batch_id, task_id=task, attempt_uid=attempt_uid,
                                records=sum(e["records"] for e in entries), attempt_dir="",
                                files=entries)  # type: ignore[arg-type]
                for task, entries in sorted(by_task.items(), key=lambda kv: int(kv[0]))]
