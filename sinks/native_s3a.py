"""The native path on ``s3a://`` (EXPERIMENTAL, behind ``TWOPHASE_EXPERIMENTAL_S3A=1``): Spark's own writers
produce the objects through Hadoop's magic committer, whose multipart uploads stay pending after Spark's
job; twophase-s3's committer completes them at twophase's commit, or aborts them.

Per micro-batch (``native_sink("parquet", path="s3a://bucket/prefix", ...)``):

- Spark writes with ``spark.sql.sources.commitProtocolClass=twophase.s3a.PendingCommitProtocol`` (the jar
  ``scripts/s3a_committer.sh build`` makes from ``scripts/jvm/s3a-committer``): Hadoop's magic committer,
  job id ``<token>-<batch>-<attempt>``, every task file a multipart upload to its FINAL key, named as
  twophase-s3 names its objects, ``<prefix>/<a=1>/part-<token>-<batch>-<task>-<attempt>-<seq>.<ext>``
  (so the key proves the sink and the batch, and twophase-s3's sweep finds it). No magic folder is made;
  each committed task attempt returns its pending uploads (a pendingset's JSON) in Spark's task commit
  message (S3A keeps them in task memory with ``fs.s3a.committer.magic.track.commits.in.memory.enabled=true``,
  else in ``.pending`` files the task commit reads and deletes). The job commit completes NOTHING and
  writes nothing: it keeps the tasks' pendingsets in the driver's JVM under the job id.
- The driver takes them (:func:`take_committed`, once): one :class:`~twophase.sinks.s3.S3Committable` per
  Spark task, whose uploads are exactly twophase-s3's (bucket, key, upload id, parts, multipart ETag).
- From there it is twophase-s3's protocol, unchanged (the same log under ``_twophase/<token>/log``, the same
  default ``sink.id`` as ``format("twophase-s3")`` on ``s3://bucket/prefix``): PENDING, COMPLETED, complete
  every upload (idempotent: an upload completed before is "already" by its ETag), COMMITTED, and the sweep
  aborts every upload in progress under the prefix that carries the sink's token for batches ``<=`` the
  committed one (failed, retried and speculative task attempts, a crashed driver's attempt), never another
  sink's. The sweep also deletes what a lost executor left in those batches' magic folders (``.pending`` files,
  0-byte markers) and older versions' manifests (objects, never data).

Nothing is visible before the commit: a pending upload is no object; a magic folder starts with ``_``
(hidden from Spark's and pyarrow's readers). Before PENDING the uploads' only record is the driver JVM's list
(lost with the driver): the sweep after the re-run batch's commit aborts them by token and batch. Records per
object are not known before the upload completes (no footer to read): the committables carry 0, and the
batch's row count is Spark's own (logged).
"""

from __future__ import annotations

import json
import os
import re
from collections import defaultdict
from typing import Any, Mapping, Optional, Sequence

from twophase._logging import get_logger
from twophase.errors import ConfigurationError, TwoPhaseError
from twophase.naming import internal_rel, own_part_rel
from twophase.sink import Guarantee, sink_token
from twophase.sinks._s3 import abort_upload, multipart_etag
from twophase.sinks.s3 import S3Committable, S3Committer, S3Sink, S3SinkOptions
from twophase.spark.native import NativeOptions, NativeTarget

_log = get_logger(__name__)

#: the environment flag that makes ``native_sink(..., path="s3a://...")`` reachable (experimental)
EXPERIMENTAL_FLAG = "TWOPHASE_EXPERIMENTAL_S3A"
PROTOCOL_CLASS = "twophase.s3a.PendingCommitProtocol"
COMMIT_PROTOCOL_CONF = "spark.sql.sources.commitProtocolClass"
FORMATS = ("parquet", "orc", "json", "csv")

_PART = re.compile(r"^part-[0-9a-f]{12}-(\d{8,})-(\d+)-([0-9a-f]{12})-\d{3,}\.[a-z0-9.]+$")


def enabled() -> bool:
    return os.environ.get(EXPERIMENTAL_FLAG, "") == "1"


def magic_job_id(sink_id: str, batch_id: int, attempt_uid: str) -> str:
    """The S3A committer's job id of one attempt of a batch: the magic folder is ``__magic_job-<this>``."""
    return f"{sink_token(sink_id)}-{batch_id:08d}-{attempt_uid}"


def s3a_settings(sink_id: str, bucket: str, prefix: str, batch_id: int, attempt_uid: str) -> dict[str, str]:
    """Hadoop options of one attempt's write (``df.write.option``: Spark puts them in the job's Hadoop conf)."""
    token = sink_token(sink_id)
    return {
        "fs.s3a.committer.magic.enabled": "true",
        "fs.s3a.committer.uuid": magic_job_id(sink_id, batch_id, attempt_uid),
        "fs.s3a.committer.require.uuid": "true",
        # the committer's cleanup must never list-and-abort every upload under the destination (others')
        "fs.s3a.committer.abort.pending.uploads": "false",
        "twophase.s3a.file.prefix": f"part-{token}-{batch_id:08d}-",
        "twophase.s3a.attempt": attempt_uid,
    }


def _key(prefix: str, rel: str) -> str:
    return f"{prefix}/{rel}" if prefix else rel


def manifest_key(sink_id: str, prefix: str, batch_id: int, attempt_uid: str) -> str:
    """Where versions before 2026-12-07 06:40 wrote an attempt's manifest (the sweep still deletes them)."""
    return _key(prefix, f"{internal_rel(sink_id)}/s3a/{batch_id:08d}-{attempt_uid}.txt")


def take_committed(sink_id: str, batch_id: int, attempt_uid: str, jvm: Any = None) -> Optional[str]:
    """The JSON list of pendingsets the job commit of this attempt left in Spark's driver JVM (removed from it),
    None if no job of this attempt committed there."""
    if jvm is None:
        from pyspark import SparkContext
        sc = SparkContext._active_spark_context
        if sc is None:
            return None
        jvm = sc._jvm
    got = jvm.twophase.s3a.PendingCommitProtocol.take(magic_job_id(sink_id, batch_id, attempt_uid))
    return None if got is None else str(got)


def pending_uploads(committed: Optional[str], bucket: str, prefix: str, sink_id: str, batch_id: int,
                    attempt_uid: str, partition_by: Sequence[str]) -> list[dict[str, Any]]:
    """The uploads one attempt's Spark job left pending: the pendingsets its committed tasks returned to the
    driver (``committed``, from :func:`take_committed`: a job that did not commit has none, so nothing of it is
    ever completed). Each upload's key must be this sink's, of this batch and attempt, where the sink puts
    its files."""
    where = f"native_sink on s3a://{bucket}/{prefix}: batch {batch_id}"
    if committed is None:
        raise TwoPhaseError(f"{where}: Spark's job left no list of pending uploads in the driver (job "
                            f"{magic_job_id(sink_id, batch_id, attempt_uid)}): is spark.sql.sources.commitProtocolClass "
                            f"{PROTOCOL_CLASS}? The batch is not committed")
    sets = json.loads(committed)
    if not isinstance(sets, list):
        raise TwoPhaseError(f"{where}: the job's list of pending uploads is not a list; the batch is not committed")
    commits = [c for data in sets for c in (data.get("commits") or [])]
    uploads = []
    for c in commits:
        key = str(c["destinationKey"])
        rel = key[len(prefix) + 1:] if prefix else key
        m = _PART.match(rel.rsplit("/", 1)[-1])
        if (c.get("bucket", bucket) != bucket or (prefix and not key.startswith(prefix + "/"))
                or own_part_rel(rel, sink_id, partition_by) != batch_id or m is None or m.group(3) != attempt_uid):
            raise TwoPhaseError(f"{where}: a task's pendingset holds an upload to {key!r}, which is not this "
                                "sink's name for it; the batch is not committed")
        parts = [{"PartNumber": i + 1, "ETag": str(t["etag"] if isinstance(t, Mapping) else t)}
                 for i, t in enumerate(c.get("etags") or [])]
        if not parts:
            raise TwoPhaseError(f"{where}: the pending upload of {key!r} has no part")
        uploads.append({"bucket": bucket, "key": key, "upload_id": str(c["uploadId"]), "parts": parts,
                        "etag": multipart_etag(parts), "bytes": int(c.get("length") or 0), "records": 0,
                        "task": str(int(m.group(2)))})
    return uploads


def delete_magic_leftovers(client: Any, bucket: str, prefix: str, sink_id: str, up_to: int) -> int:
    """Delete the magic folders and manifests of this sink's batches ``<= up_to`` (pendingsets, 0-byte markers:
    never data, never another sink's: the folder names carry the token)."""
    token = sink_token(sink_id)
    doomed = []
    where = [(_key(prefix, f"__magic_job-{token}-"), re.compile(r"^(\d{8,})-")),
             (_key(prefix, f"{internal_rel(sink_id)}/s3a/"), re.compile(r"^(\d{8,})-"))]
    for pfx, pattern in where:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=pfx):
            for o in page.get("Contents", ()):
                m = pattern.match(o["Key"][len(pfx):])
                if m and int(m.group(1)) <= up_to:
                    doomed.append(o["Key"])
    for i in range(0, len(doomed), 1000):
        client.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in doomed[i:i + 1000]],
                                                     "Quiet": True})
    return len(doomed)


class S3ACommitter(S3Committer):
    """twophase-s3's committer; its sweep also deletes the magic folders and manifests of swept batches."""

    def abort_lingering(self, up_to_checkpoint: int, highest_committed: Optional[int] = None) -> int:
        n = super().abort_lingering(up_to_checkpoint, highest_committed)
        o = self.sink.options
        try:
            delete_magic_leftovers(self.sink.client, o.bucket, o.prefix, self.sink.sink_id, up_to_checkpoint)
        except Exception as e:  # noqa: BLE001 - hidden objects; the next sweep deletes them
            _log.warning("s3a_magic_cleanup_failed", sink_id=self.sink.sink_id, up_to=up_to_checkpoint, error=str(e))
        return n


class S3ASink(S3Sink):
    """twophase-s3's spec (log, names, completion, sweep) for what Spark's magic committer left pending."""

    def create_committer(self) -> S3ACommitter:
        return S3ACommitter(self)


class S3ANativeTarget(NativeTarget):
    """``native_sink("parquet" | "orc" | "json" | "csv", path="s3a://bucket/prefix")`` (experimental)."""

    save_mode = "append"

    def __init__(self, sink: S3ASink, fmt: str, partition_by: Sequence[str]) -> None:
        self.spec = sink
        self.sink = sink
        self.spark_format = fmt
        self.partition_by = tuple(partition_by)
        self._jvm: Any = None  # Spark's driver JVM (check_session), where the job commit leaves its uploads

    @classmethod
    def create(cls, options: NativeOptions) -> "S3ANativeTarget":
        if not enabled():
            raise ConfigurationError(f"native_sink: path {options.path!r}: the native path on s3a:// is experimental; "
                                     "use format('twophase-s3')")
        if options.format not in FORMATS:
            raise ConfigurationError(f"native_sink({options.format!r}) on s3a:// is not supported; use one of "
                                     f"{', '.join(FORMATS)}")
        raw: dict[str, Any] = {"path": "s3://" + options.path.split("://", 1)[1], "format": "parquet",
                               "partitionBy": ",".join(options.partition_by), "log.retain": str(options.log_retain),
                               "checkpointLocation": options.owner, **dict(options.s3_options)}
        if options.sink_id:
            raw["sink.id"] = options.sink_id
        if options.log_location:
            raw["log.location"] = options.log_location
        return cls(S3ASink(S3SinkOptions.from_options(raw)), options.format, options.partition_by)

    def attempt_dir(self, batch_id: int, attempt_uid: str) -> str:
        return magic_job_id(self.sink.sink_id, batch_id, attempt_uid)

    def save_path(self, attempt: str) -> str:
        o = self.sink.options
        return f"s3a://{o.bucket}/{o.prefix}" if o.prefix else f"s3a://{o.bucket}/"

    def session_settings(self) -> Mapping[str, str]:
        return {COMMIT_PROTOCOL_CONF: PROTOCOL_CLASS}

    def attempt_settings(self, batch_id: int, attempt_uid: str) -> Mapping[str, str]:
        o = self.sink.options
        return s3a_settings(self.sink.sink_id, o.bucket, o.prefix, batch_id, attempt_uid)

    def check_session(self, spark: Any) -> None:
        """The committer's jar must be on Spark's classpath (``spark.jars``), else Spark's write would fail late."""
        try:
            jvm = spark.sparkContext._jvm
            self._jvm = jvm
            jvm.java.lang.Class.forName(PROTOCOL_CLASS, False, jvm.java.lang.Thread.currentThread().getContextClassLoader())
        except Exception as e:
            raise ConfigurationError(
                f"native_sink on s3a://: Spark cannot load {PROTOCOL_CLASS}: add the jar that "
                "`bash scripts/s3a_committer.sh build` makes (.venv/jvm/s3a-committer/twophase-s3a-committer.jar) "
                "and hadoop-aws to spark.jars") from e

    def committables(self, batch_id: int, attempt_uid: str, attempt_dir: str, *,
                     partition_by: Optional[Sequence[str]] = None,
                     expected_records: Optional[int] = None) -> list[S3Committable]:
        o = self.sink.options
        cols = self.partition_by if partition_by is None else tuple(partition_by)
        committed = take_committed(self.sink.sink_id, batch_id, attempt_uid, self._jvm)
        uploads = pending_uploads(committed, o.bucket, o.prefix, self.sink.sink_id, batch_id, attempt_uid, cols)
        if expected_records == 0:  # an empty batch: Spark's one empty file commits nothing
            for u in uploads:
                abort_upload(self.sink.client, u["bucket"], u["key"], u["upload_id"])
            return []
        by_task: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for u in uploads:
            by_task[u.pop("task")].append(u)
        _log.info("s3a_pending_uploads", sink_id=self.sink.sink_id, checkpoint_id=batch_id, uploads=len(uploads),
                  tasks=len(by_task), spark_rows=expected_records)
        return [S3Committable(checkpoint_id=batch_id, task_id=task, attempt_uid=attempt_uid, records=0,
                              uploads=entries,  # type: ignore[arg-type]
                              guarantee=Guarantee.EXACTLY_ONCE.value)
                for task, entries in sorted(by_task.items(), key=lambda kv: int(kv[0]))]
