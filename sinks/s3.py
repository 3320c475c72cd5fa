"""Exactly-once objects on S3 through multipart uploads: an upload is invisible until it is completed.

Layout under ``s3://bucket/prefix``::

    <prefix>/<a=1>/part-<token>-<ckpt>-<task>-<attempt>-<seq>.<ext>   objects (visible once completed)
    <prefix>/_twophase/<token>/log/                                   the transaction log (an S3 log store)

``<token>`` is the sink's identity (:mod:`twophase.sinks._naming`): sinks sharing a prefix never touch each other.

One transaction (a task's share of a checkpoint) opens one multipart upload per output file:

- the writer (``S3Writer``) opens nothing at first; the first rows of a partition directory create the upload;
- ``write`` encodes rows (Parquet, JSON lines, CSV) into a buffer and uploads a part each time the buffer
  reaches ``partSize`` (at least 5 MiB, S3's minimum for all parts but the last), in the background;
- ``prepare_commit`` closes the format (footer), uploads the last part and returns the committable
  (:class:`S3Committable`): ``{bucket, key, upload_id, parts: [{PartNumber, ETag}], etag}`` per file;
- the committer (``S3Committer``) completes each upload at commit, or aborts it.

Invariants (``test_s3_sink_invN_*``):

1. An object appears under the prefix only through ``commit`` (CompleteMultipartUpload), whole.
2. ``commit`` is idempotent: completing a completed upload is a no-op; an unknown upload plus an
   object whose ETag is the expected multipart ETag (MD5 of the part MD5s, ``-N``) means committed
   before. An unknown upload without that object is LOST (the coordinator stops with DataLossError).
3. ``abort`` only aborts uploads; it never deletes an object, so committed data is never touched.
4. ``abort_lingering(n)`` aborts the in-progress uploads under the prefix of checkpoints ``<= n`` that
   carry this sink's token (crashed tasks, failed attempts): after recovery no
   orphan upload of this sink remains, and no other sink's or tool's upload is ever touched. It also
   runs right after each commit (``sweep_after_commit``), so a loser attempt of the LAST batch of a run
   (a retried task whose first attempt died, a speculative copy) leaves no upload behind: one
   prefix-scoped ListMultipartUploads per batch. Safe against attempts still running: it runs once
   checkpoint ``n`` is COMMITTED and every checkpoint below it is final, so no upload of a checkpoint
   ``<= n`` can ever be completed again (a re-run's acks are aborted, never committed); an upload a
   zombie creates after the listing is swept by the next batch's recovery or commit.
"""

from __future__ import annotations

import binascii
import contextlib
import hashlib
import io
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, ClassVar, Collection, Mapping, Optional, TypedDict

import pyarrow as pa

from twophase.sinks._naming import internal_rel, own_part_checkpoint, part_file_name
from twophase.sinks._filelike import FileLikeWriter
from twophase.sinks._formats import EXTENSIONS, FORMATS, FormatWriter, open_format_writer
from twophase._logging import get_logger
from twophase._redact import safe_repr
from twophase.errors import CommitFailedError, ConfigurationError, DataLossError, TransientSinkError
from twophase.log import TransactionLog
from twophase.log_s3 import S3Config, error_code, http_status, open_log_store, parse_s3_url
from twophase.options import Option, parse_choice, parse_duration_ms, parse_list, parse_options, parse_size
from twophase.sink import (Committable, CommitResult, CommitStatus, Guarantee, SinkCommitter, SinkSpec,
                           TransactionContext)

_log = get_logger(__name__)

MIN_PART_SIZE = 5 << 20
#: part-<checkpoint>-<task>-<attempt uid>-<seq>.<ext>: the names this project gives its objects


S3_CLIENT_OPTIONS: tuple[Option[Any], ...] = (
    Option("s3.endpoint", str, help="S3 endpoint URL (default: boto3's, e.g. AWS_ENDPOINT_URL)"),
    Option("s3.region", str, help="S3 region (default: boto3's, e.g. AWS_DEFAULT_REGION)"),
    Option("s3.accessKeyId", str, help="access key id (default: boto3's credential chain)"),
    Option("s3.secretAccessKey", str, help="secret access key (with s3.accessKeyId)"),
    Option("s3.sessionToken", str, help="session token for temporary credentials"),
    Option("s3.connectTimeout", parse_duration_ms,
           help="how long to wait for a connection to S3 (e.g. '5s'; default: boto3's 60 s)"),
    Option("s3.readTimeout", parse_duration_ms,
           help="how long to wait for S3 to answer a request (e.g. '30s'; default: boto3's 60 s); a "
                "server that pauses longer fails the request, which boto3 retries (5 attempts)"),
)

S3_OPTIONS: tuple[Option[Any], ...] = (
    Option("path", str, required=True, help="where objects go: s3://bucket/prefix"),
    Option("format", parse_choice(*FORMATS), "parquet", help="parquet, json (JSON lines) or csv"),
    Option("partitionBy", parse_list, (), help="comma-separated Hive partition columns"),
    Option("partSize", parse_size, 8 << 20, help="multipart part size, at least 5m (S3's minimum)"),
    Option("maxFileSize", parse_size, 128 << 20, help="roll to a new object past this many bytes (e.g. 128m)"),
    Option("compression", parse_choice("snappy", "zstd", "gzip", "none"), "snappy", help="Parquet compression"),
    *S3_CLIENT_OPTIONS,
)


def s3_config_from(o: Mapping[str, Any]) -> S3Config:
    """The :class:`S3Config` of parsed ``s3.*`` options."""
    return S3Config(o.get("s3.endpoint"), o.get("s3.region"), o.get("s3.accessKeyId"), o.get("s3.secretAccessKey"),
                    o.get("s3.sessionToken"), connect_timeout_ms=o.get("s3.connectTimeout"),
                    read_timeout_ms=o.get("s3.readTimeout"))


@safe_repr
@dataclass(frozen=True)
class S3SinkOptions:
    """Validated options of the S3 sink (see :data:`S3_OPTIONS`)."""

    bucket: str
    prefix: str
    s3: S3Config = field(default_factory=S3Config)
    format: str = "parquet"
    partition_by: tuple[str, ...] = ()
    part_size: int = 8 << 20
    max_file_size: int = 128 << 20
    compression: str = "snappy"
    sink_id: Optional[str] = None
    guarantee: Guarantee = Guarantee.EXACTLY_ONCE
    log_location: Optional[str] = None
    log_retain: int = 100
    owner: Optional[str] = None

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    @classmethod
    def from_options(cls, raw: Mapping[str, Any], schema: Any = None) -> "S3SinkOptions":
        """Parse Spark's string options; ``schema`` (anything with ``.names``) checks partition columns."""
        o = parse_options(raw, S3_OPTIONS, sink="twophase-s3")
        bucket, prefix = parse_s3_url(o["path"])
        if o["partSize"] < MIN_PART_SIZE:
            raise ConfigurationError(f"twophase-s3: option 'partSize'={o['partSize']} is below S3's minimum part "
                                     "size of 5 MiB; use at least 5m")
        if o["maxFileSize"] < o["partSize"]:
            raise ConfigurationError("twophase-s3: option 'maxFileSize' must be at least 'partSize'")
        opts = cls(bucket=bucket, prefix=prefix, s3=s3_config_from(o), format=o["format"],
                   partition_by=o["partitionBy"], part_size=o["partSize"], max_file_size=o["maxFileSize"],
                   compression=o["compression"], sink_id=o["sink.id"], guarantee=Guarantee.parse(o["guarantee"]),
                   log_location=o["log.location"], log_retain=o["log.retain"], owner=o["checkpointlocation"])
        check_partition_columns("twophase-s3", opts.partition_by, schema)
        return opts


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


def check_bucket(client: Any, bucket: str, *, sink: str, url: str) -> None:
    """Fail on the driver, before any data moves, if the bucket is missing or the credentials are refused."""
    try:
        client.head_bucket(Bucket=bucket)
        return
    except Exception as e:
        status, code = http_status(e), error_code(e)
        name = type(e).__name__
        if status == 404 or code in ("NoSuchBucket", "404"):
            raise ConfigurationError(f"{sink}: bucket {bucket!r} of option 'path'={url!r} does not exist; "
                                     "create it first or fix the path") from e
        if status in (401, 403) or code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
            raise ConfigurationError(f"{sink}: S3 refused the credentials for bucket {bucket!r} ({code or status}); "
                                     "check options 's3.accessKeyId'/'s3.secretAccessKey' or AWS_ACCESS_KEY_ID/"
                                     "AWS_SECRET_ACCESS_KEY/AWS_PROFILE") from e
        if name in ("NoCredentialsError", "PartialCredentialsError"):
            raise ConfigurationError(f"{sink}: no S3 credentials found; set options 's3.accessKeyId' and "
                                     "'s3.secretAccessKey' or boto3's environment (AWS_ACCESS_KEY_ID...)") from e
        if name in ("EndpointConnectionError", "ConnectTimeoutError", "ConnectionClosedError"):
            raise ConfigurationError(f"{sink}: cannot reach the S3 endpoint ({e}); check option 's3.endpoint' "
                                     "or AWS_ENDPOINT_URL") from e
        raise TransientSinkError(f"{sink}: cannot check bucket {bucket!r}: {e}") from e


def multipart_etag(parts: list[Mapping[str, Any]]) -> str:
    """The ETag S3 gives the object of a completed multipart upload: MD5(part MD5s) ``-N``."""
    md5 = hashlib.md5()
    for p in parts:
        md5.update(binascii.unhexlify(str(p["ETag"]).strip('"')))
    return f"{md5.hexdigest()}-{len(parts)}"


class MultipartStream(io.RawIOBase):
    """A write-only binary stream that becomes one multipart upload.

    Bytes are buffered and uploaded as a part whenever ``part_size`` is reached (at most two parts
    in flight on ``pool``); :meth:`finish` uploads the rest as the last part and returns the parts.
    Nothing is visible until someone completes the upload with those parts.
    """

    def __init__(self, client: Any, bucket: str, key: str, part_size: int, pool: ThreadPoolExecutor) -> None:
        super().__init__()
        self.client, self.bucket, self.key, self.part_size, self.pool = client, bucket, key, part_size, pool
        self.upload_id: str = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
        self._buf = bytearray()
        self._pos = 0
        self._futures: list[Future] = []
        self._parts: list[dict[str, Any]] = []

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def write(self, b: Any) -> int:
        data = memoryview(b).cast("B")
        self._buf += data
        self._pos += len(data)
        while len(self._buf) >= self.part_size:
            chunk = bytes(self._buf[:self.part_size])
            del self._buf[:self.part_size]
            self._submit(chunk)
        return len(data)

    def _submit(self, chunk: bytes) -> None:
        number = len(self._futures) + 1
        self._futures.append(self.pool.submit(self._upload, number, chunk))
        pending = [f for f in self._futures if not f.done()]
        if len(pending) > 2:  # bound memory: wait for the oldest part in flight
            pending[0].result()

    def _upload(self, number: int, chunk: bytes) -> dict[str, Any]:
        r = self.client.upload_part(Bucket=self.bucket, Key=self.key, UploadId=self.upload_id, PartNumber=number,
                                    Body=chunk)
        return {"PartNumber": number, "ETag": r["ETag"]}

    def finish(self) -> list[dict[str, Any]]:
        """Upload what is buffered as the last part; wait for every part; return them in order."""
        if self._buf or not self._futures:
            self._submit(bytes(self._buf))
            self._buf = bytearray()
        self._parts = [f.result() for f in self._futures]
        return self._parts

    def abort(self) -> None:
        for f in self._futures:
            with contextlib.suppress(Exception):
                f.result()
        abort_upload(self.client, self.bucket, self.key, self.upload_id)


def complete_upload(client: Any, u: Mapping[str, Any]) -> str:
    """Complete upload ``u`` (invariants 1, 2); returns 'completed' or 'already'. Raises DataLossError."""
    parts = [{"PartNumber": int(p["PartNumber"]), "ETag": p["ETag"]} for p in u["parts"]]
    try:
        client.complete_multipart_upload(Bucket=u["bucket"], Key=u["key"], UploadId=u["upload_id"],
                                         MultipartUpload={"Parts": parts})
        return "completed"
    except Exception as e:
        failure = e
    # the upload is unknown (completed before, or lost) or the call failed: look at the object
    try:
        head = client.head_object(Bucket=u["bucket"], Key=u["key"])
        if str(head.get("ETag", "")).strip('"') == u["etag"]:
            return "already"
        found = f"an object with ETag {head.get('ETag')}, not {u['etag']}"
    except Exception as e:
        if error_code(e) not in ("404", "NoSuchKey", "NotFound"):
            raise CommitFailedError(f"twophase-s3: cannot complete s3://{u['bucket']}/{u['key']}: {failure}") from failure
        found = "no object"
    try:
        client.list_parts(Bucket=u["bucket"], Key=u["key"], UploadId=u["upload_id"], MaxParts=1)
    except Exception as e:
        if error_code(e) in ("NoSuchUpload", "NoSuchKey", "404"):  # radosgw answers NoSuchKey
            raise DataLossError(f"twophase-s3: upload {u['upload_id']} of s3://{u['bucket']}/{u['key']} is gone "
                                f"(aborted or expired) and {found} is there: the data of this checkpoint is lost") from failure
    raise CommitFailedError(f"twophase-s3: cannot complete s3://{u['bucket']}/{u['key']}: {failure}") from failure


def abort_upload(client: Any, bucket: str, key: str, upload_id: str) -> bool:
    """Abort one upload (invariant 3); True if it was there. Never deletes an object."""
    try:
        client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
        return True
    except Exception as e:
        if error_code(e) in ("NoSuchUpload", "404"):
            return False
        raise TransientSinkError(f"cannot abort upload {upload_id} of s3://{bucket}/{key}: {e}") from e


def abort_lingering_uploads(client: Any, bucket: str, prefix: str, sink_id: str, up_to_checkpoint: int,
                            keep_upload_ids: Collection[str]) -> int:
    """Abort uploads under ``prefix`` that THIS sink named (its token) for checkpoints ``<= up_to``
    (invariant 4): never another sink's, another tool's or another query's upload."""
    aborted = 0
    pfx = f"{prefix}/" if prefix else ""
    for page in client.get_paginator("list_multipart_uploads").paginate(Bucket=bucket, Prefix=pfx):
        for up in page.get("Uploads", ()):
            cid = own_part_checkpoint(up["Key"].rsplit("/", 1)[-1], sink_id)
            if cid is None or cid > up_to_checkpoint or up["UploadId"] in keep_upload_ids:
                continue
            if abort_upload(client, bucket, up["Key"], up["UploadId"]):
                aborted += 1
    return aborted


def object_name(context: TransactionContext, seq: int, ext: str) -> str:
    return part_file_name(context.sink_id, context.checkpoint_id, context.task_id, context.attempt_uid, seq, ext)


@dataclass
class _OpenObject:
    key: str
    stream: MultipartStream
    writer: FormatWriter


class Upload(TypedDict):
    """One finished multipart upload of a committable (everything CompleteMultipartUpload needs)."""

    bucket: str
    key: str
    upload_id: str
    parts: list[dict[str, Any]]
    etag: str
    bytes: int
    records: int


@dataclass(frozen=True, kw_only=True)
class S3Committable(Committable):
    """An S3 transaction's handle: every upload it opened, completed by the committer."""

    kind: ClassVar[str] = "s3"
    uploads: list[Upload] = field(default_factory=list)
    guarantee: str = Guarantee.EXACTLY_ONCE.value


class S3Sink(SinkSpec[S3Committable]):
    """Exactly-once Parquet / JSON lines / CSV objects on S3 through multipart uploads."""

    #: abort orphan uploads right after each commit too (invariant 4), not only at the recovery before the
    #: next micro-batch, which never comes after the last batch of a run: one ListMultipartUploads
    #: (prefix-scoped, paged by 1000 uploads in progress) per batch
    sweep_after_commit = True

    def __init__(self, options: S3SinkOptions) -> None:
        self.options = options
        self.sink_id = options.sink_id or f"s3:{options.url}"
        self.guarantee = options.guarantee
        self._client: Any = None

    @classmethod
    def from_options(cls, raw: Mapping[str, Any], schema: Any = None) -> "S3Sink":
        return cls(S3SinkOptions.from_options(raw, schema))

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["options"])

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = self.options.s3.client()
        return self._client

    def key(self, rel: str) -> str:
        return f"{self.options.prefix}/{rel}" if self.options.prefix else rel

    def validate_destination(self) -> None:
        """Missing bucket, refused credentials, unreachable endpoint: a ConfigurationError now."""
        check_bucket(self.client, self.options.bucket, sink="twophase-s3", url=self.options.url)

    def transaction_log(self) -> TransactionLog:
        loc = self.options.log_location or f"{self.options.url}/{internal_rel(self.sink_id)}/log"
        return TransactionLog(open_log_store(loc, self.options.s3), self.sink_id, retain=self.options.log_retain)

    def create_writer(self, context: TransactionContext) -> "S3Writer":
        return S3Writer(self, context)

    def create_committer(self) -> "S3Committer":
        return S3Committer(self)


class S3Writer(FileLikeWriter[S3Committable]):
    """Task side: one multipart upload per output file, parts uploaded in the background."""

    def __init__(self, sink: S3Sink, context: TransactionContext) -> None:
        o = sink.options
        super().__init__(context, partition_by=o.partition_by, max_file_size=o.max_file_size, upload_threads=2)
        self.sink = sink

    def open_file(self, part_rel: str, schema: pa.Schema) -> _OpenObject:
        o = self.sink.options
        name = self.next_name(EXTENSIONS[o.format])
        key = self.sink.key(f"{part_rel}/{name}" if part_rel else name)
        assert self.pool is not None
        stream = MultipartStream(self.sink.client, o.bucket, key, o.part_size, self.pool)
        writer = open_format_writer(o.format, stream, schema, compression=o.compression)
        return _OpenObject(key, stream, writer)

    def finish_file(self, f: _OpenObject) -> dict[str, Any]:
        f.writer.close()
        parts = f.stream.finish()
        return {"bucket": self.sink.options.bucket, "key": f.key, "upload_id": f.stream.upload_id,
                "parts": parts, "etag": multipart_etag(parts), "bytes": f.stream.tell(), "records": f.writer.records}

    def after_finish(self) -> None:
        if self.sink.guarantee is Guarantee.AT_LEAST_ONCE:  # task-level commit: visible now, duplicates on replay
            for u in self.finished:
                complete_upload(self.sink.client, u)

    def committable(self) -> S3Committable:
        c = self.context
        return S3Committable(checkpoint_id=c.checkpoint_id, task_id=c.task_id, attempt_uid=c.attempt_uid,
                             records=self.records, uploads=list(self.finished),  # type: ignore[arg-type]
                             guarantee=self.sink.guarantee.value)

    def discard_open(self, f: _OpenObject) -> None:
        f.stream.abort()

    def discard_finished(self, entry: dict[str, Any]) -> None:
        abort_upload(self.sink.client, entry["bucket"], entry["key"], entry["upload_id"])


class S3Committer(SinkCommitter[S3Committable]):
    """Driver side: complete (invariants 1, 2) or abort (3) uploads; sweep this sink's orphans (4)."""

    committable_type = S3Committable
    commit_parallelism = 8

    def __init__(self, sink: S3Sink) -> None:
        self.sink = sink

    def commit(self, committable: S3Committable, *, recovering: bool = False) -> CommitResult[S3Committable]:
        if committable.guarantee == Guarantee.AT_LEAST_ONCE.value:
            return CommitResult(committable, CommitStatus.COMMITTED)
        try:
            outcomes = [complete_upload(self.sink.client, u) for u in committable.uploads]
        except DataLossError as e:  # invariant 2: gone, and no object with its ETag
            return CommitResult(committable, CommitStatus.LOST, str(e))
        _log.debug("s3_committed", sink_id=self.sink.sink_id, checkpoint_id=committable.checkpoint_id,
                   task=committable.task_id, uploads=len(outcomes), already=outcomes.count("already"))
        already = bool(outcomes) and all(o == "already" for o in outcomes)
        return CommitResult(committable, CommitStatus.ALREADY_COMMITTED if already else CommitStatus.COMMITTED)

    def abort(self, committable: S3Committable, *, recovering: bool = False) -> None:
        if committable.guarantee == Guarantee.AT_LEAST_ONCE.value:
            return
        for u in committable.uploads:
            abort_upload(self.sink.client, u["bucket"], u["key"], u["upload_id"])

    def abort_lingering(self, up_to_checkpoint: int, highest_committed: Optional[int] = None) -> int:
        """Abort this sink's uploads of checkpoints ``<= up_to_checkpoint`` (invariant 4)."""
        o = self.sink.options
        n = abort_lingering_uploads(self.sink.client, o.bucket, o.prefix, self.sink.sink_id, up_to_checkpoint, ())
        if n:
            _log.info("lingering_aborted", sink_id=self.sink.sink_id, up_to=up_to_checkpoint, uploads=n)
        return n
