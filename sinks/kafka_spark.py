"""Spark format ``twophase-kafka`` (registered by :mod:`twophase.spark`): the exactly-once Kafka sink
(writeStream) and the replayable source (readStream); one format, so it lives with the sink.

Sink: ``df.writeStream.format("twophase-kafka").option("kafka.bootstrap.servers", ...).option("topic", ...)``
with columns key, value, and optionally topic, partition, headers — see :mod:`twophase.sinks.kafka`.

Source: ``spark.readStream.format("twophase-kafka").option("subscribe", "t")`` with the schema of Spark's
Kafka source — see :mod:`twophase.sources.kafka`. Where each source method runs: ``initialOffset``,
``latestOffset`` and ``partitions`` on the driver (a planner Python worker), ``read`` on executors,
once per split; the offset is the per-topic-partition map and Spark checkpoints it.

Batch: ``spark.read.format("twophase-kafka")`` reads ``[startingOffsets, endingOffsets)`` (default earliest
to latest) with the same split reader (:class:`KafkaBatchReader`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from twophase._versions import require

require("pyspark", minimum="4.2", what="twophase-kafka's Spark source (pyspark.sql.streaming.datasource)")

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition  # noqa: E402
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from twophase.sinks.kafka import KafkaSink
from twophase.sources._kafka_offsets import KafkaSplit
from twophase.sources.kafka import (HEADERS_DDL, SPARK_SCHEMA_DDL, KafkaOffsetReader, KafkaSource, KafkaSourceOptions,
                                    KafkaSplitReader)
from twophase.sinks._spark_types import check_kafka_columns
from twophase.spark.datasource import TwoPhaseSinkDataSource


@dataclass
class KafkaInputPartition(InputPartition):
    """One topic-partition range ``[start, end)`` of a micro-batch."""

    topic: str
    partition: int
    start: int
    end: int

    def split(self) -> KafkaSplit:
        return KafkaSplit(self.topic, self.partition, self.start, self.end)


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Drives :class:`twophase.sources.kafka.KafkaSource` from Spark (offsets are plain dicts, read is Arrow).

    Admission control: :meth:`getDefaultReadLimit` tells Spark ``ReadMaxRows(maxOffsetsPerTrigger)``, or
    ``ReadMinRows(minOffsetsPerTrigger)`` when only that is set (PySpark has no composite limit, so the
    other option of the pair is applied from the options); a ``ReadAllAvailable`` from the engine
    (Trigger.Once) overrides both, as in Spark's Kafka source. ``minOffsetsPerTrigger`` holds a batch back
    until that many offsets are available or ``maxTriggerDelay`` has passed since the last batch; the
    first batch after a (re)start is never held back.

    Trigger.AvailableNow: :meth:`prepareForTriggerAvailableNow` fixes the target offset; later batches
    respect ``maxOffsetsPerTrigger`` and never go past the target, and ``minOffsetsPerTrigger`` does not
    apply (nothing past the target would ever come to fill a batch).
    """

    def __init__(self, options: KafkaSourceOptions) -> None:
        self.options = options
        self._source: KafkaSource | None = None
        self._target: dict | None = None

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self.source.offsets.available()

    @property
    def source(self) -> KafkaSource:
        if self._source is None:
            self._source = KafkaSource(self.options)
        return self._source

    def initialOffset(self) -> dict:
        return self.source.initial_offset()

    def latestOffset(self, start: dict = None, limit: Any = None) -> dict:  # type: ignore[override]
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows
        if start is None:  # older engines call latestOffset() without arguments
            start = self.source.initial_offset()
        max_rows, min_rows = self.options.max_offsets_per_trigger, self.options.min_offsets_per_trigger
        if isinstance(limit, ReadAllAvailable):
            max_rows = min_rows = None
        elif isinstance(limit, ReadMaxRows):
            max_rows = limit.max_rows
        elif isinstance(limit, ReadMinRows):
            min_rows = limit.min_rows
        if self._target is not None:
            min_rows = None
        return self.source.offsets.latest_offset(start, max_rows, cap=self._target, min_rows=min_rows)

    def getDefaultReadLimit(self) -> Any:
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows
        if self.options.max_offsets_per_trigger:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        if self.options.min_offsets_per_trigger:
            return ReadMinRows(self.options.min_offsets_per_trigger)
        return ReadAllAvailable()

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return [KafkaInputPartition(s.topic, s.partition, s.start, s.end)
                for s in KafkaSource.splits_of(start, end, self.options.min_partitions)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, KafkaInputPartition)
        yield from KafkaSplitReader(self.options).read(partition.split())

    def commit(self, end: dict) -> None:
        pass

    def stop(self) -> None:
        if self._source is not None:
            self._source.close()


class KafkaBatchReader(DataSourceReader):
    """``spark.read.format("twophase-kafka")``: the records of ``[startingOffsets, endingOffsets)``, planned on
    the driver (:meth:`partitions`, minPartitions applies) and read by the executors' split reader."""

    def __init__(self, options: KafkaSourceOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        offsets = KafkaOffsetReader(self.options)
        try:
            start = offsets.initial_offset()
            end = offsets.ending_offset(start)
        finally:
            offsets.close()
        return [KafkaInputPartition(s.topic, s.partition, s.start, s.end)
                for s in KafkaSource.splits_of(start, end, self.options.min_partitions)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, KafkaInputPartition):  # PySpark's one stand-in when no range has records
            return
        yield from KafkaSplitReader(self.options).read(partition.split())


class KafkaDataSource(TwoPhaseSinkDataSource):
    """``format("twophase-kafka")``: exactly-once Kafka writes and replayable Kafka reads."""

    short_name = "twophase-kafka"
    spec_class = KafkaSink

    def schema(self) -> str:
        include = str(self.options.get("includeheaders", self.options.get("includeHeaders", "false"))).lower()
        return SPARK_SCHEMA_DDL + (", " + HEADERS_DDL if include == "true" else "")

    def build_sink(self, schema: StructType) -> KafkaSink:
        """Parse the options and columns, then refuse key/value/topic/partition/headers of the wrong type."""
        sink = KafkaSink.from_options(dict(self.options), schema)
        self.check_sink_columns(self.short_name, sink, schema)
        return sink

    @classmethod
    def check_sink_columns(cls, what: str, sink: KafkaSink, schema: StructType) -> None:
        check_kafka_columns(what, schema)

    def streamReader(self, schema: StructType) -> KafkaStreamReader:
        return KafkaStreamReader(KafkaSourceOptions.from_options(dict(self.options)))

    def reader(self, schema: StructType) -> KafkaBatchReader:
        return KafkaBatchReader(KafkaSourceOptions.from_options(dict(self.options), batch=True))
