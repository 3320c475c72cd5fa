"""Exactly-once Delta Lake tables (local path, S3 or Azure Blob / ADLS Gen2): data files first, then ONE Delta
commit per checkpoint.

Executors write Parquet data files straight into the table location (Hive-style partition directories);
a data file no Delta commit references is invisible to every Delta reader. A task's handle is the list
of its files as Delta Add actions (path, size, partition values, stats). The driver commits a whole
checkpoint atomically (:meth:`DeltaCommitter.commit_checkpoint`): one Delta commit with every Add action of
every task and an app transaction ``(app id = sink id, version = checkpoint id)``. Commits go through
deltalake (delta-rs); on S3 and on Azure its conditional create of the next ``_delta_log`` entry
(If-None-Match: *) makes concurrent commits safe.

Where the table lives decides how a data file is written (none needs an atomic rename or hard link: a
data file is invisible until a Delta commit names it, and what must not be seen half-written is kept
out of the store's namespace until whole): locally a file fsynced at prepare_commit; on S3 a multipart
upload completed at prepare_commit (:mod:`twophase.sinks._s3`); on Azure a block blob whose blocks are
staged while the task writes and committed with one Put Block List at prepare_commit
(:mod:`twophase.sinks._azure`). Paths on Azure: ``abfss://container@account.dfs.core.windows.net/t``,
``abfs://``, ``wasbs://container@account.blob.core.windows.net/t`` or ``az://container/t``, all kept as
the ``abfss://`` form (one table, one default sink id).

Layout::

    <table>/_delta_log/                         the Delta log (the table's truth)
    <table>/<a=1>/part-<token>-<ckpt>-<task>-<attempt>-<seq>.parquet   data files
    <table>/_twophase/<token>/log/              twophase's transaction log for this sink

``<token>`` is the sink's identity (:mod:`twophase.naming`). Several queries may append to one table,
each with its own ``sink.id`` (its own log, app id and token); none ever touches another's files.

Invariants (``test_delta_sink_invN_*``):

1. Rows become visible only through the checkpoint's single Delta commit: all of a checkpoint or none.
2. A checkpoint is committed at most once: the commit is skipped when the table's transaction version
   for the app id is already ``>= checkpoint id`` (delta-rs accepts duplicates, so the check is ours), or,
   on a table whose ``delta.setTransactionRetentionDuration`` expires app transactions, when the history
   since this sink's previous commit has the checkpoint's commitInfo (:meth:`DeltaCommitter._in_history`).
3. ``abort`` deletes only files of the handle that no Delta commit added (if the table has the
   handle's checkpoint, that commit's files are read first and kept), and a commit never adds a file
   that is gone (the checkpoint is LOST instead: a table never references a missing file). A file gone
   BEFORE the decision (``VACUUM ... RETAIN 0 HOURS`` while the batch was in flight) declines the batch
   instead (:meth:`DeltaCommitter.check_prepared`: one stat or HEAD per file of the batch, once every ack
   is in): aborted, run again, nothing lost. Only a file deleted in the window between that check and
   the Delta commit makes a decided checkpoint LOST.
4. ``abort_lingering(n)`` deletes only data files that carry this sink's token, of checkpoints
   ``<= n``, that the sink's own log proves were never committed (the checkpoint's record is final and
   does not list the file): crashed tasks, failed attempts. It aborts in-progress S3 uploads of those
   checkpoints likewise. A file any Delta commit added is never deleted, whatever OPTIMIZE or DELETE
   later removed from the snapshot (time travel and VACUUM keep their files); a file no final record
   speaks for is kept and logged. It runs right after each commit too (``sweep_after_commit``), so a
   loser attempt of the LAST batch of a run leaves no data file behind, at a bounded cost: for the
   checkpoint just committed, on S3 and Azure only the directories its Add actions name and the table
   root are listed, for names ``part-<token>-<ckpt>-`` (a prefix listing that returns only that
   checkpoint's files); on a local disk, which cannot list by prefix, the name records of its attempts
   are read instead (invariant 7). The whole table is listed only when the log shows a checkpoint not
   swept that way (a crash between commit and sweep, a gap) and at least every ``FULL_SWEEP_EVERY``
   checkpoints (what a scoped sweep cannot see: a retry that put rows in other partitions on S3/Azure,
   a zombie that finished after the sweep); that listing looks again at every checkpoint whose record
   the log still keeps, so a zombie that wrote after the previous whole listing is caught too.
   A watermark in the log keeps each checkpoint from being scoped-swept twice.
5. The stream's schema is checked on the driver before any data moves: a new column needs
   ``mergeSchema=true`` (then it is added, nullable, in a metadata-only commit); a changed type or other
   partition columns are refused with a :class:`~twophase.errors.ConfigurationError`.
6. No row that breaks the table's NOT NULL columns, CHECK constraints, column invariants or generated
   columns is ever committed: the writer checks every batch before writing it
   (:mod:`twophase.sinks._delta_checks`); the task fails with ConstraintViolationError. A requirement the
   table gained while a checkpoint was in flight is checked at commit against that checkpoint's files
   (each committable records what its writer enforced); rows that break it stop the commit, loudly.
   Tables whose files twophase cannot write correctly (column mapping, identity columns, and every table
   feature not on :data:`~twophase.sinks._delta_checks.WRITABLE_FEATURES`: deletion vectors, type widening,
   row tracking, clustering, ...) are refused on the driver before the query writes anything, naming the
   feature (an allow-list of the table's protocol; checked again at commit).
7. On a local table the per-batch sweep costs what the batch wrote, never what the table holds: every
   attempt (a Python writer, the native path's rename) appends each data file's name to its own record
   ``_twophase/<token>/names/<ckpt>/<task>-<attempt>`` BEFORE creating the file; the sweep right after
   checkpoint ``n`` committed reads ``n``'s record folder (one entry per attempt of ``n``), deletes the
   named files ``n``'s record does not list (the sink's layout and ``n``'s names only, as invariant 4),
   then those records; it reads no directory of the table. Nothing the old per-batch directory scan found
   is missed: a loser file of ``n`` that existed when the records were read was named in one before it
   was created, so it is deleted then, whatever partition it is in. A file named after that (a zombie
   still writing; its record may be removed under it) or never named (a power cut lost an unsynced
   record; an attempt of an older version) is one of this sink's files of a checkpoint ``<= n`` with a
   final record: the next whole listing, at most ``FULL_SWEEP_EVERY`` checkpoints later (or at a recovery
   after a gap), lists it and deletes it while the log keeps ``n``'s record (``log.retain`` newest), and
   removes the record folders of the checkpoints it covered. Records are never read as a reason to
   delete a file a final record lists, so they can only add deletions the whole listing would also make.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import json
import math
import os
import shutil
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterator, Mapping, Optional, Sequence, TypedDict

import pyarrow as pa

from twophase.sinks._delta_checks import TableChecks, check_table_protocol, table_checks, table_open_error
from twophase.sinks._filelike import FileLikeWriter
from twophase.sinks._formats import ParquetFormatWriter
from twophase.sinks._filelike import check_partition_columns
from twophase.sinks._s3 import (MultipartStream, abort_lingering_uploads, check_bucket, check_part_count,
                                complete_upload, multipart_etag)
from twophase.sinks._azure import AzureFiles, check_container
from twophase.naming import internal_rel, own_part_checkpoint, own_part_rel
from twophase import faults
from twophase._logging import get_logger
from twophase._redact import safe_repr
from twophase.errors import ConstraintViolationError, ConfigurationError, MissingDependencyError, TransientSinkError, TwoPhaseError
from twophase.log import TransactionLog
from twophase.log_store import fsync_dir, makedirs_durable
from twophase.log_s3 import S3_CLIENT_OPTIONS, S3_SCHEMES, S3Config, error_code, is_s3_url, open_log_store, parse_s3_url, s3_config_from
from twophase.log_azure import (AZURE_CLIENT_OPTIONS, AzureConfig, azure_config_from, is_azure_url, parse_azure_url)
from twophase.options import Option, parse_bool, parse_choice, parse_list, parse_options, parse_size
from twophase.sink import (Committable, CommitResult, CommitStatus, Guarantee, SinkCommitter, SinkSpec,
                           TransactionContext, sink_token)
from twophase.states import CheckpointState

_log = get_logger(__name__)

WATERMARK = "delta_orphans_scanned.json"
#: list the whole table for orphans at least every this many checkpoints (and at most every
#: ``log.retain // 2``, so that the log still has the records that prove files orphaned)
FULL_SWEEP_EVERY = 50

DELTA_OPTIONS: tuple[Option[Any], ...] = (
    Option("path", str, required=True, help="the table: a local directory, s3://bucket/prefix or "
           "abfss://container@account.dfs.core.windows.net/prefix (also abfs://, wasbs://, az://container/prefix)"),
    Option("partitionBy", parse_list, (), help="comma-separated partition columns (Spark's partitionBy() does not "
           "reach Python sinks; use this option)"),
    Option("mergeSchema", parse_bool, False, help="add new columns of the stream to the table's schema"),
    Option("targetFileSize", parse_size, 128 << 20, help="roll to a new data file past this many bytes (e.g. 128m)"),
    Option("partSize", parse_size, 5 << 20, help="multipart part size for tables on S3 (at least 5m, the default), "
           "block size on Azure"),
    Option("compression", parse_choice("snappy", "zstd", "gzip", "none"), "snappy", help="Parquet compression"),
    *S3_CLIENT_OPTIONS,
    *AZURE_CLIENT_OPTIONS,
)


def delta_storage_options(config: S3Config) -> dict[str, str]:
    """The same settings as deltalake (object_store) storage options."""
    out: dict[str, str] = {}
    endpoint = config.resolved_endpoint()
    if endpoint:
        out["AWS_ENDPOINT_URL"] = endpoint
        if endpoint.startswith("http://"):
            out["AWS_ALLOW_HTTP"] = "true"
    region = config.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    out["AWS_REGION"] = region or "us-east-1"
    if config.access_key_id:
        out["AWS_ACCESS_KEY_ID"] = config.access_key_id
        out["AWS_SECRET_ACCESS_KEY"] = config.secret_access_key or ""
        if config.session_token:
            out["AWS_SESSION_TOKEN"] = config.session_token
    if config.connect_timeout_ms:
        out["connect_timeout"] = f"{config.connect_timeout_ms}ms"
    if config.read_timeout_ms:
        out["timeout"] = f"{config.read_timeout_ms}ms"
    # commits to _delta_log use S3's conditional put (If-None-Match), no locking service needed
    out["conditional_put"] = "etag"
    return out


def delta_azure_storage_options(config: AzureConfig) -> dict[str, str]:
    """A resolved :class:`AzureConfig` as deltalake (object_store) storage options. The endpoint is passed
    only when it is not the account's default (Azurite, a private endpoint), with ``allow_http`` for
    http://. (object_store's ``use_emulator`` is not used: it sends every request to 127.0.0.1:10000.)
    delta-rs commits on Azure with a conditional create (If-None-Match: *), no locking service needed."""
    out: dict[str, str] = {"account_name": str(config.account_name)}
    if config.account_key:
        out["account_key"] = config.account_key
    elif config.sas_token:
        out["sas_token"] = config.sas_token
    endpoint = str(config.endpoint)
    if endpoint != f"https://{config.account_name}.blob.core.windows.net":
        out["endpoint"] = endpoint
        if endpoint.startswith("http://"):
            out["allow_http"] = "true"
    return out


#: times a Delta commit refused for a conflict a blind append cannot have is made again (:func:`_blind_append_conflict`)
COMMIT_CONFLICT_RETRIES = 10
#: delta-rs's messages of the conflicts it finds for an append that a newer commit removed files "it read" (it counts
#: the whole snapshot as read), or added files: an append of new files reads none, so neither can change its result
_BLIND_APPEND_CONFLICTS = ("a concurrent transaction deleted data this operation read",
                           "a concurrent transaction added new data")


def _blind_append_conflict(e: BaseException) -> bool:
    """Whether ``e`` is delta-rs refusing twophase's append for a concurrent commit that only removed or added data
    files (an UPDATE, DELETE, MERGE or another append); a schema or protocol change is not (the files may not fit)."""
    return type(e).__name__ == "CommitFailedError" and any(m in str(e) for m in _BLIND_APPEND_CONFLICTS)


#: tests only: a folder; see :func:`_commit_gate`
COMMIT_GATE_ENV = "TWOPHASE_DELTA_COMMIT_GATE"


def _commit_gate(checkpoint_id: int, read_version: int) -> None:
    """A test's hook (``TWOPHASE_DELTA_COMMIT_GATE=<folder>``, read here, so it reaches the process that
    commits, as :mod:`twophase.faults` does): while ``<folder>/delta-commit`` exists, a commit that has read
    the table's version and checked its files waits here, before its Delta commit, at most 120 s; it first
    writes ``<checkpoint id> <table version read>`` to ``<folder>/delta-commit.entered``. So a test makes
    another writer's commit land between twophase's read of the table and its commit. Unset (always, outside
    tests): nothing."""
    folder = os.environ.get(COMMIT_GATE_ENV)
    if not folder:
        return
    gate = os.path.join(folder, "delta-commit")
    if not os.path.exists(gate):
        return
    with open(gate + ".entered", "a") as f:
        f.write(f"{checkpoint_id} {read_version}\n")
    deadline = time.monotonic() + 120
    while os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.02)


def _deltalake() -> Any:
    from twophase._versions import require
    require("deltalake", what="twophase-delta")
    try:
        import deltalake
    except ImportError as e:  # pragma: no cover - depends on the install
        raise MissingDependencyError("twophase-delta needs deltalake: pip install 'twophase[delta]'") from e
    return deltalake


@safe_repr
@dataclass(frozen=True)
class DeltaSinkOptions:
    """Validated options of the Delta sink (see :data:`DELTA_OPTIONS`)."""

    uri: str
    partition_by: tuple[str, ...] = ()
    merge_schema: bool = False
    target_file_size: int = 128 << 20
    part_size: int = 5 << 20
    compression: str = "snappy"
    s3: S3Config = field(default_factory=S3Config)
    #: the table's account, resolved (options, environment, URL) when the table is on Azure, else None
    azure: Optional[AzureConfig] = None
    storage: Mapping[str, str] = field(default_factory=dict)
    schema: Optional[pa.Schema] = None
    sink_id: Optional[str] = None
    guarantee: Guarantee = Guarantee.EXACTLY_ONCE
    log_location: Optional[str] = None
    log_retain: int = 100
    owner: Optional[str] = None

    @property
    def on_s3(self) -> bool:
        return is_s3_url(self.uri)

    @property
    def on_azure(self) -> bool:
        return is_azure_url(self.uri)

    @classmethod
    def from_options(cls, raw: Mapping[str, Any], schema: Optional[pa.Schema] = None) -> "DeltaSinkOptions":
        """Parse Spark's string options; ``schema`` is the stream's Arrow schema (checked at start)."""
        o = parse_options(raw, DELTA_OPTIONS, sink="twophase-delta", prefixes=("storage.",))
        path = str(o["path"])
        azure: Optional[AzureConfig] = None
        if is_azure_url(path):
            url = parse_azure_url(path)
            azure = azure_config_from(o).resolve(url, option="path")
            uri = url.canonical(str(azure.account_name)).rstrip("/")
        elif "://" in path and not path.startswith("file://"):
            scheme = path.split("://", 1)[0].lower()
            if scheme not in S3_SCHEMES:
                raise ConfigurationError(
                    f"twophase-delta: option 'path'={path!r}: {scheme}:// is not supported; a table is a local path, "
                    "s3://bucket/prefix, or on Azure abfss://container@account.dfs.core.windows.net/prefix "
                    "(abfs://, wasbs://, az://container/prefix)")
            parse_s3_url(path)
            uri = path.rstrip("/")
        else:
            uri = os.path.abspath(os.path.expanduser(path.removeprefix("file://")))
        if o["partSize"] < 5 << 20:
            raise ConfigurationError("twophase-delta: option 'partSize' is below S3's minimum part size; use at least 5m")
        if is_s3_url(uri):
            check_part_count("twophase-delta", "targetFileSize", o["targetFileSize"], o["partSize"])
        storage = {k[len("storage."):]: str(v) for k, v in o.items() if k.startswith("storage.")}
        if o["guarantee"] != Guarantee.EXACTLY_ONCE.value:
            raise ConfigurationError("twophase-delta: option 'guarantee' can only be 'exactly-once' (a Delta commit is "
                                     "already transactional; use deltalake directly for unchecked appends)")
        opts = cls(uri=uri, partition_by=o["partitionBy"], merge_schema=o["mergeSchema"],
                   target_file_size=o["targetFileSize"], part_size=o["partSize"], compression=o["compression"],
                   s3=s3_config_from(o), azure=azure, storage=storage, schema=schema, sink_id=o["sink.id"],
                   log_location=o["log.location"], log_retain=o["log.retain"], owner=o["checkpointlocation"])
        check_partition_columns("twophase-delta", opts.partition_by, schema)
        return opts

    def storage_options(self) -> Optional[dict[str, str]]:
        """deltalake storage options: S3 settings from the ``s3.*`` options / environment, or the Azure account's
        (``azure.*`` options / environment), then ``storage.*``."""
        out = (delta_storage_options(self.s3) if self.on_s3 else
               delta_azure_storage_options(self.azure) if self.azure is not None else {})
        out.update(self.storage)
        return out or None


def _nested_additions(table_t: Any, stream_t: Any, path: str) -> Optional[list[str]]:
    """What ``stream_t`` adds to ``table_t`` (Delta type JSON, as ``Field.type.to_json()``): the dotted paths
    of struct fields the table lacks (``[]``: the same type), or None where they differ otherwise (another
    type, a field the stream lacks). Structs nest in structs, array elements and map values; a new field
    is always nullable (the stream's schema is made nullable first), so older files read it as null."""
    if isinstance(table_t, str) or isinstance(stream_t, str):
        return [] if table_t == stream_t else None
    kind = table_t.get("type")
    if kind != stream_t.get("type"):
        return None
    if kind == "struct":
        theirs = {f["name"]: f["type"] for f in table_t["fields"]}
        ours = {f["name"]: f["type"] for f in stream_t["fields"]}
        if set(theirs) - set(ours):
            return None  # the stream dropped a field: refused, never written as a narrower struct
        out: list[str] = []
        for name, t in ours.items():
            if name not in theirs:
                out.append(f"{path}.{name}")
                continue
            sub = _nested_additions(theirs[name], t, f"{path}.{name}")
            if sub is None:
                return None
            out.extend(sub)
        return out
    if kind == "array":
        return _nested_additions(table_t["elementType"], stream_t["elementType"], f"{path}[]")
    if kind == "map":
        keys = _nested_additions(table_t["keyType"], stream_t["keyType"], f"{path}{{key}}")
        values = _nested_additions(table_t["valueType"], stream_t["valueType"], f"{path}{{value}}")
        return None if keys is None or values is None or keys else values
    return [] if table_t == stream_t else None


# --------------------------------------------------------------------------- where data files live


class _LocalFiles:
    """Data files in a local (or POSIX-shared) table directory, and the name records of the attempts that
    write them (invariant 7): ``<table>/_twophase/<token>/names/<ckpt:08d>/<task>-<attempt>``, one line per
    data file name the attempt is about to create, appended BEFORE the file is created. A local directory
    cannot be listed by name prefix (a scan reads every name in it), so the sweep of a committed checkpoint
    reads these records instead of the table's directories."""

    def __init__(self, root: str, sink_id: str) -> None:
        self.root = root
        self.sink_id = sink_id
        self.token = sink_token(sink_id)
        self._made: set[str] = set()

    def names_dir(self, checkpoint_id: Optional[int] = None) -> str:
        base = os.path.join(self.root, internal_rel(self.sink_id), "names")
        return base if checkpoint_id is None else os.path.join(base, f"{checkpoint_id:08d}")

    def note(self, rel: str) -> None:
        """Record that this attempt is about to create the data file ``rel`` (a name of :func:`part_file_name`):
        one appended line in its attempt's record. Not fsynced: a record lost to a power cut leaves a file the
        whole-table listing still finds (invariant 7)."""
        name = rel.rsplit("/", 1)[-1]
        cid = own_part_checkpoint(name, self.sink_id)
        if cid is None:  # pragma: no cover - every writer names its files with part_file_name
            return
        attempt = name[len(f"part-{self.token}-{cid:08d}-"):].rsplit("-", 1)[0]  # <task>-<attempt uid>
        d = self.names_dir(cid)
        if d not in self._made:
            os.makedirs(d, exist_ok=True)
            self._made.add(d)
        try:
            fd = os.open(os.path.join(d, attempt), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except FileNotFoundError:  # the sweep removed the folder meanwhile (a zombie attempt): make it again
            os.makedirs(d, exist_ok=True)
            fd = os.open(os.path.join(d, attempt), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, (rel + "\n").encode())
        finally:
            os.close(fd)

    def noted(self, checkpoint_id: int) -> tuple[list[str], list[str]]:
        """``(data file names, record paths)`` of every attempt of ``checkpoint_id`` that noted a name: one
        listing of the checkpoint's own record folder (its attempts, not the table's history)."""
        d = self.names_dir(checkpoint_id)
        try:
            records = sorted(os.listdir(d))
        except (FileNotFoundError, NotADirectoryError):
            return [], []
        rels: list[str] = []
        paths: list[str] = []
        for r in records:
            path = os.path.join(d, r)
            try:
                with open(path, "rb") as f:
                    body = f.read()
            except (FileNotFoundError, IsADirectoryError):
                continue
            paths.append(path)
            # a torn last line (the attempt died while appending it) names no file it created
            rels.extend(line for line in body.decode("utf-8", "replace").split("\n") if line)
        return rels, paths

    def forget(self, checkpoint_id: int, paths: Sequence[str]) -> None:
        """Remove the records ``paths`` of ``checkpoint_id`` that a sweep acted on, then its folder if empty
        (a zombie's record written since keeps it: the whole-table listing removes it later)."""
        for p in paths:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)
        with contextlib.suppress(OSError):
            os.rmdir(self.names_dir(checkpoint_id))
        self._made.discard(self.names_dir(checkpoint_id))

    def forget_up_to(self, up_to: int) -> None:
        """Remove the record folders of checkpoints ``<= up_to`` (after a whole-table listing swept them)."""
        base = self.names_dir()
        try:
            dirs = os.listdir(base)
        except FileNotFoundError:
            return
        for d in dirs:
            if d.isdigit() and int(d) <= up_to:
                shutil.rmtree(os.path.join(base, d), ignore_errors=True)
                self._made.discard(os.path.join(base, d))

    def unlink(self, rel: str) -> bool:
        """Delete the data file ``rel``; False if it was not there."""
        try:
            os.unlink(os.path.join(self.root, rel))
            return True
        except FileNotFoundError:
            return False

    def open(self, rel: str, pool: ThreadPoolExecutor) -> Any:
        path = os.path.join(self.root, rel)
        self.note(rel)  # before the file exists: a sweep that can see the file can see its name (invariant 7)
        makedirs_durable(os.path.dirname(path))
        return open(path, "wb")

    def finish(self, stream: Any) -> int:
        stream.flush()
        os.fsync(stream.fileno())
        size = stream.tell()
        stream.close()
        fsync_dir(os.path.dirname(stream.name))
        return size

    def discard(self, stream: Any, rel: str) -> None:
        with contextlib.suppress(Exception):
            stream.close()
        self.delete(rel)

    def delete(self, rel: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self.root, rel))

    def exists(self, rel: str) -> bool:
        return os.path.isfile(os.path.join(self.root, rel))

    def reader(self, rel: str) -> Any:
        """A readable source of the data file ``rel`` (for pyarrow.parquet)."""
        return os.path.join(self.root, rel)

    def list_named(self, dir_rel: str, name_prefix: str) -> Iterator[str]:
        """Files directly in ``dir_rel`` (``""``: the root) whose name starts with ``name_prefix``."""
        try:
            entries = os.scandir(os.path.join(self.root, dir_rel) if dir_rel else self.root)
        except (FileNotFoundError, NotADirectoryError):
            return
        with entries:
            for e in entries:
                if e.name.startswith(name_prefix) and e.is_file(follow_symlinks=False):
                    yield f"{dir_rel}/{e.name}" if dir_rel else e.name

    def list_data(self) -> Iterator[str]:
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames[:] = [d for d in dirnames if not d.startswith(("_", "."))]
            for n in filenames:
                yield os.path.relpath(os.path.join(dirpath, n), self.root).replace(os.sep, "/")

    def abort_uploads(self, sink_id: str, up_to: int, partition_by: Sequence[str]) -> int:
        return 0


class _S3Files:
    """Data files on S3: each is a multipart upload, completed at prepare_commit (a Delta commit makes it visible)."""

    def __init__(self, uri: str, config: S3Config, part_size: int) -> None:
        self.bucket, self.prefix = parse_s3_url(uri)
        self.config, self.part_size = config, part_size
        self._client: Any = None

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = self.config.client()
        return self._client

    def key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def open(self, rel: str, pool: ThreadPoolExecutor) -> Any:
        return MultipartStream(self.client, self.bucket, self.key(rel), self.part_size, pool)

    def finish(self, stream: MultipartStream) -> int:
        parts = stream.finish()
        complete_upload(self.client, {"bucket": self.bucket, "key": stream.key, "upload_id": stream.upload_id,
                                      "parts": parts, "etag": multipart_etag(parts)})
        return stream.tell()

    def discard(self, stream: MultipartStream, rel: str) -> None:
        with contextlib.suppress(Exception):
            stream.abort()

    def delete(self, rel: str) -> None:
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self.key(rel))
        except Exception as e:
            if error_code(e) not in ("NoSuchKey", "404"):
                raise TransientSinkError(f"twophase-delta: cannot delete s3://{self.bucket}/{self.key(rel)}: {e}") from e

    def exists(self, rel: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=self.key(rel))
            return True
        except Exception as e:
            if error_code(e) in ("NoSuchKey", "404", "NotFound"):
                return False
            raise TransientSinkError(f"twophase-delta: cannot check s3://{self.bucket}/{self.key(rel)}: {e}") from e

    def reader(self, rel: str) -> Any:
        """The data file ``rel``, read whole (for pyarrow.parquet)."""
        import io
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self.key(rel))["Body"].read()
        except Exception as e:
            raise TransientSinkError(f"twophase-delta: cannot read s3://{self.bucket}/{self.key(rel)}: {e}") from e
        return io.BytesIO(body)

    def list_named(self, dir_rel: str, name_prefix: str) -> Iterator[str]:
        """Objects directly in ``dir_rel`` whose name starts with ``name_prefix``: one prefix listing."""
        base = f"{self.prefix}/" if self.prefix else ""
        pfx = self.key(f"{dir_rel}/{name_prefix}" if dir_rel else name_prefix)
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=pfx):
            for o in page.get("Contents", ()):
                rel = o["Key"][len(base):]
                if "/" not in rel[len(dir_rel) + 1 if dir_rel else 0:]:
                    yield rel

    def list_data(self) -> Iterator[str]:
        base = f"{self.prefix}/" if self.prefix else ""
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=base):
            for o in page.get("Contents", ()):
                rel = o["Key"][len(base):]
                if not any(seg.startswith(("_", ".")) for seg in rel.split("/")[:-1]):
                    yield rel

    def abort_uploads(self, sink_id: str, up_to: int, partition_by: Sequence[str]) -> int:
        return abort_lingering_uploads(self.client, self.bucket, self.prefix, sink_id, up_to, (), partition_by)


# --------------------------------------------------------------------------- stats and partition values


def _partition_values(part_rel: str, schema: Optional[pa.Schema]) -> dict[str, Optional[str]]:
    """``a=1/b=x%3Ay`` -> {'a': '1', 'b': 'x:y'}; the Hive null directory is None. Timestamp columns of
    ``schema`` get Delta's forms (:func:`delta_timestamp_partition_value`): a UTC-adjusted column the
    ISO-8601 instant in UTC (``2024-01-01T10:00:00.000000Z``), a timestamp_ntz the wall-clock text."""
    out: dict[str, Optional[str]] = {}
    if not part_rel:
        return out
    for seg in part_rel.split("/"):
        k, _, v = seg.partition("=")
        name = urllib.parse.unquote(k)
        value: Optional[str] = None if v == "__HIVE_DEFAULT_PARTITION__" else urllib.parse.unquote(v)
        if value is not None and schema is not None and name in schema.names and pa.types.is_timestamp(schema.field(name).type):
            value = delta_timestamp_partition_value(value, utc=schema.field(name).type.tz is not None, column=name)
        out[name] = value
    return out


def delta_timestamp_partition_value(text: str, *, utc: bool, column: str = "") -> str:
    """A timestamp partition folder's text as the Delta partition value.

    ``text`` is what the writer put in the folder name: Spark's ``yyyy-MM-dd HH:mm:ss[.f]`` (the native path
    makes Spark write it in UTC) or Python's isoformat (``2024-01-01T05:00:00-05:00``, the Python path). A
    UTC-adjusted column (Delta ``timestamp``) gets the instant in UTC as Delta's own writer stores it,
    ``2024-01-01T10:00:00.000000Z`` (a text without an offset is taken as UTC); a ``timestamp_ntz`` column
    gets ``2024-01-01 05:00:00.000000`` (no zone: none applies). Readers take an offset-less ``timestamp``
    value as UTC, so writing the session's local text would shift every row of the partition."""
    try:
        v = _dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise TwoPhaseError(f"twophase-delta: the partition folder value {text!r} of timestamp column {column!r} "
                            "is not a timestamp Delta can store (years 1-9999)") from None
    if utc:
        if v.tzinfo is not None:
            v = v.astimezone(_dt.timezone.utc).replace(tzinfo=None)
        return _iso_micros(v, "T") + "Z"
    return _iso_micros(v.replace(tzinfo=None), " ")


def _iso_micros(v: _dt.datetime, sep: str) -> str:
    """``v`` (naive) as ``YYYY-MM-DD<sep>HH:MM:SS.ffffff`` with a 4-digit year (strftime's %Y is not padded)."""
    return (f"{v.year:04d}-{v.month:02d}-{v.day:02d}{sep}{v.hour:02d}:{v.minute:02d}:{v.second:02d}"
            f".{v.microsecond:06d}")


#: Delta's default prefix length of string statistics (``delta.dataSkippingStringPrefixLength``)
STRING_PREFIX = 32


def _min_string(v: str) -> str:
    """A lower bound of ``v`` no longer than :data:`STRING_PREFIX` characters (its prefix)."""
    return v[:STRING_PREFIX]


def _max_string(v: str) -> Optional[str]:
    """An upper bound of ``v`` no longer than :data:`STRING_PREFIX` + 1 characters, or None when there is
    none that short. A truncated prefix is smaller than ``v``; the prefix with its last character incremented
    (code point order, which UTF-8 byte order keeps) is larger than every string starting with that prefix."""
    if len(v) <= STRING_PREFIX:
        return v
    prefix = v[:STRING_PREFIX]
    for i in range(len(prefix) - 1, -1, -1):
        c = ord(prefix[i]) + 1
        if 0xD800 <= c <= 0xDFFF:  # skip the surrogate range, which is not a character
            c = 0xE000
        if c <= 0x10FFFF:
            return prefix[:i] + chr(c)
    return None


_UNIT_US = {"s": 1_000_000, "ms": 1000, "us": 1, "ns": None}
_EPOCH = _dt.datetime(1970, 1, 1)


def _timestamp_json(us: int, *, upper: bool, utc: bool) -> Optional[str]:
    """Delta's timestamp statistic of ``us`` microseconds since the epoch (milliseconds, ``Z`` for UTC-adjusted
    columns), or None when it is outside what the format can show (years 1-9999). Statistics have millisecond
    precision: a maximum with microseconds is rounded UP to the next millisecond, so it still bounds every
    value (rounding down would let readers skip a file that holds a matching row); a minimum is rounded down."""
    ms = -(-us // 1000) if upper else us // 1000
    try:
        v = _EPOCH + _dt.timedelta(milliseconds=ms)
    except OverflowError:
        return None
    return _iso_micros(v, "T")[:-3] + ("Z" if utc else "")  # 4-digit years, as Delta writes them


class _Stats:
    """Delta file statistics: numRecords, nullCount of every leaf column, and minValues / maxValues for the
    types Delta skips data on: integers, floats (none when the column holds NaN or infinity), dates,
    timestamps (milliseconds; the maximum rounded up) and strings (a 32-character prefix for the minimum,
    an upper bound of at most 33 characters for the maximum).

    Invariant: for every column with statistics, ``min <= value <= max`` for every non-null value of the
    file, in Delta's order. A reader may skip the file on that basis, so a bound that is too tight loses rows
    from query results. Each bound is therefore rounded outward; where no such bound exists the column has
    no min/max. Decimals, booleans, binary and nested columns get none.
    """

    def __init__(self, schema: pa.Schema) -> None:
        self.num_records = 0
        self.null_count = {f.name: 0 for f in schema if not pa.types.is_nested(f.type)}  # Delta: leaves only
        self.min: dict[str, Any] = {}
        self.max: dict[str, Any] = {}
        self._skip: set[str] = set()
        self._types = {f.name: f.type for f in schema}
        self._tracked = [f.name for f in schema if pa.types.is_integer(f.type) or pa.types.is_floating(f.type)
                         or pa.types.is_date(f.type) or pa.types.is_timestamp(f.type)
                         or pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]

    def update(self, batch: pa.RecordBatch) -> None:
        import pyarrow.compute as pc
        self.num_records += batch.num_rows
        for name in self.null_count:
            self.null_count[name] += batch.column(name).null_count
        for name in self._tracked:
            if name in self._skip:
                continue
            col = batch.column(name)
            if pa.types.is_timestamp(col.type):  # as integers: Python datetimes overflow at years 1 and 9999
                scale = _UNIT_US[col.type.unit]
                ints = col.cast(pa.int64())
                mm = pc.min_max(ints).as_py()
                if mm["min"] is None:
                    continue
                lo, hi = ((mm["min"] * scale, mm["max"] * scale) if scale is not None
                          else (mm["min"] // 1000, -(-mm["max"] // 1000)))
                self.min[name] = lo if name not in self.min else min(self.min[name], lo)
                self.max[name] = hi if name not in self.max else max(self.max[name], hi)
                continue
            mm = pc.min_max(col).as_py()
            lo, hi = mm["min"], mm["max"]
            if lo is None:
                continue
            if isinstance(lo, float) and (not math.isfinite(lo) or not math.isfinite(hi) or pc.any(pc.is_nan(col)).as_py()):
                self._skip.add(name)
                self.min.pop(name, None)
                self.max.pop(name, None)
                continue
            self.min[name] = lo if name not in self.min else min(self.min[name], lo)
            self.max[name] = hi if name not in self.max else max(self.max[name], hi)

    def _bounds(self) -> tuple[dict[str, Any], dict[str, Any]]:
        lows: dict[str, Any] = {}
        highs: dict[str, Any] = {}
        for name, lo in self.min.items():
            hi = self.max[name]
            t = self._types[name]
            if pa.types.is_timestamp(t):
                low = _timestamp_json(lo, upper=False, utc=t.tz is not None)
                high = _timestamp_json(hi, upper=True, utc=t.tz is not None)
                if low is not None and high is not None:  # else no statistics for the column: still correct
                    lows[name], highs[name] = low, high
            elif isinstance(lo, str):
                lows[name] = _min_string(lo)
                upper = _max_string(hi)
                if upper is not None:
                    highs[name] = upper
            elif isinstance(lo, _dt.date):
                lows[name], highs[name] = lo.isoformat(), hi.isoformat()
            else:
                lows[name], highs[name] = lo, hi
        return lows, highs

    def to_json(self) -> str:
        lows, highs = self._bounds()
        return json.dumps({"numRecords": self.num_records, "minValues": lows, "maxValues": highs,
                           "nullCount": self.null_count}, separators=(",", ":"))


# --------------------------------------------------------------------------- the sink


@dataclass
class _OpenFile:
    rel: str
    part_rel: str
    stream: Any
    writer: ParquetFormatWriter
    stats: _Stats


class DataFile(TypedDict):
    """One data file of a committable, as the Delta Add action it becomes (``rel`` = ``path``)."""

    path: str
    rel: str
    size: int
    partition_values: dict[str, Optional[str]]
    modification_time: int
    stats: str
    records: int


@dataclass(frozen=True, kw_only=True)
class DeltaCommittable(Committable):
    """A Delta transaction's handle: its data files (future Add actions); a checkpoint commits them in one version."""

    kind: ClassVar[str] = "delta"
    files: list[DataFile] = field(default_factory=list)
    #: the table's requirements the writer enforced (:meth:`TableChecks.to_json`); re-checked at commit
    checks: Optional[dict[str, Any]] = None


class DeltaSink(SinkSpec[DeltaCommittable]):
    """Exactly-once appends to a Delta table: one atomic Delta commit per checkpoint (see module invariants)."""

    #: sweep right after each commit too (invariant 4): after the last batch of a run no recovery comes;
    #: the sweep of a just-committed checkpoint lists only where its files can be (see abort_lingering)
    sweep_after_commit = True
    supports_write_jobs = True
    #: the table may be created after validate_destination, from the first batch's columns (the native path's
    #: check_schema); False: a sink without a schema needs the table to exist
    table_from_batch = False

    def __init__(self, options: DeltaSinkOptions) -> None:
        self.options = options
        self.uri = options.uri
        self.sink_id = options.sink_id or f"delta:{options.uri}"
        self.guarantee = Guarantee.EXACTLY_ONCE
        #: the table's partition columns (the option, or the existing table's when the option is empty)
        self.partition_by: tuple[str, ...] = options.partition_by
        #: what the table requires of every row (NOT NULL, CHECK, generated columns); read with the table's
        #: schema on the driver, else by the first writer (None: not read yet)
        self.checks: Optional[TableChecks] = None
        self.files: Any
        if options.on_s3:
            self.files = _S3Files(options.uri, options.s3, options.part_size)
        elif options.azure is not None:
            url = parse_azure_url(options.uri)
            self.files = AzureFiles(options.azure, url.container, url.prefix, options.part_size)
        else:
            self.files = _LocalFiles(options.uri, self.sink_id)

    @classmethod
    def from_options(cls, raw: Mapping[str, Any], schema: Optional[pa.Schema] = None) -> "DeltaSink":
        return cls(DeltaSinkOptions.from_options(raw, schema))

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "partition_by": self.partition_by, "checks": self.checks}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["options"])
        self.partition_by = tuple(state.get("partition_by", self.options.partition_by))
        self.checks = state.get("checks")

    def table_checks(self, schema: pa.Schema) -> TableChecks:
        """What the table requires of rows of ``schema`` (read once per sink object; none while there is no table)."""
        if self.checks is None:
            dt = self._table()
            self.checks = TableChecks() if dt is None else table_checks(dt, schema)
        return self.checks

    # ---- the table

    def _table(self) -> Any:
        """The DeltaTable, or None if there is none at ``uri`` yet."""
        dl = _deltalake()
        so = self.options.storage_options()
        if not dl.DeltaTable.is_deltatable(self.uri, storage_options=so):
            return None
        try:
            return dl.DeltaTable(self.uri, storage_options=so)
        except Exception as e:  # delta-rs cannot load the table: a reader feature it does not know, a catalog's table
            refused = table_open_error(self.uri, e)
            if refused is None:
                raise
            raise refused from None

    def sync_commit(self, checkpoint_id: Optional[int], since: Optional[int] = None) -> None:
        """Make the table's Delta commit of ``checkpoint_id`` durable (local tables; a store's PUT is durable).

        delta-rs writes ``_delta_log/<version>.json`` as a temp file hard-linked into place, with no fsync:
        after a power loss the version could be gone while twophase's log says COMMITTED, and the batch
        would be lost. This fsyncs the commit files from the newest version back to the one whose app
        transaction for this sink is ``checkpoint_id`` (or older: the table has it through a later one),
        then the ``_delta_log`` directory (the new names). ``None``: only the newest version (a table
        creation or schema change). Data files were fsynced when written (the commit only names them).

        ``since``: the table's version before this process committed ``checkpoint_id``: the versions after it
        are found by probing ``since + 1``, ``since + 2``, ... (a commit per batch, and what other writers
        committed meanwhile), without listing ``_delta_log``, which grows with every batch (invariant 7)."""
        if self.options.on_s3 or self.options.azure is not None:
            return
        log_dir = os.path.join(self.uri, "_delta_log")
        versions: list[int] = []
        if since is not None and checkpoint_id is not None:
            v = since + 1
            while os.path.exists(os.path.join(log_dir, f"{v:020d}.json")):
                versions.append(v)
                v += 1
            versions.reverse()
        if not versions or not self._sync_versions(log_dir, versions, checkpoint_id):
            try:
                names = os.listdir(log_dir)
            except FileNotFoundError:
                return
            versions = sorted((int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit()), reverse=True)
            self._sync_versions(log_dir, versions, checkpoint_id)
        fsync_dir(log_dir)

    def _sync_versions(self, log_dir: str, versions: Sequence[int], checkpoint_id: Optional[int]) -> bool:
        """fsync the commit files ``versions`` (newest first) down to the one holding ``checkpoint_id`` (None:
        the first); False if none of them holds it."""
        for v in versions:
            path = os.path.join(log_dir, f"{v:020d}.json")
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:  # pragma: no cover - log cleanup removed an expired version
                continue
            try:
                os.fsync(fd)
                with os.fdopen(os.dup(fd), "rb") as f:
                    body = f.read() if checkpoint_id is not None else b""
            finally:
                os.close(fd)
            if checkpoint_id is None or self._has_txn(body, checkpoint_id):
                return True
        return False

    def _has_txn(self, commit: bytes, checkpoint_id: int) -> bool:
        """Whether the Delta commit ``commit`` (JSON lines) sets this sink's app transaction to ``<= checkpoint_id``
        (the scan back from the newest version stops there: that version or a later one holds the checkpoint)."""
        if b'"txn"' not in commit:
            return False
        for line in commit.splitlines():
            if b'"txn"' not in line:
                continue
            with contextlib.suppress(ValueError):
                txn = json.loads(line).get("txn") or {}
                if txn.get("appId") == self.sink_id and int(txn.get("version", -1)) <= checkpoint_id:
                    return True
        return False

    def transaction_version(self) -> Optional[int]:
        """The table's app transaction version for this sink id (the last checkpoint committed to it)."""
        dt = self._table()
        return None if dt is None else dt.transaction_version(self.sink_id)

    # ---- driver-side set-up (invariant 5)

    def validate_destination(self) -> None:
        """Check the bucket or container, then create the table or check the stream's schema against it; refuse
        a table whose features twophase-delta does not write (:func:`~twophase.sinks._delta_checks.check_protocol`)
        before anything is written. Without a schema (``DeltaSink.from_options(options)``) the table must exist."""
        if self.options.on_s3:
            check_bucket(self.files.client, self.files.bucket, sink="twophase-delta", url=self.uri,
                         config=self.files.config)
        elif self.options.azure is not None:
            check_container(self.options.azure, self.files.container_name, self.files.prefix, sink="twophase-delta",
                            url=self.uri)
        else:
            try:
                makedirs_durable(self.uri)
            except OSError as e:
                raise ConfigurationError(f"twophase-delta: option 'path'={self.uri!r} cannot be created: {e.strerror}") from e
        if self.options.schema is not None:
            self.ensure_schema(self.options.schema)
            return
        dt = self._table()
        if dt is None and self.table_from_batch:
            return
        if dt is None:
            raise ConfigurationError(
                f"twophase-delta: the table {self.uri} does not exist and the sink has no schema to create it with: "
                "build the sink with the stream's Arrow schema, DeltaSink.from_options(options, schema) (what "
                "format('twophase-delta') does; twophase.spark.foreach_batch gives it the batch's schema), or create "
                "the table first")
        check_table_protocol(dt)

    def adopt_schema(self, schema: pa.Schema) -> None:
        """Give a sink built without a schema (``DeltaSink.from_options(options)``) the stream's ``schema``, as
        format('twophase-delta') builds its sink: :meth:`validate_destination` then creates the table from it, or
        checks it against the table on the driver. A sink that has a schema keeps it."""
        if self.options.schema is None:
            check_partition_columns("twophase-delta", self.options.partition_by, schema)
            self.options = dataclasses.replace(self.options, schema=schema)

    def ensure_schema(self, schema: pa.Schema) -> None:
        """Create the table for ``schema`` or check ``schema`` against it (invariant 5)."""
        dl = _deltalake()
        dt = self._table()
        nullable = pa.schema([f.with_nullable(True) for f in schema])
        if dt is None:
            dl.DeltaTable.create(self.uri, nullable, mode="ignore", partition_by=list(self.partition_by) or None,
                                 storage_options=self.options.storage_options(),
                                 commit_properties=dl.CommitProperties(custom_metadata={"twophase.sink_id": self.sink_id}))
            _log.info("delta_table_created", sink_id=self.sink_id, uri=self.uri, partition_by=list(self.partition_by))
            self.sync_commit(None)
            dt = self._table()
        check_table_protocol(dt)  # before anything is written to the table, a schema change included
        table_parts = tuple(dt.metadata().partition_columns)
        if self.options.partition_by and tuple(self.options.partition_by) != table_parts:
            raise ConfigurationError(f"twophase-delta: option 'partitionBy'={','.join(self.options.partition_by)} but the "
                                     f"table {self.uri} is partitioned by {list(table_parts) or 'nothing'}; use the "
                                     "table's partition columns")
        self.partition_by = table_parts
        missing_parts = [c for c in table_parts if c not in schema.names]
        if missing_parts:
            raise ConfigurationError(f"twophase-delta: the table {self.uri} is partitioned by {missing_parts}, which the "
                                     "stream does not have")
        table_types = {f.name: f.type for f in dt.schema().fields}
        new_fields, added = [], []
        for f in dl.Schema.from_arrow(nullable).fields:
            if f.name not in table_types:
                new_fields.append(f)
                added.append(f.name)
                continue
            grown = _nested_additions(json.loads(table_types[f.name].to_json()), json.loads(f.type.to_json()), f.name)
            if grown is None:
                raise ConfigurationError(f"twophase-delta: column {f.name!r} is {f.type} in the stream but "
                                         f"{table_types[f.name]} in the table {self.uri}; cast it in the query "
                                         "(mergeSchema adds columns and struct fields, it does not change types "
                                         "or drop fields)")
            if grown:
                new_fields.append(f)  # Delta merges a struct column's new fields into the existing column
                added.extend(grown)
        if new_fields and not self.options.merge_schema:
            raise ConfigurationError(f"twophase-delta: the stream has columns or struct fields {added} that the "
                                     f"table {self.uri} does not have; add .option('mergeSchema', 'true') to add them, "
                                     "or select the table's columns")
        if new_fields:
            dt.alter.add_columns(new_fields)
            self.sync_commit(None)
            _log.info("delta_schema_merged", sink_id=self.sink_id, uri=self.uri, added=added)
            dt = self._table()
        self.checks = table_checks(dt, schema)  # refuses what cannot be written correctly, before any write

    def transaction_log(self) -> TransactionLog:
        loc = self.options.log_location or f"{self.uri}/{internal_rel(self.sink_id)}/log"
        return TransactionLog(open_log_store(loc, self.options.s3, self.options.azure), self.sink_id,
                              retain=self.options.log_retain)

    def create_writer(self, context: TransactionContext) -> "DeltaWriter":
        return DeltaWriter(self, context)

    def create_committer(self) -> "DeltaCommitter":
        return DeltaCommitter(self)


class DeltaWriter(FileLikeWriter[DeltaCommittable]):
    """Task side: Parquet data files straight under the table root, invisible until a Delta commit adds them."""

    def __init__(self, sink: DeltaSink, context: TransactionContext) -> None:
        super().__init__(context, partition_by=sink.partition_by, max_file_size=sink.options.target_file_size,
                         upload_threads=2)
        self.sink = sink

    def write(self, batch: pa.RecordBatch) -> int:
        """Refuse a batch that breaks the table's NOT NULL, CHECK or generated columns before writing any of it."""
        self.sink.table_checks(batch.schema).enforce(batch)
        return super().write(batch)

    def open_file(self, part_rel: str, schema: pa.Schema) -> _OpenFile:
        name = self.next_name("parquet")
        rel = f"{part_rel}/{name}" if part_rel else name
        assert self.pool is not None
        stream = self.sink.files.open(rel, self.pool)
        compression = "none" if self.sink.options.compression == "none" else self.sink.options.compression
        return _OpenFile(rel, part_rel, stream, ParquetFormatWriter(stream, schema, compression), _Stats(schema))

    def observe(self, f: _OpenFile, piece: pa.RecordBatch) -> None:
        f.stats.update(piece)

    def finish_file(self, f: _OpenFile) -> dict[str, Any]:
        f.writer.close()
        size = self.sink.files.finish(f.stream)
        return {"path": f.rel, "rel": f.rel, "size": size,
                "partition_values": _partition_values(f.part_rel, self.sink.options.schema),
                "modification_time": int(time.time() * 1000), "stats": f.stats.to_json(),
                "records": f.stats.num_records}

    def committable(self) -> DeltaCommittable:
        c = self.context
        enforced = self.sink.checks.to_json() if self.sink.checks is not None else None
        return DeltaCommittable(checkpoint_id=c.checkpoint_id, task_id=c.task_id, attempt_uid=c.attempt_uid,
                                records=self.records, files=list(self.finished),  # type: ignore[arg-type]
                                checks=enforced)

    def discard_open(self, f: _OpenFile) -> None:
        self.sink.files.discard(f.stream, f.rel)

    def discard_finished(self, entry: dict[str, Any]) -> None:
        self.sink.files.delete(entry["rel"])


def _record_files(rec: Any) -> set[str]:
    """The data files a checkpoint record's handles name: a Spark task's handle lists its ``files``; the embedded
    runtime's task handle (:class:`twophase.runtime.committer.JobCommitter`) wraps the transactions it carries
    (``{"task", "sink", "txns": [handle, ...]}``), each listing its ``files``."""
    out: set[str] = set()
    for h in rec.handles.values():
        for inner in [h, *(h.get("txns") or ())]:
            out.update(f["rel"] for f in inner.get("files") or ())
    return out


class DeltaCommitter(SinkCommitter[DeltaCommittable]):
    """Driver side: ONE Delta commit per checkpoint (invariants 1, 2), file deletes (3), the sweep (4).

    The sweep needs the sink's log to PROVE a file uncommitted (the record of its checkpoint is final
    and does not list it): it reads records and keeps its watermark in the log's store, but never
    writes a checkpoint's state (the coordinator alone does).
    """

    committable_type = DeltaCommittable

    def __init__(self, sink: DeltaSink) -> None:
        self.sink = sink
        self.sink_id = sink.sink_id
        self.uri = sink.uri
        self.files = sink.files
        self.options = sink.options
        self._log: Optional[TransactionLog] = None
        self._parts: Optional[tuple[str, ...]] = None

    def _table(self) -> Any:
        return self.sink._table()

    def transaction_log(self) -> TransactionLog:
        if self._log is None:
            self._log = self.sink.transaction_log()
        return self._log

    def commit_checkpoint(self, checkpoint_id: int, handles: Sequence[DeltaCommittable], *,
                          recovering: bool = False) -> list[CommitResult[DeltaCommittable]]:
        """ONE Delta commit for the whole checkpoint, skipped if the table already has it (invariants 1, 2).

        A commit another writer made after this one read the table (an UPDATE, DELETE or MERGE by delta-spark)
        makes delta-rs refuse the append ("a concurrent transaction deleted data this operation read": it counts
        the snapshot as read); the append reads nothing, so the table is read again, and with it every check of
        this method (the checkpoint not in the table yet, its files there, the table's requirements), and the
        commit made again, up to :data:`COMMIT_CONFLICT_RETRIES` times. A schema or protocol change is raised."""
        _deltalake()  # a clear MissingDependencyError if deltalake is missing
        from deltalake.transaction import AddAction, CommitProperties, Transaction
        files = [f for h in handles for f in h.files]
        for attempt in range(COMMIT_CONFLICT_RETRIES + 1):
            dt = self._table()
            if dt is None:
                raise TwoPhaseError(f"twophase-delta: the table {self.uri} is gone; checkpoint {checkpoint_id} cannot "
                                    "be committed")
            done = dt.transaction_version(self.sink_id)
            if (done is not None and done >= checkpoint_id) or self._in_history(dt, checkpoint_id, done):
                _log.info("delta_already_committed", sink_id=self.sink_id, checkpoint_id=checkpoint_id, table_txn=done)
                self.sink.sync_commit(checkpoint_id)  # a crashed predecessor may have committed it without fsync
                return [CommitResult(h, CommitStatus.ALREADY_COMMITTED) for h in handles]
            if not files:  # nothing to add: an empty batch makes no Delta version
                return [CommitResult(h, CommitStatus.COMMITTED) for h in handles]
            lost = self._missing(handles)
            if lost:  # never add a file that is gone: the table would reference it forever (invariant 2)
                return [CommitResult(h, CommitStatus.LOST, f"twophase-delta: checkpoint {checkpoint_id} task "
                                     f"{h.task_id}: data files {missing[:5]} are gone (deleted or vacuumed) and were "
                                     "never committed")
                        if missing else CommitResult(h, CommitStatus.COMMITTED) for h, missing in lost]
            self._recheck(checkpoint_id, handles, dt)
            actions = [AddAction(f["path"], int(f["size"]), dict(f["partition_values"]), int(f["modification_time"]),
                                 True, f["stats"]) for f in files]
            props = CommitProperties(
                custom_metadata={"twophase.sink_id": self.sink_id, "twophase.checkpoint_id": checkpoint_id},
                app_transactions=[Transaction(self.sink_id, checkpoint_id, int(time.time() * 1000))])
            before = dt.version()
            _commit_gate(checkpoint_id, before)
            try:
                dt.create_write_transaction(actions, "append", dt.schema(),
                                            partition_by=list(dt.metadata().partition_columns), commit_properties=props)
                break
            except Exception as e:  # deltalake's CommitFailedError (its module differs between releases)
                if attempt >= COMMIT_CONFLICT_RETRIES or not _blind_append_conflict(e):
                    raise
                _log.warning("delta_commit_conflict_retried", sink_id=self.sink_id, checkpoint_id=checkpoint_id,
                             read_version=before, attempt=attempt + 1, error=str(e).split("\n")[0],
                             meaning="another writer (UPDATE, DELETE, MERGE) committed after this commit read the "
                             "table; twophase's append reads nothing, so it reads the table again and commits after it")
                time.sleep(min(0.05 * 2 ** attempt, 1.0))
        self.sink.sync_commit(checkpoint_id, since=before)  # durable before the coordinator records COMMITTED
        _log.info("delta_committed", sink_id=self.sink_id, checkpoint_id=checkpoint_id, files=len(files),
                  records=sum(int(f.get("records", 0)) for f in files), recovering=recovering)
        faults.maybe_crash("mid_commit", checkpoint_id)
        return [CommitResult(h, CommitStatus.COMMITTED) for h in handles]

    def _in_history(self, dt: Any, checkpoint_id: int, done: Optional[int]) -> bool:
        """Whether the table has a commit of ``checkpoint_id`` that its app transaction no longer shows: only on a
        table with ``delta.setTransactionRetentionDuration``, which expires app transactions (delta-rs then drops
        them from the snapshot, and an older checkpoint's files, compacted away by OPTIMIZE, would be added
        again). Reads the history newest first (16, then 4x more entries) and stops at this sink's commit of an
        older checkpoint: the commits since this sink's previous one, not the table. A history that no longer
        reaches the checkpoint (its log entries cleaned up) answers no."""
        if "delta.setTransactionRetentionDuration" not in (dt.metadata().configuration or {}):
            return False
        limit = 16
        while True:
            entries = dt.history(limit)
            for e in entries:
                if e.get("twophase.sink_id") != self.sink_id or e.get("twophase.checkpoint_id") is None:
                    continue
                cid = int(e["twophase.checkpoint_id"])
                if cid == checkpoint_id:
                    _log.warning("delta_commit_found_in_history", sink_id=self.sink_id, checkpoint_id=checkpoint_id,
                                 table_txn=done, version=e.get("version"), meaning="the table's app transaction for "
                                 "this sink expired (delta.setTransactionRetentionDuration); the commit is not made again")
                    return True
                if cid < checkpoint_id:
                    return False
            if len(entries) < limit:
                return False
            limit *= 4

    def _recheck(self, checkpoint_id: int, handles: Sequence[DeltaCommittable], dt: Any) -> None:
        """Invariant 6 at commit: the rows of ``handles`` against every requirement the table gained after their
        writers checked them (a constraint added while the checkpoint was in flight). Reads only the files of
        handles with such requirements (none in the common case). Rows that break one raise
        ConstraintViolationError; nothing is committed, and the checkpoint stays COMPLETED (Delta refuses such
        a commit; twophase does not drop decided data on its own)."""
        import pyarrow.parquet as pq
        schema = pa.schema(dt.schema().to_arrow())
        now = table_checks(dt, schema)
        for h in handles:
            added = now.added_since(h.checks)
            if not added:
                continue
            _log.warning("delta_requirements_rechecked", sink_id=self.sink_id, checkpoint_id=checkpoint_id,
                         task=h.task_id, not_null=list(added.not_null), checks=[n for n, _ in added.checks])
            for f in h.files:
                table = pq.read_table(self.files.reader(f["rel"]))
                for name, value in (f.get("partition_values") or {}).items():
                    if name in schema.names and name not in table.column_names:
                        table = table.append_column(name, pa.array([value] * table.num_rows, pa.string())
                                                    .cast(schema.field(name).type))
                try:
                    for batch in table.to_batches():
                        added.enforce(batch)
                except ConstraintViolationError as e:
                    raise ConstraintViolationError(
                        f"{e} -- checkpoint {checkpoint_id} (task {h.task_id}) was decided before the table gained "
                        "this requirement, so its rows were not checked against it when written; they are not "
                        "committed. Either drop the requirement (ALTER TABLE ... DROP CONSTRAINT) and restart the "
                        "query, or record the checkpoint as lost: twophase log resolve "
                        f"{self.transaction_log().location} --sink-id {self.sink_id} --checkpoint {checkpoint_id} "
                        "--accept-loss") from None

    def check_prepared(self, checkpoint_id: int, committables: Sequence[DeltaCommittable]) -> list[str]:
        """Before the decision (invariant 3): each task whose pre-committed data files are already gone.

        A data file no Delta version references yet is fair game for ``VACUUM ... RETAIN 0 HOURS`` (Delta's
        retention check turned off) or any other deletion; found gone here, before the coordinator writes
        the decision, the batch is declined (every handle aborted, ABORTED in the log, a retriable
        CheckpointDeclinedError) and Spark's restart runs it again: nothing is lost. Decided, it could only
        become LOST (a DataLossError an operator ends with ``twophase log resolve --accept-loss``).

        Cost: the batch's own files only, never the table: one stat per file locally, one HEAD per file on
        S3 (one Get Blob Properties on Azure), eight at a time, the same look the commit takes again
        (:meth:`_missing`). Only when a file is missing is the table read, so that a checkpoint the table
        already has (its files since removed by OPTIMIZE and VACUUM) is never declined. A store that cannot
        answer is not asked (logged): the commit still tells committed from lost.

        The window from this check to the Delta commit remains: a file deleted in it is found by the
        commit's own look and the checkpoint, decided, is LOST (DataLossError naming its files)."""
        if not any(h.files for h in committables):
            return []
        try:
            lost = self._missing(committables)
        except TransientSinkError as e:
            _log.warning("delta_prepared_check_skipped", sink_id=self.sink_id, checkpoint_id=checkpoint_id,
                         error=str(e), consequence="decided without it; the commit tells committed from lost")
            return []
        if not lost:
            return []
        dt = self._table()
        done = None if dt is None else dt.transaction_version(self.sink_id)
        if done is not None and done >= checkpoint_id:  # committed already: its files may since be vacuumed
            return []
        if dt is not None and self._in_history(dt, checkpoint_id, done):
            return []
        found = [f"task {h.task_id}: {len(missing)} of its {len(h.files)} pre-committed data files are gone "
                 f"(deleted or vacuumed before the decision, no Delta version references them): {missing[:5]}"
                 for h, missing in lost if missing]
        _log.warning("delta_prepared_files_gone", sink_id=self.sink_id, checkpoint_id=checkpoint_id,
                     files=sum(len(m) for _, m in lost), consequence="the checkpoint is declined before the "
                     "decision (a Spark batch runs again, the runtime fails over, a batch write must be re-run)")
        hint = ("VACUUM deletes files no Delta version references once they are older than its retention: never "
                "VACUUM this table with a retention below the longest batch (RETAIN 0 HOURS needs "
                "spark.databricks.delta.retentionDurationCheck.enabled=false, which is what allows it)")
        return found[:-1] + [f"{found[-1]}; {hint}"]

    def commit(self, committable: DeltaCommittable, *, recovering: bool = False) -> CommitResult[DeltaCommittable]:
        """A Delta checkpoint commits whole: this commits ``committable`` as the only one of its checkpoint."""
        return self.commit_checkpoint(committable.checkpoint_id, [committable], recovering=recovering)[0]

    def _missing(self, handles: Sequence[DeltaCommittable]) -> list[tuple[DeltaCommittable, list[str]]]:
        """``[(handle, its missing files)]`` if any file of ``handles`` is gone, else ``[]`` (one stat or
        HEAD per file, in parallel)."""
        rels = [f["rel"] for h in handles for f in h.files]
        with ThreadPoolExecutor(min(8, len(rels))) as pool:
            present = dict(zip(rels, pool.map(self.files.exists, rels)))
        if all(present.values()):
            return []
        return [(h, [f["rel"] for f in h.files if not present[f["rel"]]]) for h in handles]

    def _committed_files(self, checkpoint_id: int) -> Optional[set[str]]:
        """The data files of this sink's Delta commit of ``checkpoint_id`` (every file the table had at
        that version), ``set()`` if the table has no commit of it, None if it cannot be told (the
        version's log entry is gone)."""
        dt = self._table()
        if dt is None:
            return set()
        done = dt.transaction_version(self.sink_id)
        if done is None or done < checkpoint_id:
            return set()
        for entry in dt.history():
            if entry.get("twophase.sink_id") == self.sink_id and entry.get("twophase.checkpoint_id") == checkpoint_id:
                dl = _deltalake()
                at = dl.DeltaTable(self.uri, version=int(entry["version"]), storage_options=self.options.storage_options())
                paths = pa.table(at.get_add_actions(flatten=True)).column("path").to_pylist()
                return {urllib.parse.unquote(p) for p in paths}
        return None

    def abort(self, committable: DeltaCommittable, *, recovering: bool = False) -> None:
        """Delete the committable's data files that no Delta commit added (invariant 3).

        The coordinator aborts only committables its log does not record as committed, so the common
        abort deletes at once; only when the table already has this checkpoint (a loser attempt of a
        committed checkpoint: a re-run, a speculative copy) does it read that commit's files first and
        keep every file the commit added. If that commit cannot be found, nothing is deleted (logged;
        the sweep, which proves orphans from the log, or VACUUM removes them)."""
        if not committable.files:
            return
        committed = self._committed_files(committable.checkpoint_id)
        if committed is None:
            _log.warning("delta_abort_kept", sink_id=self.sink_id, checkpoint_id=committable.checkpoint_id,
                         files=len(committable.files), why="the table has this checkpoint but its commit is not in "
                         "the history any more; cannot prove these files uncommitted")
            return
        for f in committable.files:
            if f["rel"] not in committed:
                self.files.delete(f["rel"])

    def abort_lingering(self, up_to_checkpoint: int, highest_committed: Optional[int] = None) -> int:
        """Delete this sink's data files of checkpoints in (watermark, up_to] that its log proves were
        never committed (invariant 4).

        A file is deleted only if its name carries this sink's token and the log's record of its
        checkpoint is final and does not list it (ABORTED, or COMMITTED with other files), nor does a later
        COMMITTED record (the embedded runtime commits a transaction of an aborted checkpoint with the
        next one; its task handles wrap the transactions, ``txns``): never a file
        of another sink or query on the same table, and never a file any Delta commit added, whatever
        later commits (OPTIMIZE, DELETE) removed from the snapshot: history and VACUUM keep those.
        A file whose checkpoint record is gone (pruned) cannot be proven orphaned and is kept (logged).

        Cost: the common call is the one right after checkpoint ``n = watermark + 1`` committed (or the
        recovery before the next batch, if that sweep did not happen): it lists only the directories
        that ``n``'s committed Add actions name plus the table root, for ``n``'s own names
        (:meth:`_sweep_committed`). Any other call (several checkpoints not swept, a checkpoint that is
        not COMMITTED) and every ``FULL_SWEEP_EVERY`` checkpoints lists the whole table.
        """
        removed = self.files.abort_uploads(self.sink_id, up_to_checkpoint, self._partition_columns())
        log = self.transaction_log()
        raw = log.store.get(WATERMARK)
        mark = json.loads(raw) if raw else {}
        scanned = int(mark.get("scanned_up_to", -1))  # every checkpoint <= this was swept, scoped or whole
        listed = int(mark.get("listed_up_to", scanned))  # ... and <= this by a whole-table listing
        if up_to_checkpoint <= scanned:
            return removed
        every = max(1, min(FULL_SWEEP_EVERY, self.options.log_retain // 2))
        rec = log.get(up_to_checkpoint) if up_to_checkpoint == scanned + 1 else None
        if rec is not None and rec.state is CheckpointState.COMMITTED and up_to_checkpoint - listed < every:
            n = self._sweep_committed(rec)
            if n is None:
                return removed  # the next sweep (recovery before the next batch, or a restart) tries again
            removed += n
        else:
            removed += self._sweep_listing(log, listed, up_to_checkpoint)
            listed = up_to_checkpoint
        log.store.put(WATERMARK, json.dumps({"scanned_up_to": up_to_checkpoint, "listed_up_to": listed}).encode())
        if removed:
            _log.info("lingering_aborted", sink_id=self.sink_id, up_to=up_to_checkpoint, files=removed)
        return removed

    def _partition_columns(self) -> tuple[str, ...]:
        """The table's partition columns (its metadata), else option partitionBy (no table yet): where the
        sweeps take this sink's names (:func:`~twophase.naming.own_part_rel`). Read once per committer."""
        if getattr(self, "_parts", None) is None:
            dt = self._table()
            if dt is None:
                return tuple(self.sink.options.partition_by)
            self._parts = tuple(dt.metadata().partition_columns)
        return self._parts  # type: ignore[return-value]

    def _sweep_committed(self, rec: Any) -> Optional[int]:
        """Delete the files of COMMITTED checkpoint ``rec`` that its record does not list; None if it failed.

        Only where the checkpoint's files can be: the partition directories its committed Add actions
        name, and the table root (an unpartitioned table). A loser attempt of a task (retry, speculative
        copy, an attempt of a failed run of the same batch) reads the same input as the winner, so its
        rows fall into the same partitions. Names are matched on ``part-<token>-<ckpt>-``, so on S3 each
        directory is one prefix listing that returns this checkpoint's files only. Safe against an
        attempt still writing: the checkpoint is COMMITTED, so none of its attempts' files can ever be
        committed (a late ack is aborted), and the files the record lists are never touched.
        """
        cid = rec.checkpoint_id
        committed = _record_files(rec)
        if isinstance(self.files, _LocalFiles):
            return self._sweep_noted(cid, committed)
        dirs = sorted({rel.rpartition("/")[0] for rel in committed} | {""})
        name_prefix = f"part-{sink_token(self.sink_id)}-{cid:08d}-"
        removed = 0
        try:
            for d in dirs:
                for rel in list(self.files.list_named(d, name_prefix)):
                    if (rel in committed
                            or own_part_checkpoint(rel.rsplit("/", 1)[-1], self.sink_id) != cid):
                        continue
                    self.files.delete(rel)
                    removed += 1
        except Exception as e:  # best effort: the checkpoint is committed; the next sweep retries
            _log.warning("lingering_sweep_failed", sink_id=self.sink_id, checkpoint_id=cid, error=str(e))
            return None
        return removed

    def _sweep_noted(self, cid: int, committed: set[str]) -> Optional[int]:
        """The scoped sweep of COMMITTED checkpoint ``cid`` on a local table (invariant 7): delete the files its
        attempts' name records list that its record does not, then those records. Reads one small folder
        (the checkpoint's attempts) and no directory of the table, whatever the table holds."""
        assert isinstance(self.files, _LocalFiles)
        try:
            rels, paths = self.files.noted(cid)
            removed = 0
            for rel in dict.fromkeys(rels):
                # the sink's layout and this checkpoint's name only: never a committed file, never another's
                if rel in committed or own_part_rel(rel, self.sink_id, self._partition_columns()) != cid:
                    continue
                removed += self.files.unlink(rel)
            self.files.forget(cid, paths)
        except Exception as e:  # best effort: the checkpoint is committed; the next whole listing retries
            _log.warning("lingering_sweep_failed", sink_id=self.sink_id, checkpoint_id=cid, error=str(e))
            return None
        return removed

    def _sweep_listing(self, log: TransactionLog, after: int, up_to: int) -> int:
        """List the whole table; delete own files of checkpoints ``<= up_to`` that final records prove orphaned.

        Checkpoints in (after, up_to] are new to a whole listing; older ones whose records the log still
        keeps (the newest ``log.retain``) are looked at again: a zombie attempt that wrote after the last
        whole listing is caught by this one (invariant 7). Files no final record speaks for are logged
        once, when their checkpoint is new to a whole listing."""
        lo = min(after, max(-1, up_to - log.retain))
        candidates: dict[str, int] = {}
        for rel in self.files.list_data():
            # the sink's layout (its partition columns, in order): never a nested table's (same sink.id) files
            cid = own_part_rel(rel, self.sink_id, self._partition_columns())
            if cid is not None and lo < cid <= up_to:
                candidates[rel] = cid
        records = {cid: log.get(cid) for cid in sorted(set(candidates.values()))}
        # the embedded runtime names a file by the checkpoint its transaction began for, and a transaction
        # whose checkpoint was aborted (expired, cancelled) is carried into and committed by a later one:
        # every COMMITTED record from the lowest candidate's checkpoint up to up_to speaks for the files
        later = {cid: log.get(cid) for cid in range(min(records, default=up_to + 1), up_to + 1) if cid not in records}
        committed = {rel for rec in [*records.values(), *later.values()]
                     if rec is not None and rec.state is CheckpointState.COMMITTED for rel in _record_files(rec)}
        unprovable: list[str] = []
        removed = 0
        for rel, cid in sorted(candidates.items()):
            rec = records[cid]
            if rec is None or rec.state not in (CheckpointState.ABORTED, CheckpointState.COMMITTED):
                if cid > after:
                    unprovable.append(rel)
                continue
            if rel in committed:
                continue
            self.files.delete(rel)
            removed += 1
        if unprovable:
            _log.warning("lingering_kept", sink_id=self.sink_id, files=unprovable[:20], count=len(unprovable),
                         why="no final log record proves these files uncommitted; left for VACUUM")
        if isinstance(self.files, _LocalFiles):
            self.files.forget_up_to(up_to)
        return removed
