"""Exactly-once file sink: stage, fsync, then atomically link into the final directory.

Layout under the output ``path``::

    <path>/<a=1>/<b=x>/part-<token>-<ckpt>-<task>-<attempt>-<seq>.<ext>  committed files (what readers see)
    <path>/_twophase/<token>/staging/<ckpt>/<task>-<attempt>/...         staged, invisible files
    <path>/_twophase/<token>/log/                                        the transaction log

``<token>`` is the sink's identity (:mod:`twophase.naming`): several sinks (queries) may share ``path``,
each with its own ``sink.id``, and none ever touches another's staged files or log.

Readers that skip names starting with ``_`` or ``.`` (Spark, pyarrow.dataset, pandas, DuckDB globs of
``*.parquet``) see only committed files. The handle of a transaction lists each staged file and its
final name, relative to ``path``.

Invariants (``test_file_sink_invN_*``):

1. A file appears in the final directory only through ``commit``, whole: it was fsynced at
   ``prepare_commit`` and is hard-linked into place (atomic, never overwriting), then unlinked from staging.
2. ``commit`` is idempotent: a file whose final name exists (and whose staged copy is gone or is the
   same inode) is already committed; a file missing from both places is reported LOST (the
   coordinator stops with DataLossError).
3. ``abort`` removes only staged files; a committed file is never removed or written twice.
4. Staged files of checkpoints ``<= n`` that no completed checkpoint owns are removed by
   ``abort_lingering(n)`` (failed attempts, speculative duplicates, crashed runs): only under the
   sink's own ``_twophase/<token>/staging``.
5. Every directory the sink creates (staging, Hive partition directories) has its parent fsynced, so
   a committed file's directory entry survives a power loss.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Optional, TypedDict

import pyarrow as pa

from twophase.sinks._filelike import FileLikeOptions, FileLikeWriter, check_partition_columns
from twophase.sinks._formats import FORMAT_OPTIONS, FormatWriter, format_options, open_format_writer
from twophase._logging import get_logger
from twophase.errors import ConfigurationError, TwoPhaseError
from twophase.naming import internal_rel
from twophase.log import TransactionLog
from twophase.log_azure import AZURE_SCHEMES, is_azure_url
from twophase.log_s3 import S3_SCHEMES, is_s3_url
from twophase.log_store import fsync_dir, makedirs_durable
from twophase.options import Option, parse_choice, parse_list, parse_options, parse_size
from twophase.sink import (Committable, CommitResult, CommitStatus, Guarantee, SinkCommitter, SinkSpec,
                           TransactionContext)

_log = get_logger(__name__)

FILE_OPTIONS: tuple[Option[Any], ...] = (
    Option("path", str, required=True, help="the output directory: .option('path', '/data/out') or .start('/data/out')"),
    *FORMAT_OPTIONS,
    Option("partitionBy", parse_list, (), help="comma-separated Hive partition columns (Spark's partitionBy() "
           "does not reach Python sinks; use this option)"),
    Option("maxFileSize", parse_size, 128 << 20, help="roll to a new file past this many bytes (e.g. 128m)"),
)


@dataclass(frozen=True, kw_only=True)
class FileSinkOptions(FileLikeOptions):
    """Validated options of the file sink (see :data:`FILE_OPTIONS`)."""

    path: str

    @classmethod
    def from_options(cls, raw: Mapping[str, Any], schema: Any = None) -> "FileSinkOptions":
        """Parse Spark's string options; ``schema`` (anything with ``.names``) checks partition columns."""
        o = parse_options(raw, FILE_OPTIONS, sink="twophase-file")
        fo = format_options(o, sink="twophase-file")
        raw_path = str(o["path"])
        scheme = raw_path.split("://", 1)[0].lower() if "://" in raw_path else ""
        if scheme and scheme != "file":
            where = ("on S3 and Azure, format twophase-file takes this path itself (file_sink_from_options builds "
                     "its S3 sink, twophase.sinks.s3.S3Sink); FileSink is the local one" if scheme in S3_SCHEMES else
                     "use format twophase-s3 (same options) for S3" if scheme == "s3n" else
                     "on Azure, format twophase-file takes this path itself (file_sink_from_options builds its Azure "
                     "sink, twophase.sinks.azure_files.AzureFilesSink); FileSink is the local one"
                     if scheme in AZURE_SCHEMES else
                     f"{scheme}:// is not supported; mount the store (gcsfuse, an HDFS NFS gateway) on "
                     "every node and give the mount path, or use twophase-s3 / twophase-delta, or twophase-file "
                     "with an abfss:// path on Azure")
            raise ConfigurationError(f"twophase-file: option 'path'={raw_path!r} is a {scheme}:// URL, but FileSink "
                                     "writes to a local or shared mounted filesystem (hard links make its commit "
                                     f"atomic); {where}")
        path = os.path.abspath(os.path.expanduser(raw_path.removeprefix("file://")))
        opts = cls(path=path, **cls.common(o, fo))
        check_partition_columns("twophase-file", opts.partition_by, schema)
        return opts


def file_sink_from_options(raw: Mapping[str, Any], schema: Any = None) -> "SinkSpec[Any]":
    """The sink of format ``twophase-file`` for these options, by the path's scheme: where the store has no
    atomic rename or hard link, the sink whose commit makes each file appear whole:

    - ``s3://``, ``s3a://``: the S3 sink (:class:`~twophase.sinks.s3.S3Sink`, the same as format
      ``twophase-s3``: one multipart upload per file, completed at the driver's commit);
    - ``abfss://``, ``abfs://``, ``az://``, ``wasbs://``: the Azure file sink
      (:class:`~twophase.sinks.azure_files.AzureFilesSink`: block blobs committed at the driver's commit);
    - else the local :class:`FileSink` (a local or mounted shared filesystem; hard links), which refuses
      any other URL (``gs://``, ``hdfs://``) naming the way out."""
    path = next((str(v) for k, v in raw.items() if k.lower() == "path"), "")
    if is_azure_url(path):
        from twophase.sinks.azure_files import AzureFilesSink
        return AzureFilesSink.from_options(raw, schema)
    if is_s3_url(path):
        from twophase.sinks.s3 import S3Sink
        return S3Sink.from_options(raw, schema)
    return FileSink.from_options(raw, schema)


@dataclass
class _OpenFile:
    staged_rel: str
    final_rel: str
    stream: Any
    writer: FormatWriter


class StagedFile(TypedDict):
    """One finished file of a committable: where it is staged, its final name (both relative to ``path``)."""

    staged: str
    final: str
    bytes: int
    records: int


@dataclass(frozen=True, kw_only=True)
class FileCommittable(Committable):
    """A file transaction's handle: its staging folder and every staged file with its final name."""

    kind: ClassVar[str] = "file"
    attempt_dir: str = ""
    files: list[StagedFile] = field(default_factory=list)
    guarantee: str = Guarantee.EXACTLY_ONCE.value


class FileSink(SinkSpec[FileCommittable]):
    """Exactly-once files (Parquet, JSON lines, CSV) with Hive partitions and size-based rolling."""

    #: sweeping is one local listing, so do it right after each commit too: a run whose last batch
    #: had a crashed attempt (re-run and committed) leaves no staged files behind, even though no
    #: further batch (whose recovery would sweep) comes
    sweep_after_commit = True
    supports_write_jobs = True

    def __init__(self, options: FileSinkOptions) -> None:
        self.options = options
        self.root = options.path
        self.sink_id = options.sink_id or f"file:{self.root}"
        self.guarantee = options.guarantee
        #: ``_twophase/<token>``: the sink's own folder (staging, default log location)
        self.internal_rel = internal_rel(self.sink_id)
        self.token = self.internal_rel.rsplit("/", 1)[-1]

    @classmethod
    def from_options(cls, raw: Mapping[str, Any], schema: Any = None) -> "FileSink":
        return cls(FileSinkOptions.from_options(raw, schema))

    @property
    def staging(self) -> str:
        return os.path.join(self.root, self.internal_rel, "staging")

    def validate_destination(self) -> None:
        """Fail early if the output directory cannot be created or written."""
        try:
            makedirs_durable(self.staging)
        except OSError as e:
            raise ConfigurationError(f"twophase-file: option 'path'={self.root!r} cannot be created: {e.strerror}; "
                                     "give a writable directory") from e
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise ConfigurationError(f"twophase-file: option 'path'={self.root!r} is not writable; give a writable directory")

    def transaction_log(self) -> TransactionLog:
        location = self.options.log_location or os.path.join(self.root, self.internal_rel, "log")
        return TransactionLog.open(location, self.sink_id, retain=self.options.log_retain)

    def create_writer(self, context: TransactionContext) -> "FileWriter":
        return FileWriter(self, context)

    def create_committer(self) -> "FileCommitter":
        return FileCommitter(self)


class FileWriter(FileLikeWriter[FileCommittable]):
    """Task side: files staged under ``_twophase/<token>/staging/<ckpt>/<task>-<attempt>``, fsynced."""

    def __init__(self, sink: FileSink, context: TransactionContext) -> None:
        o = sink.options
        super().__init__(context, partition_by=o.partition_by, max_file_size=o.max_file_size,
                         max_records=o.format_options.max_records_per_file)
        self.sink = sink
        self.exactly_once = sink.guarantee is Guarantee.EXACTLY_ONCE
        self.attempt_rel = (f"{sink.internal_rel}/staging/{context.checkpoint_id:020d}/{context.task_id}-{context.attempt_uid}"
                            if self.exactly_once else "")

    def open_file(self, part_rel: str, schema: pa.Schema) -> _OpenFile:
        o = self.sink.options
        name = self.next_name(o.format_options.extension)
        final_rel = f"{part_rel}/{name}" if part_rel else name
        if self.exactly_once:
            staged_rel = f"{self.attempt_rel}/{final_rel}"
        else:  # at-least-once: written next to its final name, hidden until the task finishes
            staged_rel = f"{part_rel + '/' if part_rel else ''}.{name}.inprogress"
        path = os.path.join(self.sink.root, staged_rel)
        makedirs_durable(os.path.dirname(path))
        stream = open(path, "wb")
        writer = open_format_writer(o.format_options, stream, schema)
        return _OpenFile(staged_rel, final_rel, stream, writer)

    def finish_file(self, f: _OpenFile) -> dict[str, Any]:
        f.writer.close()
        f.stream.flush()
        os.fsync(f.stream.fileno())
        size = f.stream.tell()
        f.stream.close()
        return {"staged": f.staged_rel, "final": f.final_rel, "bytes": size, "records": f.writer.records}

    def after_finish(self) -> None:
        root = self.sink.root
        dirs = {os.path.dirname(os.path.join(root, f["staged"])) for f in self.finished}
        if not self.exactly_once:  # task-level commit: visible now, duplicates on replay
            for f in self.finished:
                os.replace(os.path.join(root, f["staged"]), os.path.join(root, f["final"]))
        for d in dirs:
            fsync_dir(d)

    def committable(self) -> FileCommittable:
        c = self.context
        return FileCommittable(checkpoint_id=c.checkpoint_id, task_id=c.task_id, attempt_uid=c.attempt_uid,
                               records=self.records, attempt_dir=self.attempt_rel, files=list(self.finished),
                               guarantee=self.sink.guarantee.value)  # type: ignore[arg-type]

    def discard_open(self, f: _OpenFile) -> None:
        with contextlib.suppress(Exception):
            f.writer.close()  # before the stream, or the writer's finaliser writes to a closed file
        with contextlib.suppress(Exception):
            f.stream.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self.sink.root, f.staged_rel))

    def discard_finished(self, entry: dict[str, Any]) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self.sink.root, entry["staged"]))

    def after_abort(self) -> None:
        if self.attempt_rel:
            shutil.rmtree(os.path.join(self.sink.root, self.attempt_rel), ignore_errors=True)


class FileCommitter(SinkCommitter[FileCommittable]):
    """Driver side: hard-link staged files into place (invariants 1, 2), remove staged attempts (3, 4)."""

    committable_type = FileCommittable

    def __init__(self, sink: FileSink) -> None:
        self.sink = sink
        self.root = sink.root

    def commit(self, committable: FileCommittable, *, recovering: bool = False) -> CommitResult[FileCommittable]:
        if committable.guarantee == Guarantee.AT_LEAST_ONCE.value:
            return CommitResult(committable, CommitStatus.COMMITTED)
        final_dirs = set()
        linked = 0
        for f in committable.files:
            staged = os.path.join(self.root, f["staged"])
            final = os.path.join(self.root, f["final"])
            makedirs_durable(os.path.dirname(final))
            try:
                os.link(staged, final)  # invariant 1: atomic, never overwrites
                linked += 1
            except FileExistsError:
                if os.path.exists(staged) and not os.path.samefile(staged, final):
                    raise TwoPhaseError(f"twophase-file: {final} exists and is not the staged file {staged}; "
                                        "refusing to overwrite committed data") from None
            except FileNotFoundError:
                if not os.path.exists(final):  # invariant 2
                    return CommitResult(committable, CommitStatus.LOST,
                                        f"twophase-file: checkpoint {committable.checkpoint_id} task {committable.task_id}: "
                                        f"staged file {staged} is gone and {final} was never committed")
                continue  # committed before; staged copy already removed
            final_dirs.add(os.path.dirname(final))
        for d in final_dirs:
            fsync_dir(d)
        for f in committable.files:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.root, f["staged"]))
        self._remove_attempt_dir(committable)
        status = CommitStatus.COMMITTED if linked or not committable.files else CommitStatus.ALREADY_COMMITTED
        return CommitResult(committable, status)

    def abort(self, committable: FileCommittable, *, recovering: bool = False) -> None:
        if committable.guarantee == Guarantee.AT_LEAST_ONCE.value:
            return
        for f in committable.files:  # invariant 3: staged files only
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.root, f["staged"]))
        self._remove_attempt_dir(committable)

    def _remove_attempt_dir(self, committable: FileCommittable) -> None:
        rel = committable.attempt_dir
        if rel and rel.startswith(f"{self.sink.internal_rel}/staging/"):
            path = os.path.join(self.root, rel)
            shutil.rmtree(path, ignore_errors=True)
            with contextlib.suppress(OSError):  # the checkpoint's folder, once its last attempt is gone
                os.rmdir(os.path.dirname(path))

    def abort_lingering(self, up_to_checkpoint: int, highest_committed: Optional[int] = None) -> int:
        """Remove staged attempts of checkpoints ``<= up_to_checkpoint`` (invariant 4): a committed
        attempt's folder is already gone, and the coordinator calls this only for decided checkpoints."""
        staging = self.sink.staging
        removed = 0
        try:
            ckpt_dirs = os.listdir(staging)
        except FileNotFoundError:
            return 0
        for d in ckpt_dirs:
            if not d.isdigit() or int(d) > up_to_checkpoint:
                continue
            cdir = os.path.join(staging, d)
            for attempt in os.listdir(cdir):
                shutil.rmtree(os.path.join(cdir, attempt), ignore_errors=True)
                removed += 1
            with contextlib.suppress(OSError):
                os.rmdir(cdir)
        if removed:
            _log.info("lingering_aborted", sink_id=self.sink.sink_id, up_to=up_to_checkpoint, attempts=removed)
        return removed
