"""The Kafka source in the embedded runtime (no Spark): :class:`KafkaRuntimeSource` (:func:`runtime_source`) drives
:class:`~twophase.sources.kafka.KafkaOffsetReader` for the offsets and reads each partition with a long-lived
consumer (kafka-python or librdkafka), positions from the job's checkpoint. Its one concern: adapting the source to
:class:`twophase.runtime.sources.Source`."""

from __future__ import annotations

import contextlib
from typing import Any, Mapping, Optional

from twophase.errors import DataLossError
from twophase.runtime.sources import Source
from twophase.sources._kafka_offsets import Offsets
from twophase.sources._kafka_source_options import SOURCE, KafkaSourceOptions
from twophase.sources._kafka_split_reader import _PAST_THE_END, _RdKafkaPartition
from twophase.sources.kafka import KafkaOffsetReader, _consumer, records_lost


class _KafkaPartitionReader:
    """A runtime split reader of one topic-partition (kafka-python, option ``kafkaClient=kafka-python``);
    its position is the next offset to read.

    read_committed by default, so aborted records and control records are skipped and reading stops at
    the last stable offset: a replay from a recorded position yields the same records (source invariant 1).
    """

    def __init__(self, options: KafkaSourceOptions, topic: str, partition: int, start: int,
                 end: Optional[int]) -> None:
        from kafka import TopicPartition
        self.options = options
        self.tp = TopicPartition(topic, partition)
        self.end = end
        self.consumer = _consumer(options.reader_config())
        self.consumer.assign([self.tp])
        earliest = self.consumer.beginning_offsets([self.tp])[self.tp]
        if earliest > start:
            if options.fail_on_data_loss:
                raise DataLossError(f"{SOURCE}: records {topic}-{partition} [{start}, {earliest}) were deleted "
                                    "(retention) before the job read them (set failOnDataLoss=false to skip them "
                                    "with a warning)")
            records_lost(topic, partition, "deleted (retention, DeleteRecords) before they were read",
                         lost_start=start, lost_end=earliest if end is None else min(earliest, end))
            start = earliest
        self.consumer.seek(self.tp, start)
        self.pos = start

    def read(self, max_records: int) -> Any:
        from twophase.runtime.sources import ReadResult
        import kafka.errors as Errors
        if self.end is not None and self.pos >= self.end:
            return ReadResult([], True)
        try:
            records = self.consumer.poll(timeout_ms=100, max_records=max_records).get(self.tp, [])
        except Errors.OffsetOutOfRangeError:
            self._out_of_range()
            return ReadResult([], False)
        out = []
        for r in records:
            if self.end is not None and r.offset >= self.end:
                break
            out.append({"key": r.key, "value": r.value, "topic": r.topic, "partition": r.partition,
                        "offset": r.offset, "timestamp": r.timestamp, "headers": list(r.headers or [])})
        if len(out) < len(records):  # reached the bounded end
            self.pos = self.end
        else:  # past the records returned, and past aborted data and control records the consumer skipped
            self.pos = max(self.consumer.position(self.tp), out[-1]["offset"] + 1 if out else self.pos)
        if self.end is not None:
            self.pos = min(self.pos, self.end)
        return ReadResult(out, self.end is not None and self.pos >= self.end)

    def _out_of_range(self) -> None:
        """The position went out of range (records deleted while the job read them, or the topic recreated):
        DataLossError, or with failOnDataLoss=false a warning and the earliest record left."""
        where = f"{self.tp.topic}-{self.tp.partition}"
        if self.options.fail_on_data_loss:
            raise DataLossError(f"{SOURCE}: offset {self.pos} of {where} is out of range (records deleted by "
                                "retention, or the topic recreated) (set failOnDataLoss=false to skip them with a "
                                "warning)")
        earliest = self.consumer.beginning_offsets([self.tp])[self.tp]
        if earliest > self.pos:
            records_lost(self.tp.topic, self.tp.partition, "deleted (retention, DeleteRecords) while they were read",
                         lost_start=self.pos, lost_end=earliest)
        else:
            records_lost(self.tp.topic, self.tp.partition, _PAST_THE_END + "; the partition is read again from its "
                         "earliest offset", recorded_start=self.pos, restart_at=earliest)
        self.consumer.seek(self.tp, earliest)
        self.pos = earliest

    def position(self) -> int:
        return self.pos

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.consumer.close()


class _RdKafkaPartitionReader:
    """The runtime split reader on librdkafka (the default): the same records and positions as
    :class:`_KafkaPartitionReader`; the position is :attr:`_RdKafkaPartition.next`, capped at the bounded end."""

    def __init__(self, options: KafkaSourceOptions, topic: str, partition: int, start: int,
                 end: Optional[int]) -> None:
        self.end = end
        self.part = _RdKafkaPartition(options, topic, partition, start, end)

    def read(self, max_records: int) -> Any:
        from twophase.runtime.sources import ReadResult
        if self.end is not None and self.part.next >= self.end:
            return ReadResult([], True)
        msgs = self.part.poll(max_records, 0.1)
        if self.end is not None and msgs and msgs[-1].offset() >= self.end:
            msgs = [m for m in msgs if m.offset() < self.end]
        if (not msgs and self.end is not None and not self.part.options.fail_on_data_loss
                and self.part.log_ends_before(self.end)):
            records_lost(self.part.topic, self.part.partition, _PAST_THE_END, lost_start=self.part.next,
                         lost_end=self.end)
            self.part.next = self.end
        out = [{"key": m.key(), "value": m.value(), "topic": m.topic(), "partition": m.partition(),
                "offset": m.offset(), "timestamp": m.timestamp()[1] if m.timestamp()[0] else None,
                "headers": list(m.headers() or ())} for m in msgs]
        return ReadResult(out, self.end is not None and self.position() >= self.end)

    def position(self) -> int:
        return self.part.next if self.end is None else min(self.part.next, self.end)

    def close(self) -> None:
        self.part.close()


class KafkaRuntimeSource(Source):
    """The same Kafka source for :mod:`twophase.runtime`: one split per topic-partition (``topic-partition``),
    the position is the next offset. ``bounded=True`` stops at the offsets available when the job first
    asks for its splits (like Spark's availableNow); otherwise the splits never finish."""

    def __init__(self, raw_options: Mapping[str, Any], *, bounded: bool = False) -> None:
        self.options = KafkaSourceOptions.from_options(raw_options)
        self.bounded = bounded
        self._start: Optional[Offsets] = None
        self._end: Optional[Offsets] = None

    def _plan(self) -> tuple[Offsets, Optional[Offsets]]:
        if self._start is None:
            reader = KafkaOffsetReader(self.options)
            try:
                self._start = reader.initial_offset()
                self._end = reader.available() if self.bounded else None
            finally:
                reader.close()
        return self._start, self._end

    def splits(self) -> list[str]:
        start, _ = self._plan()
        return [f"{t}-{p}" for t, ps in sorted(start.items()) for p in sorted(ps, key=int)]

    def open_reader(self, split_id: str, position: Optional[Any]) -> "_KafkaPartitionReader | _RdKafkaPartitionReader":
        start, end = self._plan()
        topic, _, part = split_id.rpartition("-")
        first = int(position) if position is not None else int(start[topic][part])
        last = int(end[topic][part]) if end is not None else None
        cls = _KafkaPartitionReader if self.options.client == "kafka-python" else _RdKafkaPartitionReader
        return cls(self.options, topic, int(part), first, last)


def runtime_source(raw_options: Mapping[str, Any], *, bounded: bool = False) -> KafkaRuntimeSource:
    """:class:`KafkaRuntimeSource` of ``raw_options`` (Spark's option names)."""
    return KafkaRuntimeSource(raw_options, bounded=bounded)
