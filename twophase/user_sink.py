"""``TwoPhaseCommitSink``: the base class of a user's own exactly-once sink (Flink's ``TwoPhaseCommitSinkFunction``).

A user writes one class with seven hooks, and it plugs in wherever a built-in sink does::

    import twophase

    class MySink(twophase.TwoPhaseCommitSink):
        def __init__(self, url, **kw):
            super().__init__(**kw)                        # sink_id=..., log_location=None, guarantee="exactly-once"
            self.url = url
        def begin_transaction(self, context): ...        # executor -> the transaction handle (TXN)
        def write(self, txn, batch): ...                  # executor; batch: pyarrow.RecordBatch
        def pre_commit(self, txn): ...                    # executor; durable and invisible after it returns
        def commit(self, txn): ...                        # driver; after the checkpoint is durable; idempotent
        def abort(self, txn): ...                         # idempotent; never touches committed data
        def recover_and_commit(self, txn): ...            # default: commit(txn); at recovery, writer long gone
        def recover_and_abort(self, txn): ...             # default: abort(txn)

It is an adapter onto the connector API of :mod:`twophase.sink`, not a second protocol:
:class:`TwoPhaseCommitSink` IS a :class:`~twophase.sink.SinkSpec` whose writer calls ``begin_transaction`` /
``write`` / ``pre_commit`` and whose committer calls ``commit`` / ``recover_and_commit`` (``recovering=True``) /
``abort`` / ``recover_and_abort``. The coordinator, the transaction log, the fault points, ``run_task`` and the
conformance suite (:data:`twophase.testing.CONFORMANCE_CHECKS`) are the built-in sinks' own, unchanged.

The transaction handle (``TXN``) travels from the executor to the driver and into the log, and is rebuilt at
recovery in another process: it is a JSON value (dict with str keys, list, str, int, float, bool, None) or a
dataclass of such fields (its class is recorded as ``module:qualname`` and rebuilt with ``cls(**fields)``).

Lingering transactions (invariant 5 of :mod:`twophase.sink`) need no hook of the user: right after
``begin_transaction`` (and again after ``pre_commit``, with the final handle) the writer records the handle under
``user-pending/`` in the sink's log store (next to the log's ``checkpoints/``, which it never touches); ``commit``
and ``abort`` remove that record, and the sweep ``abort_lingering(n)`` calls ``recover_and_abort`` on every recorded
handle of a checkpoint ``<= n`` that is still there (a losing attempt, a task that died in ``write``, a
pre-committed task whose ack never reached the driver): ``recover_and_abort`` may get a handle whose ``pre_commit``
never ran. A record whose abort raises is logged (``lingering_abort_failed``, naming the sink id and the record),
kept, and retried by the next sweep; the others go on. Executors need to reach the log location (the query's
checkpoint location is on shared storage anyway). A handle that is not JSON at ``begin_transaction`` gets no early
record (it is refused at ``pre_commit``).

Invariants (named in tests as ``test_user_sink_invN_*``):

1. The hooks run where and when the table of :mod:`twophase.sink` says for the hook they adapt: ``commit`` only for
   a checkpoint the log decided COMPLETED, ``recover_and_commit`` when that commit is repeated at recovery
   (``recovering=True``), ``recover_and_abort`` for a PENDING checkpoint found at recovery and for the sweep.
2. A handle that is not JSON (or a dataclass of JSON fields, importable by its ``module:qualname``) is refused on
   ``pre_commit``, before the task acks, with a :class:`~twophase.errors.ConfigurationError` naming the field;
   the task fails and its transaction is aborted. What is accepted comes back equal from JSON (no tuple, no
   non-str dict key, no NaN: those would change on the way).
3. A commit hook raising :class:`~twophase.errors.DataLossError` makes the committable LOST, with a detail naming
   the hook, the sink id and the operator command (``twophase log resolve ... --accept-loss``); the coordinator
   stops with DataLossError. Nothing is ever swallowed.
4. Any other exception of a user hook reaches the caller as :class:`SinkHookError` (or DataLossError) whose
   message names the hook (``MySink.commit``) and the sink id, the original chained; ``retriable`` is the
   original's (a :class:`~twophase.errors.TwoPhaseError`) or True for an ``OSError``.
5. The sweep aborts only handles this sink recorded (its own log store, keyed by its sink id), of checkpoints
   ``<= n``; a committed handle's record is removed by its commit before the checkpoint is recorded COMMITTED,
   so the sweep never aborts it (and ``abort`` must never touch committed data anyway).
6. ``sink_id`` is required and validated; the log is at ``log_location``, else under the query's checkpoint
   location (``<owner>/twophase-sink/<token of sink id>``, see :meth:`TwoPhaseCommitSink.bind_owner`), else a
   ConfigurationError names both ways.
7. Pickling (Spark sends the sink to every task and to the driver's commit worker, again for every batch): every
   attribute the sink has when it is first bound (first writer, committer or ``bind_owner``: what the constructor
   set) must pickle, else a ConfigurationError names the attribute; an attribute a hook sets later whose value
   cannot be pickled (a client or connection made lazily) travels as None. A subclass's own ``__getstate__``
   replaces this rule.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
import importlib
import json
import math
import os
import pickle
import re
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Generic, Optional, TypeVar, Union

from twophase._logging import get_logger
from twophase._redact import redact_text
from twophase.errors import ConfigurationError, DataLossError, SinkHookError, TwoPhaseError
from twophase.log import TransactionLog
from twophase.sink import (Committable, CommitResult, CommitStatus, Guarantee, SinkCommitter, SinkSpec, SinkWriter,
                           TransactionContext, sink_token, write_sink_id)

_log = get_logger(__name__)

TXN = TypeVar("TXN")

#: where the writer records pre-committed handles in the sink's log store (invariant 5)
PENDING_PREFIX = "user-pending/"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.]")
_MAX_SINK_ID = 256


@dataclass(frozen=True, kw_only=True)
class UserCommittable(Committable):
    """The committable of a :class:`TwoPhaseCommitSink`: the user's transaction handle as JSON, and the
    ``module:qualname`` of its dataclass ("" for a plain JSON value)."""

    kind: ClassVar[str] = "user"
    txn: Any = None
    txn_class: str = ""


# --------------------------------------------------------------------------- the handle as JSON (invariant 2)


def _refuse(sink: "TwoPhaseCommitSink[Any]", path: str, why: str) -> ConfigurationError:
    return ConfigurationError(
        f"{type(sink).__name__} (sink {sink.sink_id!r}): the transaction handle must be a JSON value (dict with str "
        f"keys, list, str, int, float, bool, None) or a dataclass of such fields, to travel to the driver and be "
        f"rebuilt at recovery; {path} {why}. Keep only names and ids in the handle (a client or connection belongs "
        "on the sink object, created lazily)")


def _check_json(sink: "TwoPhaseCommitSink[Any]", value: Any, path: str) -> None:
    if value is None or (isinstance(value, (bool, str, int)) and not isinstance(value, enum.Enum)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _refuse(sink, path, f"is {value!r}, which JSON does not carry")
        return
    if isinstance(value, list):
        for i, v in enumerate(value):
            _check_json(sink, v, f"{path}[{i}]")
        return
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise _refuse(sink, f"{path}[{k!r}]", f"has a {type(k).__name__} key (JSON keys are str: use str keys)")
            _check_json(sink, v, f"{path}[{k!r}]")
        return
    if isinstance(value, tuple):
        raise _refuse(sink, path, "is a tuple (it would come back as a list): use a list")
    if dataclasses.is_dataclass(value):
        raise _refuse(sink, path, f"is a {type(value).__name__} dataclass (only the handle itself may be a "
                                  "dataclass): use a dict")
    raise _refuse(sink, path, f"is a {type(value).__module__}.{type(value).__qualname__}")


def _class_path(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _resolve(path: str) -> Any:
    module, _, qualname = path.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def encode_txn(sink: "TwoPhaseCommitSink[Any]", txn: Any) -> tuple[Any, str]:
    """``(JSON value, class path)`` of a handle, or a ConfigurationError naming the field that cannot travel."""
    if dataclasses.is_dataclass(txn) and not isinstance(txn, type):
        cls = type(txn)
        path = _class_path(cls)
        try:
            found = _resolve(path)
        except (ImportError, AttributeError):
            found = None
        if found is not cls:
            if cls.__module__ == "__main__":  # a module-level class of the script: another process has another __main__
                raise _refuse(sink, f"its class {path}", "is defined in the script run as __main__, which Spark's "
                                                       "workers and a restarted driver cannot import by that name: "
                                                       "define the dataclass in a module of its own, importable where "
                                                       "the job runs (or use a dict handle)")
            raise _refuse(sink, f"its class {path}", "cannot be imported by that name at recovery (defined inside a "
                                                   "function?): define the dataclass at module level")
        out = {}
        for f in dataclasses.fields(txn):
            if not f.init:  # a value the class makes itself (an id from a default_factory) would be made anew
                raise _refuse(sink, f"field {cls.__qualname__}.{f.name}", "is declared init=False: the driver would "
                                    "rebuild the handle with a new value of it; make it an ordinary field")
            v = getattr(txn, f.name)
            _check_json(sink, v, f"field {cls.__qualname__}.{f.name}")
            out[f.name] = v
        try:
            rebuilt = cls(**json.loads(json.dumps(out)))
        except Exception as e:  # an InitVar, a __post_init__ that refuses its own values
            raise _refuse(sink, f"its class {path}", f"cannot be rebuilt from its fields ({type(e).__name__}: {e})")
        if rebuilt != txn:
            raise _refuse(sink, f"its class {path}", "rebuilt from its fields is not equal to the handle (a "
                                                     "__post_init__ that changes values, or a field that is not "
                                                     "compared): use plain fields, or a dict")
        return out, path
    _check_json(sink, txn, "txn")
    return txn, ""


def decode_txn(sink: "TwoPhaseCommitSink[Any]", committable: UserCommittable) -> Any:
    """The handle of ``committable`` as the user's hooks take it (a dataclass is rebuilt from its class path)."""
    if not committable.txn_class:
        return committable.txn
    try:
        cls = _resolve(committable.txn_class)
        return cls(**committable.txn)
    except (ImportError, AttributeError, TypeError) as e:
        raise ConfigurationError(
            f"{type(sink).__name__} (sink {sink.sink_id!r}): the transaction handle of checkpoint "
            f"{committable.checkpoint_id} task {committable.task_id} is a {committable.txn_class} and cannot be rebuilt "
            f"in this process ({type(e).__name__}: {e}); install the module that defines it where the driver runs")


#: (class, sink id, attribute) already warned about by attribute_not_pickled in this process
_NOT_PICKLED_WARNED: set = set()


def _picklable(value: Any) -> bool:
    if value is None or isinstance(value, (str, int, float, bool, bytes)):
        return True
    try:
        try:
            from pyspark import cloudpickle as _cp  # what Spark pickles with (lambdas, local classes)
            _cp.dumps(value)
        except ImportError:
            pickle.dumps(value)
    except Exception:
        return False
    return True


# --------------------------------------------------------------------------- the user's base class


class TwoPhaseCommitSink(SinkSpec[UserCommittable], Generic[TXN]):
    """Base of a user's own exactly-once sink: implement the hooks, pass it where a sink goes.

    ``twophase.spark.foreach_batch(MySink(..., log_location=...), owner=checkpoint)`` (or
    ``MySink(...).bind_owner(checkpoint)`` for the log under the checkpoint location), ``stream.sink_to(MySink(...,
    log_location=...))`` in the embedded runtime. See the module docstring for the invariants.
    """

    #: the sweep is one listing of the sink's own pending records: sweep right after each commit too
    sweep_after_commit = True

    def __init__(self, *, sink_id: str, log_location: Optional[str] = None,
                 guarantee: Union[str, Guarantee] = Guarantee.EXACTLY_ONCE) -> None:
        where = type(self).__name__
        if not isinstance(sink_id, str) or not sink_id.strip():
            raise ConfigurationError(f"{where}: sink_id is required, a non-empty string that stays the same across "
                                     f"restarts (the transaction log is keyed by it), got {sink_id!r}")
        if sink_id != sink_id.strip() or len(sink_id) > _MAX_SINK_ID or any(not c.isprintable() for c in sink_id):
            raise ConfigurationError(f"{where}: sink_id {sink_id!r} must be printable, at most {_MAX_SINK_ID} "
                                     "characters, without leading or trailing spaces")
        if log_location is not None and (not isinstance(log_location, str) or not log_location.strip()):
            raise ConfigurationError(f"{where}: log_location must be a path or URL (or None: under the query's "
                                     f"checkpoint location), got {log_location!r}")
        self.sink_id = sink_id
        self.log_location = log_location
        self.guarantee = guarantee if isinstance(guarantee, Guarantee) else Guarantee.parse(str(guarantee))
        #: the query's checkpoint location, set by :meth:`bind_owner`; the default home of the log
        self.owner: Optional[str] = None
        self._twophase_init = True

    # ---- the user's hooks

    @abc.abstractmethod
    def begin_transaction(self, context: TransactionContext) -> TXN:
        """Open a transaction for ``context`` (executor); returns its handle (JSON or a dataclass of JSON)."""

    @abc.abstractmethod
    def write(self, txn: TXN, batch: Any) -> None:
        """Write one ``pyarrow.RecordBatch`` into ``txn`` (executor); nothing is visible to readers."""

    @abc.abstractmethod
    def pre_commit(self, txn: TXN) -> None:
        """Make ``txn`` durable and still invisible (executor); after it returns, ``txn`` travels as JSON."""

    @abc.abstractmethod
    def commit(self, txn: TXN) -> Optional[CommitStatus]:
        """Make ``txn`` visible (driver, after the checkpoint is durable); idempotent. Raise
        :class:`~twophase.errors.DataLossError` if its data is gone. May return
        ``CommitStatus.ALREADY_COMMITTED`` when the destination tells that ``txn`` was committed before (anything
        else, None included, is COMMITTED)."""

    @abc.abstractmethod
    def abort(self, txn: TXN) -> None:
        """Discard ``txn``; idempotent; never touches committed data."""

    def recover_and_commit(self, txn: TXN) -> Optional[CommitStatus]:
        """Commit ``txn`` at recovery (another process; the writer long gone). Default: :meth:`commit`."""
        return self.commit(txn)

    def recover_and_abort(self, txn: TXN) -> None:
        """Abort ``txn`` at recovery or in the sweep (the writer gone). Default: :meth:`abort`."""
        self.abort(txn)

    # ---- plumbing

    def bind_owner(self, owner: Optional[str]) -> "TwoPhaseCommitSink[TXN]":
        """Tell the sink its query's checkpoint location (the log's default home when ``log_location`` is None);
        returns the sink. The adapters call it with the location they claim the log for."""
        self._check_init()
        if owner:
            self.owner = owner
        return self

    def _check_init(self) -> None:
        if not getattr(self, "_twophase_init", False):
            raise ConfigurationError(f"{type(self).__name__}.__init__ did not call super().__init__(sink_id=..., "
                                     "log_location=..., guarantee=...); add that call")
        if not self.__dict__.get("_twophase_bound", False):
            self._check_picklable()
            self._twophase_bound = True

    # ---- pickling (invariant 7): Spark pickles the sink to every task and to the commit worker, again per batch

    def _check_picklable(self) -> None:
        """At bind time (the first writer, committer or bind_owner): what the constructor set must pickle."""
        own = type(self).__getstate__ is not TwoPhaseCommitSink.__getstate__  # a subclass's rule (it drops its clients)
        state = self.__getstate__() if own else self.__dict__
        for name, value in (state.items() if isinstance(state, dict) else ()):
            if not _picklable(value):
                raise ConfigurationError(
                    f"{type(self).__name__} (sink {self.sink_id!r}): attribute {name!r} ({type(value).__name__}) cannot "
                    "be pickled, and Spark sends the sink to every task and to the driver's commit worker: keep only "
                    f"settings on the sink and create the client lazily (self.{name} = None in __init__, made on "
                    "first use in a hook: such a value set after the sink is bound travels as None)")

    def __getstate__(self) -> dict[str, Any]:
        """The sink's attributes; one whose value cannot be pickled (a client or connection a hook made lazily)
        travels as None and is made again on first use where the copy runs."""
        state = dict(self.__dict__)
        if state.get("_twophase_bound", False):
            for name, value in state.items():
                if not _picklable(value):
                    key = (type(self).__qualname__, state.get("sink_id"), name)
                    if key not in _NOT_PICKLED_WARNED:  # once per process: the sink is pickled per task and batch
                        _NOT_PICKLED_WARNED.add(key)
                        _log.warning("attribute_not_pickled", sink_id=state.get("sink_id"), attribute=name,
                                     type=type(value).__name__,
                                     consequence="it travels as None and is made again on first use where the copy "
                                                 "runs (warned once per process)")
                    state[name] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def resolved_log_location(self) -> str:
        """Where this sink's transaction log is (invariant 6)."""
        self._check_init()
        if self.log_location:
            return self.log_location
        if self.owner:
            owner = self.owner
            if owner.startswith("file:") and not owner.startswith("file://"):
                owner = owner[len("file:"):]
            if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:(?!//)", owner):  # dbfs:/..., hdfs:/...: not a local path
                raise ConfigurationError(
                    f"{type(self).__name__} (sink {self.sink_id!r}): the checkpoint location {owner!r} is a URL without "
                    "'//' that twophase would take for a local path on each host: pass log_location= to the "
                    "constructor (a shared path, or s3://bucket/prefix)")
            token = sink_token(self.sink_id)
            return (f"{owner.rstrip('/')}/twophase-sink/{token}" if "://" in owner
                    else os.path.join(owner, "twophase-sink", token))
        raise ConfigurationError(
            f"{type(self).__name__} (sink {self.sink_id!r}) has no place for its transaction log: pass "
            "log_location='/path/or/s3://bucket/prefix' to the constructor (kept across restarts, reachable from the "
            "driver and the executors), or give it the query's checkpoint location: "
            "sink.bind_owner('<checkpointLocation>') (the log then lives under it)")

    def transaction_log(self) -> TransactionLog:
        return TransactionLog.open(self.resolved_log_location(), self.sink_id)

    def create_writer(self, context: TransactionContext) -> "_UserWriter":
        self._check_init()
        return _UserWriter(self, context)

    def create_committer(self) -> "_UserCommitter":
        self._check_init()
        return _UserCommitter(self)

    def call_hook(self, hook: str, *args: Any) -> Any:
        """Run user hook ``hook`` (invariant 4: its errors name the hook and the sink id)."""
        fn: Callable[..., Any] = getattr(self, hook)
        what = f"{type(self).__name__}.{hook} of sink {self.sink_id!r}"
        try:
            return fn(*args)
        except ConfigurationError as e:
            raise ConfigurationError(f"{what}: {redact_text(str(e))}") from e
        except DataLossError as e:
            raise DataLossError(f"{what} declared the data gone: {redact_text(str(e))}") from e
        except Exception as e:  # the user's message passes through the one redaction (a URL's password, a key=)
            retriable = e.retriable if isinstance(e, TwoPhaseError) else isinstance(e, OSError)
            raise SinkHookError(f"{what} failed: {type(e).__name__}: {redact_text(str(e))}",
                                retriable=retriable) from e

    # ---- batch writes (twophase.write_job): one sink id and log per write, the same hooks

    supports_write_jobs = True

    def write_job_spec(self, key: str) -> "TwoPhaseCommitSink[TXN]":
        """The sink of one batch write: built again by its constructor from the options it was built from (a
        registered format, :func:`twophase.spark.data_source`), with sink id ``<sink id>#write:<key>@<digest>`` and
        its log under this sink's log (``<log>/write-jobs/<key>``), so that whatever the constructor derives from
        the sink id (names, prefixes its sweep proves ownership by) is the write's own."""
        options = self.__dict__.get("_twophase_options")
        if options is None:
            raise ConfigurationError(
                f"{type(self).__name__} (sink {self.sink_id!r}) takes batch writes (df.write) only as a registered "
                "format: spark.dataSource.register(twophase.spark.data_source(" + type(self).__name__ + ", name=...)), "
                "then df.write.format(name).option(...).mode('append').save()")
        base_log = self.resolved_log_location().rstrip("/")
        spec = type(self)(**{**options, "sink_id": write_sink_id(self.sink_id, base_log, key),
                             "log_location": f"{base_log}/write-jobs/{key}"})
        spec._twophase_options = dict(options)
        return spec

    # ---- pending records (invariant 5)

    def _pending_name(self, c: Committable) -> str:
        return f"{PENDING_PREFIX}{c.checkpoint_id:020d}-{_UNSAFE.sub('_', c.task_id)}-{_UNSAFE.sub('_', c.attempt_uid)}.json"


class _UserWriter(SinkWriter[UserCommittable]):
    """Task side: ``begin_transaction`` at creation, ``write`` per batch, ``pre_commit`` then the pending record."""

    def __init__(self, sink: TwoPhaseCommitSink[Any], context: TransactionContext) -> None:
        super().__init__(context)
        self.sink = sink
        self.records = 0
        self.txn = sink.call_hook("begin_transaction", context)
        if sink.guarantee is not Guarantee.AT_LEAST_ONCE:
            try:
                self._record_early()
            except BaseException:  # no record names the transaction begun and no writer exists to abort it
                try:
                    sink.call_hook("abort", self.txn)
                except Exception as e:
                    _log.warning("abort_after_failed_early_record_failed", sink_id=sink.sink_id, error=repr(e))
                raise

    def _record_early(self) -> None:
        """The pending record right after begin_transaction: a task that dies in ``write`` leaves a handle the
        sweep aborts (``recover_and_abort`` may thus get a handle whose ``pre_commit`` never ran). A handle that
        cannot travel is refused at ``pre_commit``, as always; then it has no early record."""
        sink, c = self.sink, self.context
        try:
            value, cls_path = encode_txn(sink, self.txn)
        except ConfigurationError:
            return
        early = UserCommittable(checkpoint_id=c.checkpoint_id, task_id=c.task_id, attempt_uid=c.attempt_uid,
                                records=0, txn=value, txn_class=cls_path)
        sink.transaction_log().store.put(sink._pending_name(early), json.dumps(early.to_json()).encode())

    def write(self, batch: Any) -> int:
        self.sink.call_hook("write", self.txn, batch)
        n = getattr(batch, "num_rows", None)
        n = len(batch) if n is None else int(n)
        self.records += n
        return n

    def prepare_commit(self) -> UserCommittable:
        sink, c = self.sink, self.context
        sink.call_hook("pre_commit", self.txn)
        value, cls_path = encode_txn(sink, self.txn)  # invariant 2: before the ack
        committable = UserCommittable(checkpoint_id=c.checkpoint_id, task_id=c.task_id, attempt_uid=c.attempt_uid,
                                      records=self.records, txn=value, txn_class=cls_path)
        if sink.guarantee is Guarantee.AT_LEAST_ONCE:
            sink.call_hook("commit", self.txn)  # no coordinator: visible at task end
            return committable
        sink.transaction_log().store.put(sink._pending_name(committable),
                                         json.dumps(committable.to_json()).encode())
        return committable

    def abort(self) -> None:
        sink, c = self.sink, self.context
        sink.call_hook("abort", self.txn)
        if sink.guarantee is not Guarantee.AT_LEAST_ONCE:  # its early record (or pre_commit's) is done with
            sink.transaction_log().store.delete(sink._pending_name(
                UserCommittable(checkpoint_id=c.checkpoint_id, task_id=c.task_id, attempt_uid=c.attempt_uid)))


class _UserCommitter(SinkCommitter[UserCommittable]):
    """Driver side: ``commit`` / ``recover_and_commit``, ``abort`` / ``recover_and_abort``, and the sweep."""

    committable_type = UserCommittable

    def __init__(self, sink: TwoPhaseCommitSink[Any]) -> None:
        self.sink = sink
        self._store: Any = None

    @property
    def store(self) -> Any:
        if self._store is None:
            self._store = self.sink.transaction_log().store
        return self._store

    def commit(self, committable: UserCommittable, *, recovering: bool = False) -> CommitResult[UserCommittable]:
        sink = self.sink
        hook = "recover_and_commit" if recovering else "commit"
        txn = decode_txn(sink, committable)
        try:
            outcome = sink.call_hook(hook, txn)
        except DataLossError as e:  # invariant 3
            location = sink.resolved_log_location()
            return CommitResult(committable, CommitStatus.LOST, (
                f"{type(sink).__name__}.{hook} (sink {sink.sink_id!r}): checkpoint {committable.checkpoint_id} task "
                f"{committable.task_id}: {e.__cause__ or e}. Checkpoint {committable.checkpoint_id} stays COMPLETED and "
                f"every restart stops here until an operator records the loss: twophase log resolve {location} "
                f"--sink-id {sink.sink_id} --checkpoint {committable.checkpoint_id} --accept-loss"))
        self.store.delete(sink._pending_name(committable))
        # a hook that can tell a repeated commit (its destination says so) returns ALREADY_COMMITTED
        status = CommitStatus.ALREADY_COMMITTED if outcome is CommitStatus.ALREADY_COMMITTED else CommitStatus.COMMITTED
        return CommitResult(committable, status)

    def abort(self, committable: UserCommittable, *, recovering: bool = False) -> None:
        sink = self.sink
        sink.call_hook("recover_and_abort" if recovering else "abort", decode_txn(sink, committable))
        self.store.delete(sink._pending_name(committable))

    def abort_lingering(self, up_to_checkpoint: int, highest_committed: Optional[int]) -> int:
        aborted = failed = 0
        for name in self.store.list(PENDING_PREFIX):
            base = name.rsplit("/", 1)[-1]
            try:
                checkpoint_id = int(base.split("-", 1)[0])
            except ValueError:
                continue  # not one of ours
            if checkpoint_id > up_to_checkpoint:
                continue  # a newer checkpoint may still ack it
            raw = self.store.get(name if name.startswith(PENDING_PREFIX) else PENDING_PREFIX + name)
            if raw is None:
                continue
            try:
                committable = UserCommittable.from_json(json.loads(raw))
                self.sink.call_hook("recover_and_abort", decode_txn(self.sink, committable))
            except Exception as e:  # one record must not block the others: kept, retried by the next sweep
                _log.warning("lingering_abort_failed", sink_id=self.sink.sink_id, record=name,
                             checkpoint_id=checkpoint_id, error=f"{type(e).__name__}: {redact_text(str(e))}")
                failed += 1
                continue
            self.store.delete(self.sink._pending_name(committable))
            aborted += 1
        if aborted or failed:
            _log.info("lingering_aborted", sink_id=self.sink.sink_id, up_to=up_to_checkpoint, transactions=aborted,
                      failed=failed)
        return aborted


__all__ = ["PENDING_PREFIX", "SinkHookError", "TwoPhaseCommitSink", "UserCommittable", "decode_txn", "encode_txn"]
