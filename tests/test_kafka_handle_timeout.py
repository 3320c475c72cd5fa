"""K-2: a pre-commit handle records the transaction timeout its producer was created with, not the process's
latest choice (``KafkaSink.known_timeout_ms``), which a long-lived process may have re-chosen (cache expired, brokers'
maximum changed) or forgotten (a refusal) since. Both writers, over fake producers (no broker); the broker test is
integration/kafka/test_kafka_timeout_handle.py."""

from __future__ import annotations

import time

import pyarrow as pa
import pytest

pytest.importorskip("kafka")

from twophase.sink import TransactionContext  # noqa: E402
from twophase.sinks import _kafka_timeout as kt  # noqa: E402
from twophase.sinks import kafka as kafka_sink  # noqa: E402
from twophase.sinks._kafka_python_writer import KafkaPythonWriter, KafkaTransaction  # noqa: E402
from twophase.sinks._kafka_rdkafka_writer import KafkaWriter, RdKafkaTransaction  # noqa: E402
from twophase.sinks.kafka import KafkaSink  # noqa: E402

SCHEMA = pa.schema([("key", pa.binary()), ("value", pa.binary())])


class _Manager:
    class producer_id_and_epoch:  # noqa: N801 - kafka-python's attribute
        producer_id, epoch = 7, 1

    def has_error(self) -> bool:
        return False


class _Producer:
    _transaction_manager = _Manager()

    def flush(self, *a) -> int:
        return 0

    def close(self, timeout: float = 0) -> None:
        pass


@pytest.mark.parametrize("change", ["chosen again", "forgotten"])
@pytest.mark.parametrize("client", ["librdkafka", "kafka-python"])
def test_k2_handle_records_the_producers_own_timeout(monkeypatch, client, change) -> None:
    monkeypatch.setattr(kt, "CACHE", kt.TimeoutCache())
    monkeypatch.setattr(kafka_sink, "_TIMEOUT_CACHE", kt.CACHE)
    sink = KafkaSink.from_options({"kafka.bootstrap.servers": "h1:9092", "topic": "out",
                                   "checkpointLocation": "/tmp/ck-k2"}, SCHEMA)
    assert not sink.options.transaction_timeout_explicit       # not pinned: the process's choice is used
    key = sink._timeout_key()
    kt.CACHE.record(key, 900_000, chosen=True)                   # the choice when the producer was created
    ctx = TransactionContext(sink.sink_id, 0, "0")
    tid = sink.transactional_id("0", 0, 0)
    if client == "kafka-python":
        writer = KafkaPythonWriter(sink, ctx, transaction=KafkaTransaction(ctx, tid, _Producer(), time.time(),
                                                                           timeout_ms=900_000))
    else:
        writer = KafkaWriter(sink, ctx, transaction=RdKafkaTransaction(ctx, tid, _Producer(), time.time(),
                                                                       producer_id=7, epoch=1, timeout_ms=900_000))
    if change == "chosen again":                                 # re-chosen after the TTL: brokers' maximum lowered
        kt.CACHE.record(key, 60_000, chosen=True)
    else:                                                        # a refusal forgot the key
        kt.CACHE.forget(key)
    assert writer.prepare_commit().timeout_ms == 900_000
