"""Exactly-once Kafka sink: one Kafka transaction per writer partition and checkpoint, committed by the driver.

The connector's parts (:mod:`twophase.sink`): :class:`KafkaSink` is the spec (options, validation,
the prefix claim, the timeout alarm, the log's location, the shared admin client);
:class:`KafkaWriter` holds one task attempt's producer and transaction (steps 1-3);
:class:`KafkaCommitter` ends transactions from the driver (steps 4-5); :class:`KafkaCommittable` is
the prepared transaction's handle.

Files (one concern each; every name is importable from this module as before): this module holds the
protocol and its invariants, the transactional id scheme, the committable and :class:`KafkaSink` (the start
check, the timeout alarm, the prefix registry); ``_kafka_options`` the options (:class:`KafkaSinkOptions`);
``_kafka_writer`` what both writers share (the id's choice and ownership); ``_kafka_rdkafka_writer`` and
``_kafka_python_writer`` the two producers; ``_kafka_committer`` the driver's EndTxn; ``_kafka_txn`` the raw
coordinator requests; ``_kafka_timeout`` the transaction timeout the brokers accept.

Protocol (``# step N`` in the code):

1. begin (executor, when the writer is created): pick the task's transactional id (see below: a slot probed with
   DescribeTransactions, never one with an open transaction); ``init_transactions`` on it;
   ``begin_transaction``.
2. write (executor): every row becomes a record (columns ``key``, ``value``, ``topic``, ``partition``,
   ``headers`` as in Spark's Kafka sink); every record's delivery report is counted per partition.
3. prepare_commit (executor): ``flush``; every record sent must be acknowledged (invariant 6), and the
   id must still be ours (DescribeTransactions: Ongoing with our producer id and epoch); the
   committable (:class:`KafkaCommittable`) carries ``transactional_id, producer_id, epoch, partitions:
   [{topic, partition, first_offset, last_offset, records}], records``. The task ends WITHOUT
   committing or aborting: the transaction stays open (the librdkafka producer is dropped, never
   closed: ``Producer.close()`` aborts the open transaction).

The producer (option ``kafkaClient``): :class:`KafkaWriter`, librdkafka through confluent-kafka (the
default; producer id and epoch from librdkafka's statistics), or :class:`KafkaPythonWriter`,
kafka-python's producer. Both follow steps 1-3 and every invariant below; the driver's requests
(step 4-5, :mod:`twophase.sinks._kafka_txn`) use kafka-python's protocol classes either way.
4. commit (driver): ``EndTxn(commit)`` carrying the committable's id, producer id and epoch, sent by the
   driver's own connection (see :mod:`twophase.sinks._kafka_txn`); committables are committed in
   parallel (``commitParallelism``) and the coordinator records COMMITTED in the log. The
   committable's measured age is checked (invariant 7).
5. abort / recovery (driver): ``EndTxn(abort)``; at start-up (prepare_sink) the broker must accept
   ``kafka.transaction.timeout.ms`` (else a ConfigurationError naming it and the broker's
   ``transaction.max.timeout.ms``), COMPLETED checkpoints are committed, then open transactions under
   the prefix are fenced (ListTransactions where the broker has it, else every id of the known id
   space: tasks seen in the log x generations x slots) -- only those of the generation of the highest
   COMMITTED checkpoint (``highest_committed``, which the coordinator passes to
   ``abort_lingering``), because prepare_sink also runs in the commit worker right before the next
   checkpoint's commit, whose transactions (the other generation) must survive; the next sweep of
   that generation (after that checkpoint commits) fences the rest.

Transactional ids: ``<prefix>-<task>-<generation>-<slot>``. ``task`` is the Spark partition or the
runtime task id (``out-0`` becomes ``out.0``: a task never contains ``-``, so ids of a prefix ``p``
never parse as ids of ``p-x``); ``generation`` is the checkpoint id mod 2; ``slot`` is one of
``transactionalIdAttempts`` (default 8) slots. An attempt probes the slots starting at
``taskAttemptId mod slots`` (Spark's id, unique per application; the runtime gives a random one per
task attempt) and takes the first whose id has no open transaction (DescribeTransactions: unknown,
CompleteCommit, CompleteAbort, Dead; then Empty), never one that is Ongoing / Prepare*. If every slot
is open the task fails (retried by Spark) naming ``transactionalIdAttempts``. The id space is bounded
(tasks x 2 x slots) and stable across restarts, so recovery finds every lingering id. A batch write
(:meth:`KafkaSink.write_job_spec`) has a prefix of its own, ``<prefix>.w<token>`` (the token of its key and
log location), and puts its run in place of the generation: its sweeps fence runs ``<= n`` only, never a
later run of the same write in flight (one id space per run; the write's runs are few).

Invariants (``test_kafka_sink_invN_*``):

1. Nothing a task writes is visible to read_committed readers before the driver commits its committable.
2. ``commit`` is idempotent: a repeated EndTxn with the same epoch succeeds (COMMITTED: the broker
   answers it as the first); if the epoch was fenced or the broker ended the transaction, the
   records are looked up with a read_committed reader: visible is ALREADY_COMMITTED, otherwise LOST
   with a detail naming the checkpoint, transactional id, partitions and the operator command
   ``twophase log resolve <log> --checkpoint N --accept-loss`` (the coordinator stops with
   :class:`~twophase.errors.DataLossError`). Never silently dropped. Transient errors (coordinator
   moving, unreachable) raise, and the commit is retried. Before the decision, ``check_prepared``
   (DescribeTransactions) finds a prepared transaction the broker already ended, or one within
   ``min(2 s, 10 %)`` of its timeout: the coordinator then declines the batch (aborted, retriable, re-run)
   instead of deciding a checkpoint that could only become LOST.
3. ``abort`` never touches committed records (the broker refuses to abort a committed epoch; noida-db
   answers success to an abort after commit and keeps the records). Needs a broker: shown by
   ``integration/kafka/test_kafka_sink.py::test_kafka_sink_inv1_inv2_inv3_driver_commits_after_writer_exited_repeat_and_abort_keep_data``
   (an abort after the commit, read back with read_committed).
4. No attempt initialises a transactional id whose transaction may still be committed. A committable
   exists only for a transaction that was Ongoing with records at prepare_commit (checked then), and an
   Ongoing id is never initialised by a probing attempt; so attempts of one partition and checkpoint
   (retries, speculative copies, a resubmitted stage whose attemptNumber restarted at 0, a runtime
   task with checkpoints c and c+2 in flight) never abort each other's prepared transaction. The
   one interleaving a probe cannot see -- attempt B probes slot k before attempt A's first write
   makes it Ongoing, and B initialises k only after A pre-committed -- needs B to stall between two
   consecutive requests for A's whole task AND taskAttemptIds congruent mod slots; B then sees an
   epoch it did not expect (``transactional_id_race``, the task fails) and the driver's commit of
   A is LOST (DataLossError): loud, never silent. Without DescribeTransactions (Kafka < 3.0) the slot
   is ``taskAttemptId mod slots`` unprobed. A fenced producer never un-fences itself (no
   client-side KIP-360 epoch bump). ``abort_lingering(n)`` fences only ids of generation
   ``min(n, highest COMMITTED) mod 2`` and, in the embedded runtime (one process), never an id this
   sink object's writers began for a checkpoint ``> n`` that is not decided yet (with max_concurrent >= 2,
   checkpoint n+2 has n's generation).
5. A transactional prefix belongs to one query (its checkpoint location): a second one is refused.
   The claim is a write-once ``owner.json`` under ``<prefixRegistry>/<cluster>/<prefix>``; the
   registry follows the log: ``s3://<bucket>/_twophase/kafka-prefixes`` when the log is on S3, so
   drivers on any host see every claim, and a driver restarted on another host with the same
   checkpoint location takes its own claim back (a URI is compared as given, never made absolute
   against the driver's working directory). With a local log it is
   ``$TWOPHASE_STATE_DIR/kafka-prefixes`` (or ``~/.twophase/kafka-prefixes``): on a cluster, put the
   checkpoint (or ``log.location``) on S3 or a shared filesystem, and ``prefixRegistry`` with it.
6. Every record sent is accounted for: prepare_commit fails the task (TransientSinkError, the
   transaction is aborted) unless every send was acknowledged -- a batch whose
   ``delivery.timeout.ms`` expired mid-task while later ones succeeded is never committed short.
7. ``kafka.transaction.timeout.ms``, when not given, is the largest timeout the brokers accept up to 1 hour
   (chosen at the start check and logged, :mod:`twophase.sinks._kafka_timeout`; Kafka's default maximum is
   15 min); an explicit value the brokers refuse fails the start check naming both settings. At commit, a committable older than 25 % of
   the timeout logs ``transaction_near_timeout``; older than 50 % (the batch took half the time the
   broker gives it: one driver outage of the same length and it expires) it is still committed, and
   the next batch is refused at prepare_sink, before it writes, with an error naming the measured
   age and the setting, until the timeout is at least twice that age (never while a COMPLETED
   checkpoint awaits recovery: committing it comes first). A commit made by recovery measures the driver's
   outage, not the batch: it logs ``transaction_aged_by_outage`` and raises no alarm. The alarm is the object
   ``timeout-alarm/timeout-alarm.json`` under the sink's transaction log location (local, shared or
   S3; a store of its own, whose lock a commit can take while the coordinator holds the log's),
   written and cleared by compare-and-swap, so a driver restarted on another host still sees it;
   nothing of it is on the driver host's disk.

Where the sink still reads its transaction log (the coordinator alone writes states; it passes
``highest_committed`` to ``abort_lingering``, so the sweep reads no state):

- :meth:`KafkaSink._check_age_alarm` (validate_destination, before any coordinator exists): whether
  a COMPLETED checkpoint awaits recovery, so that the alarm never blocks the recovery that commits it.
- :meth:`KafkaCommitter._known_id_space`, only where the broker cannot ListTransactions (Kafka < 3.0):
  the task ids of the log's handles are the only record of which ids were used under the prefix.
- The prefix registry (invariant 5) is a :class:`~twophase.log.TransactionLog` of its own (its
  write-once owner claim), not the sink's log; the alarm is an object of a store of its own.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import socket
import threading
import time
import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, Optional, TypedDict

from twophase._logging import get_logger
from twophase._redact import redact_error
from twophase.errors import (ConcurrentWriterError, ConfigurationError, FencedError,
                             TransientSinkError)
from twophase.log import LogStore, TransactionLog, decode_record, encode_record
from twophase.log_s3 import is_s3_url, open_log_store, parse_s3_url
from twophase.options import parse_duration_ms  # re-exported (public since the options lived here)
from twophase.sinks._kafka_options import (DEFAULT_TRANSACTION_TIMEOUT_MS, KAFKA_SINK_OPTIONS, S3_REGISTRY_PREFIX,
                                          SINK, KafkaSinkOptions, owner_key)
from twophase.sinks._kafka_timeout import (CACHE as _TIMEOUT_CACHE, check_delivery_timeout,
                                          check_timeout_against_trigger, choose_default_timeout, chosen_timeout,
                                          delivery_timeout_for, timeout_accepted)
from twophase.sink import (Committable, Guarantee, SinkSpec, TransactionContext, sink_token,
                           write_identity, write_sink_id)

if TYPE_CHECKING:  # loaded on first use (see _MOVED at the end)
    from twophase.sinks._kafka_committer import KafkaCommitter
    from twophase.sinks._kafka_python_writer import KafkaPythonWriter, KafkaTransaction
    from twophase.sinks._kafka_rdkafka_writer import KafkaWriter, RdKafkaTransaction
    from twophase.sinks._kafka_writer import _KafkaWriterBase

_log = get_logger(__name__)

#: invariant 7: a handle older than these fractions of the timeout at commit warns / blocks the next batch
WARN_AGE_FRACTION = 0.25
BLOCK_AGE_FRACTION = 0.5
#: invariant 7: before the decision, a transaction within min(EXPIRY_MARGIN_MS, EXPIRY_MARGIN_FRACTION) of its
#: timeout is taken as expired (the broker aborts it at its next check, likely before the EndTxn arrives)
EXPIRY_MARGIN_MS = 2000.0
EXPIRY_MARGIN_FRACTION = 0.1


@dataclass(frozen=True)
class TransactionAge:
    """Invariant 7: a prepared transaction's measured age (from before ``init_transactions``, so never below the
    broker's) against its transaction timeout: the one arithmetic behind the commit's warning and alarm
    (:meth:`KafkaCommitter._check_age`) and the check before the decision (:meth:`KafkaCommitter.check_prepared`).
    A timeout of 0 or unknown is never near."""

    age_ms: float
    timeout_ms: float

    @property
    def warns(self) -> bool:
        """Older than :data:`WARN_AGE_FRACTION` of the timeout: the commit warns."""
        return self.timeout_ms > 0 and self.age_ms > WARN_AGE_FRACTION * self.timeout_ms

    @property
    def blocks(self) -> bool:
        """Older than :data:`BLOCK_AGE_FRACTION` of the timeout: the commit raises the alarm (next batch refused)."""
        return self.timeout_ms > 0 and self.age_ms > BLOCK_AGE_FRACTION * self.timeout_ms

    @property
    def expiring(self) -> bool:
        """Within ``min(2 s, 10 %)`` of the timeout: check_prepared declines the batch before the decision."""
        margin = min(EXPIRY_MARGIN_MS, EXPIRY_MARGIN_FRACTION * self.timeout_ms)
        return self.timeout_ms > 0 and self.age_ms >= self.timeout_ms - margin


#: invariant 7: the alarm is the object ALARM_OBJECT of a store of its own at ``<log location>/ALARM_STORE``:
#: a commit raises it while the coordinator holds the log's lock, so it must not need that lock
ALARM_STORE = "timeout-alarm"
ALARM_OBJECT = "timeout-alarm.json"


def _is_s3(location: Optional[str]) -> bool:
    return bool(location) and is_s3_url(str(location))


def _join(location: str, *names: str) -> str:
    """``location/name/...`` for a URI or a local path."""
    if "://" in location:
        return "/".join([location.rstrip("/"), *names])
    return os.path.join(location, *names)


class KafkaPartition(TypedDict):
    """One topic-partition a transaction wrote: the offsets acknowledged and how many records."""

    topic: str
    partition: int
    first_offset: Optional[int]
    last_offset: Optional[int]
    records: int


@dataclass(frozen=True, kw_only=True)
class KafkaCommittable(Committable):
    """A prepared Kafka transaction: what the driver needs to EndTxn it (invariant 2) and to judge its age (7).

    Exactly the keys of the handle dict earlier versions wrote (``"sink": "kafka"`` and the fields
    below), so their logs still decode; every field beyond the base ones has a default.
    ``transactional_id``, ``producer_id`` and ``epoch`` are None for at-least-once (no transaction).
    """

    kind: ClassVar[str] = "kafka"
    guarantee: str = Guarantee.EXACTLY_ONCE.value
    transactional_id: Optional[str] = None
    partitions: list[KafkaPartition] = field(default_factory=list)
    #: wall-clock time (s) the transaction began, and the transaction timeout it runs with (invariant 7)
    began_at: Optional[float] = None
    timeout_ms: Optional[int] = None
    producer_id: Optional[int] = None
    epoch: Optional[int] = None

    def age(self, now: Optional[float] = None) -> Optional[TransactionAge]:
        """Invariant 7: this transaction's age at ``now`` (wall clock, default the current time) against its
        timeout; None when its start was not recorded."""
        if not self.began_at:
            return None
        return TransactionAge(((time.time() if now is None else now) - float(self.began_at)) * 1000,
                              float(self.timeout_ms or 0))


class KafkaSink(SinkSpec[KafkaCommittable]):
    """Exactly-once (Kafka transactions, driver commit) or at-least-once (idempotent producer) Kafka writes.

    The spec: options, validation, the prefix claim, the timeout alarm, the log, the shared admin
    client (created lazily, process-wide, never pickled). :class:`KafkaWriter` writes on executors,
    :class:`KafkaCommitter` commits on the driver."""

    #: a losing attempt's open transaction holds back read_committed consumers: fence it right after
    #: the commit, not only at the next micro-batch's recovery
    sweep_after_commit = True
    supports_write_jobs = True

    def write_job_spec(self, key: str) -> "KafkaSink":
        """One batch write (:mod:`twophase.write_job`): its own sink id, its log under this sink's log
        (``log.location`` or ``checkpointLocation`` is required: Kafka has no place of its own for it) and its
        own transactional prefix ``<prefix>.w<token of the write's identity>``, the identity being the key and
        the log location (:func:`~twophase.sink.write_identity`: two pipelines on one topic with their own
        ``log.location`` and the same writeId never share transactional ids), so its sweeps fence only its own
        ids. Its transactional ids carry the run, not the generation (:meth:`transactional_id`)."""
        if not (self.options.log_location or self.options.owner):
            raise ConfigurationError(f"{SINK}: a batch write needs a place for its transaction log: add "
                                     ".option('log.location', '/path/or/s3://bucket/prefix') (kept across runs, so that "
                                     "a re-run with the same writeId writes nothing)")
        base_log = self.log_location().rstrip("/")
        return type(self)(dataclasses.replace(
            self.options, sink_id=write_sink_id(self.sink_id, base_log, key),
            log_location=_join(base_log, f"write-jobs/{key}"),
            transactional_id_prefix=f"{self.prefix}.w{sink_token(write_identity(base_log, key))}", owner=None,
            write_job=True))

    def __init__(self, options: KafkaSinkOptions) -> None:
        self.options = options
        self.sink_id = options.sink_id
        self.guarantee = options.guarantee
        self.prefix = options.transactional_id_prefix
        # invariant 4 (embedded runtime, where the writers and the committer share this spec object):
        # ids its writers began and whose committable is not decided yet, -> (checkpoint id, epoch);
        # never pickled (a Spark executor's copy knows only its own)
        self._live: dict[str, tuple[int, int]] = {}
        self._live_lock = threading.Lock()

    @classmethod
    def from_options(cls, raw: Mapping[str, Any], schema: Any = None) -> "KafkaSink":
        return cls(KafkaSinkOptions.from_options(raw, schema))

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["options"])

    # ---- naming (invariant 4)

    @staticmethod
    def task_name(task_id: int | str) -> str:
        """The task part of a transactional id: never contains ``-`` (``out-0`` -> ``out.0``)."""
        return re.sub(r"[^A-Za-z0-9._]", "_", str(task_id).replace("-", "."))

    def generation(self, checkpoint_id: int) -> int:
        """The id part of checkpoint ``checkpoint_id``: its generation (``checkpoint_id mod 2``), or for a batch
        write the run itself. A batch write's runs are not retried in order like micro-batches: a run taken over
        by a newer one may still be alive, and its abort sweeps ids ``<= its run``; with generations that sweep
        fenced run ``n + 2`` (same generation) in flight, whose commit then raised DataLossError."""
        return checkpoint_id if self.options.write_job else checkpoint_id % 2

    def transactional_id(self, task_id: int | str, checkpoint_id: int, slot: int) -> str:
        """``<prefix>-<task>-<generation>-<slot mod slots>`` (see the module docstring and :meth:`generation`)."""
        return (f"{self.prefix}-{self.task_name(task_id)}-{self.generation(checkpoint_id)}-"
                f"{slot % self.options.attempt_slots}")

    def _parse_id(self, transactional_id: str) -> Optional[tuple[str, int, int]]:
        """``(task, generation, slot)`` of one of this prefix's ids (a batch write's: ``(task, run, slot)``),
        else None."""
        gen = r"(\d+)" if self.options.write_job else r"([01])"
        m = re.fullmatch(re.escape(self.prefix) + r"-([A-Za-z0-9._]+)-" + gen + r"-(\d+)", transactional_id)
        return None if m is None else (m.group(1), int(m.group(2)), int(m.group(3)))

    def _candidate_ids(self, context: TransactionContext) -> list[str]:
        """The task's ids of the checkpoint's generation, from slot ``taskAttemptId mod slots`` on."""
        uid = context.task_attempt_id if context.task_attempt_id is not None else context.attempt
        slots = self.options.attempt_slots
        return [self.transactional_id(context.task_id, context.checkpoint_id, (uid + i) % slots) for i in range(slots)]

    # ---- driver-side set-up

    def _client(self) -> Any:
        """The process-wide admin connection for these connection settings (lazily created, never pickled)."""
        from twophase.sinks._kafka_txn import shared_client
        return shared_client(self.options.connection_config())

    def validate_destination(self) -> None:
        """Fail early (bounded by kafka.bootstrap.timeout.ms): broker reachable, topic there, prefix ours. A broker
        authorizer's refusal is a ConfigurationError naming the ACLs the sink needs."""
        import kafka.errors as Errors
        try:
            self._validate_destination()
        except Errors.AuthorizationError as e:
            raise ConfigurationError(
                f"{SINK}: the brokers at {','.join(self.options.bootstrap_servers)} refused this principal "
                f"({type(e).__name__}: {redact_error(e, self.options.producer_config)}); the sink needs the ACLs "
                f"WRITE and DESCRIBE on TransactionalId prefix {self.prefix!r} (option transactionalIdPrefix) and "
                f"WRITE and DESCRIBE on the topic(s) it writes ({self.options.topic or 'its topic column'}), e.g. "
                f"kafka-acls --add --allow-principal User:<user> --operation Write --operation Describe "
                f"--transactional-id {self.prefix} --resource-pattern-type prefixed --topic "
                f"{self.options.topic or '<topic>'}") from e

    def _validate_destination(self) -> None:
        client = self._client()
        if self.options.topic and client.topic_partitions(self.options.topic) is None:
            if self.options.producer_config.get("allow_auto_create_topics", True) is False:
                raise ConfigurationError(f"{SINK}: topic {self.options.topic!r} does not exist at "
                                         f"{','.join(self.options.bootstrap_servers)}; create it first")
        if self.guarantee is Guarantee.EXACTLY_ONCE and self.options.owner:
            self._claim_prefix(self.options.owner)
        if self.guarantee is Guarantee.EXACTLY_ONCE:
            self._check_transaction_timeout(client)
            if self.options.owner or self.options.log_location:  # else prepare_sink names what is missing
                self._check_age_alarm()

    def _check_transaction_timeout(self, client: Any) -> None:
        """Invariant 7: the broker must accept the timeout, else fail now on the driver (asked again after
        ``_kafka_timeout.TTL_S`` or a refusal: a lowered transaction.max.timeout.ms is noticed).

        With no ``kafka.transaction.timeout.ms`` given, the largest timeout the brokers accept (up to the 1-hour
        default) is chosen, logged, and pinned into this sink's options: the copies Spark sends to executors and
        to the commit runner are made after this check, so every producer uses the chosen timeout."""
        if not self.options.transaction_timeout_explicit:
            chosen = choose_default_timeout(client, f"{self.prefix}-timeout-check", key=self._timeout_key(),
                                            sink_id=self.sink_id)
            self.options = dataclasses.replace(self.options, transaction_timeout_ms=chosen,
                                               transaction_timeout_explicit=True)
            if self.options.trigger_interval_ms is not None:
                check_timeout_against_trigger(chosen, self.options.trigger_interval_ms, chosen=True)
            if "delivery_timeout_ms" in self.options.producer_config:
                check_delivery_timeout(self.options.producer_config["delivery_timeout_ms"], chosen, chosen=True)
            return
        if not timeout_accepted(client, f"{self.prefix}-timeout-check", self.options.transaction_timeout_ms,
                                key=self._timeout_key()):
            raise self._timeout_refused()

    def delivery_timeout_ms(self, client_default_ms: int) -> int:
        """A transactional producer's delivery timeout: ``kafka.delivery.timeout.ms`` if set (refused above the
        transaction timeout by the start check), else the client's default clamped to the transaction timeout."""
        return delivery_timeout_for(self.options.producer_config.get("delivery_timeout_ms"), client_default_ms,
                                    self.effective_timeout_ms())

    def _timeout_key(self) -> Any:
        """The key of this sink's brokers' answers in :data:`twophase.sinks._kafka_timeout.CACHE`."""
        return _TIMEOUT_CACHE.key(self.options.bootstrap_servers, self.prefix)

    def effective_timeout_ms(self) -> int:
        """The transaction timeout producers and fences use: the explicit or pinned one, else (a sink whose start
        check did not run in this process, e.g. a CLI's) the brokers' choice (:func:`choose_default_timeout`)."""
        if self.options.transaction_timeout_explicit:
            return self.options.transaction_timeout_ms
        return choose_default_timeout(self._client(), f"{self.prefix}-timeout-check", key=self._timeout_key(),
                                      sink_id=self.sink_id)

    def known_timeout_ms(self) -> Optional[int]:
        """The transaction timeout as far as known without asking the brokers (for a handle's age check):
        explicit or pinned, else the choice this process made when it created a producer, else None."""
        if self.options.transaction_timeout_explicit:
            return self.options.transaction_timeout_ms
        return chosen_timeout(key=self._timeout_key())

    def _timeout_refused(self) -> ConfigurationError:
        _TIMEOUT_CACHE.forget(self._timeout_key())  # the brokers' maximum changed: the next start check asks again
        timeout = self.options.transaction_timeout_ms
        return ConfigurationError(
            f"{SINK}: the broker refuses kafka.transaction.timeout.ms={timeout} ms"
            f"{' (the default, 1 hour)' if timeout == DEFAULT_TRANSACTION_TIMEOUT_MS else ''}: it is above the "
            "brokers' transaction.max.timeout.ms (Kafka's default is 900000 = 15 min). Raise "
            f"transaction.max.timeout.ms on the brokers to at least {timeout} (recommended: prepared transactions "
            "must outlive the longest batch plus any driver outage), or set kafka.transaction.timeout.ms to at "
            "most the brokers' transaction.max.timeout.ms")

    def _cluster(self) -> str:
        return hashlib.sha1(",".join(sorted(self.options.bootstrap_servers)).encode()).hexdigest()[:10]

    # ---- invariant 7: the timeout alarm, an object of the log store

    def _alarm_store(self) -> LogStore:
        return open_log_store(_join(self.log_location(), ALARM_STORE), self.options.s3)

    def _alarm_uri(self, store: LogStore) -> str:
        return _join(store.location, ALARM_OBJECT)

    def _read_alarm(self, store: LogStore) -> tuple[Optional[dict[str, Any]], Optional[str]]:
        """The alarm (None if absent) and the version it was read at (for compare-and-swap)."""
        data, version = store.get_versioned(ALARM_OBJECT)
        if data is None:
            return None, None
        return decode_record(data, self._alarm_uri(store)), version

    def _record_alarm(self, store: LogStore, alarm: Mapping[str, Any]) -> bool:
        """Raise the alarm to ``alarm`` unless one at least as old is up (compare-and-swap: parallel commits of
        one checkpoint and the next batch's check never lose each other's write). True if it is up now."""
        for _ in range(8):
            current, version = self._read_alarm(store)
            if current is not None and not current.get("cleared") and \
                    int(current.get("age_ms", 0)) >= int(alarm["age_ms"]):
                return True
            if store.put_if_version(ALARM_OBJECT, encode_record(dict(alarm)), version) is not None:
                return True
        return False

    def _raise_alarm(self, committable: "KafkaCommittable", age_ms: float, timeout: Any) -> None:
        alarm = {"sink_id": self.sink_id, "transactional_id_prefix": self.prefix,
                 "checkpoint_id": committable.checkpoint_id, "transactional_id": committable.transactional_id,
                 "age_ms": round(age_ms), "transaction_timeout_ms": timeout, "at": time.time(),
                 "host": socket.gethostname()}
        store = None
        try:
            store = self._alarm_store()
            if self._record_alarm(store, alarm):
                return
            error: Any = "the alarm object stayed contended"
        except Exception as e:  # the commit itself must go on: its transaction is already old
            error = repr(e)
        _log.error("timeout_alarm_not_recorded", sink_id=self.sink_id, checkpoint_id=committable.checkpoint_id,
                   alarm=None if store is None else self._alarm_uri(store), error=error,
                   hint="the next batch will not be refused; raise kafka.transaction.timeout.ms")

    def _legacy_alarm_path(self) -> Optional[str]:
        """Where earlier versions kept the alarm: a file in the driver host's prefix registry."""
        registry = self.options.prefix_registry or self._local_registry()
        if "://" in registry:
            return None
        return os.path.join(registry, self._cluster(), f"{self.prefix}.timeout-alarm.json")

    def _migrate_legacy_alarm(self, store: LogStore) -> None:
        """An alarm a previous version left on this host's disk moves into the log store (then the file goes)."""
        path = self._legacy_alarm_path()
        if path is None or not os.path.exists(path):
            return
        try:
            with open(path) as f:
                old = json.load(f)
            alarm = {"sink_id": self.sink_id, "transactional_id_prefix": self.prefix,
                     "checkpoint_id": old.get("checkpoint_id"), "age_ms": int(old.get("age_ms", 0)),
                     "transaction_timeout_ms": old.get("transaction_timeout_ms"), "at": old.get("at"),
                     "host": socket.gethostname(), "migrated_from": path}
        except (OSError, ValueError, TypeError):
            return
        if self._record_alarm(store, alarm):
            _log.info("timeout_alarm_migrated", sink_id=self.sink_id, source=path, alarm=self._alarm_uri(store))
            with contextlib.suppress(OSError):
                os.remove(path)

    def _check_age_alarm(self) -> None:
        """Invariant 7: refuse the next batch after one came within 50 % of the timeout."""
        store = self._alarm_store()
        self._migrate_legacy_alarm(store)
        alarm, version = self._read_alarm(store)
        if alarm is None or alarm.get("cleared"):
            return
        age_ms, timeout = int(alarm.get("age_ms", 0)), self.options.transaction_timeout_ms
        where = self._alarm_uri(store)
        if age_ms <= BLOCK_AGE_FRACTION * timeout:
            # compare-and-swap, not delete: an alarm a concurrent commit raised meanwhile stays up
            cleared = {**alarm, "cleared": True, "cleared_at": time.time(), "cleared_with_timeout_ms": timeout}
            if store.put_if_version(ALARM_OBJECT, encode_record(cleared), version) is not None:
                _log.info("timeout_alarm_cleared", sink_id=self.sink_id, age_ms=age_ms, transaction_timeout_ms=timeout,
                          alarm=where)
            return
        # The spec reads the log's states here, and only here: whether a COMPLETED checkpoint awaits
        # recovery. This check runs in validate_destination, before the coordinator exists (prepare_sink
        # validates, then recovers), so no coordinator can pass the fact; it reads, never writes.
        with contextlib.suppress(Exception):
            from twophase.states import CheckpointState
            if any(r.state is CheckpointState.COMPLETED for r in self.transaction_log().unfinished()):
                # recovery (which follows in prepare_sink) must commit those before they age further:
                # never block it; the next batch's check refuses to write
                _log.warning("timeout_alarm_deferred", sink_id=self.sink_id, age_ms=age_ms,
                             transaction_timeout_ms=timeout, reason="a COMPLETED checkpoint awaits recovery")
                return
        remove = f"aws s3 rm {where}" if _is_s3(where) else f"rm {where}"
        raise ConfigurationError(
            f"{SINK}: checkpoint {alarm.get('checkpoint_id')} kept its Kafka transactions open {age_ms / 1000:.0f}s "
            f"before the driver committed them, more than half of kafka.transaction.timeout.ms={timeout} ms: a driver "
            "outage or a slower batch would let the broker abort prepared transactions (data loss). The next batch "
            f"is refused until kafka.transaction.timeout.ms is at least {2 * age_ms} (and the brokers' "
            "transaction.max.timeout.ms allows it), or batches are made shorter and the alarm object "
            f"{where} of the sink's transaction log is deleted ({remove})")

    # ---- invariant 5: the prefix registry

    @staticmethod
    def _local_registry() -> str:
        base = os.environ.get("TWOPHASE_STATE_DIR") or os.path.join(os.path.expanduser("~"), ".twophase")
        return os.path.join(base, "kafka-prefixes")

    def _registry(self) -> str:
        """Option ``prefixRegistry``; else in the log's bucket when the log is on S3; else on this host."""
        if self.options.prefix_registry:
            return self.options.prefix_registry
        try:
            location = self.log_location()
        except ConfigurationError:
            location = ""
        if _is_s3(location):
            bucket, _ = parse_s3_url(location, option="log.location")
            return f"{location.split('://', 1)[0]}://{bucket}/{S3_REGISTRY_PREFIX}"
        return self._local_registry()

    def _registry_store(self) -> LogStore:
        return open_log_store(_join(self._registry(), self._cluster(), self.prefix), self.options.s3)

    def _claim_prefix(self, owner: str) -> None:
        """Invariant 5: one query (checkpoint location) per transactional prefix and cluster."""
        store = self._registry_store()
        registry = TransactionLog(store, f"kafka-prefix:{self.prefix}")
        try:
            registry.claim(owner_key(owner))
        except ConcurrentWriterError:
            current = registry.owner() or {}
            if current.get("owner") == os.path.abspath(owner):
                return  # claimed by an older twophase, which made even a URI absolute: the same query
            raise ConcurrentWriterError(
                f"{SINK}: transactional prefix {self.prefix!r} is used by the query with checkpoint "
                f"{current.get('owner')!r}; this query ({owner!r}) would fence its producers. Give this query its "
                f"own option 'transactionalIdPrefix' (or 'sink.id'); to move the prefix, delete "
                f"{_join(store.location, 'owner.json')} (the claim in the prefix registry)") from None

    def log_location(self) -> str:
        location = self.options.log_location
        if not location:
            if not self.options.owner:
                raise ConfigurationError(f"{SINK}: exactly-once needs option 'checkpointLocation' (or 'log.location')")
            location = _join(self.options.owner, "twophase-kafka", self.prefix)
        return location

    def transaction_log(self) -> TransactionLog:
        return TransactionLog(open_log_store(self.log_location(), self.options.s3), self.sink_id,
                              retain=self.options.log_retain)

    # ---- invariant 4: ids begun by writers of this process (shared by its writers and committers)

    def _forget(self, transactional_id: Optional[str], epoch: Optional[int] = None) -> None:
        """The id's transaction is decided (or never prepared): no longer protected from sweeps."""
        if transactional_id is None:
            return
        with self._live_lock:
            live = self._live.get(transactional_id)
            if live is not None and (epoch is None or live[1] == epoch):
                del self._live[transactional_id]

    def _remember(self, transactional_id: str, checkpoint_id: int, epoch: int) -> None:
        """A writer of this process began ``transactional_id`` for ``checkpoint_id``: protect it from sweeps
        of older checkpoints until its committable is decided (invariant 4, embedded runtime)."""
        with self._live_lock:
            self._live[transactional_id] = (checkpoint_id, epoch)

    def _live_above(self, checkpoint_id: int) -> set[str]:
        """Ids this process began for checkpoints ``> checkpoint_id`` that are not decided yet."""
        with self._live_lock:
            return {tid for tid, (cid, _epoch) in self._live.items() if cid > checkpoint_id}

    # ---- the writer and the committer

    def create_writer(self, context: TransactionContext) -> "_KafkaWriterBase":
        """A librdkafka writer (:class:`KafkaWriter`), or a kafka-python one with ``kafkaClient=kafka-python``."""
        if self.options.client == "kafka-python":
            from twophase.sinks._kafka_python_writer import KafkaPythonWriter
            return KafkaPythonWriter(self, context)
        from twophase.sinks._kafka_rdkafka_writer import KafkaWriter
        return KafkaWriter(self, context)

    def create_committer(self) -> "KafkaCommitter":
        from twophase.sinks._kafka_committer import KafkaCommitter
        return KafkaCommitter(self)



# ---- the parts split out by concern (each imports names of this module, so they are loaded on first use)
_MOVED = {
    "KafkaCommitter": "twophase.sinks._kafka_committer",  # driver side, steps 4-5
    "_KafkaWriterBase": "twophase.sinks._kafka_writer",   # what both writers share: the id's ownership
    **dict.fromkeys(("KafkaWriter", "RdKafkaTransaction", "LIBRDKAFKA_LOGGER", "LIBRDKAFKA_DELIVERY_TIMEOUT_MS"),
                    "twophase.sinks._kafka_rdkafka_writer"),  # the librdkafka writer, steps 1-3
    **dict.fromkeys(("KafkaPythonWriter", "KafkaTransaction"), "twophase.sinks._kafka_python_writer"),  # kafka-python's
}


def __getattr__(name: str) -> Any:
    """``twophase.sinks.kafka.<name>`` keeps working for the classes moved to their own modules."""
    if name in _MOVED:
        import importlib
        return getattr(importlib.import_module(_MOVED[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = ["KafkaSink", "KafkaSinkOptions", "KafkaWriter", "KafkaPythonWriter", "KafkaCommitter", "KafkaCommittable",
           "KafkaTransaction", "RdKafkaTransaction",
           "KAFKA_SINK_OPTIONS", "parse_duration_ms", "FencedError"]
