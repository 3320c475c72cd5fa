"""The writer and committer of a file sink on an object store whose files become visible at the DRIVER's
commit: S3 (each file one multipart upload, :mod:`twophase.sinks.s3`) and Azure Blob (each file one block
blob whose blocks are staged, :mod:`twophase.sinks.azure_files`). What differs per store is a small
:class:`ObjectStore` (open a stream of invisible parts, finish it into an entry, complete or abort an entry,
list and drop this sink's unfinished files); the rest is here once:

- :class:`ObjectStoreWriter` (task side, a :class:`~twophase.sinks._filelike.FileLikeWriter`): one stream
  per output file, parts sent in the background on two threads; ``prepare_commit`` finishes every file
  (its last part) and returns the committable listing the entries; at-least-once completes them right away.
- :class:`ObjectStoreCommitter` (driver side): completes every entry of a checkpoint at once (a pool of
  ``commit_parallelism`` threads; fault point ``mid_commit`` when the first is done), takes the sweep's
  listing on the same pool meanwhile, and sweeps this sink's unfinished files of checkpoints ``<= n``
  with it, never the checkpoint's own (kept by id). Before the decision, :meth:`ObjectStoreCommitter.check_prepared`
  asks the store which entries' invisible parts are already gone (:meth:`ObjectStore.gone`): any, and the
  checkpoint is declined (aborted, retriable) rather than decided into a loss.

The invariants are the sinks' (``test_s3_sink_invN_*``, ``test_azure_files_sink_invN_*``); this module
only runs them in one order.
"""

from __future__ import annotations

import abc
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any, ClassVar, Collection, Generic, Mapping, Optional, Sequence, TypeVar

import pyarrow as pa

from twophase import faults
from twophase._logging import get_logger
from twophase.errors import DataLossError
from twophase.sink import Committable, CommitResult, CommitStatus, Guarantee, SinkCommitter, SinkSpec
from twophase.sink import TransactionContext
from twophase.sinks._filelike import FileLikeWriter
from twophase.sinks._formats import FormatWriter, open_format_writer

_log = get_logger(__name__)

C = TypeVar("C", bound=Committable)

#: one unfinished file of this sink found by a sweep: (key, id, checkpoint id)
Pending = tuple[str, str, int]


class ObjectStore(abc.ABC):
    """Where a sink's files go and how one is made visible: the six operations the shared writer and
    committer need. One per sink spec (picklable: clients are made lazily, per process)."""

    #: the name its log events carry (``s3``, ``azure``)
    kind: str = ""

    @abc.abstractmethod
    def key(self, rel: str) -> str:
        """The object key of ``rel`` (relative to the sink's path)."""

    @abc.abstractmethod
    def open_stream(self, key: str, pool: ThreadPoolExecutor) -> Any:
        """A write-only binary stream whose parts go out on ``pool``, invisible; it has ``tell()`` and ``abort()``."""

    @abc.abstractmethod
    def finish(self, key: str, stream: Any) -> dict[str, Any]:
        """Send the stream's last part; the entry that completes it (JSON values, with ``bytes``)."""

    @abc.abstractmethod
    def complete(self, entry: Mapping[str, Any]) -> str:
        """Make ``entry`` visible, whole: 'completed', or 'already' if it was before. DataLossError if its parts
        are gone and it was never made visible; another error if anything else is in its place."""

    @abc.abstractmethod
    def abort(self, entry: Mapping[str, Any]) -> None:
        """Drop ``entry``'s invisible parts; never touches a visible object. Idempotent."""

    @abc.abstractmethod
    def entry_id(self, entry: Mapping[str, Any]) -> str:
        """What identifies ``entry`` among :meth:`list_own`'s ids (kept out of the sweep of its checkpoint)."""

    @abc.abstractmethod
    def list_own(self, sink_id: str) -> list[Pending]:
        """This sink's unfinished files under the path (names carrying its token)."""

    def list_own_for(self, sink_id: str, checkpoint_id: int, entries: Sequence[Mapping[str, Any]], *,
                     recovering: bool = False) -> list[Pending]:
        """What the sweep right after checkpoint ``checkpoint_id``'s commit (its ``entries``) lists: by default
        :meth:`list_own` (a store whose listing grows with history scopes it, proving nothing is missed)."""
        return self.list_own(sink_id)

    #: True if entries can vanish before they are completed (S3: someone else aborts an upload) and :meth:`gone`
    #: tells which: ``check_prepared`` then takes the sweep's listing before the decision and looks at it
    checks_prepared: bool = False
    #: what ``check_prepared`` advises when entries are found gone (the store's usual culprits)
    gone_advice: str = ""
    #: what its entries are called in those words
    entry_noun: str = "pending files"

    def gone(self, entries: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        """Of ``entries`` (of a checkpoint not decided yet) that the sweep's listing did not show, those whose
        invisible parts are gone and which are not visible either: they can never be completed. Raises when the
        store cannot tell (the check is then skipped). By default none."""
        return []

    @abc.abstractmethod
    def drop_own(self, pending: Collection[Pending], up_to: int, keep_ids: Collection[str]) -> int:
        """Drop the listed files of checkpoints ``<= up_to`` whose id is not in ``keep_ids``; how many went."""


class ObjectStoreSpec(SinkSpec[C]):
    """A sink spec with a :attr:`store` and options (an ``options_class`` with ``from_options(raw, schema)``) with
    ``partition_by``, ``max_file_size`` and ``format_options``. Pickled as its options alone (clients are lazy)."""

    #: the sweep right after each commit too, not only at the recovery before the next micro-batch (which never
    #: comes after the last batch of a run): a loser attempt of the last batch leaves nothing behind
    sweep_after_commit = True
    supports_write_jobs = True
    options_class: ClassVar[Any]
    store: ObjectStore
    options: Any

    @classmethod
    def from_options(cls, raw: Mapping[str, Any], schema: Any = None) -> Any:
        """Parse Spark's string options (``schema``, anything with ``.names``, checks partition columns)."""
        return cls(cls.options_class.from_options(raw, schema))

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["options"])  # type: ignore[misc]


@dataclass
class _OpenObject:
    key: str
    stream: Any
    writer: FormatWriter


class ObjectStoreWriter(FileLikeWriter[C]):
    """Task side: one stream of invisible parts per output file, parts sent in the background."""

    committable_class: type[Committable]
    #: the committable's field listing the entries (``uploads`` on S3, ``blobs`` on Azure)
    entries_field: str = "files"

    def __init__(self, sink: ObjectStoreSpec[C], context: TransactionContext) -> None:
        o = sink.options
        super().__init__(context, partition_by=o.partition_by, max_file_size=o.max_file_size,
                         max_records=o.format_options.max_records_per_file, upload_threads=2)
        self.sink = sink
        self.store = sink.store

    def open_file(self, part_rel: str, schema: pa.Schema) -> _OpenObject:
        fo = self.sink.options.format_options
        name = self.next_name(fo.extension)
        key = self.store.key(f"{part_rel}/{name}" if part_rel else name)
        assert self.pool is not None
        stream = self.store.open_stream(key, self.pool)
        return _OpenObject(key, stream, open_format_writer(fo, stream, schema))

    def finish_file(self, f: _OpenObject) -> dict[str, Any]:
        f.writer.close()
        return {**self.store.finish(f.key, f.stream), "records": f.writer.records}

    def after_finish(self) -> None:
        if self.sink.guarantee is Guarantee.AT_LEAST_ONCE:  # task-level commit: visible now, duplicates on replay
            for entry in self.finished:
                self.store.complete(entry)

    def committable(self) -> C:
        c = self.context
        return self.committable_class(checkpoint_id=c.checkpoint_id, task_id=c.task_id,  # type: ignore[return-value]
                                      attempt_uid=c.attempt_uid, records=self.records,
                                      guarantee=self.sink.guarantee.value,
                                      **{self.entries_field: list(self.finished)})

    def discard_open(self, f: _OpenObject) -> None:
        f.stream.abort()

    def discard_finished(self, entry: dict[str, Any]) -> None:
        self.store.abort(entry)


class ObjectStoreCommitter(SinkCommitter[C], Generic[C]):
    """Driver side: complete or abort a checkpoint's entries; sweep this sink's unfinished files."""

    commit_parallelism = 8
    #: completing an entry again after the sweep is still "already": the sweep drops only unfinished files,
    #: never a visible object, and never the checkpoint's own (kept by id)
    sweep_with_commit = True
    entries_field: str = "files"

    def __init__(self, sink: ObjectStoreSpec[C]) -> None:
        self.sink = sink
        self.store = sink.store
        #: the sweep's listing taken while a checkpoint's entries completed: (its id, the listing, their ids)
        self._listed: Optional[tuple[int, Future, frozenset[str]]] = None
        #: the sweep's listing ``check_prepared`` took before the decision: (checkpoint id, listing, entry ids)
        self._checked: Optional[tuple[int, list[Pending], frozenset[str]]] = None

    def entries(self, committable: C) -> list[Mapping[str, Any]]:
        return list(getattr(committable, self.entries_field))

    def _jobs(self, committables: Sequence[C]) -> list[tuple[int, Mapping[str, Any]]]:
        """``(index of its committable, entry)`` for every entry to complete (at-least-once committables have none)."""
        return [(i, e) for i, c in enumerate(committables) if not self._at_least_once(c) for e in self.entries(c)]

    @staticmethod
    def _at_least_once(committable: Committable) -> bool:
        return getattr(committable, "guarantee", None) == Guarantee.AT_LEAST_ONCE.value

    def commit(self, committable: C, *, recovering: bool = False) -> CommitResult[C]:
        if self._at_least_once(committable):
            return CommitResult(committable, CommitStatus.COMMITTED)
        try:
            outcomes = [self.store.complete(e) for e in self.entries(committable)]
        except DataLossError as e:  # gone, and never made visible
            return CommitResult(committable, CommitStatus.LOST, str(e))
        already = bool(outcomes) and all(o == "already" for o in outcomes)
        return CommitResult(committable, CommitStatus.ALREADY_COMMITTED if already else CommitStatus.COMMITTED)

    def commit_checkpoint(self, checkpoint_id: int, committables: Sequence[C], *,
                          recovering: bool = False) -> list[CommitResult[C]]:
        """Complete every entry of the checkpoint concurrently; one result per committable, as :meth:`commit`
        gives it. A failure other than data loss is raised once the others finished."""
        if not committables:
            return []
        jobs = self._jobs(committables)
        outcomes: list[list[str]] = [[] for _ in committables]
        lost: dict[int, str] = {}
        checked, self._checked = self._checked, None
        ids = frozenset(self.store.entry_id(e) for _, e in jobs)
        if jobs:
            with ThreadPoolExecutor(min(self.commit_parallelism, len(jobs)) + 1,
                                    thread_name_prefix="twophase-commit") as pool:
                futures = {pool.submit(self.store.complete, e): i for i, e in jobs}
                if checked is not None and not recovering and checked[0] == checkpoint_id and checked[2] == ids:
                    # the listing check_prepared took of these very entries before the decision: as safe as one
                    # taken now (every entry of the checkpoint is kept by id, every checkpoint below it is final)
                    taken: Future = Future()
                    taken.set_result(checked[1])
                    self._listed = (checkpoint_id, taken, ids)
                else:  # the sweep's listing, beside the completions; the sweep uses it only after them
                    self._listed = (checkpoint_id, pool.submit(self.store.list_own_for, self.sink.sink_id,
                                                               checkpoint_id, [e for _, e in jobs],
                                                               recovering=recovering), ids)
                for n, done in enumerate(as_completed(futures)):
                    i = futures[done]
                    try:
                        outcomes[i].append(done.result())
                    except DataLossError as e:
                        lost[i] = f"{lost[i]}; {e}" if i in lost else str(e)
                    if n == 0:
                        faults.maybe_crash("mid_commit", checkpoint_id)
        else:
            # no file in this checkpoint: its sweep still lists what it can have touched, not the whole path
            listed: Future = Future()
            try:
                listed.set_result(self.store.list_own_for(self.sink.sink_id, checkpoint_id, [], recovering=recovering))
            except Exception as e:  # noqa: BLE001 - the sweep lists again
                listed.set_exception(e)
            self._listed = (checkpoint_id, listed, frozenset())
            faults.maybe_crash("mid_commit", checkpoint_id)
        results = []
        for i, c in enumerate(committables):
            if i in lost:
                results.append(CommitResult(c, CommitStatus.LOST, lost[i]))
                continue
            already = bool(outcomes[i]) and all(o == "already" for o in outcomes[i])
            results.append(CommitResult(c, CommitStatus.ALREADY_COMMITTED if already else CommitStatus.COMMITTED))
        _log.debug(f"{self.store.kind}_checkpoint_committed", sink_id=self.sink.sink_id, checkpoint_id=checkpoint_id,
                   files=len(jobs), already=sum(o.count("already") for o in outcomes), lost=len(lost))
        return results

    def check_prepared(self, checkpoint_id: int, committables: Sequence[C]) -> list[str]:
        """Before the decision (coordinator invariant 4), on a store that ``checks_prepared``: each task with an
        entry whose invisible parts are already gone (on S3 an upload aborted by someone else). Any: the
        checkpoint is declined (every entry aborted, ABORTED, a retriable CheckpointDeclinedError) instead of
        decided into a loss.

        Cost: the listing the sweep after this checkpoint's commit takes anyway (:meth:`ObjectStore.list_own_for`),
        taken here instead and handed to the commit (:meth:`commit_checkpoint` does not list again): no request
        more while every entry is listed; only an entry the listing does not show is looked at
        (:meth:`ObjectStore.gone`). A store that cannot answer (a 5xx, a timeout) is not asked (logged): the
        checkpoint is decided and the commit tells committed from lost (and lists for its sweep itself). An
        entry already made visible (a decided checkpoint asked again) is never gone."""
        self._checked = None
        jobs = self._jobs(committables)
        if not jobs or not self.store.checks_prepared:
            return []
        entries = [e for _, e in jobs]
        try:
            listing = self.store.list_own_for(self.sink.sink_id, checkpoint_id, entries)
            listed = {p[1] for p in listing}
            unseen = [e for e in entries if self.store.entry_id(e) not in listed]
            gone = self.store.gone(unseen) if unseen else []
        except Exception as e:  # noqa: BLE001 - a check that cannot tell never declines
            _log.warning(f"{self.store.kind}_prepared_check_skipped", sink_id=self.sink.sink_id,
                         checkpoint_id=checkpoint_id, error=str(e),
                         consequence="decided without it; the commit tells committed from lost")
            return []
        if not gone:
            self._checked = (checkpoint_id, listing, frozenset(self.store.entry_id(e) for e in entries))
            return []
        gone_ids = {self.store.entry_id(e) for e in gone}
        lost: dict[int, list[str]] = {}
        for i, e in jobs:
            if self.store.entry_id(e) in gone_ids:
                lost.setdefault(i, []).append(str(e.get("key", e.get("name", ""))))
        found = [f"task {committables[i].task_id}: {len(keys)} of its {len(self.entries(committables[i]))} "
                 f"{self.store.entry_noun} are gone before the decision (their parts dropped, never made visible): "
                 f"{keys[:5]}" for i, keys in sorted(lost.items())]
        _log.warning(f"{self.store.kind}_prepared_files_gone", sink_id=self.sink.sink_id, checkpoint_id=checkpoint_id,
                     files=len(gone_ids), consequence="the checkpoint is declined before the decision (a Spark batch "
                     "runs again, the runtime fails over, a batch write must be re-run)")
        if self.store.gone_advice:
            found[-1] = f"{found[-1]}; {self.store.gone_advice}"
        return found

    def abort(self, committable: C, *, recovering: bool = False) -> None:
        if self._at_least_once(committable):
            return
        for e in self.entries(committable):
            self.store.abort(e)

    def abort_lingering(self, up_to_checkpoint: int, highest_committed: Optional[int] = None) -> int:
        """Drop this sink's unfinished files of checkpoints ``<= up_to_checkpoint``; right after the commit of
        ``up_to_checkpoint`` with the listing taken during it."""
        listed, self._listed = self._listed, None
        pending, keep = None, frozenset()
        if listed is not None and listed[0] == up_to_checkpoint:
            try:
                pending, keep = listed[1].result(), listed[2]
            except Exception as e:  # noqa: BLE001 - list again below
                _log.warning(f"{self.store.kind}_sweep_listing_failed", sink_id=self.sink.sink_id,
                             checkpoint_id=up_to_checkpoint, error=str(e), consequence="listed again")
        if pending is None:
            pending = self.store.list_own(self.sink.sink_id)
        n = self.store.drop_own(pending, up_to_checkpoint, keep)
        if n:
            _log.info("lingering_aborted", sink_id=self.sink.sink_id, up_to=up_to_checkpoint, files=n)
        return n
