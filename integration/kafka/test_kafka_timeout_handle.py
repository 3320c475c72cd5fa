"""K-2: the transaction handle records the transaction timeout its producer was created with.

A sink whose ``kafka.transaction.timeout.ms`` is not pinned (a CLI's, the embedded runtime's, an executor of a
long-lived process) gives each producer the process's current choice (``_kafka_timeout.choose_default_timeout``,
cached for 10 min). The handle's ``timeout_ms`` feeds the age check (invariant 7); it was read again at pre-commit
(``known_timeout_ms()``), which is the process's LATEST choice: after the cache expired and the brokers'
maximum changed, or after a refusal forgot the key (None), the handle named a timeout the producer never had."""

from __future__ import annotations

import dataclasses

import pytest

from integration.kafka.broker import create_topic, key_value_batch, unique

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(180)]


@pytest.mark.parametrize("client", ["librdkafka", "kafka-python"])
@pytest.mark.parametrize("change", ["chosen again", "forgotten"])
def test_kafka_k2_handle_records_the_producers_own_timeout_not_the_latest_choice(kafka_bootstrap, tmp_path, client,
                                                                                 change, monkeypatch):
    from twophase.sink import TransactionContext, run_task
    from twophase.sinks import _kafka_timeout as kt
    from twophase.sinks import kafka as kafka_sink
    from twophase.sinks.kafka import KafkaSink
    from twophase.spark.datasource import prepare_sink

    monkeypatch.setattr(kt, "CACHE", kt.TimeoutCache())
    monkeypatch.setattr(kafka_sink, "_TIMEOUT_CACHE", kt.CACHE)
    topic = create_topic(kafka_bootstrap, unique("k2"), 1)
    raw = {"kafka.bootstrap.servers": kafka_bootstrap, "topic": topic, "checkpointLocation": str(tmp_path / "ck"),
           "prefixRegistry": str(tmp_path / "registry"), "transactionalIdPrefix": unique("k2"), "kafkaClient": client}
    sink = KafkaSink.from_options(raw)
    prepare_sink(sink, raw["checkpointLocation"], what="k2 test")
    pinned = sink.options.transaction_timeout_ms
    assert sink.options.transaction_timeout_explicit          # the start check pinned the brokers' choice
    # a copy that did not run the start check in this process (not pinned): it asks the process's cache
    sink.options = dataclasses.replace(sink.options, transaction_timeout_explicit=False)
    key = sink._timeout_key()
    assert kt.chosen_timeout(key=key) == pinned

    def batches():
        yield key_value_batch("k2", 3)
        # the producer exists now (created with `pinned`); the process's choice changes before pre-commit
        if change == "chosen again":
            kt.CACHE.record(key, 60_000, chosen=True)
        else:
            kt.CACHE.forget(key)

    ack = run_task(sink, TransactionContext(sink.sink_id, 0, "0", 0), batches())
    try:
        assert ack.handle["timeout_ms"] == pinned, ack.handle
    finally:
        from twophase.coordinator import CheckpointCoordinator
        CheckpointCoordinator(sink).complete_batch(0, [ack], ["0"])
