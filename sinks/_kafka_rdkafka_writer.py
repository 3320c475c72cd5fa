"""The Kafka sink's default writer: :class:`KafkaWriter`, steps 1-3 of :mod:`twophase.sinks.kafka` on librdkafka
(confluent-kafka), with :class:`RdKafkaTransaction`, its transaction's delivery and statistics accounting. Its one
concern: producing a task's records in one Kafka transaction with librdkafka; the producer id and epoch come from
librdkafka's statistics (else DescribeTransactions), every delivery report is counted (invariant 6) and a producer
is dropped, never closed, so its transaction stays open for the driver's commit."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
import json
import logging
import time
import types
from typing import Any, Optional

import pyarrow as pa

from twophase._kafka import librdkafka_config
from twophase._logging import get_logger
from twophase._redact import redact_error
from twophase.errors import ConfigurationError, MissingDependencyError, TransientSinkError
from twophase.sink import Guarantee, TransactionContext

from twophase.sinks._kafka_writer import _KafkaWriterBase
from twophase.sinks.kafka import SINK, KafkaCommittable, KafkaPartition

_log = get_logger('twophase.sinks.kafka')  # the public module's logger name: users' log filters keep working


@dataclass
class RdKafkaTransaction:
    """In-task state of a librdkafka writer: the producer, its producer id and epoch (from librdkafka's
    statistics), and per topic-partition ``[acknowledged, first offset, last offset]`` (invariant 6).

    Every callback (delivery reports, statistics, errors) runs inside ``poll``/``flush`` on the task's own
    thread: no lock is needed."""

    context: TransactionContext
    transactional_id: Optional[str]
    producer: Any
    began_at: float
    producer_id: Optional[int] = None
    epoch: Optional[int] = None
    records: int = 0
    tracks: dict[tuple[str, int], list[int]] = field(default_factory=dict)
    errors: list[Any] = field(default_factory=list)
    #: fatal producer errors (error_cb): fenced, or the transaction can never commit
    fatal: list[Any] = field(default_factory=list)
    #: the newest ``eos`` object of librdkafka's statistics (producer_id, producer_epoch, txn_state)
    eos: dict[str, Any] = field(default_factory=dict)
    #: the transaction.timeout.ms the producer was created with (what the handle records for the age check)
    timeout_ms: Optional[int] = None

    def on_delivery(self, err: Any, msg: Any) -> None:
        """Delivery report of one record (the only per-record Python work besides ``produce``)."""
        if err is not None:
            self.errors.append(err)
            return
        off = msg.offset()
        tp = (msg.topic(), msg.partition())
        t = self.tracks.get(tp)
        if t is None:
            self.tracks[tp] = [1, off, off]
        else:
            t[0] += 1
            if off > t[2]:
                t[2] = off
            elif off < t[1]:
                t[1] = off

    def on_stats(self, stats_json: str) -> None:
        with contextlib.suppress(ValueError, TypeError):
            eos = json.loads(stats_json).get("eos")
            if eos:
                self.eos = eos

    def on_error(self, err: Any) -> None:
        if err.fatal():
            self.fatal.append(err)

    def acked(self) -> int:
        return sum(t[0] for t in self.tracks.values())


#: the Python logger librdkafka's log lines go to
LIBRDKAFKA_LOGGER = "twophase.sinks.kafka.librdkafka"
#: librdkafka's default ``delivery.timeout.ms`` (``message.timeout.ms``)
LIBRDKAFKA_DELIVERY_TIMEOUT_MS = 300_000

#: records produced between two ``poll(0)`` calls (delivery reports hold queue space until served)
_POLL_EVERY = 5000


class KafkaWriter(_KafkaWriterBase):
    """The default writer: a librdkafka (confluent-kafka) transactional producer per task attempt.

    - step 1: the id probed as for every writer (invariant 4); ``init_transactions`` (with
      ``enable.sparse.connections=false``: ~6 ms instead of ~505 ms at random), the producer id and
      epoch from librdkafka's statistics (``eos``, every ``statistics.interval.ms``; DescribeTransactions
      if they do not come), ``begin_transaction``.
    - step 2: ``produce`` per record straight from the Arrow columns (``partitioner=murmur2_random``:
      Java's key placement, as Spark's Kafka sink); a full queue (BufferError) polls and retries.
    - step 3: ``flush``; every record must have its delivery report and none may have failed
      (invariant 6); the id must still be Ongoing with our producer id and epoch (invariant 4). Then
      the producer is DROPPED, never closed: ``Producer.close()`` aborts the open transaction, while
      destroying the handle (or the process dying) leaves it Ongoing for the driver's EndTxn.
    """

    #: librdkafka defaults of the sink (a ``kafka.*`` option overrides any of them, also under a librdkafka alias:
    #: ``kafka.queue.buffering.max.ms`` is applied after ``linger.ms``)
    PRODUCER_DEFAULTS: dict[str, Any] = {"linger.ms": 5, "batch.size": 1_000_000}
    #: librdkafka properties the sink sets itself, applied after every ``kafka.*`` option (which may not name them:
    #: :data:`twophase.sinks._kafka_options._RDKAFKA_SINK_OWN`)
    PRODUCER_OWN: dict[str, Any] = {"enable.sparse.connections": False, "partitioner": "murmur2_random"}
    #: how often librdkafka publishes statistics (the producer id and epoch arrive with the first after init)
    STATS_INTERVAL_MS = 10
    #: how long step 1 waits for the producer id and epoch in the statistics before asking the broker
    STATS_WAIT_S = 2.0

    def _producer_config(self, txn: RdKafkaTransaction) -> dict[str, Any]:
        """The librdkafka properties of ``txn``'s producer, applied in this order (librdkafka takes them in order, the
        last of a property and its aliases wins): the sink's defaults, the user's librdkafka-only properties
        (option kafkaClient=librdkafka), the mapped Spark / kafka-python settings, then the sink's own (callbacks,
        partitioner, sparse connections, transactional id and timeouts, statistics): a librdkafka alias given by
        the user never overrides what the sink sets."""
        cfg = {**self.PRODUCER_DEFAULTS, **self.options.librdkafka_extra,
               **librdkafka_config(self.options.producer_config, what=SINK), **self.PRODUCER_OWN,
               "on_delivery": txn.on_delivery, "error_cb": txn.on_error,
               # librdkafka's own log lines go to Python logging (served in poll/flush), not raw to stderr
               "logger": logging.getLogger(LIBRDKAFKA_LOGGER)}
        if txn.transactional_id is not None:
            txn.timeout_ms = self.sink.effective_timeout_ms()
            cfg.update({"transactional.id": txn.transactional_id,
                        "transaction.timeout.ms": txn.timeout_ms,
                        "delivery.timeout.ms": self.sink.delivery_timeout_ms(LIBRDKAFKA_DELIVERY_TIMEOUT_MS),
                        "statistics.interval.ms": self.STATS_INTERVAL_MS, "stats_cb": txn.on_stats})
        else:
            cfg.setdefault("enable.idempotence", True)
        return cfg

    def _producer(self, txn: RdKafkaTransaction) -> Any:
        from twophase._versions import require
        require("confluent-kafka", what=f"{SINK}'s default producer (or set option kafkaClient=kafka-python)")
        try:
            from confluent_kafka import Producer
        except ImportError as e:
            raise MissingDependencyError("twophase-kafka's default producer needs confluent-kafka: pip install "
                                         "'twophase[kafka]' (or set option kafkaClient=kafka-python)") from e
        cfg = self._producer_config(txn)
        try:
            return Producer(cfg)
        except Exception as e:
            raise TransientSinkError(f"{SINK}: cannot create a producer for {','.join(self.options.bootstrap_servers)}: "
                                     f"{type(e).__name__}: {redact_error(e, cfg)}") from e

    def _begin(self, context: TransactionContext) -> RdKafkaTransaction:  # step 1
        if self.sink.guarantee is Guarantee.AT_LEAST_ONCE:
            txn = RdKafkaTransaction(context, None, None, time.time())
            txn.producer = self._producer(txn)
            return txn
        tid, seen = self._choose_id(context)  # invariant 4
        txn = RdKafkaTransaction(context, tid, None, time.time())
        producer = txn.producer = self._producer(txn)
        try:
            producer.init_transactions(max(30.0, self.options.producer_config.get("request_timeout_ms", 30000) / 1000))
            txn.producer_id, txn.epoch = self._producer_id_and_epoch(txn)
            self._check_no_race(context, tid, seen, txn.producer_id, txn.epoch)
            producer.begin_transaction()
        except BaseException as e:
            txn.producer = None  # dropped, not closed: nothing of ours is open yet
            if "INVALID_TRANSACTION_TIMEOUT" in str(e).upper().replace(" ", "_"):
                raise self.sink._timeout_refused() from e
            raise
        self.sink._remember(tid, context.checkpoint_id, txn.epoch)
        _log.debug("transaction_begun", transactional_id=tid, checkpoint_id=context.checkpoint_id,
                   task=context.task_id, task_attempt_id=context.task_attempt_id, epoch=txn.epoch,
                   producer_id=txn.producer_id)
        return txn

    def _producer_id_and_epoch(self, txn: RdKafkaTransaction) -> tuple[int, int]:
        """The producer id and epoch ``init_transactions`` got: librdkafka's statistics (``eos``), else the
        broker's DescribeTransactions of the id (Empty right after init, nobody else may use it)."""
        deadline = time.monotonic() + self.STATS_WAIT_S
        while time.monotonic() < deadline:
            txn.producer.poll(0.005)
            eos = txn.eos
            if int(eos.get("producer_id", -1)) >= 0 and eos.get("txn_state") in ("Ready", "InTransaction"):
                return int(eos["producer_id"]), int(eos["producer_epoch"])
        states = self.sink._client().describe([txn.transactional_id])
        st = None if states is None else states.get(txn.transactional_id)
        if st is None or st.is_open:
            raise TransientSinkError(f"{SINK}: no producer id and epoch for transactional id "
                                     f"{txn.transactional_id!r} after init_transactions (statistics: {txn.eos}, "
                                     f"broker: {st})")
        return st.producer_id, st.epoch

    def _produce_waiting(self, *args: Any, **kwargs: Any) -> None:
        """``produce`` after a BufferError (queue full): serve delivery reports until there is room,
        bounded by the delivery timeout (expired records leave the queue as failed reports)."""
        producer = self.txn.producer
        limit = float(self.options.producer_config.get("delivery_timeout_ms", LIBRDKAFKA_DELIVERY_TIMEOUT_MS)) / 1000 + 60
        deadline = time.monotonic() + limit
        while True:
            producer.poll(0.05)
            try:
                producer.produce(*args, **kwargs)
                return
            except BufferError:
                if time.monotonic() > deadline:
                    raise TransientSinkError(f"{SINK}: the producer queue stayed full for {limit:.0f}s "
                                             f"(transaction {self.txn.transactional_id!r})") from None

    def _write(self, batch: pa.RecordBatch) -> int:
        n = batch.num_rows
        if n == 0:
            return 0
        txn = self.txn
        cols = batch.schema.names
        values = batch.column(cols.index("value")).to_pylist()
        keys = batch.column(cols.index("key")).to_pylist() if "key" in cols else [None] * n
        default_topic = self.options.topic
        producer = txn.producer
        produce, poll = producer.produce, producer.poll
        # option 'topic' wins over a 'topic' column, as in Spark's Kafka sink
        topic_column = "topic" in cols and not default_topic
        if not topic_column and "partition" not in cols and "headers" not in cols:
            if default_topic is None:
                raise ConfigurationError(f"{SINK}: no option 'topic' is set and the stream has no 'topic' column")
            for start in range(0, n, _POLL_EVERY):
                for v, k in zip(values[start:start + _POLL_EVERY], keys[start:start + _POLL_EVERY]):
                    try:
                        produce(default_topic, v, k)
                    except BufferError:
                        self._produce_waiting(default_topic, v, k)
                    txn.records += 1
                poll(0)
            return n
        topics = batch.column(cols.index("topic")).to_pylist() if topic_column else None
        parts = batch.column(cols.index("partition")).to_pylist() if "partition" in cols else None
        headers = batch.column(cols.index("headers")).to_pylist() if "headers" in cols else None
        for i in range(n):
            topic = topics[i] if topics is not None and topics[i] is not None else default_topic
            if topic is None:
                raise ConfigurationError(f"{SINK}: row {i} has a null topic and no option 'topic' is set")
            kw: dict[str, Any] = {}
            if parts is not None and parts[i] is not None:
                kw["partition"] = parts[i]
            if headers is not None and headers[i]:
                kw["headers"] = [(h["key"], h["value"]) for h in headers[i]]
            try:
                produce(topic, values[i], keys[i], **kw)
            except BufferError:
                self._produce_waiting(topic, values[i], keys[i], **kw)
            txn.records += 1
            if txn.records % _POLL_EVERY == 0:
                poll(0)
        return n

    def prepare_commit(self) -> KafkaCommittable:  # step 3
        txn = self.txn
        producer = txn.producer
        producer.flush()  # every delivery report is served (or the record expired: a failed report)
        if txn.fatal:
            raise TransientSinkError(f"{SINK}: transaction {txn.transactional_id!r} failed while writing: "
                                     f"{txn.fatal[0]!r}")
        acked = txn.acked()
        # invariant 6: each record gets exactly one delivery report, so every record sent has a successful one
        # exactly when acked == records and none failed. len(producer) is no measure: it also counts requests
        # and ops librdkafka has queued (seen after flush() on an SSL listener with 5 of 5 records acknowledged)
        if txn.errors or acked != txn.records:
            raise self._not_acknowledged(acked, txn.errors)
        partitions: list[KafkaPartition] = [
            {"topic": topic, "partition": part, "first_offset": t[1], "last_offset": t[2], "records": t[0]}
            for (topic, part), t in sorted(txn.tracks.items())]
        if txn.transactional_id is not None:
            eos = txn.eos  # librdkafka bumps its epoch only after an abortable error: then it is not ours
            if int(eos.get("producer_id", txn.producer_id)) != txn.producer_id or \
                    int(eos.get("producer_epoch", txn.epoch)) != txn.epoch:
                raise TransientSinkError(f"{SINK}: transaction {txn.transactional_id!r}: the producer's id and "
                                         f"epoch moved from ({txn.producer_id}, {txn.epoch}) to {eos}")
            if partitions:
                self._check_still_ours(types.SimpleNamespace(producer_id=txn.producer_id, epoch=txn.epoch))
        c = txn.context
        committable = KafkaCommittable(
            checkpoint_id=c.checkpoint_id, task_id=c.task_id, attempt_uid=c.attempt_uid, records=txn.records,
            guarantee=self.sink.guarantee.value, transactional_id=txn.transactional_id, partitions=partitions,
            began_at=txn.began_at, timeout_ms=txn.timeout_ms, producer_id=txn.producer_id,
            epoch=txn.epoch)
        # the task ends without committing or aborting: the producer is dropped, NEVER closed (close() aborts)
        txn.producer = None
        del producer
        return committable

    def abort(self) -> None:
        txn = self.txn
        producer, txn.producer = txn.producer, None
        if producer is not None and txn.transactional_id is not None:
            with contextlib.suppress(Exception):
                producer.abort_transaction(10)
        if producer is not None and txn.transactional_id is None:
            with contextlib.suppress(Exception):
                producer.purge()
        del producer
        self.sink._forget(txn.transactional_id)
