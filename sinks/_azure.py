"""Block blobs written in two phases, for sinks on Azure Blob Storage: Azure's analogue of S3's multipart
uploads (:mod:`twophase.sinks._s3`). Blob Storage has no atomic rename or hard link (ADLS Gen2's rename is
not on the Blob API and not conditional on a missing target), so a file is made visible by committing
its blocks instead:

- a task stages its blocks with Put Block while it writes (:class:`BlockBlobStream`): staged blocks are
  invisible, no reader and no listing without ``include=uncommittedblobs`` sees them;
- :func:`commit_blocks` makes the blob with one Put Block List (``If-None-Match: *``: it never replaces a
  blob); for Delta the blob is still unreferenced until the Delta commit adds it;
- :func:`drop_uncommitted` removes a name's staged blocks and never a committed data file: it commits an
  empty block list with ``If-None-Match: *`` (which discards the staged blocks, and fails if a committed
  blob is there) and deletes exactly that empty blob (``If-Match`` its ETag). Azure's Delete Blob answers
  404 for a name with only staged blocks (Azurite deletes them: both are handled). Cut between its two
  requests (a crash, or the SDK re-sent the Put Block List whose answer was lost and got 409), a committed
  0-byte blob stays under the name: a data file is never 0 bytes (a file has a row, and every format
  writes at least a byte per row), so a 0-byte blob under a part name is an abort's leftover, which the
  drop's 409 path and :func:`list_own_staged` (the sweep) remove;
- :func:`delete_blob` deletes a committed blob, or drops staged blocks where no blob is committed.

Azure garbage-collects staged blocks that were never committed after seven days; the sweeps remove a
sink's own well before that.
"""

from __future__ import annotations

import contextlib
import io
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator, Optional, Sequence

from twophase.sinks._chunked import ChunkedUploadStream
from twophase.errors import CommitFailedError, ConfigurationError, DataLossError, TransientSinkError
from twophase.log_azure import AzureConfig, azure_error_code, http_status
from twophase.naming import own_part_rel


def block_id(n: int) -> str:
    """The id of block ``n`` of a blob: a fixed-width counter (Azure wants ids of one length per blob; the
    SDK base64-encodes them)."""
    return f"{n:08d}"


class BlockBlobStream(ChunkedUploadStream):
    """A write-only binary stream that becomes one block blob, invisible until :func:`commit_blocks`.

    Bytes are buffered and staged as a block (Put Block) whenever ``block_size`` is reached, at most two
    blocks in flight on ``pool`` (:class:`~twophase.sinks._chunked.ChunkedUploadStream`); :meth:`finish`
    stages the rest and returns the block ids in order."""

    def __init__(self, blob: Any, block_size: int, pool: ThreadPoolExecutor) -> None:
        super().__init__(block_size, pool)
        self.blob, self.block_size = blob, block_size
        self.name = blob.blob_name

    def _send(self, index: int, chunk: bytes) -> str:
        bid = block_id(index)
        self.blob.stage_block(bid, chunk, length=len(chunk))
        return bid

    def finish(self) -> list[str]:
        """Stage what is buffered as the last block; wait for every block; return their ids in order."""
        return self.finish_chunks()

    def abort(self) -> None:
        """Wait for the blocks in flight, then drop them (never a committed blob)."""
        self.wait_in_flight()
        drop_uncommitted(self.blob)


def commit_blocks(blob: Any, block_ids: list[str], size: int) -> None:
    """Put Block List with ``If-None-Match: *``: the blob appears whole, never over another. A 409/412 whose
    blob has ``size`` bytes is this commit's own (a retry of a request whose answer was lost; names are
    unique per attempt, so nobody else writes this name)."""
    from azure.core import MatchConditions
    from azure.storage.blob import BlobBlock
    try:
        blob.commit_block_list([BlobBlock(block_id=b) for b in block_ids], match_condition=MatchConditions.IfMissing)
        return
    except Exception as e:
        if http_status(e) not in (409, 412):
            raise TransientSinkError(f"cannot commit the blocks of blob {blob.blob_name!r}: {azure_error_code(e)}") from e
        failure = e
    try:
        there = blob.get_blob_properties().size
    except Exception:
        there = None
    if there != size:
        raise TransientSinkError(f"blob {blob.blob_name!r} already exists with {there} bytes, not the {size} staged") \
            from failure


def commit_staged(blob: Any, block_ids: list[str], size: int, *, where: str) -> str:
    """Make the staged blocks ``block_ids`` the blob, whole (Put Block List with ``If-None-Match: *``: never over
    another blob); 'completed', or 'already' when the blob is there with exactly that committed block list and
    ``size`` bytes (an earlier commit of this entry). The twophase-file sink's commit on Azure.

    A blob of other content under the name is never overwritten: if the staged blocks are still there it is
    a CommitFailedError naming it; if they are gone too (Put Block List of another blob discards them) a
    DataLossError. No blob and the blocks gone (dropped, or older than Azure's seven days for uncommitted
    blocks) is a DataLossError naming ``where``."""
    from azure.core import MatchConditions
    from azure.storage.blob import BlobBlock
    try:
        blob.commit_block_list([BlobBlock(block_id=b) for b in block_ids], match_condition=MatchConditions.IfMissing)
        return "completed"
    except Exception as e:
        if http_status(e) not in (400, 404, 409, 412):
            raise TransientSinkError(f"cannot commit the blocks of {where}: {azure_error_code(e)}") from e
        failure = e
    try:  # a blob is there (409, 412) or blocks are missing (400 InvalidBlockList): look
        committed, staged = blob.get_block_list("all")
    except Exception as e:
        if http_status(e) != 404:
            raise TransientSinkError(f"cannot read the block list of {where}: {azure_error_code(e)}") from e
        committed, staged = [], []  # no blob and no staged block under the name
    try:
        there: Optional[int] = int(blob.get_blob_properties().size)
    except Exception as e:
        if http_status(e) != 404:
            raise TransientSinkError(f"cannot read the properties of {where}: {azure_error_code(e)}") from e
        there = None  # no committed blob (a name with staged blocks only has no properties)
    ours_staged = set(block_ids) <= {b.id for b in staged}
    if there is None:
        if ours_staged:
            raise TransientSinkError(f"cannot commit the blocks of {where}: {azure_error_code(failure)}") from failure
        raise DataLossError(f"twophase-file: the staged blocks of {where} are gone and it was never committed "
                            "(dropped, or older than the seven days Azure keeps uncommitted blocks): the data of "
                            f"this checkpoint is lost ({azure_error_code(failure)})") from failure
    ids = [b.id for b in committed]
    if ids == list(block_ids) and there == size:
        return "already"
    if ours_staged:
        raise CommitFailedError(f"twophase-file: {where} exists with other content ({len(ids)} blocks, {there} bytes; "
                                f"this commit has {len(block_ids)} blocks, {size} bytes); refusing to overwrite it. "
                                "Another writer used this sink's name: remove or move that blob, then restart") from failure
    raise DataLossError(f"twophase-file: {where} exists with other content ({len(ids)} blocks, {there} bytes, not "
                        f"the {len(block_ids)} blocks of {size} bytes staged) and the staged blocks are gone: another "
                        "writer committed a blob under this sink's name; it was not overwritten, and the data of this "
                        "checkpoint is lost") from failure


def drop_uncommitted(blob: Any) -> bool:
    """Remove the staged blocks of ``blob`` without ever touching a committed blob (see module doc); True if
    it removed something. A committed blob under the name is left alone (False)."""
    from azure.core import MatchConditions
    try:
        etag = blob.commit_block_list([], match_condition=MatchConditions.IfMissing)["etag"]
    except Exception as e:
        if http_status(e) not in (409, 412):
            raise TransientSinkError(f"cannot drop the staged blocks of blob {blob.blob_name!r}: "
                                     f"{azure_error_code(e)}") from e
        etag = _empty_blob_etag(blob)  # a committed blob is there: a data file (not ours to drop here), or
        if etag is None:  # the 0-byte blob of a drop cut between its requests (this one's lost answer)
            return False
    try:
        blob.delete_blob(etag=etag, match_condition=MatchConditions.IfNotModified)
    except Exception as e:
        if http_status(e) not in (404, 412):
            raise TransientSinkError(f"cannot delete blob {blob.blob_name!r}: {azure_error_code(e)}") from e
    return True


def _empty_blob_etag(blob: Any) -> Optional[str]:
    """The ETag of the committed blob under the name if it has 0 bytes (what an empty Put Block List leaves;
    never a data file), else None (no blob, or one with data)."""
    try:
        props = blob.get_blob_properties()
    except Exception as e:
        if http_status(e) == 404:
            return None
        raise TransientSinkError(f"cannot read the properties of blob {blob.blob_name!r}: {azure_error_code(e)}") from e
    return str(props.etag) if int(props.size or 0) == 0 else None


def delete_blob(blob: Any) -> None:
    """Delete a committed blob; where there is none, drop the name's staged blocks (Azure answers 404 to
    Delete Blob on them). No error if nothing is there."""
    try:
        blob.delete_blob()
        return
    except Exception as e:
        if http_status(e) != 404:
            raise TransientSinkError(f"cannot delete blob {blob.blob_name!r}: {azure_error_code(e)}") from e
    drop_uncommitted(blob)


def list_names(container: Any, key_prefix: str, *, uncommitted: bool = True) -> Iterator[str]:
    """Names of the blobs whose name starts with ``key_prefix``, with names that have only staged blocks
    (``include=uncommittedblobs``) unless ``uncommitted`` is False."""
    include = ["uncommittedblobs"] if uncommitted else None
    for b in container.list_blobs(name_starts_with=key_prefix, include=include):
        yield b.name


def list_own_staged(container: Any, prefix: str, sink_id: str, partition_by: Sequence[str],
                    name_prefixes: Optional[Sequence[str]] = None) -> list[tuple[str, str, int]]:
    """``(name, name, checkpoint id)`` of every name under ``prefix`` that THIS sink made (its token, where it
    puts its files: under folders of its partition columns ``partition_by`` in order,
    :func:`~twophase.naming.own_part_rel`, never under a nested destination's folder, even ``region=eu``) and that
    holds no data: staged blocks only (no committed blob), or a committed 0-byte blob (a drop cut between
    its two requests, see the module doc; a data file is never 0 bytes). Staged-only names are the blobs
    listed with ``include=uncommittedblobs`` minus those listed without (List Blobs says no more about a
    name with staged blocks only). Two listings of the prefix, each one request per 5000 names (committed
    ones included: Azure has no listing of staged blocks alone). ``name_prefixes`` (relative to ``prefix``)
    lists only the names starting with one of them instead of the whole prefix: two listings each."""
    key_prefix = f"{prefix}/" if prefix else ""
    starts = [key_prefix] if name_prefixes is None else [key_prefix + p for p in sorted(set(name_prefixes))]

    def own(uncommitted: bool) -> dict[str, tuple[int, int]]:
        out = {}
        include = ["uncommittedblobs"] if uncommitted else None
        for start in starts:
            for b in container.list_blobs(name_starts_with=start, include=include):
                cid = own_part_rel(b.name[len(key_prefix):], sink_id, partition_by)
                if cid is not None:
                    out[b.name] = (cid, int(b.size or 0))
        return out

    committed = own(False)  # first: a name committed between the two listings looks staged-only here, and
    every = own(True)  # drop_uncommitted then refuses it (a committed blob with data is there)
    return [(name, name, cid) for name, (cid, _) in sorted(every.items())
            if name not in committed or committed[name][1] == 0]


def check_container(config: AzureConfig, container_name: str, prefix: str, *, sink: str, url: str) -> None:
    """Fail on the driver, before any data moves, if the container is missing, the credentials are refused
    or the endpoint does not answer (ConfigurationError naming the option and the fix). One List Blobs of
    at most one name under ``prefix`` (what a container SAS with the sink's permissions allows; Get
    Container Properties needs more), asked with one quick retry, not the data path's five."""
    container = config.container_client(container_name, retry_total=1, initial_backoff=0.5, increment_base=1)
    try:
        next(iter(container.list_blobs(name_starts_with=f"{prefix}/" if prefix else None, results_per_page=1)
                  .by_page()), None)
        return
    except Exception as e:
        status, code, name = http_status(e), azure_error_code(e), type(e).__name__
        if status == 404 or code == "ContainerNotFound":
            raise ConfigurationError(f"{sink}: container {container_name!r} of option 'path'={url!r} does "
                                     "not exist; create it first or fix the path") from None
        if status in (401, 403) or code in ("AuthenticationFailed", "AuthorizationFailure", "AuthorizationPermissionMismatch"):
            raise ConfigurationError(f"{sink}: Azure refused the credentials for container {container_name!r} "
                                     f"({code or status}); check options 'azure.accountKey' / 'azure.sasToken' or "
                                     "AZURE_STORAGE_ACCOUNT_KEY / AZURE_STORAGE_SAS_TOKEN") from None
        if name in ("ServiceRequestError", "ServiceResponseError", "ConnectionError"):
            raise ConfigurationError(f"{sink}: cannot reach the Azure Blob endpoint {config.endpoint!r}; "
                                     "check option 'azure.endpoint'") from None
        raise TransientSinkError(f"{sink}: cannot check container {container_name!r}: {code or name}") from None


class AzureFiles:
    """Data files in an Azure Blob container under ``prefix``, each a block blob staged while written and
    committed at prepare_commit (the Delta sink's files backend on Azure; the same five operations as
    its local and S3 backends)."""

    def __init__(self, config: AzureConfig, container: str, prefix: str, block_size: int) -> None:
        self.config, self.container_name, self.prefix, self.block_size = config, container, prefix, block_size
        self._client: Any = None

    @property
    def client(self) -> Any:
        """The container's client (made on first use in each process)."""
        if self._client is None:
            self._client = self.config.container_client(self.container_name)
        return self._client

    def key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def _where(self, rel: str) -> str:
        return f"{self.container_name}/{self.key(rel)}"

    def open(self, rel: str, pool: ThreadPoolExecutor) -> BlockBlobStream:
        return BlockBlobStream(self.client.get_blob_client(self.key(rel)), self.block_size, pool)

    def finish(self, stream: BlockBlobStream) -> int:
        commit_blocks(stream.blob, stream.finish(), stream.tell())
        return stream.tell()

    def discard(self, stream: BlockBlobStream, rel: str) -> None:
        with contextlib.suppress(Exception):
            stream.abort()

    def delete(self, rel: str) -> None:
        delete_blob(self.client.get_blob_client(self.key(rel)))

    def exists(self, rel: str) -> bool:
        """A committed blob is there (staged blocks alone are not a file: Get Blob Properties answers 404)."""
        try:
            self.client.get_blob_client(self.key(rel)).get_blob_properties()
            return True
        except Exception as e:
            if http_status(e) == 404:
                return False
            raise TransientSinkError(f"cannot check blob {self._where(rel)}: {self.config.error_text(e)}") from e

    def reader(self, rel: str) -> Any:
        """The data file ``rel``, read whole (for pyarrow.parquet)."""
        try:
            return io.BytesIO(self.client.get_blob_client(self.key(rel)).download_blob().readall())
        except Exception as e:
            raise TransientSinkError(f"cannot read blob {self._where(rel)}: {self.config.error_text(e)}") from e

    def list_named(self, dir_rel: str, name_prefix: str) -> Iterator[str]:
        """Blobs directly in ``dir_rel`` whose name starts with ``name_prefix``, names with only staged blocks
        included (a failed attempt's): one prefix listing."""
        base = f"{self.prefix}/" if self.prefix else ""
        for name in list_names(self.client, self.key(f"{dir_rel}/{name_prefix}" if dir_rel else name_prefix)):
            rel = name[len(base):]
            if "/" not in rel[len(dir_rel) + 1 if dir_rel else 0:]:
                yield rel

    def list_data(self) -> Iterator[str]:
        """Every blob of the table outside ``_``/``.`` folders, names with only staged blocks included."""
        base = f"{self.prefix}/" if self.prefix else ""
        for name in list_names(self.client, base):
            rel = name[len(base):]
            if not any(seg.startswith(("_", ".")) for seg in rel.split("/")[:-1]):
                yield rel

    def abort_uploads(self, sink_id: str, up_to: int, partition_by: Sequence[str]) -> int:
        """Nothing apart: the sweeps' own listings (:meth:`list_named`, :meth:`list_data`) include names with
        only staged blocks, and deleting one drops its blocks, so a failed attempt's staged blocks go with
        the same proof and the same listings as its committed files (no second listing of the table per
        batch, as S3's ListMultipartUploads would be)."""
        return 0
