"""The Kafka source's driver side (KafkaOffsetReader) against a fake kafka-python consumer (no broker):
retries of offset queries, partitions whose end went below the recorded start, subscribePattern, timestamps,
batch ends, minOffsetsPerTrigger; and the Spark reader's read limits."""

from __future__ import annotations

import logging
from collections import namedtuple
from typing import Any, Optional

import pytest

from twophase.errors import ConfigurationError, DataLossError, TransientSinkError
from twophase.sources._kafka_offsets import KafkaSplit
from twophase.sources.kafka import KafkaOffsetReader, KafkaSourceOptions

SRC = {"kafka.bootstrap.servers": "h:1", "subscribe": "t", "kafkaClient": "kafka-python"}
OffsetAndTimestamp = namedtuple("OffsetAndTimestamp", "offset timestamp")


class FakeConsumer:
    """The few kafka-python KafkaConsumer calls the driver makes, over fixed offsets; ``failures`` makes
    the next that many calls raise ``error``."""

    def __init__(self, earliest: dict, latest: dict, *, times: Optional[dict] = None, failures: int = 0,
                 error: Optional[BaseException] = None) -> None:
        self.earliest, self.latest, self.times = earliest, latest, times or {}
        self.failures, self.error, self.calls = failures, error, 0

    def _maybe_fail(self) -> None:
        self.calls += 1
        if self.failures:
            self.failures -= 1
            raise self.error

    def topics(self) -> set:
        self._maybe_fail()
        return {t for t, _p in self.latest} | {"__consumer_offsets"}

    def partitions_for_topic(self, topic: str) -> set:
        self._maybe_fail()
        return {p for t, p in self.latest if t == topic}

    def beginning_offsets(self, parts: list) -> dict:
        self._maybe_fail()
        return {tp: self.earliest[(tp.topic, tp.partition)] for tp in parts}

    def end_offsets(self, parts: list) -> dict:
        self._maybe_fail()
        return {tp: self.latest[(tp.topic, tp.partition)] for tp in parts}

    def offsets_for_times(self, query: dict) -> dict:
        self._maybe_fail()
        out = {}
        for tp, ms in query.items():
            hit = [o for o, t in self.times.get((tp.topic, tp.partition), []) if t >= ms]
            out[tp] = OffsetAndTimestamp(hit[0], ms) if hit else None
        return out

    def close(self) -> None:
        pass


def _reader(raw: dict[str, Any], consumer: FakeConsumer, hw: Optional[FakeConsumer] = None, *,
            batch: bool = False) -> KafkaOffsetReader:
    reader = KafkaOffsetReader(KafkaSourceOptions.from_options({**SRC, **raw}, batch=batch))
    reader._consumer = consumer
    reader._hw_consumer = hw or consumer
    return reader


def test_kafka_offset_reader_retries_transient_errors_fetch_offset_num_retries_times(monkeypatch, caplog):
    import kafka.errors as Errors
    slept = []
    monkeypatch.setattr("twophase.sources.kafka.time.sleep", slept.append)
    offsets = {("t", 0): 5}
    flaky = FakeConsumer(offsets, offsets, failures=3, error=Errors.RequestTimedOutError())
    reader = _reader({"fetchOffset.numRetries": "3", "fetchOffset.retryIntervalMs": "40"}, flaky)
    assert reader.available() == {"t": {"0": 5}}  # partitions_for_topic failed 3 times, then answered
    assert slept == [0.04] * 3 and "kafka_offset_fetch_retry" in caplog.text
    # one retry fewer than needed: the error names the options to raise
    reader = _reader({"fetchOffset.numRetries": "2"}, FakeConsumer(offsets, offsets, failures=3,
                                                                   error=Errors.RequestTimedOutError()))
    with pytest.raises(TransientSinkError, match="failed 3 time.*fetchOffset.numRetries=2"):
        reader.available()
    # an error that is not transient is not retried
    bad = FakeConsumer(offsets, offsets, failures=1, error=Errors.TopicAuthorizationFailedError())
    with pytest.raises(Errors.TopicAuthorizationFailedError):
        _reader({}, bad).available()
    assert bad.calls == 1


@pytest.mark.parametrize("fail", [True, False])
def test_kafka_offset_reader_end_below_the_recorded_start_is_data_loss_or_a_named_restart(monkeypatch, caplog, fail):
    """The topic was recreated: its end (4) is below the start this query reached (10). Before, the batch
    kept the start and waited silently; now failOnDataLoss=true raises DataLossError naming t-0, and false
    warns kafka_records_lost and ends t-0 at its earliest offset (no split), so the next batch reads it."""
    monkeypatch.setattr("twophase.sources.kafka.time.sleep", lambda s: None)
    caplog.set_level(logging.WARNING)
    consumer = FakeConsumer({("t", 0): 1, ("t", 1): 0}, {("t", 0): 4, ("t", 1): 9})
    reader = _reader({"failOnDataLoss": str(fail).lower()}, consumer)
    start = {"t": {"0": 10, "1": 5}}
    if fail:
        with pytest.raises(DataLossError, match=r"t-0 \(recorded start 10, end now 4\).*failOnDataLoss=false"):
            reader.latest_offset(start)
        return
    end = reader.latest_offset(start)
    assert end == {"t": {"0": 1, "1": 9}}
    assert reader.splits(start, end) == [KafkaSplit("t", 1, 5, 9)]  # none of t-0 in this batch
    assert "kafka_records_lost" in caplog.text and "partition=0" in caplog.text
    assert "recorded_start=10" in caplog.text and "end_now=4" in caplog.text and "restart_at=1" in caplog.text
    assert reader.latest_offset(end) == {"t": {"0": 4, "1": 9}}  # the next batch reads t-0 from its earliest


def test_kafka_offset_reader_start_past_the_last_stable_offset_is_not_data_loss(monkeypatch):
    """An open transaction keeps the last stable offset (4) below offsets that exist (high watermark 12):
    a start of 10 is waiting for the transaction, not lost."""
    monkeypatch.setattr("twophase.sources.kafka.time.sleep", lambda s: None)
    lso = FakeConsumer({("t", 0): 0}, {("t", 0): 4})
    hw = FakeConsumer({("t", 0): 0}, {("t", 0): 12})
    reader = _reader({}, lso, hw)
    assert reader.latest_offset({"t": {"0": 10}}) == {"t": {"0": 10}}


def test_kafka_offset_reader_subscribe_pattern_matches_whole_names_and_skips_internal_topics():
    consumer = FakeConsumer({}, {("events-a", 0): 3, ("events-b", 0): 1, ("events-b", 1): 2, ("xevents-c", 0): 1,
                                 ("events-a-dlq", 0): 0, ("__events-internal", 0): 1})
    reader = _reader({"subscribe": None, "subscribePattern": r"events-[a-z]"}, consumer)
    assert reader.topic_partitions() == [("events-a", 0), ("events-b", 0), ("events-b", 1)]
    # a topic created later is read by a later batch from offset 0 (absent from the start)
    consumer.latest[("events-z", 0)] = 7
    assert reader.latest_offset({"events-a": {"0": 3}, "events-b": {"0": 1, "1": 2}})["events-z"] == {"0": 7}
    nothing = _reader({"subscribe": None, "subscribePattern": "nomatch"}, consumer)
    assert nothing.initial_offset() == {}


def test_kafka_offset_reader_starting_timestamps():
    times = {("t", 0): [(0, 100), (1, 200), (2, 300)], ("t", 1): [(0, 100)]}
    consumer = FakeConsumer({("t", 0): 0, ("t", 1): 0}, {("t", 0): 3, ("t", 1): 1}, times=times)
    assert _reader({"startingTimestamp": "150", "startingOffsetsByTimestampStrategy": "latest"},
                   consumer).initial_offset() == {"t": {"0": 1, "1": 1}}
    with pytest.raises(ConfigurationError, match=r"startingTimestamp.*t-1 has no record.*150"):
        _reader({"startingTimestamp": "150"}, consumer).initial_offset()
    by = _reader({"startingOffsetsByTimestamp": '{"t": {"0": 250, "1": 50}}', "startingOffsets": "latest"}, consumer)
    assert by.initial_offset() == {"t": {"0": 2, "1": 0}}


def test_kafka_offset_reader_batch_end():
    consumer = FakeConsumer({("t", 0): 0, ("t", 1): 0}, {("t", 0): 30, ("t", 1): 20})
    reader = _reader({"endingOffsets": '{"t": {"0": 10, "1": -1}}'}, consumer, batch=True)
    assert reader.ending_offset({"t": {"0": 0, "1": 0}}) == {"t": {"0": 10, "1": 20}}
    with pytest.raises(ConfigurationError, match=r"t-0 ends at 10 before its start 12"):
        reader.ending_offset({"t": {"0": 12, "1": 0}})
    past = _reader({"endingOffsets": '{"t": {"0": 31}}'}, consumer, batch=True)
    with pytest.raises(ConfigurationError, match=r"endingOffsets.*past the latest offset.*t-0: 31 > 30"):
        past.ending_offset({"t": {"0": 0, "1": 0}})


def test_kafka_offset_reader_min_offsets_per_trigger_holds_until_enough_or_the_delay(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr("twophase.sources.kafka.time.monotonic", lambda: now[0])
    consumer = FakeConsumer({("t", 0): 0}, {("t", 0): 3})
    reader = _reader({"minOffsetsPerTrigger": "5", "maxTriggerDelay": "10s"}, consumer)
    start = {"t": {"0": 0}}
    assert reader.latest_offset(start, min_rows=5) == {"t": {"0": 3}}  # the first batch is not held back
    consumer.latest[("t", 0)] = 6
    now[0] += 1
    assert reader.latest_offset({"t": {"0": 3}}, min_rows=5) == {"t": {"0": 3}}  # 3 < 5: held
    consumer.latest[("t", 0)] = 8
    assert reader.latest_offset({"t": {"0": 3}}, min_rows=5) == {"t": {"0": 8}}  # 5 offsets: a batch
    consumer.latest[("t", 0)] = 9
    now[0] += 9.9
    assert reader.latest_offset({"t": {"0": 8}}, min_rows=5) == {"t": {"0": 8}}
    now[0] += 0.1  # maxTriggerDelay since the last batch
    assert reader.latest_offset({"t": {"0": 8}}, min_rows=5) == {"t": {"0": 9}}


def test_kafka_spark_stream_reader_read_limits():
    """What the Spark reader tells the engine, and what it does with the limit it gets back."""
    pytest.importorskip("pyspark")
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows
    from twophase.sinks.kafka_spark import KafkaStreamReader

    def limit_of(raw: dict) -> Any:
        return KafkaStreamReader(KafkaSourceOptions.from_options({**SRC, **raw})).getDefaultReadLimit()
    assert limit_of({}) == ReadAllAvailable()
    assert limit_of({"maxOffsetsPerTrigger": "10"}) == ReadMaxRows(10)
    assert limit_of({"minOffsetsPerTrigger": "7"}) == ReadMinRows(7)
    assert limit_of({"minOffsetsPerTrigger": "7", "maxOffsetsPerTrigger": "10"}) == ReadMaxRows(10)

    seen = []

    class Offsets:
        def latest_offset(self, start, limit=None, *, cap=None, min_rows=None):
            seen.append((limit, min_rows, cap))
            return start

    reader = KafkaStreamReader(KafkaSourceOptions.from_options({**SRC, "minOffsetsPerTrigger": "7",
                                                                "maxOffsetsPerTrigger": "10"}))
    reader._source = type("S", (), {"offsets": Offsets(), "close": lambda self: None})()
    reader.latestOffset({}, ReadMaxRows(10))
    reader.latestOffset({}, ReadMinRows(3))
    reader.latestOffset({}, ReadAllAvailable())  # Trigger.Once: everything, no minimum
    reader._target = {"t": {"0": 4}}  # Trigger.AvailableNow: no minimum (nothing past the target comes)
    reader.latestOffset({}, ReadMaxRows(10))
    assert seen == [(10, 7, None), (10, 3, None), (None, None, None), (10, None, {"t": {"0": 4}})]


def test_kafka_offset_reader_batch_end_by_timestamp():
    """endingTimestamp / endingOffsetsByTimestamp (Spark's precedence over endingOffsets): each partition ends
    before its first record at or after the time, at its latest offset where there is none."""
    times = {("t", 0): [(0, 100), (1, 200), (2, 300)], ("t", 1): [(0, 100)]}
    consumer = FakeConsumer({("t", 0): 0, ("t", 1): 0}, {("t", 0): 3, ("t", 1): 1}, times=times)
    one = _reader({"endingTimestamp": "150", "endingOffsets": '{"t": {"0": 3}}'}, consumer, batch=True)
    assert one.ending_offset({"t": {"0": 0, "1": 0}}) == {"t": {"0": 1, "1": 1}}
    by = _reader({"endingOffsetsByTimestamp": '{"t": {"0": 250, "1": 50}}'}, consumer, batch=True)
    assert by.ending_offset({"t": {"0": 0, "1": 0}}) == {"t": {"0": 2, "1": 0}}
    with pytest.raises(ConfigurationError, match=r"endingOffsetsByTimestamp.*missing.*t-1.*endingTimestamp"):
        _reader({"endingOffsetsByTimestamp": '{"t": {"0": 250}}'}, consumer, batch=True).ending_offset({"t": {"0": 0}})
    with pytest.raises(ConfigurationError, match=r"t-0 ends at 1 before its start 2"):
        one.ending_offset({"t": {"0": 2, "1": 0}})
    with pytest.raises(ConfigurationError, match=r"'endingTimestamp' is for batch reads"):
        _reader({"endingTimestamp": "150"}, consumer)
