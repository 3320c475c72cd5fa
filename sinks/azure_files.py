"""Exactly-once files on Azure Blob Storage (and ADLS Gen2 through its Blob API): each file a block blob whose
blocks are staged while the task writes and committed by the DRIVER with one Put Block List.

Format ``twophase-file`` takes this sink for an Azure path (``abfss://container@account.dfs.core.windows.net/out``,
``abfs://``, ``wasbs://``, ``az://container/out``), so the same query writes to a local folder or to Azure.
Blob Storage has no atomic rename and no hard link (ADLS Gen2's rename is not on the Blob API, and not
conditional on a missing target), so a file is not staged elsewhere and moved: it is made visible where it
lies, whole, by committing its blocks.

Layout under the path (the container's ``prefix``)::

    <prefix>/<a=1>/part-<token>-<ckpt>-<task>-<attempt>-<seq>.<ext>   blobs (visible once committed)
    <prefix>/_twophase/<token>/log/                                   the transaction log (an Azure log store)

One transaction (a task's share of a checkpoint), in the shape of the S3 sink (:mod:`twophase.sinks.s3`;
the writer and committer are :mod:`twophase.sinks._objectstore`'s, shared with it):

- ``write`` encodes rows (Parquet, JSON lines, CSV) and stages a block (Put Block) each time ``blockSize``
  bytes are buffered, in the background; a name with staged blocks only is no blob: no read and no listing
  (but one with ``include=uncommittedblobs``) sees it;
- ``prepare_commit`` stages the last block and returns the committable (:class:`AzureFilesCommittable`):
  ``{container, name, block_ids, bytes, records}`` per file;
- the committer commits every file of a checkpoint at once (Put Block List, ``If-None-Match: *``).

Invariants (``test_azure_files_sink_invN_*``):

1. A blob appears under the path only through ``commit`` (Put Block List of exactly its staged blocks),
   whole; never over another blob (``If-None-Match: *``).
2. ``commit`` is idempotent: a blob there with exactly the committed block list and size of the entry was
   committed before (ALREADY_COMMITTED). A blob of other content is never overwritten: an error naming it
   while the staged blocks are there, LOST once they are gone. No blob and no staged blocks (dropped; Azure
   drops uncommitted blocks after seven days: a checkpoint pre-committed but not committed within seven
   days) is LOST, naming the file: the coordinator stops with DataLossError, never a silent skip.
3. ``abort`` only drops staged blocks (:func:`~twophase.sinks._azure.drop_uncommitted`: a conditional empty
   commit and a delete of exactly that empty blob); it never deletes a committed blob. Azure has no other way
   to discard staged blocks before its seven days (Delete Blob answers 404 for a name with staged blocks
   only), so for the time of one request a loser's name is an EMPTY blob: Spark skips empty files; another
   reader listing at that instant may see a 0-byte file (never a partial one, never a duplicate row). A drop
   cut between its two requests (a crash, or a re-sent Put Block List whose answer was lost) leaves that
   0-byte blob: the drop's retry and the sweep remove it (a data file is never 0 bytes).
4. ``abort_lingering(n)`` drops the staged-only names under the path of checkpoints ``<= n`` that carry this
   sink's token (crashed, failed, speculative or zombie attempts), and its 0-byte blobs of invariant 3:
   never another sink's, never a blob with data, never a name under a folder other than a Hive partition
   folder (another destination nested in this path, even with the same ``sink.id``). It runs right after each commit (``sweep_after_commit``), WITH the commit (``sweep_with_commit``:
   a commit of the checkpoint again after the sweep is still ALREADY_COMMITTED, invariant 2, since the
   sweep keeps the checkpoint's own names and never touches a committed blob). Cost, flat as history grows
   (invariant 6): the sweep right after checkpoint ``n``'s commit lists only ``n``'s own names
   (``part-<token>-<n>-``) in the folders ``n``'s blobs are in and the path itself, two requests each
   (with and without ``include=uncommittedblobs``; Azure lists no staged blocks alone), taken while the
   checkpoint's blobs are committed; the whole path (one request per 5000 names, twice) only every
   ``FULL_SWEEP_EVERY`` checkpoints and at a recovery that sweeps.
5. ``commit_checkpoint`` commits every file of a checkpoint at once (``commit_parallelism`` threads);
   fault point ``mid_commit`` fires when the first is committed.
6. The scoped sweep of invariant 4 misses no straggler the whole-path listing of every batch found: each is
   dropped at the latest by the next whole listing, at most ``FULL_SWEEP_EVERY`` checkpoints later (proof:
   :meth:`AzureBlobs.list_own_for`).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, ClassVar, Collection, Mapping, Sequence, TypedDict

from twophase._redact import safe_repr
from twophase.errors import ConfigurationError
from twophase.log import TransactionLog
from twophase.log_azure import AZURE_CLIENT_OPTIONS, AzureConfig, azure_config_from, parse_azure_url
from twophase.log_s3 import open_log_store
from twophase.naming import internal_rel, part_name_prefix
from twophase.options import Option, parse_list, parse_options, parse_size
from twophase.sink import Committable, Guarantee, TransactionContext
from twophase.sinks._azure import BlockBlobStream, check_container, commit_staged, drop_uncommitted, list_own_staged
from twophase.sinks._filelike import FileLikeOptions, check_partition_columns
from twophase.sinks._formats import FORMAT_OPTIONS, format_options
from twophase.sinks._objectstore import ObjectStore, ObjectStoreCommitter, ObjectStoreSpec, ObjectStoreWriter

SINK = "twophase-file"
#: Azure's limits: at most 50,000 blocks per blob, each at most 4000 MiB
MAX_BLOCKS, MAX_BLOCK_SIZE, MIN_BLOCK_SIZE = 50_000, 4000 << 20, 64 << 10

AZURE_FILE_OPTIONS: tuple[Option[Any], ...] = (
    Option("path", str, required=True, help="where blobs go: abfss://container@account.dfs.core.windows.net/prefix"),
    *FORMAT_OPTIONS,
    Option("partitionBy", parse_list, (), help="comma-separated Hive partition columns"),
    Option("blockSize", parse_size, 8 << 20,
           help="bytes per staged block (Put Block), 64k to 4000m; a file has at most 50,000 blocks"),
    Option("maxFileSize", parse_size, 128 << 20, help="roll to a new blob past this many bytes (e.g. 128m)"),
    *AZURE_CLIENT_OPTIONS,
)


@safe_repr
@dataclass(frozen=True, kw_only=True)
class AzureFilesOptions(FileLikeOptions):
    """Validated options of the Azure file sink (see :data:`AZURE_FILE_OPTIONS`)."""

    container: str
    prefix: str
    #: ``abfss://container@account.dfs.core.windows.net/prefix``, whatever form the path had
    url: str
    azure: AzureConfig = field(default_factory=AzureConfig)
    block_size: int = 8 << 20

    @classmethod
    def from_options(cls, raw: Mapping[str, Any], schema: Any = None) -> "AzureFilesOptions":
        """Parse Spark's string options (the account's credentials resolved here, on the driver)."""
        o = parse_options(raw, AZURE_FILE_OPTIONS, sink=SINK)
        fo = format_options(o, sink=SINK)
        url = parse_azure_url(o["path"])
        azure = azure_config_from(o).resolve(url, option="path")
        bs = o["blockSize"]
        if not MIN_BLOCK_SIZE <= bs <= MAX_BLOCK_SIZE:
            raise ConfigurationError(f"{SINK}: option 'blockSize'={bs} is outside Azure's block sizes; give 64k to 4000m")
        if o["maxFileSize"] > MAX_BLOCKS * bs // 2:
            raise ConfigurationError(f"{SINK}: option 'maxFileSize'={o['maxFileSize']} needs more than half of Azure's "
                                     f"{MAX_BLOCKS} blocks per blob of option 'blockSize'={bs}; raise 'blockSize' or "
                                     "lower 'maxFileSize'")
        opts = cls(container=url.container, prefix=url.prefix, url=url.canonical(str(azure.account_name)), azure=azure,
                   block_size=bs, **cls.common(o, fo))
        check_partition_columns(SINK, opts.partition_by, schema)
        return opts


class StagedBlob(TypedDict):
    """One finished file of a committable: its staged blocks, committed by the driver."""

    container: str
    name: str
    block_ids: list[str]
    bytes: int
    records: int


@dataclass(frozen=True, kw_only=True)
class AzureFilesCommittable(Committable):
    """An Azure file transaction's handle: every blob it staged, committed by the committer."""

    kind: ClassVar[str] = "azure-files"
    blobs: list[StagedBlob] = field(default_factory=list)
    guarantee: str = Guarantee.EXACTLY_ONCE.value


class AzureFilesSink(ObjectStoreSpec[AzureFilesCommittable]):
    """Exactly-once Parquet / JSON lines / CSV files on Azure Blob Storage through staged blocks (swept right
    after each commit, invariant 4)."""

    options_class = AzureFilesOptions

    def __init__(self, options: AzureFilesOptions) -> None:
        self.options = options
        self.sink_id = options.sink_id or f"file:{options.url}"
        self.guarantee = options.guarantee
        self.store = AzureBlobs(self)

    def validate_destination(self) -> None:
        """Missing container, refused credentials, unreachable endpoint: a ConfigurationError now."""
        check_container(self.options.azure, self.options.container, self.options.prefix, sink=SINK,
                        url=self.options.url)

    def transaction_log(self) -> TransactionLog:
        """Beside the data, in the container (``<path>/_twophase/<token>/log``), unless ``log.location``."""
        loc = self.options.log_location or f"{self.options.url}/{internal_rel(self.sink_id)}/log"
        return TransactionLog(open_log_store(loc, self.options.azure), self.sink_id, retain=self.options.log_retain)

    def create_writer(self, context: TransactionContext) -> "AzureFilesWriter":
        return AzureFilesWriter(self, context)

    def create_committer(self) -> "AzureFilesCommitter":
        return AzureFilesCommitter(self)


class AzureBlobs(ObjectStore):
    """The Azure file sink's files: one block blob each (invariants 1-4; :mod:`twophase.sinks._azure`)."""

    kind = "azure"
    #: the sweep lists the whole path at least every this many checkpoints (invariant 6)
    FULL_SWEEP_EVERY = 50

    def __init__(self, sink: AzureFilesSink) -> None:
        self.sink = sink
        self._client: Any = None

    @property
    def client(self) -> Any:
        """The container's client (made on first use in each process)."""
        if self._client is None:
            self._client = self.sink.options.azure.container_client(self.sink.options.container)
        return self._client

    def key(self, rel: str) -> str:
        p = self.sink.options.prefix
        return f"{p}/{rel}" if p else rel

    def where(self, name: str) -> str:
        a = self.sink.options.azure.account_name
        return f"abfss://{self.sink.options.container}@{a}.dfs.core.windows.net/{name}"

    def open_stream(self, key: str, pool: ThreadPoolExecutor) -> BlockBlobStream:
        return BlockBlobStream(self.client.get_blob_client(key), self.sink.options.block_size, pool)

    def finish(self, key: str, stream: BlockBlobStream) -> dict[str, Any]:
        ids = stream.finish()
        return {"container": self.sink.options.container, "name": key, "block_ids": ids, "bytes": stream.tell()}

    def complete(self, entry: Mapping[str, Any]) -> str:
        return commit_staged(self.client.get_blob_client(entry["name"]), list(entry["block_ids"]), int(entry["bytes"]),
                             where=self.where(entry["name"]))

    def abort(self, entry: Mapping[str, Any]) -> None:
        drop_uncommitted(self.client.get_blob_client(entry["name"]))

    def entry_id(self, entry: Mapping[str, Any]) -> str:
        return str(entry["name"])

    def list_own(self, sink_id: str) -> list[tuple[str, str, int]]:
        return list_own_staged(self.client, self.sink.options.prefix, sink_id, self.sink.options.partition_by)

    def list_own_for(self, sink_id: str, checkpoint_id: int, entries: Sequence[Mapping[str, Any]], *,
                     recovering: bool = False) -> list[tuple[str, str, int]]:
        """The listing of the sweep right after checkpoint ``n = checkpoint_id`` committed ``entries``: only
        ``n``'s own names (prefix ``part-<token>-<n>-``) in each folder an entry is in and directly under the
        path; the whole path (:meth:`list_own`) when ``n % FULL_SWEEP_EVERY == 0`` or ``recovering``.

        Invariant 6 (nothing the whole listing of every batch found is missed). A straggler is a name of
        this sink (its token, its layout) of a checkpoint ``c`` holding no data (staged blocks only, or an
        abort's 0-byte blob); the old sweep after each commit ``m >= c`` listed the whole path and dropped it.

        1. Safety is unchanged: a scoped listing returns a subset of the whole listing (its prefixes lie
           under the path; the same :func:`~twophase.naming.own_part_rel` filter), and what is dropped of it
           is decided as before (``c <= up_to``, not the checkpoint's own, ``drop_uncommitted`` never
           deletes a committed blob with data).
        2. A checkpoint with no blobs lists ``n``'s names directly under the path (its losers read the same
           empty input). A straggler of ``n`` staged before the listing, in a folder of one of ``n``'s committed blobs or
           directly under the path, starts with ``<folder>/part-<token>-<n>-`` (:func:`part_name_prefix`),
           so the scoped listing of ``n``'s own sweep returns it and it is dropped then, as before. This
           is the common case: a loser attempt (retry, speculative copy, a failed run of the same batch)
           reads the same input as the winner, so its rows go to the same partition folders.
        3. Any other straggler (staged after that listing: a zombie attempt still running; in a folder no
           committed blob of ``n`` is in; of an older checkpoint, staged late) is listed by the next whole
           listing, which is taken (a) by the sweep of every checkpoint ``m`` with
           ``m % FULL_SWEEP_EVERY == 0``: batch ids are consecutive and each batch's commit is followed by
           its sweep, so at most ``FULL_SWEEP_EVERY`` batches later (the ids go on across restarts); (b) by
           every sweep not right after its own commit's listing (a recovery that commits or sweeps, a failed
           scoped listing:
           :meth:`ObjectStoreCommitter.abort_lingering` lists the whole path). A recovery after a clean stop
           whose last commit was swept does not sweep: a straggler staged after that last sweep waits for (a)
           in the next run, as one staged after the last whole listing did before. A sweep is best effort: one that
           fails defers the drop to the next whole listing, as a failed sweep did before. It has ``c <= m``,
           so it is dropped then (1). Until then it is invisible to readers (staged blocks are no blob), but
           an abort's 0-byte blob stays up to ``FULL_SWEEP_EVERY`` batches longer than before; Azure drops
           staged blocks after seven days whatever happens.

        Cost per batch: ``2 * (folders of n + 1)`` List Blobs requests, whatever the path holds; the whole
        listing (``2 * names / 5000`` requests) once per ``FULL_SWEEP_EVERY`` checkpoints."""
        if recovering or checkpoint_id % self.FULL_SWEEP_EVERY == 0:
            return self.list_own(sink_id)
        key_prefix = f"{self.sink.options.prefix}/" if self.sink.options.prefix else ""
        name = part_name_prefix(sink_id, checkpoint_id)
        folders = {""}
        for e in entries:
            rel = str(e["name"])[len(key_prefix):]
            folders.add(rel.rsplit("/", 1)[0] + "/" if "/" in rel else "")
        return list_own_staged(self.client, self.sink.options.prefix, sink_id, self.sink.options.partition_by,
                               [f + name for f in folders])

    def drop_own(self, pending: Collection[tuple[str, str, int]], up_to: int, keep_ids: Collection[str]) -> int:
        return sum(1 for name, _, cid in pending
                   if cid <= up_to and name not in keep_ids and drop_uncommitted(self.client.get_blob_client(name)))


class AzureFilesWriter(ObjectStoreWriter[AzureFilesCommittable]):
    """Task side: one block blob per output file, blocks staged in the background."""

    committable_class = AzureFilesCommittable
    entries_field = "blobs"


class AzureFilesCommitter(ObjectStoreCommitter[AzureFilesCommittable]):
    """Driver side: commit (invariants 1, 2) or drop (3) staged blocks, a checkpoint's at once (5); sweep this
    sink's staged-only names (4) with the commit."""

    committable_type = AzureFilesCommittable
    entries_field = "blobs"
