"""The connector API every exactly-once sink implements: a spec, a writer, a committer, a committable.

The shape is Flink's Sink V2 (``org.apache.flink.api.connector.sink2``): a picklable
:class:`SinkSpec` (options, :meth:`~SinkSpec.validate_destination`, the log's location) creates a
:class:`SinkWriter` on the task side and a :class:`SinkCommitter` on the driver side. The writer's
:meth:`~SinkWriter.prepare_commit` returns a typed :class:`Committable` (the pre-committed
transaction's handle, JSON on the wire and in the log); the committer commits the committables of a
completed checkpoint and returns one :class:`CommitResult` per committable. Sinks never read or write
the transaction log's states: the coordinator alone decides (:mod:`twophase.coordinator`) and the
log alone records (:mod:`twophase.log`).

Where each hook runs (Spark adapter / embedded runtime) and how often:

=======================================  ========  =========================================================
hook                                     where     called
=======================================  ========  =========================================================
``SinkSpec.validate_destination``        driver    before each micro-batch (Spark) / job start (runtime)
``SinkSpec.create_writer``               executor  once per task attempt and checkpoint (by :class:`TaskDriver`)
``SinkWriter.write``                     executor  once per Arrow record batch of the task's input
``SinkWriter.prepare_commit``            executor  once, after the last write; returns the Committable (the ack)
``SinkWriter.abort``                     executor  instead of prepare_commit when the task fails
``SinkSpec.create_committer``            driver    once per coordinator (Spark: per commit call)
``SinkCommitter.commit_checkpoint``      driver    once per completed checkpoint; MAY BE CALLED AGAIN, also
                                                   at recovery (``recovering=True``), the writer long gone
``SinkCommitter.abort``                  driver    per committable of a declined checkpoint, a duplicate
                                                   ack, a PENDING checkpoint found at recovery
``SinkCommitter.abort_lingering``        driver    at recovery and after each commit: abort what no log owns
=======================================  ========  =========================================================

One task driver, :class:`TaskDriver`, runs the writer for the Spark writer, ``foreach_batch`` and the
runtime's sink task: it owns the transaction's state (:data:`twophase.states.TRANSACTION_TRANSITIONS`)
and the task-side fault points ``write`` and ``after_pre_commit``.

Invariants every sink must keep (named in tests as ``test_sink_invN_*``; the conformance suite
``tests/conformance`` and ``integration/conformance`` runs them against every sink):

1. Nothing written in a transaction is visible to readers before its committable is committed.
2. ``commit_checkpoint`` is idempotent: committing a committed committable is a no-op reported as
   ``ALREADY_COMMITTED``, never a second copy. A committable whose data can no longer be committed
   is reported ``LOST`` (the coordinator stops with :class:`~twophase.errors.DataLossError`).
3. ``abort`` is idempotent and never touches committed data.
4. A committable is JSON-serializable and self-sufficient (:meth:`Committable.to_json` /
   :meth:`Committable.from_json`): the driver commits it in another process than the one that wrote
   it, possibly after the writer died.
5. ``abort_lingering(up_to, highest_committed)`` aborts only transactions of checkpoints ``<= up_to``
   that no completed checkpoint owns; it never aborts a transaction that a newer checkpoint may still
   ack, and it removes only what it can prove is its own: every name a sink creates carries
   :func:`sink_token` of its sink id, and a sweep matches that token, never a bare name pattern
   (another sink, another query may write into the same folder, bucket or table).
"""

from __future__ import annotations

import abc
import dataclasses
import enum
import hashlib
import os
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Iterable, Mapping, Optional, Sequence, TypeVar

from twophase import faults
from twophase._logging import get_logger
from twophase.errors import ConfigurationError
from twophase.states import TransactionState, check_transition

if TYPE_CHECKING:
    from twophase.log import TransactionLog

_log = get_logger(__name__)


def sink_token(sink_id: str) -> str:
    """A short, stable digest of ``sink_id`` (12 hex digits) that every name a sink creates carries
    (invariant 5: a sink sweeps only names with its own token)."""
    return hashlib.sha256(sink_id.encode()).hexdigest()[:12]


def normalized_log_location(location: str) -> str:
    """``location`` as one string per place: a local path absolute and normalised (``file://`` dropped),
    ``s3a://`` as ``s3://``, no trailing ``/``. The log stores' own ``location`` is already in this form; this
    also takes the string a user gave (``log.location``)."""
    loc = location.strip()
    if loc.startswith("file://"):
        loc = loc[len("file://"):]
    if "://" not in loc:
        return os.path.normpath(os.path.abspath(os.path.expanduser(loc)))
    scheme, rest = loc.split("://", 1)
    scheme = scheme.lower()
    return f"{'s3' if scheme == 's3a' else scheme}://{rest.rstrip('/')}"


def write_identity(base_log_location: str, key: str) -> str:
    """The identity of batch write ``key`` of the sink whose transaction log is at ``base_log_location``:
    ``<key>@<12 hex digits of the normalised log location>``.

    The log location is in it because the log is what makes a writeId idempotent: two pipelines writing to one
    destination (topic, path, table) with their own ``log.location`` and the same writeId (a run date) are two
    writes, and must never share a token (one's sweep would delete the other's staged files; on Delta the
    second would be taken for "already committed") or Kafka transactional ids (one would fence the other). A
    re-run of the same write (same log location, same key) has the same identity. Short and within
    ``[A-Za-z0-9._@-]`` (a key is at most 64 such characters), so every sink's limits hold.

    A local location is taken with its symlinks resolved (on the driver, where the identity is made): one log
    directory reached by two spellings is one log, so one identity. Two hosts that mount one share at different
    paths still give two identities: give such pipelines one ``log.location`` spelling."""
    location = normalized_log_location(base_log_location)
    if "://" not in location:
        location = os.path.realpath(location)
    digest = hashlib.sha256(location.encode()).hexdigest()[:12]
    return f"{key}@{digest}"


def write_sink_id(sink_id: str, base_log_location: str, key: str) -> str:
    """The sink id of batch write ``key`` of sink ``sink_id`` whose log is at ``base_log_location``:
    ``<sink id>#write:<key>@<log digest>`` (:func:`write_identity`)."""
    return f"{sink_id}#write:{write_identity(base_log_location, key)}"


class Guarantee(str, enum.Enum):
    """Delivery guarantee a sink runs with (option ``guarantee``)."""

    EXACTLY_ONCE = "exactly-once"
    AT_LEAST_ONCE = "at-least-once"

    @classmethod
    def parse(cls, value: str) -> "Guarantee":
        try:
            return cls(value.strip().lower())
        except ValueError:
            raise ConfigurationError(
                f"option 'guarantee' must be 'exactly-once' or 'at-least-once', got {value!r}") from None


@dataclass(frozen=True)
class TransactionContext:
    """Identity of one transaction: which sink, checkpoint, task and attempt.

    ``attempt`` is the attempt number within the task's stage attempt (Spark's ``attemptNumber()``,
    which restarts at 0 in every stage attempt: NOT unique). ``task_attempt_id`` is unique per
    application (Spark's ``taskAttemptId()``; PySpark exposes no stage attempt number); sinks that
    name external transactions per attempt must derive the name from it. ``query_id`` is the streaming query's persistent id
    (``<checkpointLocation>/metadata``), when the engine tells it.
    """

    sink_id: str
    checkpoint_id: int
    task_id: str
    attempt: int = 0
    attempt_uid: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    task_attempt_id: Optional[int] = None
    query_id: Optional[str] = None


@dataclass(frozen=True)
class Ack:
    """A task's acknowledgement of a checkpoint: its pre-committed handle (Spark's commit message)."""

    checkpoint_id: int
    task_id: str
    attempt_uid: str
    handle: Mapping[str, Any]
    records: int = 0
    #: the streaming query the task ran for (Spark's persistent query id), checked against the log's binding
    query_id: Optional[str] = None

    def to_json(self) -> dict[str, Any]:
        return {"checkpoint_id": self.checkpoint_id, "task_id": self.task_id, "attempt_uid": self.attempt_uid,
                "handle": dict(self.handle), "records": self.records, "query_id": self.query_id}

    @classmethod
    def from_json(cls, a: Mapping[str, Any]) -> "Ack":
        """The inverse of :meth:`to_json` (an ack travels as JSON from executors to the driver)."""
        return cls(int(a["checkpoint_id"]), str(a["task_id"]), str(a["attempt_uid"]), a["handle"],
                   int(a.get("records", 0)), a.get("query_id"))


@dataclass(frozen=True, kw_only=True)
class Committable:
    """A pre-committed transaction's handle: typed in Python, JSON on the wire and in the log (invariant 4).

    Subclasses add their fields (plain JSON values, lists of JSON objects) and set ``kind``; the JSON
    form carries ``"sink": kind``. :meth:`from_json` ignores keys it does not know, so a log written by
    another version of twophase still recovers.
    """

    kind: ClassVar[str] = ""
    checkpoint_id: int
    task_id: str
    attempt_uid: str
    records: int = 0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"sink": self.kind}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            out[f.name] = [dict(x) if isinstance(x, Mapping) else x for x in v] if isinstance(v, (list, tuple)) else v
        return out

    @classmethod
    def from_json(cls: type[C], data: Mapping[str, Any]) -> C:
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in data.items() if k in names}
        kw["checkpoint_id"] = int(kw["checkpoint_id"])
        kw["task_id"] = str(kw["task_id"])
        kw.setdefault("attempt_uid", "")
        return cls(**kw)


C = TypeVar("C", bound=Committable)


class CommitStatus(str, enum.Enum):
    """What committing one committable did (Flink's Committer outcomes, without retry-later: a
    transient failure raises and the whole checkpoint's commit is retried, idempotently)."""

    COMMITTED = "committed"
    ALREADY_COMMITTED = "already_committed"
    #: its data is gone (expired, deleted): never silent, the coordinator stops with DataLossError
    LOST = "lost"


@dataclass(frozen=True)
class CommitResult(Generic[C]):
    """The outcome of one committable; ``detail`` says why for LOST (what is gone, and where)."""

    committable: C
    status: CommitStatus
    detail: str = ""


class SinkWriter(abc.ABC, Generic[C]):
    """The task side of one transaction (one task attempt, one checkpoint). Driven by :class:`TaskDriver`."""

    def __init__(self, context: "TransactionContext") -> None:
        self.context = context

    @abc.abstractmethod
    def write(self, batch: Any) -> int:
        """Write one ``pyarrow.RecordBatch``; returns the number of records written. Nothing is visible."""

    @abc.abstractmethod
    def prepare_commit(self) -> C:
        """Make everything written durable but invisible and return its committable (invariant 4)."""

    @abc.abstractmethod
    def abort(self) -> None:
        """Drop the open transaction after a task failure (best effort; recovery sweeps the rest)."""


class SinkCommitter(abc.ABC, Generic[C]):
    """The driver side: commits and aborts committables, sweeps leftovers. Never writes the log."""

    #: commit the committables of one checkpoint with this many threads (I/O-bound sinks set > 1)
    commit_parallelism: int = 1
    #: the sweep after a commit (``abort_lingering(n)``) may run between committing checkpoint ``n``'s
    #: handles and recording it COMMITTED: committing one of those handles again after the sweep (recovery
    #: after a crash in between) is still ALREADY_COMMITTED. Then the COMMITTED record says the sweep went
    #: through and the recovery before the next batch needs none (:mod:`twophase.decisions`). False where a
    #: sweep may fence what a later commit of the same handle needs (Kafka's transactional ids). Such a
    #: sweep's ``highest_committed`` argument is the id below ``n`` (``n`` is not recorded COMMITTED yet).
    sweep_with_commit: bool = False
    #: the committable class this committer takes (decodes JSON handles from acks and the log)
    committable_type: type[Committable] = Committable

    def decode(self, handle: Mapping[str, Any]) -> C:
        """The typed committable of a JSON handle (from an ack or the log)."""
        return self.committable_type.from_json(handle)  # type: ignore[return-value]

    @abc.abstractmethod
    def commit(self, committable: C, *, recovering: bool = False) -> CommitResult[C]:
        """Make ``committable``'s data visible; idempotent (invariant 2)."""

    @abc.abstractmethod
    def abort(self, committable: C, *, recovering: bool = False) -> None:
        """Discard ``committable``'s data; idempotent, never touches committed data (invariant 3).
        ``recovering``: found in a PENDING checkpoint at recovery (its writer is gone)."""

    def commit_checkpoint(self, checkpoint_id: int, committables: Sequence[C], *,
                          recovering: bool = False) -> list[CommitResult[C]]:
        """Commit every committable of a completed checkpoint; one result per committable, in order.

        The default commits one by one (``commit_parallelism`` threads) and is therefore atomic only per
        committable; a crash in between is repaired by recovery committing the rest (fault point
        ``mid_commit``). Override to commit a checkpoint atomically (Delta: one table version).
        """
        if not committables:
            return []
        first = self.commit(committables[0], recovering=recovering)
        faults.maybe_crash("mid_commit", checkpoint_id)
        rest = list(committables[1:])
        if self.commit_parallelism > 1 and len(rest) > 1:
            with ThreadPoolExecutor(min(self.commit_parallelism, len(rest))) as pool:
                results = list(pool.map(lambda c: self.commit(c, recovering=recovering), rest))
        else:
            results = [self.commit(c, recovering=recovering) for c in rest]
        return [first, *results]

    def check_prepared(self, checkpoint_id: int, committables: Sequence[C]) -> list[str]:
        """Before the decision (coordinator step 3): one description per committable whose prepared data the
        destination has already discarded, so that it can never commit (a lease that ran out: Kafka's broker
        aborts a transaction older than ``transaction.timeout.ms``). Any: the checkpoint is declined (aborted,
        retriable) instead of decided, since deciding it would only make it LOST. The default (prepared data
        is durable until commit or abort) finds none. A check that cannot tell returns none: the commit
        still tells lost from committed."""
        return []

    def abort_lingering(self, up_to_checkpoint: int, highest_committed: Optional[int]) -> int:
        """Abort this sink's transactions of checkpoints ``<= up_to_checkpoint`` that no completed
        checkpoint owns (invariant 5); ``highest_committed`` is the log's highest COMMITTED id when the
        coordinator calls. Returns how many were aborted. The default knows of none."""
        return 0

    def close(self) -> None:
        """Release driver-side resources (clients, pools)."""


class SinkSpec(abc.ABC, Generic[C]):
    """A sink's picklable description: options, identity, where its log lives; creates writers and committers.

    Spark pickles the spec to executors (writers) and to the commit worker (committer). Keep it light:
    clients are created lazily and left out of the pickled state.
    """

    #: Stable id of this sink; the transaction log is keyed by it and every name it creates carries its token.
    sink_id: str
    #: what the sink promises; AT_LEAST_ONCE sinks commit at task end and the Spark adapter keeps no log
    guarantee: Guarantee = Guarantee.EXACTLY_ONCE
    #: True if lingering transactions hurt readers until they are aborted (Kafka: an open transaction
    #: holds back read_committed consumers), or a sweep is cheap, so the adapters sweep right after each
    #: commit too, not only at the recovery before the next micro-batch (which may never come).
    sweep_after_commit: bool = False

    #: batch writes (``df.write.format(...)``, SQL ``INSERT INTO``) are supported: the spec is an options
    #: dataclass with ``sink_id`` and ``log_location`` fields (see :meth:`write_job_spec`)
    supports_write_jobs: ClassVar[bool] = False

    def write_job_spec(self, key: str) -> "SinkSpec[C]":
        """The spec of one batch write of this sink (:mod:`twophase.write_job`): its own sink id
        ``<sink id>#write:<key>@<digest of this sink's log location>`` (:func:`write_identity`), so every name it
        creates carries its own token and no sweep of it (or of the streaming query on the same destination, or
        of another batch write, or of another pipeline's write with the same writeId and its own
        ``log.location``) reaches another's data, and its own log at ``<this sink's log>/write-jobs/<key>``.
        Refused where :attr:`supports_write_jobs` is False."""
        if not self.supports_write_jobs:
            raise ConfigurationError(
                f"{type(self).__name__} does not take batch writes (df.write / INSERT INTO); write with a streaming "
                "query instead: spark.readStream...writeStream.trigger(availableNow=True) gives the same exactly-once "
                "backfill, its checkpoint making a re-run idempotent")
        options = getattr(self, "options")
        base_log = self.transaction_log().location.rstrip("/")
        return type(self)(dataclasses.replace(  # type: ignore[call-arg]
            options, sink_id=write_sink_id(self.sink_id, base_log, key), log_location=f"{base_log}/write-jobs/{key}"))

    def validate_destination(self) -> None:
        """Fail early, on the driver before any data moves, if the destination cannot work (unreachable,
        missing, refused settings), with an error that names the option and the fix. Default: nothing."""

    @abc.abstractmethod
    def create_writer(self, context: TransactionContext) -> SinkWriter[C]:
        """Open a transaction for ``context`` (task side); nothing of it is visible to readers."""

    @abc.abstractmethod
    def create_committer(self) -> SinkCommitter[C]:
        """The driver-side committer of this sink."""

    @abc.abstractmethod
    def transaction_log(self) -> "TransactionLog":
        """The durable log of this sink (its location is the sink's to choose; only the coordinator uses it)."""

    def close(self) -> None:
        """Release driver-side resources of the spec (shared clients)."""


class TaskDriver(Generic[C]):
    """The one task-side sequence of the protocol: create the writer, write, prepare_commit, or abort.

    Used by the Spark writer (:func:`run_task`), ``foreach_batch`` and the runtime's sink task, which
    writes a transaction in several steps between barriers. The transaction's moves are checked against
    :data:`twophase.states.TRANSACTION_TRANSITIONS`; fault points ``write`` (after the first non-empty
    write) and ``after_pre_commit`` are here and nowhere else.
    """

    def __init__(self, spec: SinkSpec[C], context: TransactionContext) -> None:
        self.context = context
        self.writer = spec.create_writer(context)
        self.state: TransactionState = TransactionState.OPEN
        self.records = 0
        self._wrote = False

    def _move(self, target: TransactionState) -> None:
        check_transition(self.state, target, what=f"transaction {self.context}")
        self.state = target

    def write(self, batch: Any) -> int:
        n = self.writer.write(batch)
        self.records += n
        if not self._wrote:
            self._wrote = True
            faults.maybe_crash("write", self.context.checkpoint_id)
        return n

    def prepare_commit(self) -> Ack:
        """Pre-commit and return the ack (the committable as JSON, with the task's identity)."""
        committable = self.writer.prepare_commit()
        self._move(TransactionState.PRE_COMMITTED)
        faults.maybe_crash("after_pre_commit", self.context.checkpoint_id)
        c = self.context
        _log.debug("pre_committed", sink_id=c.sink_id, checkpoint_id=c.checkpoint_id, task=c.task_id, records=self.records)
        return Ack(c.checkpoint_id, c.task_id, c.attempt_uid, committable.to_json(), self.records, c.query_id)

    def abort(self) -> None:
        """Abort the open transaction (best effort: a failure is logged, recovery sweeps what is left)."""
        if self.state is not TransactionState.OPEN:
            return
        try:
            self.writer.abort()
        except Exception as e:  # the original error matters more
            _log.warning("abort_open_failed", checkpoint_id=self.context.checkpoint_id, task=self.context.task_id,
                         error=str(e))
        self._move(TransactionState.ABORTED)


def run_task(spec: SinkSpec[Any], context: TransactionContext, batches: Iterable[Any]) -> Ack:
    """Run one task's side of the protocol: write every batch, prepare_commit, return the ack.

    On any failure the open transaction is aborted and the error re-raised (the task fails and the
    checkpoint cannot complete).
    """
    task = TaskDriver(spec, context)
    try:
        for batch in batches:
            task.write(batch)
        return task.prepare_commit()
    except BaseException:
        task.abort()
        raise
