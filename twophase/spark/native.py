"""``native_sink(format, ...)``: Spark's own JVM writers produce the data files; twophase decides and commits them.

The Python Data Source path (``format("twophase-file")``) moves every row from the JVM to a Python
worker as Arrow. The native path does not: a ``foreachBatch`` function writes each micro-batch with
``df.write.format(parquet|orc|json|csv)`` (Spark's partitioning, file naming and task commit protocol)
into the sink's PRIVATE staging folder, then the driver lists what Spark wrote and runs the same
two-phase commit as every other twophase sink (the same log, coordinator and committer)::

    q = (df.writeStream
           .foreachBatch(twophase.spark.native_sink("parquet", path="/data/out", partitionBy=["day"],
                                                     checkpointLocation="/data/ck"))
           .option("checkpointLocation", "/data/ck")
           .start())

Per micro-batch (``foreachBatch`` calls the function on the driver with ``(df, batchId)``):

1. prepare: validate, claim the sink's log for ``checkpointLocation`` and the running query's id
   (Spark's ``sql.streaming.queryId``), recover: COMPLETED checkpoints are committed, PENDING ones
   aborted, staging folders of checkpoints up to the highest committed one swept.
2. skip: a batch the log has COMMITTED (or LOST, or pruned below the highest committed id) returns at
   once: Spark re-ran a batch whose own commit-log entry is missing. The Spark write does not run.
3. write: ``df.write...save(<staging>/<batchId>/native-<attempt>)``, in a folder new for this attempt
   (Hadoop's FileOutputCommitter, algorithm 1: only committed task attempts' files are in the folder
   when ``save()`` returns; a failed or speculative attempt's files stay under ``_temporary``).
   Fault point ``after_spark_write``.
4. list: the sink's target (:class:`NativeTarget`) lists the data files, descending exactly into the
   ``<col>=<value>`` folders Spark made (whatever the value: Spark's readers hide ``_x``, ``.x`` and
   ``x._COPYING_`` names, the sink must not); ``_SUCCESS``, ``_temporary`` and Hadoop's ``.crc`` files are
   skipped. The records of the listed files must equal Spark's own count of the rows written (an
   observation on the written frame), else the batch fails before anything is decided. An empty batch
   commits no file (Spark writes one empty file for it). The files are made durable (fsync) and grouped
   per Spark task into committables whose final names carry the sink's token.
5. decide and commit: :meth:`CheckpointCoordinator.complete_batch` with one ack per Spark task (all
   sent by the driver): PENDING, COMPLETED (durable, fault points ``before_complete``,
   ``after_complete``), commit (``mid_commit``), COMMITTED (``after_commit``), sweep.

Invariants (named in tests as ``test_native_invN_*``):

1. A batch the log has committed is never written again: the Spark write does not run (step 2).
2. Nothing Spark writes is visible before its batch is COMPLETED in the log: Spark writes only into
   the sink's staging folder, under a folder per attempt, and only the files listed after ``save()``
   returned are recorded and committed (files of failed or speculative task attempts never are).
3. A crash at any step neither loses nor duplicates a record: before COMPLETED, the attempt is
   abandoned (a PENDING record is aborted at recovery) and Spark re-runs the batch into a new
   folder; the old folder is swept once the batch commits. After COMPLETED, recovery commits it and
   the re-run is skipped (invariant 1).
4. Sweeps remove only the sink's own staging folders (``_twophase/<token>/staging``), never a file
   of another sink or tool.
5. A second query on the same sink is refused (the log's owner and query binding) before Spark
   writes anything; so is a ``checkpointLocation`` that is not the running query's.
6. Options are validated in one place (:func:`native_options`), before any data moves, with errors
   that name the option and the fix.
"""

from __future__ import annotations

import abc
import importlib
import os
import re
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from twophase import faults
from twophase._logging import get_logger
from twophase.coordinator import CheckpointCoordinator
from twophase.errors import ConfigurationError, TwoPhaseError
from twophase.log import TransactionLog
from twophase.log_store import fsync_dir
from twophase.options import Option, parse_bool, parse_list, parse_options, parse_positive_int
from twophase.sink import Ack, Committable, Guarantee, SinkSpec
from twophase.states import CheckpointState

__all__ = ["NativeOptions", "NativeSink", "NativeTarget", "SparkFile", "native_options", "native_sink",
           "list_spark_output", "check_record_count", "keep_written", "NATIVE_TARGETS"]

_log = get_logger(__name__)

#: set by Spark on the stream's thread, which runs the foreachBatch function: the query's persistent id
QUERY_ID_PROPERTY = "sql.streaming.queryId"

#: format -> "module:Class" of its :class:`NativeTarget` (loaded on demand: the core imports no connector)
NATIVE_TARGETS: dict[str, str] = {
    "parquet": "twophase.sinks.native_files:FileNativeTarget",
    "orc": "twophase.sinks.native_files:FileNativeTarget",
    "json": "twophase.sinks.native_files:FileNativeTarget",
    "csv": "twophase.sinks.native_files:FileNativeTarget",
    "delta": "twophase.sinks.native_delta:DeltaNativeTarget",
}

#: Spark's codecs per format (the ones Spark writes without extra libraries); "none" and "uncompressed" agree
COMPRESSIONS: dict[str, tuple[str, ...]] = {
    "parquet": ("snappy", "none", "uncompressed", "gzip", "lz4", "lz4_raw", "zstd"),
    "orc": ("snappy", "none", "uncompressed", "zlib", "lz4", "zstd"),
    "json": ("none", "uncompressed", "bzip2", "deflate", "gzip", "lz4", "snappy", "zstd"),
    "csv": ("none", "uncompressed", "bzip2", "deflate", "gzip", "lz4", "snappy", "zstd"),
    "delta": ("snappy", "none", "uncompressed", "gzip", "lz4", "lz4_raw", "zstd"),
}

_TEXT_WRITER_OPTIONS = ("dateFormat", "timestampFormat", "timestampNTZFormat", "encoding", "lineSep", "timeZone")
#: the options of Spark's own writer that the native path passes through, per format (Spark's names)
SPARK_WRITER_OPTIONS: dict[str, tuple[str, ...]] = {
    "parquet": (),
    "orc": (),
    "json": (*_TEXT_WRITER_OPTIONS, "ignoreNullFields"),
    "csv": (*_TEXT_WRITER_OPTIONS, "sep", "delimiter", "quote", "escape", "escapeQuotes", "quoteAll", "header",
            "nullValue", "emptyValue", "ignoreLeadingWhiteSpace", "ignoreTrailingWhiteSpace",
            "charToEscapeQuoteEscaping"),
    "delta": (),
}
#: Hadoop settings of a format's writer, passed through by prefix (e.g. parquet.block.size)
SPARK_WRITER_PREFIXES: dict[str, tuple[str, ...]] = {"parquet": ("parquet.",), "orc": ("orc.",), "delta": ("parquet.",)}

#: Hadoop settings every native write gets: the commit algorithm whose job commit moves only committed task
#: outputs into the folder (2 moves task output at task commit), and no _SUCCESS marker (nothing reads it)
COMMITTER_SETTINGS: dict[str, str] = {
    "mapreduce.fileoutputcommitter.algorithm.version": "1",
    "mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
}


@dataclass(frozen=True)
class NativeOptions:
    """Validated options of a native sink (see :func:`native_options`)."""

    format: str
    path: str
    #: the query's checkpoint location: the owner of the sink's log
    owner: str
    partition_by: tuple[str, ...] = ()
    #: options for Spark's writer (``df.write.option``), Spark's names, string values
    writer_options: Mapping[str, str] = field(default_factory=dict)
    sink_id: Optional[str] = None
    log_location: Optional[str] = None
    log_retain: int = 100
    #: Delta: add new columns of the stream to the table's schema
    merge_schema: bool = False
    #: s3a:// (experimental, :mod:`twophase.sinks.native_s3a`): twophase's S3 client options (``s3.*``)
    s3_options: Mapping[str, str] = field(default_factory=dict, repr=False)  # secrets: never in a repr


def _as_option_value(v: Any) -> Any:
    """Python values as Spark's string options: lists comma-joined (partitionBy), booleans lower-case."""
    if isinstance(v, (list, tuple)):
        return ",".join(str(x) for x in v)
    if isinstance(v, bool):
        return "true" if v else "false"
    return v if v is None else str(v)


def native_options(fmt: str, raw: Mapping[str, Any]) -> NativeOptions:
    """Validate a native sink's format and options in one place (invariant 6); raise ConfigurationError naming
    the option and the fix. Options of Spark's writer are checked by name (an unknown one is refused: Spark
    would ignore it silently), ``compression`` against the format's codecs; Spark checks the other values
    when the first batch is planned, on the driver, before any task runs."""
    fmt = str(fmt).strip().lower()
    if fmt not in NATIVE_TARGETS:
        raise ConfigurationError(f"native_sink: format {fmt!r} is not supported; use one of "
                                 f"{', '.join(NATIVE_TARGETS)} (Kafka and S3 without Hadoop stay on "
                                 "format('twophase-kafka') / format('twophase-s3'))")
    what = f"native_sink({fmt!r})"
    declared: list[Option[Any]] = [
        Option("path", str, required=True, help="the output directory (a table for delta): path='/data/out'"),
        Option("partitionBy", parse_list, (), help="partition columns: partitionBy=['a', 'b'] or 'a,b'"),
        Option("compression", str, help=f"one of {', '.join(COMPRESSIONS[fmt])}"),
        Option("maxRecordsPerFile", parse_positive_int, help="roll to a new file after this many records"),
        *(Option(k, str) for k in SPARK_WRITER_OPTIONS[fmt]),
    ]
    if fmt == "delta":
        declared.append(Option("mergeSchema", parse_bool, False, help="add new columns of the stream to the table"))
    given = {k: _as_option_value(v) for k, v in raw.items() if v is not None}
    s3a = str(given.get("path") or "").lower().startswith("s3a://") and _s3a_enabled()
    if s3a:  # experimental: twophase's S3 client options reach the bucket from the driver
        from twophase.log_s3 import S3_CLIENT_OPTIONS
        declared.extend(S3_CLIENT_OPTIONS)
    o = parse_options(given, declared, sink=what, prefixes=SPARK_WRITER_PREFIXES.get(fmt, ()))
    owner = o.get("checkpointlocation")
    if not owner:
        raise ConfigurationError(
            f"{what}: option 'checkpointLocation' is required: give the query's checkpoint location, the same as "
            "writeStream.option('checkpointLocation', ...); it identifies the query that owns the sink")
    if Guarantee.parse(o["guarantee"]) is not Guarantee.EXACTLY_ONCE:
        raise ConfigurationError(
            f"{what}: option 'guarantee'={o['guarantee']!r}: the native path is exactly-once only; for at-least-once "
            f"writes use Spark's own sink, writeStream.format({fmt!r})")
    path = str(o["path"])
    scheme = path.split("://", 1)[0].lower() if "://" in path else ""
    if scheme and scheme != "file" and not s3a:
        raise ConfigurationError(
            f"{what}: option 'path'={path!r} is a {scheme}:// URL; the native path commits on a local or mounted "
            "shared filesystem (hard links for files, a local Delta table). For S3 use format('twophase-s3') or "
            "format('twophase-delta') (Python writers, no Hadoop jars needed), for Azure (abfss://, az://) "
            "format('twophase-delta'); mount other stores on every node")
    writer: dict[str, str] = {}
    if o["compression"] is not None:
        codec = str(o["compression"]).strip().lower()
        if codec not in COMPRESSIONS[fmt]:
            raise ConfigurationError(f"{what}: option 'compression'={codec!r} does not apply to {fmt}; use one of "
                                     f"{', '.join(COMPRESSIONS[fmt])}")
        writer["compression"] = codec
    if o["maxRecordsPerFile"] is not None:
        writer["maxRecordsPerFile"] = str(o["maxRecordsPerFile"])
    for k in SPARK_WRITER_OPTIONS[fmt]:
        if o.get(k) is not None:
            writer[k] = str(o[k])
    prefixes = SPARK_WRITER_PREFIXES.get(fmt, ())
    for k, v in o.items():
        if prefixes and k.startswith(prefixes):
            writer[k] = str(v)
    return NativeOptions(format=fmt, path=str(o["path"]), owner=str(owner), partition_by=tuple(o["partitionBy"]),
                         writer_options=writer, sink_id=o["sink.id"], log_location=o["log.location"],
                         log_retain=int(o["log.retain"]), merge_schema=bool(o.get("mergeSchema") or False),
                         s3_options={k: str(v) for k, v in given.items() if s3a and k.lower().startswith("s3.")})


def _s3a_enabled() -> bool:
    """The native path on s3a:// is experimental: reachable only with TWOPHASE_EXPERIMENTAL_S3A=1."""
    return os.environ.get("TWOPHASE_EXPERIMENTAL_S3A", "") == "1"


# --------------------------------------------------------------------------- what Spark wrote

#: Spark's data file names: part-<task:05d>-<job uuid>[_<bucket>](.|-)c<file:03d>[.<codec>].<ext>
#: (Spark 4 writes ``-c000``, earlier versions ``.c000``)
_SPARK_PART = re.compile(r"^part-(\d{5,})-.*[.-]c(\d{3,})(?:\.(.+))?$")
_SPARK_TASK = re.compile(r"^part-(\d+)-")


@dataclass(frozen=True)
class SparkFile:
    """One data file Spark's writer left in an attempt folder."""

    #: relative to the attempt folder, with '/' (``a=1/part-00000-….c000.snappy.parquet``)
    rel: str
    #: the partition folders (``a=1/b=x``; ``""`` unpartitioned)
    dir_rel: str
    #: the Spark task (partition) that wrote it, as Spark numbered it
    task: str
    #: the extension Spark gave it (``snappy.parquet``, ``json.gz``), lower-case letters, digits and dots
    ext: str


def _spark_name(name: str) -> tuple[str, str]:
    """``(task, ext)`` of a data file name Spark's writer chose."""
    m = _SPARK_PART.match(name)
    if m:
        task, ext = m.group(1), m.group(3) or "data"
    else:
        t = _SPARK_TASK.match(name)
        task, ext = (t.group(1) if t else "0"), (name.split(".", 1)[1] if "." in name else "data")
    return str(int(task)), re.sub(r"[^a-z0-9.]", "", ext.lower()).strip(".") or "data"


def _checksum_or_marker(name: str) -> bool:
    """What Hadoop's writer adds beside the data files: ``.<file>.crc`` checksums, the ``_SUCCESS`` marker."""
    return (name.startswith(".") and name.endswith(".crc")) or name in ("_SUCCESS", "_SUCCESS.crc")


#: the characters Spark escapes in partition folder names (as %XX), besides control characters
_PATH_ESCAPE = frozenset('"#%\'*/:=?\\\x7f{[]^')


def partition_folder_prefix(column: str) -> str:
    """The start of the folder names Spark's writer makes for partition column ``column`` (``<col>=``): the
    name escaped as Spark escapes path names (``ExternalCatalogUtils.escapePathName``)."""
    return "".join(f"%{ord(c):02X}" if c in _PATH_ESCAPE or ord(c) < 0x20 else c for c in column) + "="


def list_spark_output(attempt_dir: str, partition_by: Sequence[str] = ()) -> list[SparkFile]:
    """The data files of a finished Spark write in ``attempt_dir``, in a stable order (invariant 2).

    Descends exactly into the partition folders Spark makes, ``<col>=<value>`` for each of ``partition_by``
    in order, WHATEVER the value (a value starting with ``_`` or ``.`` or ending in ``._COPYING_``, a column
    named ``.p``: Spark's readers hide such folders, but they hold rows of the batch). Skipped: the
    ``_temporary`` folder at the top (where failed and speculative attempts write: never committed by
    Spark), Hadoop's ``.crc`` checksums and the ``_SUCCESS`` marker. Anything else where Spark puts no
    such thing (a folder that is not the next ``<col>=``, a folder among the data files) is refused: it
    cannot be placed, and skipping it could drop rows.
    """
    prefixes = [partition_folder_prefix(c) for c in partition_by]
    out: list[SparkFile] = []

    def walk(path: str, rel_dir: str, depth: int) -> None:
        with os.scandir(path) as it:
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:
            is_dir = e.is_dir(follow_symlinks=False)
            if depth == 0 and e.name == "_temporary" and is_dir:
                continue
            if not is_dir and _checksum_or_marker(e.name):
                continue
            rel = f"{rel_dir}/{e.name}" if rel_dir else e.name
            if depth < len(prefixes):
                if is_dir and e.name.startswith(prefixes[depth]) and len(e.name) > len(prefixes[depth]):
                    walk(e.path, rel, depth + 1)
                    continue
                raise TwoPhaseError(f"native_sink: Spark's write left {rel!r} in {attempt_dir} where only partition "
                                    f"folders {prefixes[depth]}<value> belong (partitionBy={list(partition_by)}); "
                                    "the batch is not committed")
            if is_dir:
                raise TwoPhaseError(f"native_sink: Spark's write left a folder {rel!r} among the data files in "
                                    f"{attempt_dir} (partitionBy={list(partition_by)}); the batch is not committed")
            task, ext = _spark_name(e.name)
            out.append(SparkFile(rel, rel_dir, task, ext))

    walk(attempt_dir, "", 0)
    return out


def check_record_count(what: str, batch_id: int, listed: int, exact: bool, expected: Optional[int]) -> None:
    """Compare the records of the listed files with Spark's own count of the rows the write took
    (``expected``, from an observation on the written frame; None: not known). A mismatch with exact
    per-file counts (Parquet and ORC footers, JSON lines) fails the batch before anything is decided:
    committing would drop (or add) rows silently. Approximate counts (CSV) only log it."""
    if expected is None or listed == expected:
        return
    if exact:
        raise TwoPhaseError(f"{what}: batch {batch_id}: Spark wrote {expected} rows but the files listed in its "
                            f"output hold {listed}; the batch is not committed (a file or partition folder was "
                            "missed or added): report this with the output folder's listing")
    _log.warning("native_record_count_differs", sink=what, checkpoint_id=batch_id, spark_rows=expected,
                 counted=listed, why="records counted from the files are approximate for this format")


def keep_written(what: str, batch_id: int, files: Sequence[SparkFile], measured: Sequence[tuple[int, Optional[int]]],
                 *, exact: bool, expected: Optional[int]) -> list[tuple[SparkFile, int, int]]:
    """``(file, bytes, records)`` of the files to commit, after :func:`check_record_count` (records None: the
    format's files could not be counted; then no check, and the file counts 0). Files of 0 records are
    dropped where counts are exact, and every file when Spark counted 0 rows: Spark writes one empty
    file (a schema-only Parquet, a CSV header) for an empty batch, which must commit nothing (a Delta
    table gets no version for it)."""
    counted = all(r is not None for _, r in measured)
    check_record_count(what, batch_id, sum(r or 0 for _, r in measured), exact and counted,
                       expected if counted else None)
    if expected == 0:
        return []
    return [(f, size, int(r or 0)) for f, (size, r) in zip(files, measured) if not (exact and r == 0)]


def make_durable(attempt_dir: str, files: Sequence[SparkFile], *,
                 measure: Optional[Callable[[str], Optional[int]]] = None) -> list[tuple[int, Optional[int]]]:
    """fsync every listed file and every folder of ``attempt_dir`` (Spark's local writer does not);
    returns ``(bytes, records)`` per file, records from ``measure`` (e.g. a Parquet footer), None if unknown."""

    def one(f: SparkFile) -> tuple[int, Optional[int]]:
        path = os.path.join(attempt_dir, f.rel)
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            size = os.fstat(fd).st_size
        finally:
            os.close(fd)
        return size, (measure(path) if measure is not None else None)

    if not files:
        return []
    with ThreadPoolExecutor(min(8, len(files))) as pool:
        got = list(pool.map(one, files))
    for d in sorted({os.path.join(attempt_dir, f.dir_rel) for f in files}, key=len, reverse=True):
        fsync_dir(d)
    for d in {f.dir_rel for f in files}:  # the partition folders' entries in their parents
        parts = d.split("/") if d else []
        for i in range(len(parts)):
            fsync_dir(os.path.join(attempt_dir, *parts[:i]))
    fsync_dir(os.path.dirname(attempt_dir))  # the attempt's entry in the batch folder
    fsync_dir(os.path.dirname(os.path.dirname(attempt_dir)))  # the batch folder's entry in staging
    return got


# --------------------------------------------------------------------------- the sink's part


class NativeTarget(abc.ABC):
    """What a sink gives the native path: its spec (log, committer), where Spark writes, the committables.

    Implemented by connectors (``twophase.sinks.native_files``, ``twophase.sinks.native_delta``); the
    core finds them by :data:`NATIVE_TARGETS`.
    """

    #: what ``df.write.format`` gets
    spark_format: str = ""
    #: the sink spec whose log, coordinator and committer decide and commit
    spec: SinkSpec[Any]

    @classmethod
    @abc.abstractmethod
    def create(cls, options: NativeOptions) -> "NativeTarget":
        """Build the target from validated options (driver side; raises ConfigurationError)."""

    @abc.abstractmethod
    def attempt_dir(self, batch_id: int, attempt_uid: str) -> str:
        """An absolute local path, new for this attempt, under the sink's private staging folder, which its
        committer's ``abort_lingering`` sweeps (invariants 3, 4)."""

    def check_schema(self, schema: Any) -> None:
        """Refuse, on the driver before anything is written, a batch whose columns the sink cannot take."""

    def partition_columns(self, options: NativeOptions) -> tuple[str, ...]:
        """The columns Spark's writer partitions by (default: the option; Delta: the table's)."""
        return options.partition_by

    def writer_settings(self) -> Mapping[str, str]:
        """Options of Spark's writer the target needs (Delta: partition folder text in UTC)."""
        return {}

    #: Spark's save mode (s3a://: "append" to the destination itself)
    save_mode: str = "errorifexists"

    def save_path(self, attempt: str) -> str:
        """Where Spark's writer saves (``attempt`` is :meth:`attempt_dir`'s)."""
        return "file://" + attempt

    def attempt_settings(self, batch_id: int, attempt_uid: str) -> Mapping[str, str]:
        """Options of Spark's writer for one attempt of a batch (s3a://: the magic committer's job id)."""
        return {}

    def session_settings(self) -> Mapping[str, str]:
        """SQL settings of the query's session for the write, restored after it (s3a://: the commit protocol)."""
        return {}

    def check_session(self, spark: Any) -> None:
        """Refuse a session that cannot run the target's write (s3a://: the committer's jar is missing)."""

    @abc.abstractmethod
    def committables(self, batch_id: int, attempt_uid: str, attempt_dir: str, *,
                     partition_by: Optional[Sequence[str]] = None,
                     expected_records: Optional[int] = None) -> list[Committable]:
        """The committables of what Spark wrote into ``attempt_dir`` (partitioned by ``partition_by``, None: the
        target's :meth:`partition_columns`): durable,
        one per Spark task, each file with its final name (invariant 2). Nothing is visible yet.
        ``expected_records``: Spark's own count of the rows written (:func:`check_record_count`); 0 commits
        no file (an empty batch: Spark still writes one empty file)."""


def load_target(options: NativeOptions) -> NativeTarget:
    where = NATIVE_TARGETS[options.format]
    if options.path.lower().startswith("s3a://"):
        where = "twophase.sinks.native_s3a:S3ANativeTarget"
    module, _, cls = where.partition(":")
    return getattr(importlib.import_module(module), cls).create(options)


@dataclass
class NativeBatchTiming:
    """What one batch cost, in ms: recovery and checks, Spark's write, and the commit phase (listing,
    fsync, the log's PENDING/COMPLETED/COMMITTED and the commit itself, then the sweep)."""

    batch_id: int
    prepare_ms: float
    write_ms: float
    commit_ms: float
    files: int


@dataclass
class NativeStats:
    """Per-process counters of a :class:`NativeSink` (benchmarks and tests read them)."""

    spark_writes: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    timings: list[NativeBatchTiming] = field(default_factory=list)


class NativeSink:
    """The ``foreachBatch`` function of the native path (see the module docstring for the protocol)."""

    def __init__(self, options: NativeOptions) -> None:
        self.options = options
        self.target = load_target(options)
        self.spec = self.target.spec
        self.stats = NativeStats()

    @property
    def sink_id(self) -> str:
        return self.spec.sink_id

    def job_group(self, batch_id: int) -> str:
        """The Spark job group of the write of ``batch_id`` (``statusTracker().getJobIdsForGroup`` finds it)."""
        return f"twophase-native-{self.sink_id}-{batch_id}"

    def __call__(self, df: Any, batch_id: int) -> None:
        batch_id = int(batch_id)
        started = time.perf_counter()
        try:
            sc = df.sparkSession.sparkContext
        except Exception as e:  # Spark Connect: the foreachBatch function runs without a SparkContext
            raise ConfigurationError(
                f"native_sink({self.options.format!r}) needs a classic SparkSession (the running query's id and the "
                "write's job group come from its SparkContext); Spark Connect has none: use "
                "format('twophase-file') / format('twophase-delta') there") from e
        query_id = sc.getLocalProperty(QUERY_ID_PROPERTY)
        log = self._prepare(query_id)  # step 1 (a second query is refused here, before anything is created)
        self._check_columns(df)
        if self._already_committed(log, batch_id):  # step 2 (invariant 1)
            self.stats.skipped.append(batch_id)
            _log.info("native_batch_already_committed", sink_id=self.sink_id, checkpoint_id=batch_id,
                      consequence="the Spark write was not run")
            return
        attempt_uid = uuid.uuid4().hex[:12]
        attempt = self.target.attempt_dir(batch_id, attempt_uid)
        partition_by = self.target.partition_columns(self.options)
        prepared = time.perf_counter()
        rows = self._spark_write(df, sc, attempt, batch_id, partition_by, attempt_uid)  # step 3
        written = time.perf_counter()
        faults.maybe_crash("after_spark_write", batch_id)
        committables = self.target.committables(batch_id, attempt_uid, attempt, partition_by=partition_by,
                                                expected_records=rows)  # step 4
        acks = [Ack(batch_id, c.task_id, attempt_uid, c.to_json(), c.records, query_id) for c in committables]
        CheckpointCoordinator(self.spec, log, sweep_after_commit=True).complete_batch(  # step 5
            batch_id, acks, expected_tasks=[c.task_id for c in committables])
        done = time.perf_counter()
        timing = NativeBatchTiming(batch_id, (prepared - started) * 1e3, (written - prepared) * 1e3,
                                   (done - written) * 1e3, sum(len(getattr(c, "files", ())) for c in committables))
        self.stats.timings.append(timing)
        _log.info("native_batch_committed", sink_id=self.sink_id, checkpoint_id=batch_id, tasks=len(acks),
                  files=timing.files, prepare_ms=round(timing.prepare_ms, 1), write_ms=round(timing.write_ms, 1),
                  commit_ms=round(timing.commit_ms, 1))

    # ---- the steps

    def _check_columns(self, df: Any) -> None:
        cols = list(df.columns)
        missing = [c for c in self.options.partition_by if c not in cols]
        what = f"native_sink({self.options.format!r})"
        if missing:
            raise ConfigurationError(f"{what}: option 'partitionBy' names {missing}, which are not columns of the "
                                     f"stream ({', '.join(cols)}); name existing columns")
        if self.options.partition_by and len(self.options.partition_by) == len(cols):
            raise ConfigurationError(f"{what}: option 'partitionBy' names every column; keep at least one data column")
        self.target.check_schema(df.schema)

    def _prepare(self, query_id: Optional[str]) -> TransactionLog:
        """Step 1: validate, claim the log for the owner and the running query, recover (invariant 5)."""
        from twophase.spark.datasource import checkpoint_query_id
        self.spec.validate_destination()
        owner = self.options.owner
        recorded = checkpoint_query_id(owner)
        if query_id and recorded and recorded != query_id:
            raise ConfigurationError(
                f"native_sink({self.options.format!r}): option 'checkpointLocation'={owner!r} holds streaming query "
                f"{recorded}, but this foreachBatch runs for query {query_id}: give native_sink the same "
                "checkpointLocation as writeStream.option('checkpointLocation', ...)")
        log = self.spec.transaction_log()
        log.claim(owner, query_id=query_id or recorded)
        CheckpointCoordinator(self.spec, log).recover()
        return log

    @staticmethod
    def _already_committed(log: TransactionLog, batch_id: int) -> bool:
        """Step 2: the log has ``batch_id`` COMMITTED or LOST, or pruned below the highest committed id."""
        rec = log.get(batch_id)
        if rec is not None:
            return rec.state in (CheckpointState.COMMITTED, CheckpointState.LOST)
        highest = log.highest_committed()
        return highest is not None and batch_id < highest

    def _spark_write(self, df: Any, sc: Any, attempt: str, batch_id: int, partition_by: Sequence[str],
                     attempt_uid: str = "") -> Optional[int]:
        """Step 3: Spark's writer, into the attempt's private folder, in a job group of its own. Returns Spark's
        count of the rows written (an observation on the written frame: no second pass), None if unknown."""
        props = {"spark.jobGroup.id": self.job_group(batch_id),
                 "spark.job.description": f"twophase native write of batch {batch_id} to {self.options.path}"}
        old = {k: sc.getLocalProperty(k) for k in props}
        for k, v in props.items():
            sc.setLocalProperty(k, v)
        session = df.sparkSession
        self.target.check_session(session)
        old_conf = {k: session.conf.get(k, None) for k in self.target.session_settings()}
        for k, v in self.target.session_settings().items():
            session.conf.set(k, v)
        try:
            observation = None
            try:
                from pyspark.sql import Observation
                from pyspark.sql import functions as F
                observation = Observation(f"twophase_native_{uuid.uuid4().hex[:12]}")
                df = df.observe(observation, F.count(F.lit(1)).alias("records"))
            except Exception as e:  # pragma: no cover - an older PySpark: no count check
                _log.warning("native_observe_unavailable", sink_id=self.sink_id, error=str(e))
                observation = None
            w = df.write.format(self.target.spark_format).mode(self.target.save_mode)
            settings = {**self.options.writer_options, **self.target.writer_settings(), **COMMITTER_SETTINGS,
                        **self.target.attempt_settings(batch_id, attempt_uid)}
            for k, v in settings.items():
                w = w.option(k, v)
            if partition_by:
                w = w.partitionBy(*partition_by)
            self.stats.spark_writes.append(batch_id)
            _log.info("native_spark_write", sink_id=self.sink_id, checkpoint_id=batch_id, attempt=attempt)
            w.save(self.target.save_path(attempt))
            if observation is None:
                return None
            got = observation.get.get("records")
            return None if got is None else int(got)
        finally:
            for k, v in old.items():
                sc.setLocalProperty(k, v)
            for k, v in old_conf.items():
                if v is None:
                    session.conf.unset(k)
                else:
                    session.conf.set(k, v)


def native_sink(format: str, options: Optional[Mapping[str, Any]] = None, **kwargs: Any) -> NativeSink:
    """A ``foreachBatch`` function writing each micro-batch with Spark's own ``format`` writer, exactly once.

    ``format``: ``parquet``, ``orc``, ``json``, ``csv`` (files under ``path``) or ``delta`` (a local table).
    Options (a mapping and/or keywords; Spark's names): ``path`` and ``checkpointLocation`` (required: the
    query's, as given to ``writeStream``), ``partitionBy`` (a list or ``"a,b"``), ``compression``,
    ``maxRecordsPerFile``, the format's own writer options (CSV ``header``, ``sep``...; ``parquet.*`` /
    ``orc.*`` Hadoop settings), and the common ``sink.id``, ``log.location``, ``log.retain``. Validated
    here, before any data moves (invariant 6).
    """
    merged: dict[str, Any] = dict(options or {})
    merged.update(kwargs)
    return NativeSink(native_options(format, merged))
