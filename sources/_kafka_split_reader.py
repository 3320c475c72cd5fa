"""The Kafka source's executor side: :class:`KafkaSplitReader` reads the records of one
:class:`~twophase.sources._kafka_offsets.KafkaSplit` (kafka-python, or librdkafka through :class:`_RdKafkaPartition`)
as Arrow record batches with the schema of Spark's Kafka source. Its one concern: invariant 2 of
:mod:`twophase.sources.kafka` (exactly the data records with offsets in ``[start, end)``, a missing record named, never
skipped silently unless failOnDataLoss=false)."""

from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator, Optional

import pyarrow as pa

from twophase._logging import get_logger
from twophase._redact import redact_error
from twophase.errors import ConfigurationError, DataLossError, MissingDependencyError, TransientSinkError
from twophase.sources._kafka_offsets import KafkaSplit
from twophase.sources._kafka_source_options import SOURCE, KafkaSourceOptions, arrow_schema
from twophase.sources.kafka import _consumer, records_lost

_log = get_logger('twophase.sources.kafka')  # the public module's logger name: users' log filters keep working


class _RdKafkaPartition:
    """One topic-partition read from ``start`` by a librdkafka consumer: assigned, no group membership, no
    offset commits (the offsets live in the job's checkpoint); its group.id is the options'
    (``kafka.group.id``, or generated).

    read_committed (the default) makes librdkafka drop aborted records and control records and report the
    end of the partition (``_PARTITION_EOF``) at the last stable offset. :attr:`next` is the offset after
    the last record returned, or the end-of-partition offset where that is higher (past control records and
    aborted data at the end), so reading again from :attr:`next` yields the records that follow, and a
    replay from the same start yields the same records (invariant 2). ``auto.offset.reset=error``: a start
    below the earliest retained record is a :class:`DataLossError`, never a silent jump (invariant 3);
    with ``failOnDataLoss=false`` the read goes on from the earliest record, with a ``kafka_records_lost``
    warning naming the skipped offsets.
    """

    def __init__(self, options: KafkaSourceOptions, topic: str, partition: int, start: int,
                 end: Optional[int] = None) -> None:
        from twophase._versions import require
        require("confluent-kafka", what=f"{SOURCE}'s default reader (or set option kafkaClient=kafka-python)")
        try:
            from confluent_kafka import Consumer, KafkaException
        except ImportError as e:
            raise MissingDependencyError(f"{SOURCE}'s default reader needs confluent-kafka: pip install "
                                         "'twophase[kafka]' (or set option kafkaClient=kafka-python)") from e
        self.options = options
        self.topic, self.partition, self.next, self.end = topic, partition, start, end
        #: the last poll reached the end of the partition's log at :attr:`next` (EOF, or an offset past the end)
        self.at_log_end = False
        cfg = options.librdkafka_consumer_config()
        where = f"{topic}-{partition}"
        try:
            self.consumer = Consumer(cfg)
        except Exception as e:
            raise ConfigurationError(f"{SOURCE}: cannot create a consumer for {where}: {type(e).__name__}: "
                                     f"{redact_error(e, cfg)}") from e
        try:
            low, _high = self.watermarks()
        except KafkaException as e:
            self.close()
            raise TransientSinkError(f"{SOURCE}: no earliest offset of {where} from kafka.bootstrap.servers="
                                     f"{cfg.get('bootstrap.servers')!r} within {self._timeout():g} s: "
                                     f"{redact_error(e, cfg)}") from e
        if low > start:
            if options.fail_on_data_loss:
                self.close()
                raise DataLossError(f"{SOURCE}: records {where} [{start}, {low}) were deleted (retention) before "
                                    "they were read (set failOnDataLoss=false to skip them with a warning)")
            self._skip_to(low, "deleted (retention, DeleteRecords) before they were read")
        self._assign(self.next)

    def _timeout(self) -> float:
        return self.options.consumer_config.get("bootstrap_timeout_ms", 15_000) / 1000

    def watermarks(self) -> tuple[int, int]:
        """(earliest offset, high watermark) of the partition, asked of the broker (not cached)."""
        from confluent_kafka import TopicPartition
        low, high = self.consumer.get_watermark_offsets(TopicPartition(self.topic, self.partition),
                                                        timeout=self._timeout(), cached=False)
        return int(low), int(high)

    def _assign(self, offset: int) -> None:
        from confluent_kafka import TopicPartition
        self.consumer.assign([TopicPartition(self.topic, self.partition, offset)])

    def _skip_to(self, low: int, why: str) -> None:
        """failOnDataLoss=false: go on from ``low``, the earliest record left; the skipped offsets are named."""
        stop = low if self.end is None else min(low, self.end)
        records_lost(self.topic, self.partition, why, lost_start=self.next, lost_end=stop)
        self.next = low

    def poll(self, max_records: int, timeout: float) -> list[Any]:
        """Up to ``max_records`` data records (librdkafka ``Message``), in offset order; advances :attr:`next`."""
        from confluent_kafka import KafkaError
        out = []
        for m in self.consumer.consume(max_records, timeout):
            err = m.error()
            if err is None:
                out.append(m)
                self.at_log_end = False
                continue
            code = err.code()
            if code == KafkaError._PARTITION_EOF:  # after every record before it, in order
                self.next = max(self.next, m.offset())
                self.at_log_end = True
            elif code in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                if self.options.fail_on_data_loss:
                    raise DataLossError(f"{SOURCE}: offset {self.next} of {self.topic}-{self.partition} is out of "
                                        f"range (records deleted by retention, or the topic recreated): {err.str()} "
                                        "(set failOnDataLoss=false to skip them with a warning)")
                self._out_of_range()
                return out
            elif err.fatal() or not err.retriable():
                raise TransientSinkError(f"{SOURCE}: reading {self.topic}-{self.partition} at {self.next}: {err.str()}")
            else:
                _log.debug("kafka_read_retriable_error", topic=self.topic, partition=self.partition, error=err.str())
        if out:
            self.next = max(self.next, out[-1].offset() + 1)
        return out

    def _out_of_range(self) -> None:
        """failOnDataLoss=false, :attr:`next` out of range: below the earliest record (deleted while reading)
        -> go on from there; past the end of the log (recreated, truncated) -> :attr:`at_log_end`."""
        low, _high = self.watermarks()
        if self.next < low:
            self._skip_to(low, "deleted (retention, DeleteRecords) while they were read")
            self._assign(self.next)
        elif self.end is None:  # an unbounded runtime split: the partition starts over
            records_lost(self.topic, self.partition, _PAST_THE_END + "; the partition is read again from its "
                         "earliest offset", recorded_start=self.next, restart_at=low)
            self.next = low
            self._assign(low)
        else:
            self.at_log_end = True

    def log_ends_before(self, end: int) -> bool:
        """At the end of the log below ``end``, and the broker's high watermark confirms offsets up to ``end``
        no longer exist (the topic was recreated, or its log truncated)."""
        return self.at_log_end and self.next < end and self.watermarks()[1] < end

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.consumer.close()


def _timestamp(kind: int, ts: int) -> tuple[Optional[int], int]:
    """librdkafka's (type, ms) -> Spark's (timestamp in us, timestampType: 0 CreateTime, 1 LogAppendTime)."""
    return (ts * 1000 if kind and ts >= 0 else None), (1 if kind == 2 else 0)


def _arrow_batch(msgs: list[Any], topic: str, partition: int, schema: pa.Schema) -> pa.RecordBatch:
    """The source's Arrow batch of librdkafka messages: one column at a time, no per-row dicts."""
    n = len(msgs)
    ts = [_timestamp(*m.timestamp()) for m in msgs]
    cols: dict[str, Any] = {"key": [m.key() for m in msgs], "value": [m.value() for m in msgs],
                            "topic": [topic] * n, "partition": [partition] * n, "offset": [m.offset() for m in msgs],
                            "timestamp": [t for t, _k in ts], "timestampType": [k for _t, k in ts]}
    if "headers" in schema.names:
        cols["headers"] = [[{"key": k, "value": v} for k, v in (m.headers() or ())] for m in msgs]
    return pa.RecordBatch.from_pydict(cols, schema=schema)


_PAST_THE_END = "past the end of the partition's log (the topic was deleted and recreated, or its log truncated)"


class KafkaSplitReader:
    """Executor side: the records of one split as Arrow batches (invariants 2, 3), with librdkafka
    (option ``kafkaClient``, the default) or kafka-python."""

    def __init__(self, options: KafkaSourceOptions, *, batch_rows: int = 10_000) -> None:
        self.options = options
        self.batch_rows = batch_rows

    def read(self, split: KafkaSplit) -> Iterator[pa.RecordBatch]:
        if split.start >= split.end:
            return iter(())
        if self.options.client == "kafka-python":
            return self._read_kafka_python(split)
        return self._read_librdkafka(split)

    def _stopped(self, split: KafkaSplit, at: int) -> TransientSinkError:
        return TransientSinkError(f"{SOURCE}: reading {split.topic}-{split.partition} [{split.start}, {split.end}) "
                                  f"stopped at {at} after kafkaConsumer.pollTimeoutMs={self.options.poll_timeout_ms}")

    def _read_librdkafka(self, split: KafkaSplit) -> Iterator[pa.RecordBatch]:
        schema = arrow_schema(self.options.include_headers)
        part = _RdKafkaPartition(self.options, split.topic, split.partition, split.start, split.end)
        try:
            deadline = time.monotonic() + self.options.poll_timeout_ms / 1000
            while part.next < split.end:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._stopped(split, part.next)
                # no more records than offsets left: a short split returns once they are in, not after the timeout
                msgs = part.poll(min(self.batch_rows, split.end - part.next), min(1.0, left))
                if msgs and msgs[-1].offset() >= split.end:  # past the range: it is whole
                    msgs = [m for m in msgs if m.offset() < split.end]
                if msgs:
                    yield _arrow_batch(msgs, split.topic, split.partition, schema)
                elif not self.options.fail_on_data_loss and part.log_ends_before(split.end):
                    records_lost(split.topic, split.partition, _PAST_THE_END, lost_start=part.next,
                                 lost_end=split.end)
                    break
        finally:
            part.close()

    def _read_kafka_python(self, split: KafkaSplit) -> Iterator[pa.RecordBatch]:
        from kafka import TopicPartition
        import kafka.errors as Errors
        consumer = _consumer(self.options.reader_config())
        tp = TopicPartition(split.topic, split.partition)
        schema = arrow_schema(self.options.include_headers)
        where = f"{split.topic}-{split.partition}"
        try:
            consumer.assign([tp])
            start = split.start
            earliest = consumer.beginning_offsets([tp])[tp]
            if earliest > start:
                if self.options.fail_on_data_loss:
                    raise DataLossError(f"{SOURCE}: records {where} [{start}, {earliest}) were deleted (retention) "
                                        "before this batch read them (set failOnDataLoss=false to skip them with a "
                                        "warning)")
                records_lost(split.topic, split.partition, "deleted (retention, DeleteRecords) before they were read",
                             lost_start=start, lost_end=min(earliest, split.end))
                start = earliest
                if start >= split.end:
                    return
            consumer.seek(tp, start)
            rows: dict[str, list[Any]] = {f.name: [] for f in schema}
            deadline = time.monotonic() + self.options.poll_timeout_ms / 1000
            while consumer.position(tp) < split.end:
                if time.monotonic() > deadline:
                    raise self._stopped(split, consumer.position(tp))
                try:
                    polled = consumer.poll(timeout_ms=1000, max_records=self.batch_rows)
                except Errors.OffsetOutOfRangeError:
                    if not self._out_of_range(consumer, tp, split):
                        break
                    continue
                records = polled.get(tp, ())
                for record in records:
                    if record.offset >= split.end:
                        break
                    self._append(rows, record)
                if len(rows["offset"]) >= self.batch_rows:
                    yield pa.RecordBatch.from_pydict(rows, schema=schema)
                    rows = {f.name: [] for f in schema}
                if rows["offset"] and rows["offset"][-1] >= split.end - 1:
                    break
                if not records and not self.options.fail_on_data_loss:
                    at = consumer.position(tp)
                    log_end = consumer.end_offsets([tp])[tp]
                    if at >= log_end and log_end < split.end:
                        records_lost(split.topic, split.partition, _PAST_THE_END, lost_start=at, lost_end=split.end)
                        break
            if rows["offset"]:
                yield pa.RecordBatch.from_pydict(rows, schema=schema)
        finally:
            with contextlib.suppress(Exception):
                consumer.close()

    def _out_of_range(self, consumer: Any, tp: Any, split: KafkaSplit) -> bool:
        """The fetch position went out of range while reading: DataLossError (failOnDataLoss=true), or go on
        from the earliest record (True) / stop at the end of a log that ends before the split (False)."""
        at = consumer.position(tp)
        where = f"{split.topic}-{split.partition}"
        if self.options.fail_on_data_loss:
            raise DataLossError(f"{SOURCE}: offset {at} of {where} is out of range (records deleted by retention, or "
                                "the topic recreated) (set failOnDataLoss=false to skip them with a warning)")
        earliest = consumer.beginning_offsets([tp])[tp]
        if at < earliest:
            records_lost(split.topic, split.partition, "deleted (retention, DeleteRecords) while they were read",
                         lost_start=at, lost_end=min(earliest, split.end))
            consumer.seek(tp, earliest)
            return True
        records_lost(split.topic, split.partition, _PAST_THE_END, lost_start=at, lost_end=split.end)
        return False

    def _append(self, rows: dict[str, list[Any]], record: Any) -> None:
        rows["key"].append(record.key)
        rows["value"].append(record.value)
        rows["topic"].append(record.topic)
        rows["partition"].append(record.partition)
        rows["offset"].append(record.offset)
        rows["timestamp"].append(int(record.timestamp) * 1000 if record.timestamp is not None and record.timestamp >= 0 else None)
        rows["timestampType"].append(int(record.timestamp_type or 0))
        if "headers" in rows:
            rows["headers"].append([{"key": k, "value": v} for k, v in (record.headers or [])])
