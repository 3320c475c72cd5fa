"""Exactly-once Kafka sink: one Kafka transaction per writer partition and checkpoint, committed by the driver.

Protocol (``# step N`` in the code):

1. begin (executor): a transactional producer for the task's transactional id; ``init_transactions``
   fences any zombie with that id and aborts what it left open; ``begin_transaction``.
2. write (executor): every row becomes a record (columns ``key``, ``value``, ``topic``, ``partition``,
   ``headers`` as in Spark's Kafka sink).
3. pre_commit (executor): ``flush``; the handle is ``{transactional_id, producer_id, epoch,
   partitions: [{topic, partition, first_offset, last_offset, records}], records}``. The task ends
   WITHOUT committing or aborting: the transaction stays open on the broker.
4. commit (driver): ``EndTxn(commit)`` carrying the handle's id, producer id and epoch, sent by the
   driver's own connection (see :mod:`sinks._kafka_txn`); handles are committed in parallel and the
   coordinator records COMMITTED in the log.
5. abort / recovery (driver): ``EndTxn(abort)``; at start-up (prepare_sink, before executors call
   ``init_transactions``) COMPLETED checkpoints are committed first, then open transactions under the
   prefix are fenced (ListTransactions where the broker has it, else every id of the known id space:
   partitions seen in the log x generations x attempt slots) -- only those of the generation of the
   highest COMMITTED checkpoint, because prepare_sink also runs in the commit worker right before the
   next checkpoint's commit, whose transactions (the other generation) must survive. Open transactions
   of the other generation are fenced by the re-run's own ``init_transactions`` (same ids) and, for
   other attempt slots, by ``abort_lingering`` after that checkpoint commits.

Transactional ids: ``<prefix>-<partition>-<generation>-<attempt slot>`` where generation is the
checkpoint id mod 2 and attempt slot is Spark's task attempt number mod ``transactionalIdAttempts``.
The id space is bounded (partitions x 2 x slots) and stable across restarts, so a restarted job
fences the zombies of the crashed one. Why the two extra parts:

- attempt slot: a retried or speculative attempt of the same partition gets ANOTHER id, so it never
  fences the attempt whose handle the driver commits (Spark commits the first attempt that
  finished; with a shared id a later-starting speculative copy would abort it: data loss).
  The losing attempt's transaction is fenced by ``abort_lingering`` after the checkpoint commits.
- generation: ``abort_lingering(n)`` runs in the commit worker while the transactions of checkpoint
  ``n+1`` are prepared but not yet acked to the driver. Fencing only ids of generation ``n mod 2``
  never touches them (Spark runs one micro-batch at a time, so no checkpoint ``n+2`` is in flight).

Invariants (``test_kafka_sink_invN_*``):

1. Nothing a task writes is visible to read_committed readers before the driver commits its handle.
2. ``commit`` is idempotent: a repeated EndTxn with the same epoch succeeds; if the epoch was fenced
   or the broker ended the transaction, the records are looked up with a read_committed reader:
   visible means committed before, otherwise :class:`~twophase.errors.DataLossError` naming the
   checkpoint, transactional id and partitions. Never silently dropped.
3. ``abort`` never touches committed records (the broker refuses to abort a committed epoch; noida-db
   answers success to an abort after commit and keeps the records, which the tests check).
4. Attempts of the same partition and checkpoint never share a transactional id (mod
   ``transactionalIdAttempts``); a fenced producer never un-fences itself (no client-side KIP-360 epoch
   bump); ``abort_lingering(n)`` fences only ids of generation ``min(n, highest COMMITTED) mod 2``.
5. A transactional prefix belongs to one query (its checkpoint location): a second one is refused.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, Collection, Mapping, Optional

import pyarrow as pa

from sinks._kafka_config import kafka_python_config
from twophase._logging import get_logger
from twophase.errors import ConcurrentWriterError, ConfigurationError, DataLossError, FencedError, TransientSinkError
from twophase.log import LocalLogStore, TransactionLog
from twophase.options import Option, parse_positive_int, parse_options
from twophase.sink import Guarantee, TransactionContext, TwoPhaseCommitSink

_log = get_logger(__name__)

SINK = "twophase-kafka"

#: Kafka settings the sink owns; setting them through kafka.* is an error that names the replacement
_RESERVED = {
    "transactional.id": "use option 'transactionalIdPrefix' (the sink derives one id per partition)",
    "key.serializer": "write a binary or string 'key' column",
    "value.serializer": "write a binary or string 'value' column",
}


def parse_duration_ms(v: str) -> int:
    """'500' (ms), '10s', '10 seconds', '2 minutes', '1m', '250ms' -> milliseconds."""
    s = str(v).strip().lower()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(ms|milliseconds?|s|sec|secs|seconds?|m|min|mins|minutes?|h|hours?)?", s)
    if not m:
        raise ValueError("expected a duration such as '10 seconds' or '500ms'")
    unit = m.group(2) or "ms"
    mult = 1 if unit.startswith("ms") or unit.startswith("milli") else 1000 if unit.startswith("s") else \
        60_000 if unit.startswith("m") else 3_600_000
    n = int(float(m.group(1)) * mult)
    if n <= 0:
        raise ValueError("must be > 0")
    return n


KAFKA_SINK_OPTIONS: tuple[Option[Any], ...] = (
    Option("topic", str, help="the topic to write to (or a 'topic' column in the stream)"),
    Option("transactionalIdPrefix", str, help="prefix of the producers' transactional ids; default: the sink id"),
    Option("transactionalIdAttempts", parse_positive_int, 8,
           help="attempt slots per partition (>= spark.task.maxFailures + speculative copies)"),
    Option("triggerInterval", parse_duration_ms,
           help="the query's trigger interval (e.g. '10 seconds'); checked against kafka.transaction.timeout.ms"),
    Option("prefixRegistry", str, help="directory where transactional prefixes are claimed by queries "
           "(default $TWOPHASE_STATE_DIR/kafka-prefixes or ~/.twophase/kafka-prefixes)"),
    Option("commitParallelism", parse_positive_int, 8, help="threads committing the transactions of a checkpoint"),
)


@dataclass(frozen=True)
class KafkaSinkOptions:
    """Validated options of the Kafka sink (see :data:`KAFKA_SINK_OPTIONS` and any ``kafka.*``)."""

    bootstrap_servers: tuple[str, ...]
    topic: Optional[str]
    producer_config: Mapping[str, Any]
    transactional_id_prefix: str
    attempt_slots: int = 8
    transaction_timeout_ms: int = 900_000
    trigger_interval_ms: Optional[int] = None
    sink_id: str = ""
    guarantee: Guarantee = Guarantee.EXACTLY_ONCE
    log_location: Optional[str] = None
    log_retain: int = 100
    owner: Optional[str] = None
    prefix_registry: Optional[str] = None
    commit_parallelism: int = 8
    columns: tuple[str, ...] = ()

    @classmethod
    def from_options(cls, raw: Mapping[str, Any], schema: Any = None) -> "KafkaSinkOptions":
        """Parse Spark's string options; ``schema`` (with ``.names`` / fields) checks the columns."""
        from kafka import KafkaProducer
        source_only = {"subscribe", "assign", "subscribepattern", "startingoffsets", "maxoffsetspertrigger",
                       "includeheaders", "polltimeoutms", "endingoffsets"}
        given = {str(k).lower() for k in raw}
        if given & source_only:
            raise ConfigurationError(f"{SINK}: option(s) {sorted(given & source_only)} are for readStream, "
                                     "not writeStream")
        o = parse_options(raw, KAFKA_SINK_OPTIONS, sink=SINK, prefixes=("kafka.",))
        kraw = {k: v for k, v in o.items() if k.startswith("kafka.")}
        servers = kraw.get("kafka.bootstrap.servers")
        if not servers or not str(servers).strip():
            raise ConfigurationError(f"{SINK}: option 'kafka.bootstrap.servers' is required, e.g. "
                                     ".option('kafka.bootstrap.servers', 'host1:9092,host2:9092')")
        cfg = kafka_python_config(kraw, KafkaProducer.DEFAULT_CONFIG, what=SINK, reserved=_RESERVED)
        guarantee = Guarantee.parse(o["guarantee"])
        names = list(getattr(schema, "names", []) or [])
        if schema is not None:
            if "value" not in names:
                raise ConfigurationError(f"{SINK}: the stream needs a 'value' column (binary or string); "
                                         f"it has {', '.join(names)}")
            unknown = [c for c in names if c not in ("key", "value", "topic", "partition", "headers")]
            if unknown:
                raise ConfigurationError(f"{SINK}: column(s) {unknown} are not written to Kafka; select key, value "
                                         "and optionally topic, partition, headers (like Spark's Kafka sink)")
            if not o["topic"] and "topic" not in names:
                raise ConfigurationError(f"{SINK}: no topic: set .option('topic', 'name') or add a 'topic' column")
        elif not o["topic"]:
            raise ConfigurationError(f"{SINK}: option 'topic' is required (or a 'topic' column in the stream)")
        owner = o["checkpointlocation"]
        sink_id = o["sink.id"] or (
            "twophase-" + hashlib.sha1(os.path.abspath(owner).encode()).hexdigest()[:12] if owner
            else f"twophase-{o['topic'] or 'multi'}")
        prefix = o["transactionalIdPrefix"] or sink_id
        if not re.fullmatch(r"[A-Za-z0-9._\-]{1,200}", prefix):
            raise ConfigurationError(f"{SINK}: option 'transactionalIdPrefix'={prefix!r} may use only letters, "
                                     "digits, '.', '_' and '-' (at most 200 characters)")
        timeout = int(cfg.pop("transaction_timeout_ms", 900_000))
        if guarantee is Guarantee.EXACTLY_ONCE:
            if cfg.get("enable_idempotence") is False:
                raise ConfigurationError(f"{SINK}: kafka.enable.idempotence=false cannot be exactly-once; drop it "
                                         "or set guarantee=at-least-once")
            if str(cfg.get("acks", "all")) not in ("all", "-1"):
                raise ConfigurationError(f"{SINK}: kafka.acks must be 'all' for exactly-once (got {cfg['acks']!r})")
        interval = o["triggerInterval"]
        if interval is not None and guarantee is Guarantee.EXACTLY_ONCE and timeout < 2 * interval:
            raise ConfigurationError(
                f"{SINK}: kafka.transaction.timeout.ms={timeout} is shorter than two trigger intervals "
                f"({interval} ms): the broker would abort prepared transactions before the driver commits them "
                "(data loss). Raise kafka.transaction.timeout.ms (<= the broker's transaction.max.timeout.ms) "
                "or shorten the trigger")
        return cls(bootstrap_servers=tuple(cfg["bootstrap_servers"]), topic=o["topic"], producer_config=cfg,
                   transactional_id_prefix=prefix, attempt_slots=o["transactionalIdAttempts"],
                   transaction_timeout_ms=timeout, trigger_interval_ms=interval, sink_id=sink_id,
                   guarantee=guarantee, log_location=o["log.location"], log_retain=o["log.retain"], owner=owner,
                   prefix_registry=o["prefixRegistry"], commit_parallelism=o["commitParallelism"],
                   columns=tuple(names))

    def connection_config(self) -> dict[str, Any]:
        """The kafka-python settings that matter for a connection (security, timeouts, client id)."""
        keep = ("bootstrap_servers", "client_id", "security_protocol", "request_timeout_ms", "bootstrap_timeout_ms",
                "api_version", "sasl_mechanism", "sasl_plain_username", "sasl_plain_password", "ssl_cafile",
                "ssl_certfile", "ssl_keyfile", "ssl_password", "ssl_check_hostname", "ssl_crlfile", "ssl_ciphers",
                "sasl_kerberos_service_name", "sasl_kerberos_domain_name", "connections_max_idle_ms",
                "retry_backoff_ms", "reconnect_backoff_ms", "reconnect_backoff_max_ms", "client_dns_lookup")
        cfg = {k: v for k, v in self.producer_config.items() if k in keep}
        cfg.setdefault("bootstrap_timeout_ms", 15_000)
        return cfg


@dataclass
class _PartitionTrack:
    first: Any
    last: Any
    records: int = 0


@dataclass
class KafkaTransaction:
    """In-task state: the producer and, per topic-partition, the first and last send futures."""

    context: TransactionContext
    transactional_id: Optional[str]
    producer: Any
    began_at: float
    tracks: dict[tuple[str, int], _PartitionTrack] = field(default_factory=dict)
    records: int = 0


def _as_bytes(values: list[Any]) -> list[Optional[bytes]]:
    return [v.encode() if isinstance(v, str) else v for v in values]


class KafkaSink(TwoPhaseCommitSink[dict, KafkaTransaction]):
    """Exactly-once (Kafka transactions, driver commit) or at-least-once (idempotent producer) Kafka writes."""

    #: a losing attempt's open transaction holds back read_committed consumers: fence it right after
    #: the commit, not only at the next micro-batch's recovery
    sweep_after_commit = True

    def __init__(self, options: KafkaSinkOptions) -> None:
        self.options = options
        self.sink_id = options.sink_id
        self.guarantee = options.guarantee
        self.prefix = options.transactional_id_prefix
        self.commit_parallelism = options.commit_parallelism

    @classmethod
    def from_options(cls, raw: Mapping[str, Any], schema: Any = None) -> "KafkaSink":
        return cls(KafkaSinkOptions.from_options(raw, schema))

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["options"])

    # ---- naming (invariant 4)

    def transactional_id(self, partition: int | str, checkpoint_id: int, attempt: int) -> str:
        """``<prefix>-<partition>-<checkpoint mod 2>-<attempt mod slots>``."""
        return f"{self.prefix}-{partition}-{checkpoint_id % 2}-{attempt % self.options.attempt_slots}"

    def _parse_id(self, transactional_id: str) -> Optional[tuple[int, int, int]]:
        m = re.fullmatch(re.escape(self.prefix) + r"-(\d+)-([01])-(\d+)", transactional_id)
        return None if m is None else (int(m.group(1)), int(m.group(2)), int(m.group(3)))

    # ---- driver-side set-up

    def _client(self) -> Any:
        from sinks._kafka_txn import shared_client
        return shared_client(self.options.connection_config())

    def validate_destination(self) -> None:
        """Fail early (bounded by kafka.bootstrap.timeout.ms): broker reachable, topic there, prefix ours."""
        client = self._client()
        if self.options.topic and client.topic_partitions(self.options.topic) is None:
            if self.options.producer_config.get("allow_auto_create_topics", True) is False:
                raise ConfigurationError(f"{SINK}: topic {self.options.topic!r} does not exist at "
                                         f"{','.join(self.options.bootstrap_servers)}; create it first")
        if self.guarantee is Guarantee.EXACTLY_ONCE and self.options.owner:
            self._claim_prefix(self.options.owner)

    def _registry(self) -> str:
        if self.options.prefix_registry:
            return self.options.prefix_registry
        base = os.environ.get("TWOPHASE_STATE_DIR") or os.path.join(os.path.expanduser("~"), ".twophase")
        return os.path.join(base, "kafka-prefixes")

    def _claim_prefix(self, owner: str) -> None:
        """Invariant 5: one query (checkpoint location) per transactional prefix and cluster."""
        cluster = hashlib.sha1(",".join(sorted(self.options.bootstrap_servers)).encode()).hexdigest()[:10]
        store = LocalLogStore(os.path.join(self._registry(), cluster, self.prefix))
        try:
            TransactionLog(store, f"kafka-prefix:{self.prefix}").claim(os.path.abspath(owner))
        except ConcurrentWriterError:
            current = TransactionLog(store, f"kafka-prefix:{self.prefix}").owner() or {}
            raise ConcurrentWriterError(
                f"{SINK}: transactional prefix {self.prefix!r} is used by the query with checkpoint "
                f"{current.get('owner')!r}; this query ({owner!r}) would fence its producers. Give this query its "
                f"own option 'transactionalIdPrefix' (or 'sink.id'); to move the prefix, delete {store.root}") from None

    def transaction_log(self) -> TransactionLog:
        location = self.options.log_location
        if not location:
            if not self.options.owner:
                raise ConfigurationError(f"{SINK}: exactly-once needs option 'checkpointLocation' (or 'log.location')")
            location = os.path.join(self.options.owner, "twophase-kafka", self.prefix)
        return TransactionLog.open(location, self.sink_id, retain=self.options.log_retain)

    # ---- executor side (steps 1-3)

    def _producer(self, transactional_id: Optional[str]) -> Any:
        from kafka import KafkaProducer
        cfg = dict(self.options.producer_config)
        cfg.setdefault("linger_ms", 5)
        cfg.setdefault("batch_size", 256 * 1024)
        # the sender polls at this interval while FindCoordinator / InitProducerId / AddPartitionsToTxn are in
        # flight: the default 100 ms makes init_transactions take ~0.25 s, 20 ms ~0.08 s (measured)
        cfg.setdefault("retry_backoff_ms", 20)
        if transactional_id is not None:
            cfg.update(transactional_id=transactional_id, transaction_timeout_ms=self.options.transaction_timeout_ms)
        else:
            cfg.setdefault("enable_idempotence", True)
        try:
            return KafkaProducer(**cfg)
        except Exception as e:
            raise TransientSinkError(f"{SINK}: cannot create a producer for {','.join(self.options.bootstrap_servers)}: "
                                     f"{type(e).__name__}: {e}") from e

    def begin_transaction(self, context: TransactionContext) -> KafkaTransaction:
        if self.guarantee is Guarantee.AT_LEAST_ONCE:
            return KafkaTransaction(context, None, self._producer(None), time.time())
        tid = self.transactional_id(context.task_id, context.checkpoint_id, context.attempt)
        producer = self._producer(tid)
        # A fenced producer must stay fenced: kafka-python (KIP-360) answers INVALID_PRODUCER_EPOCH on a
        # produce by bumping the epoch itself, which would let a zombie abort the transaction of the
        # writer that fenced it (measured with noida-db). Pre-KIP-360 classification makes it fatal.
        producer._transaction_manager._supports_epoch_bump = lambda: False
        try:
            producer.init_transactions()  # step 1: fences zombies of tid, aborts what they left open
            producer.begin_transaction()
        except BaseException:
            with contextlib.suppress(Exception):
                producer.close(timeout=0)
            raise
        return KafkaTransaction(context, tid, producer, time.time())

    def write(self, txn: KafkaTransaction, batch: pa.RecordBatch) -> int:  # step 2
        n = batch.num_rows
        if n == 0:
            return 0
        cols = batch.schema.names
        values = _as_bytes(batch.column(cols.index("value")).to_pylist())
        keys = _as_bytes(batch.column(cols.index("key")).to_pylist()) if "key" in cols else [None] * n
        topics = batch.column(cols.index("topic")).to_pylist() if "topic" in cols else None
        parts = batch.column(cols.index("partition")).to_pylist() if "partition" in cols else None
        headers = batch.column(cols.index("headers")).to_pylist() if "headers" in cols else None
        default_topic = self.options.topic
        send = txn.producer.send
        tracks = txn.tracks
        for i in range(n):
            topic = (topics[i] if topics is not None and topics[i] is not None else default_topic)
            if topic is None:
                raise ConfigurationError(f"{SINK}: row {i} has a null topic and no option 'topic' is set")
            hdrs = None
            if headers is not None and headers[i]:
                hdrs = [(h["key"], h["value"].encode() if isinstance(h["value"], str) else h["value"]) for h in headers[i]]
            fut = send(topic, value=values[i], key=keys[i], headers=hdrs,
                       partition=parts[i] if parts is not None else None)
            tp = fut._produce_future.topic_partition
            track = tracks.get(tp)
            if track is None:
                tracks[tp] = _PartitionTrack(fut, fut, 1)
            else:
                track.last = fut
                track.records += 1
        txn.records += n
        return n

    def pre_commit(self, txn: KafkaTransaction) -> dict:  # step 3
        producer = txn.producer
        producer.flush()
        tm = getattr(producer, "_transaction_manager", None)
        if tm is not None and tm.has_error():
            raise TransientSinkError(f"{SINK}: transaction {txn.transactional_id!r} failed while writing: {tm.last_error!r}")
        partitions = []
        for (topic, part), track in sorted(txn.tracks.items()):
            first, last = track.first.get(timeout=30), track.last.get(timeout=30)
            partitions.append({"topic": topic, "partition": part, "first_offset": first.offset,
                               "last_offset": last.offset, "records": track.records})
        c = txn.context
        handle = {"sink": "kafka", "checkpoint_id": c.checkpoint_id, "task_id": c.task_id,
                  "attempt_uid": c.attempt_uid, "guarantee": self.guarantee.value,
                  "transactional_id": txn.transactional_id, "partitions": partitions, "records": txn.records,
                  "began_at": txn.began_at, "timeout_ms": self.options.transaction_timeout_ms}
        if tm is not None and txn.transactional_id is not None:
            handle["producer_id"] = tm.producer_id_and_epoch.producer_id
            handle["epoch"] = tm.producer_id_and_epoch.epoch
        # end the task without committing or aborting: close only stops the sender thread
        producer.close(timeout=5)
        return handle

    def abort_open(self, txn: KafkaTransaction) -> None:
        with contextlib.suppress(Exception):
            if txn.transactional_id is not None:
                txn.producer.abort_transaction()
        with contextlib.suppress(Exception):
            txn.producer.close(timeout=0)

    # ---- driver side (steps 4-5)

    def commit(self, handle: Mapping[str, Any]) -> None:
        """EndTxn(commit) with the handle's id, producer id and epoch (invariant 2)."""
        if handle.get("guarantee") == Guarantee.AT_LEAST_ONCE.value or not handle.get("partitions"):
            return
        from sinks._kafka_txn import EndTxnOutcome, verify_committed
        self._check_age(handle)
        outcome = self._client().end_txn(handle["transactional_id"], int(handle["producer_id"]),
                                          int(handle["epoch"]), commit=True)
        if outcome is EndTxnOutcome.OK:
            return
        missing = verify_committed(self.options.connection_config(), handle["partitions"])
        if not missing:
            _log.info("commit_already_done", transactional_id=handle["transactional_id"],
                      checkpoint_id=handle.get("checkpoint_id"))
            return
        age_s = time.time() - float(handle.get("began_at", time.time()))
        raise DataLossError(
            f"{SINK}: checkpoint {handle.get('checkpoint_id')} task {handle.get('task_id')}: the prepared transaction "
            f"{handle['transactional_id']!r} (producer id {handle['producer_id']}, epoch {handle['epoch']}) was "
            f"aborted by the broker (expired after kafka.transaction.timeout.ms={handle.get('timeout_ms')} ms, or "
            f"fenced) before the driver could commit it; {handle.get('records')} records in partitions "
            f"{', '.join(missing)} are lost (transaction age {age_s:.0f}s)")

    def _check_age(self, handle: Mapping[str, Any]) -> None:
        began, timeout = handle.get("began_at"), handle.get("timeout_ms")
        if began and timeout:
            age_ms = (time.time() - float(began)) * 1000
            if age_ms > 0.5 * float(timeout):
                _log.warning("transaction_near_timeout", transactional_id=handle.get("transactional_id"),
                             checkpoint_id=handle.get("checkpoint_id"), age_ms=round(age_ms),
                             transaction_timeout_ms=timeout,
                             hint="raise kafka.transaction.timeout.ms or make batches shorter")

    def abort(self, handle: Mapping[str, Any]) -> None:
        """EndTxn(abort); a fenced epoch means it is already ended (invariant 3)."""
        if handle.get("guarantee") == Guarantee.AT_LEAST_ONCE.value or not handle.get("transactional_id"):
            return
        if not handle.get("partitions"):
            return
        self._client().end_txn(handle["transactional_id"], int(handle["producer_id"]), int(handle["epoch"]),
                               commit=False)

    def abort_lingering(self, up_to_checkpoint: int, keep: Collection[Mapping[str, Any]] = ()) -> int:
        """Fence open transactions of generation ``n mod 2`` under the prefix, n = min(up_to, highest committed).

        Clamping to the highest COMMITTED checkpoint keeps a re-run of an ABORTED checkpoint id (which
        Spark does after a failed batch) from being fenced by the recovery that precedes its commit.
        """
        if self.guarantee is Guarantee.AT_LEAST_ONCE:
            return 0
        highest = self.transaction_log().highest_committed()
        if highest is None:
            return 0
        n = min(up_to_checkpoint, highest)
        generation = n % 2
        kept = {h.get("transactional_id") for h in keep}
        client = self._client()
        listed = client.list_transactions(self.prefix + "-")
        if listed is not None:
            ids = sorted({tid for tid, _pid, _state in listed})
        else:
            ids = self._known_id_space()
        fenced = 0
        for tid in ids:
            parsed = self._parse_id(tid)
            if parsed is None or parsed[1] != generation or tid in kept:
                continue
            client.fence(tid, self.options.transaction_timeout_ms)
            fenced += 1
        if fenced:
            _log.info("lingering_aborted", sink_id=self.sink_id, generation=generation, up_to=n, fenced=fenced,
                      listed=listed is not None)
        return fenced

    def _known_id_space(self) -> list[str]:
        """Every id the sink may have used: partitions seen in the log x 2 generations x attempt slots."""
        partitions = 0
        for rec in self.transaction_log().records():
            for h in rec.handles.values():
                task = str(h.get("task_id", ""))
                if task.isdigit():
                    partitions = max(partitions, int(task) + 1)
        return [self.transactional_id(p, g, a) for p in range(partitions) for g in (0, 1)
                for a in range(self.options.attempt_slots)]

    def close(self) -> None:
        pass


__all__ = ["KafkaSink", "KafkaSinkOptions", "KAFKA_SINK_OPTIONS", "parse_duration_ms", "FencedError"]
