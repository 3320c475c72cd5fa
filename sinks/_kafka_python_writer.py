"""The Kafka sink's kafka-python writer (option ``kafkaClient=kafka-python``): :class:`KafkaPythonWriter`, steps
1-3 of :mod:`twophase.sinks.kafka` on kafka-python's producer, with :class:`KafkaTransaction` and its per-partition
acknowledgement accounting (invariant 6). Its one concern: producing a task's records in one Kafka transaction
with kafka-python, for environments without confluent-kafka."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
import threading
import time
from typing import Any, Optional

import pyarrow as pa

from twophase._logging import get_logger
from twophase._redact import redact_error
from twophase.errors import ConfigurationError, TransientSinkError
from twophase.sink import Guarantee, TransactionContext

from twophase.sinks._kafka_writer import _KafkaWriterBase
from twophase.sinks.kafka import SINK, KafkaCommittable, KafkaPartition

_log = get_logger('twophase.sinks.kafka')  # the public module's logger name: users' log filters keep working


class _PartitionTrack:
    """Per topic-partition accounting of one transaction (invariant 6): records sent, acknowledged,
    and the lowest / highest acknowledged offset. ``ack`` runs on the producer's sender thread."""

    __slots__ = ("records", "acked", "first", "last", "lock")

    def __init__(self, lock: threading.Lock) -> None:
        self.records = 0
        self.acked = 0
        self.first: Optional[int] = None
        self.last: Optional[int] = None
        self.lock = lock

    def ack(self, metadata: Any) -> None:
        offset = metadata.offset
        with self.lock:
            self.acked += 1
            if self.first is None or offset < self.first:
                self.first = offset
            if self.last is None or offset > self.last:
                self.last = offset


@dataclass
class KafkaTransaction:
    """In-task state: the producer and, per topic-partition, what was sent and acknowledged."""

    context: TransactionContext
    transactional_id: Optional[str]
    producer: Any
    began_at: float
    tracks: dict[tuple[str, int], _PartitionTrack] = field(default_factory=dict)
    records: int = 0
    errors: list[BaseException] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: the transaction_timeout_ms the producer was created with (what the handle records for the age check)
    timeout_ms: Optional[int] = None

    def fail(self, error: BaseException) -> None:
        """Errback of every send (sender thread): the record was not written."""
        with self.lock:
            self.errors.append(error)

    def settled(self) -> int:
        with self.lock:
            return sum(t.acked for t in self.tracks.values()) + len(self.errors)


def _as_bytes(values: list[Any]) -> list[Optional[bytes]]:
    return [v.encode() if isinstance(v, str) else v for v in values]


class KafkaPythonWriter(_KafkaWriterBase):
    """The kafka-python producer (option ``kafkaClient=kafka-python``): pure Python, ~30x slower than
    :class:`KafkaWriter`; kept for environments without confluent-kafka."""

    def _producer(self, transactional_id: Optional[str]) -> Any:
        from kafka import KafkaProducer
        cfg = dict(self.options.producer_config)
        cfg.setdefault("linger_ms", 5)
        cfg.setdefault("batch_size", 256 * 1024)
        # the sender polls at this interval while FindCoordinator / InitProducerId / AddPartitionsToTxn are in
        # flight: the default 100 ms makes init_transactions take ~0.25 s, 20 ms ~0.08 s (measured)
        cfg.setdefault("retry_backoff_ms", 20)
        if transactional_id is not None:
            cfg.update(transactional_id=transactional_id, transaction_timeout_ms=self.sink.effective_timeout_ms(),
                       delivery_timeout_ms=self.sink.delivery_timeout_ms(
                           KafkaProducer.DEFAULT_CONFIG["delivery_timeout_ms"]))
        else:
            cfg.setdefault("enable_idempotence", True)
        try:
            return KafkaProducer(**cfg)
        except Exception as e:
            raise TransientSinkError(f"{SINK}: cannot create a producer for {','.join(self.options.bootstrap_servers)}: "
                                     f"{type(e).__name__}: {redact_error(e, cfg)}") from e

    def _begin(self, context: TransactionContext) -> KafkaTransaction:  # step 1
        if self.sink.guarantee is Guarantee.AT_LEAST_ONCE:
            return KafkaTransaction(context, None, self._producer(None), time.time())
        tid, seen = self._choose_id(context)  # invariant 4
        producer = self._producer(tid)
        # A fenced producer must stay fenced: kafka-python (KIP-360) answers INVALID_PRODUCER_EPOCH on a
        # produce by bumping the epoch itself, which would let a zombie abort the transaction of the
        # writer that fenced it (measured with noida-db). Pre-KIP-360 classification makes it fatal.
        producer._transaction_manager._supports_epoch_bump = lambda: False
        try:
            producer.init_transactions()  # the id had no open transaction: this aborts nothing pending
            pe = producer._transaction_manager.producer_id_and_epoch
            self._check_no_race(context, tid, seen, pe.producer_id, pe.epoch)
            producer.begin_transaction()
        except BaseException as e:
            with contextlib.suppress(Exception):
                producer.close(timeout=0)
            if "InvalidTransactionTimeout" in str(e):  # where prepare_sink did not check it (embedded runtime)
                raise self.sink._timeout_refused() from e
            raise
        self.sink._remember(tid, context.checkpoint_id, pe.epoch)
        _log.debug("transaction_begun", transactional_id=tid, checkpoint_id=context.checkpoint_id,
                   task=context.task_id, task_attempt_id=context.task_attempt_id, epoch=pe.epoch)
        # the handle records the timeout this producer really has, not the process's latest choice (which a
        # long-lived process may have changed since: K-2)
        return KafkaTransaction(context, tid, producer, time.time(),
                                timeout_ms=producer.config.get("transaction_timeout_ms"))

    def _write(self, batch: pa.RecordBatch) -> int:
        n = batch.num_rows
        if n == 0:
            return 0
        txn = self.txn
        cols = batch.schema.names
        values = _as_bytes(batch.column(cols.index("value")).to_pylist())
        keys = _as_bytes(batch.column(cols.index("key")).to_pylist()) if "key" in cols else [None] * n
        default_topic = self.options.topic
        # option 'topic' wins over a 'topic' column, as in Spark's Kafka sink
        topics = batch.column(cols.index("topic")).to_pylist() if "topic" in cols and not default_topic else None
        parts = batch.column(cols.index("partition")).to_pylist() if "partition" in cols else None
        headers = batch.column(cols.index("headers")).to_pylist() if "headers" in cols else None
        send = txn.producer.send
        tracks = txn.tracks
        fail = txn.fail
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
                track = tracks[tp] = _PartitionTrack(txn.lock)
            track.records += 1
            txn.records += 1
            fut.add_callback(track.ack)  # invariant 6: every record is accounted for
            fut.add_errback(fail)
        return n

    def prepare_commit(self) -> KafkaCommittable:  # step 3
        txn = self.txn
        producer = txn.producer
        producer.flush()
        tm = getattr(producer, "_transaction_manager", None)
        if tm is not None and tm.has_error():
            raise TransientSinkError(f"{SINK}: transaction {txn.transactional_id!r} failed while writing: {tm.last_error!r}")
        self._account()
        partitions: list[KafkaPartition] = []
        for (topic, part), track in sorted(txn.tracks.items()):
            partitions.append({"topic": topic, "partition": part, "first_offset": track.first,
                               "last_offset": track.last, "records": track.acked})
        if partitions and txn.transactional_id is not None and tm is not None:
            self._check_still_ours(tm.producer_id_and_epoch)
        c = txn.context
        producer_id = epoch = None
        if tm is not None and txn.transactional_id is not None:
            producer_id = tm.producer_id_and_epoch.producer_id
            epoch = tm.producer_id_and_epoch.epoch
        committable = KafkaCommittable(
            checkpoint_id=c.checkpoint_id, task_id=c.task_id, attempt_uid=c.attempt_uid, records=txn.records,
            guarantee=self.sink.guarantee.value, transactional_id=txn.transactional_id, partitions=partitions,
            began_at=txn.began_at, timeout_ms=txn.timeout_ms, producer_id=producer_id,
            epoch=epoch)
        # end the task without committing or aborting: close only stops the sender thread
        producer.close(timeout=5)
        return committable

    def _account(self, *, timeout_s: float = 30.0) -> None:
        """Invariant 6: after flush, every record sent must be acknowledged; else fail the task."""
        txn = self.txn
        deadline = time.monotonic() + timeout_s
        while txn.settled() < txn.records and time.monotonic() < deadline:
            time.sleep(0.01)  # flush returned; callbacks of the last batches may still be running
        acked = sum(t.acked for t in txn.tracks.values())
        if txn.errors or acked != txn.records:
            raise self._not_acknowledged(acked, txn.errors)

    def abort(self) -> None:
        txn = self.txn
        with contextlib.suppress(Exception):
            if txn.transactional_id is not None:
                txn.producer.abort_transaction()
        with contextlib.suppress(Exception):
            txn.producer.close(timeout=0)
        self.sink._forget(txn.transactional_id)
