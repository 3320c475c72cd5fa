"""Exactly-once objects on S3 through multipart uploads: an upload is invisible until it is completed.

Layout under ``s3://bucket/prefix``::

    <prefix>/<a=1>/part-<token>-<ckpt>-<task>-<attempt>-<seq>.<ext>   objects (visible once completed)
    <prefix>/_twophase/<token>/log/                                   the transaction log (an S3 log store)

``<token>`` is the sink's identity (:mod:`twophase.naming`): sinks sharing a prefix never touch each other.

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
   checkpoint ``n``'s uploads are completed and every checkpoint below it is final, so no upload of a
   checkpoint ``<= n`` can ever be completed again (a re-run's acks are aborted, never committed); an
   upload a zombie creates after the listing is swept by the next batch's commit. The committer sweeps
   WITH the commit (``sweep_with_commit``: before COMMITTED is recorded, which then says so; completing
   an upload again after the sweep is still "already", invariant 2), so the recovery before the next
   batch lists no uploads when that record says swept: in the steady state one ListMultipartUploads per
   batch in all. Whatever left uploads behind (a retried, speculative or zombie task, a crashed driver),
   the next commit's sweep covers them, since it covers every checkpoint up to its own; the log's
   attempt number could not tell (a retried task does not make a new attempt of its checkpoint).
5. ``commit_checkpoint`` completes every upload of a checkpoint at once (a pool of
   ``commit_parallelism`` threads): its commit takes one CompleteMultipartUpload's time, not one per
   file; fault point ``mid_commit`` fires when the first upload is completed, the others done or not.
   The listing of the sweep that follows the commit (invariant 4) is taken on the same pool while the
   uploads complete, and the sweep of that checkpoint uses it: it is taken after the checkpoint is
   COMPLETED (so every upload of a checkpoint at or below it that it shows is a loser's, or the
   checkpoint's own), the checkpoint's own uploads are kept out of it by id, and the sweep runs only
   once every one of them is completed. What an attempt opens after the listing is the next commit's.
   (On the deciding paths ``check_prepared`` takes that listing before the decision instead, invariant 6.)
6. ``check_prepared`` (before the decision): an upload of the checkpoint aborted by someone else after the tasks
   pre-committed (another Spark job's S3A committer with Hadoop's default
   ``fs.s3a.committer.abort.pending.uploads=true`` cleaning the same tree, ``hadoop s3guard uploads -abort``, a
   lifecycle rule) declines the checkpoint: aborted, retriable, run again; never decided into a DataLossError.
   Cost: none in requests while every upload is there: the check takes the sweep's prefix-scoped
   ListMultipartUploads (invariant 4) before the decision instead of beside the completions, and the commit's
   sweep uses it (it lists every upload of this checkpoint, all kept by id, and every checkpoint below is final,
   so it is as safe as one taken after COMPLETED); the commit phase gains that listing's latency. Only an upload
   the listing does not show is looked at: ListParts, then HeadObject (:func:`missing_uploads`; an upload completed
   before, with the expected ETag, is never gone). A listing that fails (a 5xx, a timeout) skips the check (logged):
   the checkpoint is decided, the commit tells and lists for its sweep itself.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, ClassVar, Collection, Mapping, Sequence, TypedDict

from twophase.naming import internal_rel, part_file_name
from twophase.sinks._s3 import (MIN_PART_SIZE, check_part_count, check_part_size, MultipartStream, abort_lingering_uploads, abort_own_uploads,  # noqa: F401
                                abort_upload, check_bucket, complete_upload, list_own_uploads, multipart_etag)
from twophase.sinks._filelike import FileLikeOptions, check_partition_columns
from twophase.sinks._formats import FORMAT_OPTIONS, format_options
from twophase.sinks._objectstore import ObjectStore, ObjectStoreCommitter, ObjectStoreSpec, ObjectStoreWriter
from twophase._logging import get_logger
from twophase._redact import safe_repr
from twophase.errors import ConfigurationError
from twophase.log import TransactionLog
from twophase.log_s3 import S3_CLIENT_OPTIONS, S3Config, error_code, open_log_store, parse_s3_url, s3_config_from
from twophase.options import Option, parse_choice, parse_list, parse_options, parse_size
from twophase.sink import Committable, Guarantee, TransactionContext

_log = get_logger(__name__)

#: part-<checkpoint>-<task>-<attempt uid>-<seq>.<ext>: the names this project gives its objects


S3_OPTIONS: tuple[Option[Any], ...] = (
    Option("path", str, required=True, help="where objects go: s3://bucket/prefix"),
    *FORMAT_OPTIONS,
    Option("partitionBy", parse_list, (), help="comma-separated Hive partition columns"),
    Option("partSize", parse_size, 5 << 20,
           help="multipart part size, 5m (S3's minimum, the default: the first part uploads while the task still "
                "encodes the file) to 5g (S3's maximum)"),
    Option("maxFileSize", parse_size, 128 << 20, help="roll to a new object past this many bytes (e.g. 128m)"),
    *S3_CLIENT_OPTIONS,
)


@safe_repr
@dataclass(frozen=True, kw_only=True)
class S3SinkOptions(FileLikeOptions):
    """Validated options of the S3 sink (see :data:`S3_OPTIONS`)."""

    bucket: str
    prefix: str
    s3: S3Config = field(default_factory=S3Config)
    part_size: int = 5 << 20

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    @classmethod
    def from_options(cls, raw: Mapping[str, Any], schema: Any = None) -> "S3SinkOptions":
        """Parse Spark's string options; ``schema`` (anything with ``.names``) checks partition columns."""
        o = parse_options(raw, S3_OPTIONS, sink="twophase-s3")
        fo = format_options(o, sink="twophase-s3")
        bucket, prefix = parse_s3_url(o["path"])
        check_part_size("twophase-s3", o["partSize"])  # 5 MiB to 5 GiB: S3 refuses others mid-task
        if o["maxFileSize"] < o["partSize"]:
            raise ConfigurationError("twophase-s3: option 'maxFileSize' must be at least 'partSize'")
        check_part_count("twophase-s3", "maxFileSize", o["maxFileSize"], o["partSize"])
        opts = cls(bucket=bucket, prefix=prefix, s3=s3_config_from(o), part_size=o["partSize"], **cls.common(o, fo))
        check_partition_columns("twophase-s3", opts.partition_by, schema)
        return opts


def object_name(context: TransactionContext, seq: int, ext: str) -> str:
    return part_file_name(context.sink_id, context.checkpoint_id, context.task_id, context.attempt_uid, seq, ext)


#: why uploads disappear before the decision, and what to change (``check_prepared``'s advice)
GONE_ADVICE = ("a multipart upload of this sink was aborted by someone else before twophase's decision: set "
               "fs.s3a.committer.abort.pending.uploads=false on every other Spark job with an S3A committer writing "
               "into the same tree (Hadoop's default true aborts every pending upload under its destination at job "
               "cleanup), never run `hadoop s3guard uploads -abort` on it, and let no lifecycle rule abort incomplete "
               "multipart uploads younger than the longest batch (AbortIncompleteMultipartUpload DaysAfterInitiation)")


def _upload_gone(client: Any, u: Mapping[str, Any]) -> bool:
    """An upload a listing did not show: gone (no upload, no object with its ETag), or there after all.
    Raises on anything else (the check is then skipped)."""
    try:
        client.list_parts(Bucket=u["bucket"], Key=u["key"], UploadId=u["upload_id"], MaxParts=1)
        return False  # the listing missed it (a store that lists uploads of exact keys only)
    except Exception as e:
        if error_code(e) not in ("NoSuchUpload", "NoSuchKey", "404"):  # radosgw answers NoSuchKey
            raise
    try:
        head = client.head_object(Bucket=u["bucket"], Key=u["key"])
    except Exception as e:
        if error_code(e) in ("404", "NoSuchKey", "NotFound"):
            return True
        raise
    return str(head.get("ETag", "")).strip('"') != u["etag"]  # completed before (a decided checkpoint): not gone


def missing_uploads(client: Any, uploads: Sequence[Mapping[str, Any]], parallelism: int = 8) -> list[Mapping[str, Any]]:
    """Of ``uploads`` a listing did not show, those neither in progress nor completed with their ETag (aborted
    or expired): one ListParts each, and a HeadObject for those it does not find, on ``parallelism`` threads.
    Raises when S3 cannot answer."""
    if not uploads:
        return []
    with ThreadPoolExecutor(min(parallelism, len(uploads)), thread_name_prefix="twophase-check") as pool:
        gone = list(pool.map(lambda u: _upload_gone(client, u), uploads))
    return [u for u, g in zip(uploads, gone) if g]


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


class S3Sink(ObjectStoreSpec[S3Committable]):
    """Exactly-once Parquet / JSON lines / CSV objects on S3 through multipart uploads.

    It aborts orphan uploads right after each commit too (``sweep_after_commit``, invariant 4), not only at
    the recovery before the next micro-batch, which never comes after the last batch of a run: one
    ListMultipartUploads (prefix-scoped, paged by 1000 uploads in progress) per batch."""

    options_class = S3SinkOptions

    def __init__(self, options: S3SinkOptions) -> None:
        self.options = options
        self.sink_id = options.sink_id or f"s3:{options.url}"
        self.guarantee = options.guarantee
        self._client: Any = None
        self.store = S3Objects(self)

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = self.options.s3.client()
        return self._client

    def key(self, rel: str) -> str:
        return f"{self.options.prefix}/{rel}" if self.options.prefix else rel

    def validate_destination(self) -> None:
        """Missing bucket, refused credentials, unreachable endpoint: a ConfigurationError now."""
        check_bucket(self.client, self.options.bucket, sink="twophase-s3", url=self.options.url,
                     config=self.options.s3)

    def transaction_log(self) -> TransactionLog:
        loc = self.options.log_location or f"{self.options.url}/{internal_rel(self.sink_id)}/log"
        return TransactionLog(open_log_store(loc, self.options.s3), self.sink_id, retain=self.options.log_retain)

    def create_writer(self, context: TransactionContext) -> "S3Writer":
        return S3Writer(self, context)

    def create_committer(self) -> "S3Committer":
        return S3Committer(self)


class S3Objects(ObjectStore):
    """The S3 sink's files: one multipart upload each (invariants 1-4; :mod:`twophase.sinks._s3`)."""

    kind = "s3"
    checks_prepared = True
    gone_advice = GONE_ADVICE
    entry_noun = "multipart uploads"

    def __init__(self, sink: S3Sink) -> None:
        self.sink = sink

    def key(self, rel: str) -> str:
        return self.sink.key(rel)

    def open_stream(self, key: str, pool: ThreadPoolExecutor) -> MultipartStream:
        return MultipartStream(self.sink.client, self.sink.options.bucket, key, self.sink.options.part_size, pool)

    def finish(self, key: str, stream: MultipartStream) -> dict[str, Any]:
        parts = stream.finish()
        return {"bucket": self.sink.options.bucket, "key": key, "upload_id": stream.upload_id, "parts": parts,
                "etag": multipart_etag(parts), "bytes": stream.tell()}

    def complete(self, entry: Mapping[str, Any]) -> str:
        return complete_upload(self.sink.client, entry)

    def abort(self, entry: Mapping[str, Any]) -> None:
        abort_upload(self.sink.client, entry["bucket"], entry["key"], entry["upload_id"])

    def entry_id(self, entry: Mapping[str, Any]) -> str:
        return str(entry["upload_id"])

    def gone(self, entries: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        """Of uploads the sweep's listing did not show, those aborted or expired (invariant 6)."""
        return missing_uploads(self.sink.client, entries)

    def list_own(self, sink_id: str) -> list[tuple[str, str, int]]:
        o = self.sink.options
        return list_own_uploads(self.sink.client, o.bucket, o.prefix, sink_id, o.partition_by)

    def drop_own(self, pending: Collection[tuple[str, str, int]], up_to: int, keep_ids: Collection[str]) -> int:
        return abort_own_uploads(self.sink.client, self.sink.options.bucket, pending, up_to, keep_ids)


class S3Writer(ObjectStoreWriter[S3Committable]):
    """Task side: one multipart upload per output file, parts uploaded in the background."""

    committable_class = S3Committable
    entries_field = "uploads"


class S3Committer(ObjectStoreCommitter[S3Committable]):
    """Driver side: complete (invariants 1, 2) or abort (3) uploads, a checkpoint's at once (5); sweep this
    sink's orphans (4) with the commit (``sweep_with_commit``: an upload completed again after the sweep is
    "already", invariant 2)."""

    committable_type = S3Committable
    entries_field = "uploads"
