"""Exactly-once file sink: stage, fsync, then atomically link into the final directory.

Layout under the output ``path``::

    <path>/<a=1>/<b=x>/part-<token>-<ckpt>-<task>-<attempt>-<seq>.<ext>  committed files (what readers see)
    <path>/_twophase/<token>/staging/<ckpt>/<task>-<attempt>/...         staged, invisible files
    <path>/_twophase/<token>/log/                                        the transaction log

``<token>`` is the sink's identity (:mod:`twophase.sinks._naming`): several sinks (queries) may share ``path``,
each with its own ``sink.id``, and none ever touches another's staged files or log.

Readers that skip names starting with ``_`` or ``.`` (Spark, pyarrow.dataset, pandas, DuckDB globs of
``*.parquet``) see only committed files. The handle of a transaction lists each staged file and its
final name, relative to ``path``.

Invariants (``test_file_sink_invN_*``):

1. A file appears in the final directory only through ``commit``, whole: it was fsynced at
   ``pre_commit`` and is hard-linked into place (atomic, never overwriting), then unlinked from staging.
2. ``commit`` is idempotent: a file whose final name exists (and whose staged copy is gone or is the
   same inode) is already committed; a file missing from both places raises DataLossError.
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
from dataclasses import dataclass
from typing import Any, Collection, Mapping, Optional

import pyarrow as pa

from twophase.sinks._formats import (EXTENSIONS, FORMATS, FileLikeTransaction, FormatWriter, open_format_writer,
                            write_rolling)
from twophase._logging import get_logger
from twophase.errors import ConfigurationError, DataLossError, TwoPhaseError
from twophase.sinks._naming import internal_rel
from twophase.log import TransactionLog, _fsync_dir, makedirs_durable
from twophase.options import Option, parse_choice, parse_list, parse_options, parse_size
from twophase.sink import Guarantee, TransactionContext, TwoPhaseCommitSink

_log = get_logger(__name__)

FILE_OPTIONS: tuple[Option[Any], ...] = (
    Option("path", str, required=True, help="the output directory: .option('path', '/data/out') or .start('/data/out')"),
    Option("format", parse_choice(*FORMATS), "parquet", help="parquet, json (JSON lines) or csv"),
    Option("partitionBy", parse_list, (), help="comma-separated Hive partition columns (Spark's partitionBy() "
           "does not reach Python sinks; use this option)"),
    Option("maxFileSize", parse_size, 128 << 20, help="roll to a new file past this many bytes (e.g. 128m)"),
    Option("compression", parse_choice("snappy", "zstd", "gzip", "none"), "snappy", help="Parquet compression"),
)


@dataclass(frozen=True)
class FileSinkOptions:
    """Validated options of the file sink (see :data:`FILE_OPTIONS`)."""

    path: str
    format: str = "parquet"
    partition_by: tuple[str, ...] = ()
    max_file_size: int = 128 << 20
    compression: str = "snappy"
    sink_id: Optional[str] = None
    guarantee: Guarantee = Guarantee.EXACTLY_ONCE
    log_location: Optional[str] = None
    log_retain: int = 100
    owner: Optional[str] = None

    @classmethod
    def from_options(cls, raw: Mapping[str, Any], schema: Any = None) -> "FileSinkOptions":
        """Parse Spark's string options; ``schema`` (anything with ``.names``) checks partition columns."""
        o = parse_options(raw, FILE_OPTIONS, sink="twophase-file")
        path = os.path.abspath(os.path.expanduser(o["path"]))
        opts = cls(path=path, format=o["format"], partition_by=o["partitionBy"], max_file_size=o["maxFileSize"],
                   compression=o["compression"], sink_id=o["sink.id"], guarantee=Guarantee.parse(o["guarantee"]),
                   log_location=o["log.location"], log_retain=o["log.retain"], owner=o["checkpointlocation"])
        if schema is not None:
            missing = [c for c in opts.partition_by if c not in schema.names]
            if missing:
                raise ConfigurationError(f"twophase-file: option 'partitionBy' names {missing}, which are not columns "
                                         f"of the stream ({', '.join(schema.names)})")
            if opts.partition_by and len(opts.partition_by) == len(schema.names):
                raise ConfigurationError("twophase-file: option 'partitionBy' names every column; keep at least one data column")
        return opts


@dataclass
class _OpenFile:
    staged_rel: str
    final_rel: str
    stream: Any
    writer: FormatWriter


@dataclass(kw_only=True)
class FileTransaction(FileLikeTransaction):
    """In-task state of one file transaction: its staging folder and open writers per partition."""

    attempt_rel: str


class FileSink(TwoPhaseCommitSink[dict, FileTransaction]):
    """Exactly-once files (Parquet, JSON lines, CSV) with Hive partitions and size-based rolling."""

    #: sweeping is one local listing, so do it right after each commit too: a run whose last batch
    #: had a crashed attempt (re-run and committed) leaves no staged files behind, even though no
    #: further batch (whose recovery would sweep) comes
    sweep_after_commit = True

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

    # ---- driver-side set-up

    def validate_destination(self) -> None:
        """Fail early if the output directory cannot be created or written."""
        try:
            makedirs_durable(self._staging)
        except OSError as e:
            raise ConfigurationError(f"twophase-file: option 'path'={self.root!r} cannot be created: {e.strerror}; "
                                     "give a writable directory") from e
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise ConfigurationError(f"twophase-file: option 'path'={self.root!r} is not writable; give a writable directory")

    def transaction_log(self) -> TransactionLog:
        location = self.options.log_location or os.path.join(self.root, self.internal_rel, "log")
        return TransactionLog.open(location, self.sink_id, retain=self.options.log_retain)

    # ---- executor side

    @property
    def _staging(self) -> str:
        return os.path.join(self.root, self.internal_rel, "staging")

    def begin_transaction(self, context: TransactionContext) -> FileTransaction:
        if self.guarantee is Guarantee.EXACTLY_ONCE:
            rel = f"{self.internal_rel}/staging/{context.checkpoint_id:020d}/{context.task_id}-{context.attempt_uid}"
        else:
            rel = ""
        return FileTransaction(context=context, attempt_rel=rel)

    def write(self, txn: FileTransaction, batch: pa.RecordBatch) -> int:
        if batch.num_rows == 0:
            return 0
        write_rolling(txn.open_files, batch, self.options.partition_by, self.options.max_file_size,
                      lambda rel, schema: self._open(txn, rel, schema), lambda f: self._close(txn, f))
        txn.records += batch.num_rows
        return batch.num_rows

    def _open(self, txn: FileTransaction, part_rel: str, schema: pa.Schema) -> _OpenFile:
        name = txn.next_name(EXTENSIONS[self.options.format])
        final_rel = f"{part_rel}/{name}" if part_rel else name
        if self.guarantee is Guarantee.EXACTLY_ONCE:
            staged_rel = f"{txn.attempt_rel}/{final_rel}"
        else:  # at-least-once: written next to its final name, hidden until the task finishes
            staged_rel = f"{part_rel + '/' if part_rel else ''}.{name}.inprogress"
        path = os.path.join(self.root, staged_rel)
        makedirs_durable(os.path.dirname(path))
        stream = open(path, "wb")
        writer = open_format_writer(self.options.format, stream, schema, compression=self.options.compression)
        return _OpenFile(staged_rel, final_rel, stream, writer)

    def _close(self, txn: FileTransaction, f: _OpenFile) -> None:
        f.writer.close()
        f.stream.flush()
        os.fsync(f.stream.fileno())
        size = f.stream.tell()
        f.stream.close()
        txn.closed.append({"staged": f.staged_rel, "final": f.final_rel, "bytes": size, "records": f.writer.records})

    def pre_commit(self, txn: FileTransaction) -> dict:
        for key in list(txn.open_files):
            self._close(txn, txn.open_files.pop(key))
        dirs = {os.path.dirname(os.path.join(self.root, f["staged"])) for f in txn.closed}
        if self.guarantee is Guarantee.AT_LEAST_ONCE:  # task-level commit: visible now, duplicates on replay
            for f in txn.closed:
                os.replace(os.path.join(self.root, f["staged"]), os.path.join(self.root, f["final"]))
        for d in dirs:
            _fsync_dir(d)
        c = txn.context
        return {"sink": "file", "checkpoint_id": c.checkpoint_id, "task_id": c.task_id, "attempt_uid": c.attempt_uid,
                "attempt_dir": txn.attempt_rel, "files": list(txn.closed), "records": txn.records,
                "guarantee": self.guarantee.value}

    def abort_open(self, txn: FileTransaction) -> None:
        for f in txn.open_files.values():
            with contextlib.suppress(Exception):
                f.writer.close()  # before the stream, or the writer's finaliser writes to a closed file
            with contextlib.suppress(Exception):
                f.stream.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.root, f.staged_rel))
        for f in txn.closed:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.root, f["staged"]))
        if txn.attempt_rel:
            shutil.rmtree(os.path.join(self.root, txn.attempt_rel), ignore_errors=True)

    # ---- driver side

    def commit(self, handle: Mapping[str, Any]) -> None:
        if handle.get("guarantee") == Guarantee.AT_LEAST_ONCE.value:
            return
        final_dirs = set()
        for f in handle["files"]:
            staged = os.path.join(self.root, f["staged"])
            final = os.path.join(self.root, f["final"])
            makedirs_durable(os.path.dirname(final))
            try:
                os.link(staged, final)  # invariant 1: atomic, never overwrites
            except FileExistsError:
                if os.path.exists(staged) and not os.path.samefile(staged, final):
                    raise TwoPhaseError(f"twophase-file: {final} exists and is not the staged file {staged}; "
                                        "refusing to overwrite committed data") from None
            except FileNotFoundError:
                if not os.path.exists(final):  # invariant 2
                    raise DataLossError(
                        f"twophase-file: checkpoint {handle['checkpoint_id']} task {handle['task_id']}: staged file "
                        f"{staged} is gone and {final} was never committed") from None
                continue  # committed before; staged copy already removed
            final_dirs.add(os.path.dirname(final))
        for d in final_dirs:
            _fsync_dir(d)
        for f in handle["files"]:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.root, f["staged"]))
        self._remove_attempt_dir(handle)

    def abort(self, handle: Mapping[str, Any]) -> None:
        if handle.get("guarantee") == Guarantee.AT_LEAST_ONCE.value:
            return
        for f in handle.get("files", ()):  # invariant 3: staged files only
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.root, f["staged"]))
        self._remove_attempt_dir(handle)

    def _remove_attempt_dir(self, handle: Mapping[str, Any]) -> None:
        rel = handle.get("attempt_dir")
        if rel and rel.startswith(f"{self.internal_rel}/staging/"):
            path = os.path.join(self.root, rel)
            shutil.rmtree(path, ignore_errors=True)
            with contextlib.suppress(OSError):  # the checkpoint's folder, once its last attempt is gone
                os.rmdir(os.path.dirname(path))

    def abort_lingering(self, up_to_checkpoint: int, keep: Collection[Mapping[str, Any]] = ()) -> int:
        """Remove staged attempts of checkpoints ``<= up_to_checkpoint`` not in ``keep`` (invariant 4)."""
        kept = {h.get("attempt_dir") for h in keep}
        removed = 0
        try:
            ckpt_dirs = os.listdir(self._staging)
        except FileNotFoundError:
            return 0
        for d in ckpt_dirs:
            if not d.isdigit() or int(d) > up_to_checkpoint:
                continue
            cdir = os.path.join(self._staging, d)
            for attempt in os.listdir(cdir):
                if f"{self.internal_rel}/staging/{d}/{attempt}" in kept:
                    continue
                shutil.rmtree(os.path.join(cdir, attempt), ignore_errors=True)
                removed += 1
            with contextlib.suppress(OSError):
                os.rmdir(cdir)
        if removed:
            _log.info("lingering_aborted", sink_id=self.sink_id, up_to=up_to_checkpoint, attempts=removed)
        return removed
