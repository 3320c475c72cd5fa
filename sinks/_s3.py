"""Multipart uploads, shared by the S3 sink and the Delta sink on S3: one place for how twophase
writes, completes, aborts and sweeps S3 objects.

Invariants (the S3 sink's, :mod:`twophase.sinks.s3`; ``test_s3_sink_invN_*``):

- an upload is invisible until :func:`complete_upload`; completing it again, or finding an object
  with its multipart ETag, is "already" committed; gone without that object is data loss;
- :func:`abort_upload` never deletes an object;
- :func:`abort_lingering_uploads` touches only uploads whose name carries the sink's token, where the sink
  puts its files (directly under its prefix or under Hive partition folders: never under a nested
  destination's folder, :func:`twophase.naming.own_part_rel`).
"""

from __future__ import annotations

import binascii
import hashlib
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Collection, Mapping, Optional, Sequence

from twophase.sinks._chunked import ChunkedUploadStream
from twophase.errors import CommitFailedError, ConfigurationError, DataLossError, TransientSinkError
from twophase.log_s3 import S3Config, error_code, http_status
from twophase.naming import own_part_rel

MIN_PART_SIZE = 5 << 20
#: S3's largest part (a larger one is refused with EntityTooLarge, after the task encoded it)
MAX_PART_SIZE = 5 << 30
#: S3's limit of parts per upload; a file may overshoot its roll size by what the writer buffered, so the
#: options keep ``maxFileSize / partSize`` at most :data:`MAX_PLANNED_PARTS`, well under it
MAX_PARTS = 10_000
MAX_PLANNED_PARTS = 9_000


def check_part_size(sink: str, part_size: int) -> None:
    """Refuse (ConfigurationError naming ``partSize`` and the limit) a part size outside S3's 5 MiB - 5 GiB: S3
    refuses such a part in the middle of a task."""
    if part_size < MIN_PART_SIZE:
        raise ConfigurationError(f"{sink}: option 'partSize'={part_size} is below S3's minimum part size of 5 MiB; "
                                 "use at least 5m")
    if part_size > MAX_PART_SIZE:
        raise ConfigurationError(f"{sink}: option 'partSize'={part_size} is above S3's maximum part size of 5 GiB "
                                 f"({MAX_PART_SIZE} bytes); use at most 5g")


def check_part_count(sink: str, size_option: str, max_size: int, part_size: int) -> None:
    """Refuse (ConfigurationError naming both options) a roll size that would take more than
    :data:`MAX_PLANNED_PARTS` parts: S3 refuses part 10,001 in the middle of a task; and a part size S3
    refuses (:func:`check_part_size`)."""
    check_part_size(sink, part_size)
    if -(-max_size // part_size) > MAX_PLANNED_PARTS:
        raise ConfigurationError(f"{sink}: option '{size_option}'={max_size} needs more than {MAX_PLANNED_PARTS} "
                                 f"parts of 'partSize'={part_size} (S3 allows {MAX_PARTS} per upload); raise "
                                 f"'partSize' to at least {-(-max_size // (MAX_PLANNED_PARTS << 20))}m or lower "
                                 f"'{size_option}'")


#: how long a bucket that passed :func:`check_bucket` is taken as there, per process
BUCKET_CHECK_TTL_S = 300.0
_checked_buckets: dict[tuple[str, str, str], float] = {}


def check_bucket(client: Any, bucket: str, *, sink: str, url: str, config: Optional[S3Config] = None) -> None:
    """Fail on the driver, before any data moves, if the bucket is missing or the credentials are refused.

    With ``config``, a bucket found with the same endpoint and access key id in the last
    :data:`BUCKET_CHECK_TTL_S` seconds is not asked again: Spark calls ``streamWriter()`` twice per
    micro-batch (planner and commit worker), each a HeadBucket otherwise. Only a pass is remembered; a
    bucket deleted meanwhile fails the next request that needs it, loudly (nothing is committed by a
    request that failed)."""
    key = ((config.resolved_endpoint() or "", config.access_key_id or "", bucket) if config is not None else None)
    now = time.monotonic()
    passed = _checked_buckets.get(key) if key is not None else None
    if passed is not None and now - passed < BUCKET_CHECK_TTL_S:
        return
    try:
        client.head_bucket(Bucket=bucket)
        if key is not None:
            _checked_buckets[key] = now
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


class MultipartStream(ChunkedUploadStream):
    """A write-only binary stream that becomes one multipart upload.

    Bytes are buffered and uploaded as a part whenever ``part_size`` is reached (at most two parts
    in flight on ``pool``, :class:`~twophase.sinks._chunked.ChunkedUploadStream`); :meth:`finish` uploads
    the rest as the last part and returns the parts. Nothing is visible until someone completes the
    upload with those parts.

    CreateMultipartUpload runs on ``pool`` too, while the task encodes its first part (a request of
    tens of milliseconds no longer waits in front of the encoding). It is queued before any part of
    this stream, so a part waiting for the upload id never holds the thread the create needs. A task
    that dies before the id is known leaves an upload nobody names: the sweep finds it by its key.
    """

    def __init__(self, client: Any, bucket: str, key: str, part_size: int, pool: ThreadPoolExecutor) -> None:
        super().__init__(part_size, pool)
        self.client, self.bucket, self.key, self.part_size = client, bucket, key, part_size
        self._created: Future = pool.submit(client.create_multipart_upload, Bucket=bucket, Key=key)
        self._parts: list[dict[str, Any]] = []

    @property
    def upload_id(self) -> str:
        """The upload's id (waits for CreateMultipartUpload; raises what it raised)."""
        return str(self._created.result()["UploadId"])

    def _send(self, index: int, chunk: bytes) -> dict[str, Any]:
        number = index + 1  # S3's part numbers start at 1
        r = self.client.upload_part(Bucket=self.bucket, Key=self.key, UploadId=self.upload_id, PartNumber=number,
                                    Body=chunk)
        return {"PartNumber": number, "ETag": r["ETag"]}

    def finish(self) -> list[dict[str, Any]]:
        """Upload what is buffered as the last part; wait for every part; return them in order."""
        self._parts = self.finish_chunks()
        return self._parts

    def abort(self) -> None:
        self.wait_in_flight()
        try:
            upload_id = self.upload_id
        except Exception:  # never created: nothing to abort (one created unseen is the sweep's)
            return
        abort_upload(self.client, self.bucket, self.key, upload_id)


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


def list_own_uploads(client: Any, bucket: str, prefix: str, sink_id: str, partition_by: Sequence[str]) -> list[tuple[str, str, int]]:
    """``(key, upload id, checkpoint id)`` of every upload in progress under ``prefix`` that THIS sink
    named (its token) where it puts its files, under folders of its partition columns ``partition_by`` in
    order (:func:`~twophase.naming.own_part_rel`: another destination nested under the prefix with the same
    sink id has the same token, never its layout, even at a ``region=eu`` folder): one
    ListMultipartUploads per 1000 uploads in progress under the prefix."""
    own = []
    pfx = f"{prefix}/" if prefix else ""
    for page in client.get_paginator("list_multipart_uploads").paginate(Bucket=bucket, Prefix=pfx):
        for up in page.get("Uploads", ()):
            cid = own_part_rel(up["Key"][len(pfx):], sink_id, partition_by)
            if cid is not None:
                own.append((up["Key"], up["UploadId"], cid))
    return own


def abort_own_uploads(client: Any, bucket: str, uploads: Collection[tuple[str, str, int]], up_to_checkpoint: int,
                      keep_upload_ids: Collection[str] = ()) -> int:
    """Abort the uploads of :func:`list_own_uploads` of checkpoints ``<= up_to``, but those in ``keep``."""
    aborted = 0
    for key, upload_id, cid in uploads:
        if cid <= up_to_checkpoint and upload_id not in keep_upload_ids and abort_upload(client, bucket, key, upload_id):
            aborted += 1
    return aborted


def abort_lingering_uploads(client: Any, bucket: str, prefix: str, sink_id: str, up_to_checkpoint: int,
                            keep_upload_ids: Collection[str], partition_by: Sequence[str]) -> int:
    """Abort uploads under ``prefix`` that THIS sink named (its token) for checkpoints ``<= up_to``
    (invariant 4): never another sink's, another tool's or another query's upload."""
    return abort_own_uploads(client, bucket, list_own_uploads(client, bucket, prefix, sink_id, partition_by), up_to_checkpoint,
                             keep_upload_ids)
